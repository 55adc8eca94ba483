"""Prompt length against the worker's context, checked here before anything is sent upstream.

A text longer than the context could hold even at the tokenizer's longest token is refused before
it is tokenized (tokenizing megabytes costs seconds and hundreds of megabytes); otherwise it is
tokenized (off the event loop when it is large) and its token count checked the way the worker
checks it: the prompt must be shorter than the context, and the prompt plus `max_tokens` must fit.
"""

from __future__ import annotations

import asyncio

from netra.serve.tokenizer import ModelText
from netra.web.errors import OpenAIError

# Texts above this many characters are tokenized in a thread, so the event loop keeps serving.
_THREAD_CHARS = 1 << 16


def check_ids(n_tokens: int, context: int | None, max_new_tokens: int | None, param: str) -> None:
    if context is None:
        return  # the worker did not say; it refuses an over-long prompt itself
    if n_tokens >= context:
        raise OpenAIError(400, f"the prompt has {n_tokens} tokens; this model's context length is {context}",
                          param=param, code="context_length_exceeded")
    if max_new_tokens is not None and n_tokens + max_new_tokens > context:
        raise OpenAIError(400, f"the prompt ({n_tokens} tokens) plus max_tokens ({max_new_tokens}) exceeds this "
                               f"model's context length {context}", param="max_tokens",
                          code="context_length_exceeded")


async def encode_checked(text: ModelText, prompt: str, context: int | None, max_new_tokens: int | None,
                         param: str) -> list[int]:
    """The prompt's token IDs, or a 400 naming its length when it cannot fit the context."""
    # Twice the bound: a normalizer may compose characters (NFC) before the tokens are cut.
    if context is not None and len(prompt) > 2 * context * text.max_token_chars:
        raise OpenAIError(400, f"the prompt has {len(prompt)} characters, more than this model's context length "
                               f"({context} tokens) can hold", param=param, code="context_length_exceeded")
    if len(prompt) > _THREAD_CHARS:
        ids = await asyncio.to_thread(text.tokenizer.encode, prompt)
    else:
        ids = text.tokenizer.encode(prompt)
    check_ids(len(ids), context, max_new_tokens, param)
    return ids
