"""Logprobs in OpenAI's shapes, from the worker's (SGLang's) `[logprob, token_id, text]` entries.

Chat: ``{"content": [{"token", "logprob", "bytes", "top_logprobs": [{"token", "logprob", "bytes"}]}]}``.
Completions (legacy): ``{"tokens", "token_logprobs", "top_logprobs": [{token: logprob}], "text_offset"}``.
A token's text is its decode alone (special tokens kept); its bytes are exact for the byte tokenizer
and byte-level BPE vocabularies (a token may hold part of a UTF-8 character), else the UTF-8 of
that text.
"""

from __future__ import annotations

from typing import Any

from netra.serve.generation import TokenLogprob
from netra.serve.tokenizer import TextTokenizer
from netra.tokenizers import ByteTokenizer


class TokenText:
    """Text and bytes of single tokens, cached per token id."""

    def __init__(self, tokenizer: TextTokenizer) -> None:
        self.tok = tokenizer
        self._cache: dict[int, tuple[str, list[int]]] = {}

    def __call__(self, tid: int) -> tuple[str, list[int]]:
        hit = self._cache.get(tid)
        if hit is None:
            text = self.tok.decode([tid], skip_special_tokens=False)
            exact = getattr(self.tok, "token_bytes", None)
            raw = exact(tid) if exact is not None else None
            if raw is None:
                raw = bytes([tid]) if isinstance(self.tok, ByteTokenizer) and tid < 256 else text.encode()
            hit = self._cache[tid] = (text, list(raw))
        return hit


def chat_logprobs(entries: list[TokenLogprob], names: TokenText) -> dict[str, Any]:
    content = []
    for lp, tid, top in entries:
        text, raw = names(tid)
        alts = []
        for alp, atid in top:
            atext, araw = names(atid)
            alts.append({"token": atext, "logprob": alp, "bytes": araw})
        content.append({"token": text, "logprob": lp, "bytes": raw, "top_logprobs": alts})
    return {"content": content}


def completion_logprobs(entries: list[TokenLogprob], names: TokenText, offset: int) -> dict[str, Any]:
    """``offset``: characters of text before this part (the echoed prompt, earlier stream chunks)."""
    tokens, values, tops, offsets = [], [], [], []
    for lp, tid, top in entries:
        text, _ = names(tid)
        tokens.append(text)
        values.append(lp)
        tops.append({names(atid)[0]: alp for alp, atid in top})
        offsets.append(offset)
        offset += len(text)
    return {"tokens": tokens, "token_logprobs": values, "top_logprobs": tops, "text_offset": offsets}
