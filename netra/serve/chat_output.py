"""One chat choice's output text split into what the client reads: reasoning, content and tool calls.

The text passes the reasoning splitter first (when the prompt opened a think block and the request
did not ask for the reasoning inline), then the tool-call parser (when tools are active), so a call
the model opens inside its reasoning is still a call, and ``</think>`` or a call's markup never
reaches ``content``. Streamed and whole outputs go through the same objects: a whole response is one
push and a flush, so both give the same fields.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from netra.serve.reasoning import ReasoningSplitter
from netra.serve.toolcall import ToolCall, ToolParser


@dataclass
class Piece:
    reasoning: str = ""
    content: str = ""
    tool_deltas: list[dict[str, Any]] = field(default_factory=list)

    def extend(self, other: Piece) -> None:
        self.reasoning += other.reasoning
        self.content += other.content
        self.tool_deltas += other.tool_deltas


class ChatOutput:
    def __init__(self, reasoning: bool, tools: ToolParser | None) -> None:
        self.splitter = ReasoningSplitter() if reasoning else None
        self.tools = tools
        self.reasoning_text: list[str] = []

    @property
    def calls(self) -> list[ToolCall]:
        return self.tools.calls if self.tools is not None else []

    def push(self, text: str) -> Piece:
        reasoning, content = self.splitter.push(text) if self.splitter is not None else ("", text)
        return self._content(reasoning, content, final=False)

    def flush(self) -> Piece:
        reasoning, content = self.splitter.flush() if self.splitter is not None else ("", "")
        return self._content(reasoning, content, final=True)

    def _content(self, reasoning: str, content: str, final: bool) -> Piece:
        self.reasoning_text.append(reasoning)
        if self.tools is None:
            return Piece(reasoning, content)
        text, deltas = self.tools.push(content)
        if final:
            more, last = self.tools.flush()
            text += more
            deltas += last
        return Piece(reasoning, text, deltas)
