"""Stream translation: native worker events -> each new token once -> text deltas -> client events.

Three small state machines, each tested against a plain-Python reference:

- `TokenTracker` turns the worker's events into new token IDs whether the worker streams
  cumulative `output_ids` (SGLang's default: the whole output so far in every event) or
  incremental ones (`--incremental-streaming-output`: only the new suffix). It tells the modes
  apart with `meta_info.completion_tokens`, which is cumulative in both, so a token is never
  counted or sent twice.
- `IncrementalDetokenizer` turns new token IDs into new text, holding back a trailing partial
  UTF-8 character (decoded as U+FFFD) until it completes, so that the concatenated deltas equal the
  decode of the whole output.
- `StopMatcher` applies OpenAI `stop` strings (the worker contract carries only stop token IDs),
  holding back text that could be the start of a stop string.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any


class UpstreamProtocolError(ValueError):
    """The worker sent an event that breaks docs/worker-contract.md."""


@dataclass
class Progress:
    """What one upstream event adds to a request."""

    new_ids: list[int]
    completion_tokens: int
    finish: dict[str, Any] | None
    meta: dict[str, Any]


@dataclass
class TokenTracker:
    ids: list[int] = field(default_factory=list)
    completion_tokens: int = 0
    mode: str | None = None  # "cumulative" | "incremental" once an event told them apart
    finished: bool = False

    def feed(self, event: dict[str, Any]) -> Progress:
        if self.finished:
            raise UpstreamProtocolError("event after the final event (finish_reason already set)")
        try:
            meta = event["meta_info"]
            ids = event["output_ids"]
            ct = int(meta["completion_tokens"])
        except (KeyError, TypeError, ValueError) as exc:
            raise UpstreamProtocolError(f"event lacks output_ids or meta_info.completion_tokens: {exc!r}") from exc
        if not isinstance(ids, list):
            raise UpstreamProtocolError("output_ids is not a list")
        finish = meta.get("finish_reason")
        prev = self.completion_tokens
        if ct < prev:
            raise UpstreamProtocolError(f"completion_tokens went back from {prev} to {ct}")
        # A final `stop` event may leave the matched stop token out of output_ids while counting it.
        slack = 1 if isinstance(finish, dict) and finish.get("type") == "stop" else 0
        cumulative_ok = ct - slack <= len(ids) <= ct and len(ids) >= len(self.ids)
        incremental_ok = ct - prev - slack <= len(ids) <= ct - prev
        mode = self.mode
        if mode is None and prev > 0:
            if cumulative_ok and incremental_ok:
                # Only possible when prev == 1 on a trimmed stop event: the shared prefix decides.
                mode = "cumulative" if ids[: len(self.ids)] == self.ids else "incremental"
            elif cumulative_ok:
                mode = "cumulative"
            elif incremental_ok:
                mode = "incremental"
        # With mode None (prev == 0) both modes read the event the same way.
        fits = {"cumulative": cumulative_ok, "incremental": incremental_ok, None: cumulative_ok or incremental_ok}
        if fits[mode]:
            new = ids[len(self.ids):] if mode == "cumulative" else list(ids)
        else:
            raise UpstreamProtocolError(
                f"event with {len(ids)} output_ids and completion_tokens={ct} after {prev} tokens fits "
                f"neither cumulative nor incremental streaming (mode so far: {self.mode})")
        self.mode = mode
        self.ids.extend(new)
        self.completion_tokens = ct
        if finish is not None:
            self.finished = True
        return Progress(new_ids=new, completion_tokens=ct, finish=finish, meta=meta)


Decode = Callable[[list[int]], str]


class IncrementalDetokenizer:
    """New text for new tokens, decoding a short window that starts at the previous emission.

    Decoding the window [prefix, end) and dropping the text of [prefix, read) keeps tokenizers
    whose decode depends on the preceding token (leading-space rules) right, and keeps the cost
    per token O(window), not O(output) as re-decoding everything would.
    """

    def __init__(self, decode: Decode) -> None:
        self._decode = decode
        self._ids: list[int] = []
        self._prefix = 0
        self._read = 0

    def push(self, new_ids: Sequence[int]) -> str:
        if not new_ids:
            return ""
        self._ids.extend(new_ids)
        prefix_text = self._decode(self._ids[self._prefix:self._read])
        text = self._decode(self._ids[self._prefix:])
        # A trailing U+FFFD is an incomplete multi-byte character: wait for its remaining bytes.
        if len(text) > len(prefix_text) and not text.endswith("\ufffd"):
            delta = text[len(prefix_text):]
            self._prefix, self._read = self._read, len(self._ids)
            return delta
        return ""

    def flush(self) -> str:
        """Everything not yet emitted (a genuinely invalid tail included), at the end of the output."""
        if self._read == len(self._ids):
            return ""
        prefix_text = self._decode(self._ids[self._prefix:self._read])
        text = self._decode(self._ids[self._prefix:])
        self._prefix = self._read = len(self._ids)
        return text[len(prefix_text):]


class StopMatcher:
    """OpenAI `stop` strings over a text stream: emits text that can no longer start a stop string."""

    def __init__(self, stops: Sequence[str], keep_stop: bool = False) -> None:
        self.stops = [s for s in stops if s]
        self.keep_stop = keep_stop
        self._held = ""
        self.matched: str | None = None

    def push(self, text: str) -> str:
        """Text safe to emit; sets `matched` (and emits nothing after it) when a stop string appears."""
        if self.matched is not None:
            return ""
        if not self.stops:
            return text
        buf = self._held + text
        # The stop string that *ends* first wins (ties: the longer one), as if the text arrived one
        # character at a time, so the result does not depend on how tokens were coalesced.
        best: tuple[int, int, str] | None = None
        for s in self.stops:
            i = buf.find(s)
            if i >= 0 and (best is None or (i + len(s), i) < best[:2]):
                best = (i + len(s), i, s)
        if best is not None:
            _, i, s = best
            self.matched = s
            self._held = ""
            return buf[: i + len(s)] if self.keep_stop else buf[:i]
        hold = 0
        for s in self.stops:
            # Longest suffix of buf that is a proper prefix of s.
            for k in range(min(len(s) - 1, len(buf)), hold, -1):
                if buf.endswith(s[:k]):
                    hold = k
                    break
        self._held = buf[len(buf) - hold:] if hold else ""
        return buf[: len(buf) - hold]

    def flush(self) -> str:
        held, self._held = self._held, ""
        return "" if self.matched is not None else held
