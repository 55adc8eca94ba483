"""What both tool-call formats share: a parsed call (`ToolCall`), the parser interface (`ToolParser`),
the whitespace the formats put between calls (`HeldSpace`), and a tag in a grammar (`tag_grammar`)."""

from __future__ import annotations

import json
import uuid
from abc import ABC, abstractmethod
from collections.abc import Collection
from dataclasses import dataclass, field
from typing import Any


def tag_grammar(tag: str, added_tokens: Collection[str] = ()) -> str:
    """A block tag in a Lark grammar (llguidance). llguidance reads every added token of a vocabulary
    as a special token, which a quoted string never matches: where the tag is one (Qwen3's and
    Qwen3.5/3.6's ``<tool_call>`` and ``</tool_call>``, though not special in Hugging Face's sense),
    the token the model was trained to write is allowed as well as the text."""
    text = json.dumps(tag, ensure_ascii=False)
    return f"({tag} | {text})" if tag in added_tokens else text


@dataclass
class ToolCall:
    index: int
    name: str
    arguments: str  # a JSON object, as text
    id: str = field(default_factory=lambda: f"call_{uuid.uuid4().hex[:24]}")

    def body(self, with_index: bool = False) -> dict[str, Any]:
        d: dict[str, Any] = {"id": self.id, "type": "function",
                             "function": {"name": self.name, "arguments": self.arguments}}
        return {"index": self.index, **d} if with_index else d


class HeldSpace:
    """Content text once a call was made: whitespace between and after calls is the format's, not content.

    Trailing whitespace is held until it is known what follows it: more text (then it is content,
    emitted with that text) or another call or the end of the output (then it is dropped). Holding
    the trailing whitespace of every piece, not only of whitespace-only pieces, keeps the content the
    same however the text was chunked. Before the first call, text passes through as it is."""

    def __init__(self) -> None:
        self.active = False
        self._held = ""

    def add(self, text: str) -> str:
        if not self.active:
            return text
        text = self._held + text
        shown = text.rstrip()
        self._held = text[len(shown):]
        return shown

    def drop(self) -> None:
        self._held = ""


class ToolParser(ABC):
    """One response's tool-call parser (one per choice), for the format the chat template teaches.

    `push` takes output text as it arrives, in any chunking (down to one character), and returns the
    content text that is safe to show now and the new ``tool_calls`` deltas of an OpenAI chat chunk;
    `flush` ends the output. Each call's deltas are, in order: one header
    ``{"index": i, "id": ..., "type": "function", "function": {"name": ..., "arguments": A}}`` when
    its function name is known, then ``{"index": i, "function": {"arguments": A}}`` as more of its
    arguments are known; the ``A`` of one call concatenate to its final ``arguments`` JSON text. One
    `push`/`flush` returns at most one delta per call (a header carries the arguments known so far).
    `calls` holds the completed calls. Pushing the whole text at once and flushing gives the same
    content and calls as any chunking."""

    calls: list[ToolCall]

    @abstractmethod
    def push(self, text: str) -> tuple[str, list[dict[str, Any]]]: ...

    @abstractmethod
    def flush(self) -> tuple[str, list[dict[str, Any]]]: ...

    @abstractmethod
    def grammar(self, tools: list[dict[str, Any]], only: str | None, parallel: bool,
                added_tokens: Collection[str] = ()) -> str:
        """The Lark grammar (llguidance) for ``tool_choice`` ``required`` (``only`` None) or a named
        function (``only``): one call, or one or more with ``parallel``, in this parser's format.
        ``added_tokens``: the strings of the vocabulary's added tokens, so that a block tag that is
        one is allowed as its token (`tag_grammar`); leave it empty for a byte-level vocabulary."""
