"""Reasoning separated from the answer, as SGLang's ``--reasoning-parser qwen3`` does.

Qwen3.5/3.6's chat template opens the think block itself: the generation prompt ends
``<|im_start|>assistant\\n<think>\\n`` (``<think>\\n\\n</think>\\n\\n`` with ``enable_thinking: false``). So
the model writes its reasoning, ``</think>``, then the answer; it never writes ``<think>``. It may also
open ``<tool_call>`` without closing the block: that ends the reasoning too, and the call is the answer's.

`opens_reasoning` tells from the rendered prompt whether the output starts inside a think block.
`ReasoningSplitter` turns output text (whole or streamed, in any chunking) into reasoning and content:
``</think>`` reaches neither, the newlines the format puts around the block are dropped, and text that
might still become a tag is held back until it is known. `ReasoningCounter` counts the reasoning's
tokens (``</think>`` included, as SGLang counts them) for ``completion_tokens_details.reasoning_tokens``.
"""

from __future__ import annotations

THINK_OPEN, THINK_CLOSE = "<think>", "</think>"
TOOL_OPEN = "<tool_call>"


def opens_reasoning(prompt: str) -> bool:
    """Whether a rendered prompt ends inside a think block (its last ``<think>`` is not closed)."""
    opened = prompt.rfind(THINK_OPEN)
    return opened >= 0 and prompt.find(THINK_CLOSE, opened) < 0


def _partial_suffix(text: str, tags: tuple[str, ...]) -> int:
    """Length of the longest end of ``text`` that is a proper prefix of one of ``tags``."""
    best = 0
    for tag in tags:
        for k in range(min(len(tag) - 1, len(text)), best, -1):
            if text.endswith(tag[:k]):
                best = k
                break
    return best


class ReasoningSplitter:
    """Feed output text as it arrives; get back (reasoning, content) that is safe to send now."""

    def __init__(self) -> None:
        self.in_reasoning = True
        self._buf = ""  # undecided text: a possible tag start, or newlines that may precede </think>
        self._started = False  # some reasoning text was emitted (leading newlines are the format's)
        self._answer_started = False  # some content was emitted (newlines after </think> are the format's)

    def push(self, text: str) -> tuple[str, str]:
        if not self.in_reasoning:
            return "", self._content(text)
        buf = self._buf + text
        close, tool = buf.find(THINK_CLOSE), buf.find(TOOL_OPEN)
        if close >= 0 and (tool < 0 or close < tool):
            self.in_reasoning, self._buf = False, ""
            return self._reasoning(buf[:close].rstrip("\n")), self._content(buf[close + len(THINK_CLOSE):])
        if tool >= 0:  # a call opened inside the block ends it; the call belongs to the answer
            self.in_reasoning, self._buf = False, ""
            return self._reasoning(buf[:tool].rstrip("\n")), self._content(buf[tool:])
        keep = _partial_suffix(buf, (THINK_CLOSE, TOOL_OPEN))
        head, tail = buf[:len(buf) - keep], buf[len(buf) - keep:]
        # Newlines at the end may be the ones before </think>: held until more reasoning follows them.
        stripped = head.rstrip("\n")
        self._buf = head[len(stripped):] + tail
        return self._reasoning(stripped), ""

    def flush(self) -> tuple[str, str]:
        """At the end of the output: undecided text is reasoning if the block never closed."""
        rest, self._buf = self._buf, ""
        if self.in_reasoning:
            return self._reasoning(rest.rstrip("\n")), ""
        return "", ""

    def _reasoning(self, text: str) -> str:
        if not self._started:
            text = text.lstrip("\n")
            self._started = bool(text)
        return text

    def _content(self, text: str) -> str:
        if not self._answer_started:
            text = text.lstrip("\n")
            self._answer_started = bool(text)
        return text


class ReasoningCounter:
    """Counts output tokens up to and including the end of the think block (its token ids), or up to
    a tool call's opening tag (exclusive), whichever comes first."""

    def __init__(self, end_ids: list[int], tool_ids: list[int]) -> None:
        self._end, self._tool = end_ids, tool_ids
        self._tail: list[int] = []
        self.tokens = 0
        self.done = False

    def push(self, ids: list[int]) -> None:
        for t in ids:
            if self.done:
                return
            self.tokens += 1
            self._tail = [*self._tail, t][-max(len(self._end), len(self._tool)):]
            if self._end and self._tail[-len(self._end):] == self._end:
                self.done = True
            elif self._tool and self._tail[-len(self._tool):] == self._tool:
                self.tokens -= len(self._tool)
                self.done = True
