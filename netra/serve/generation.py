"""One choice = one upstream request: native events in, coalesced text deltas and exact usage out."""

from __future__ import annotations

import time
from collections.abc import AsyncGenerator
from dataclasses import dataclass, field
from typing import Any

from netra.serve.metrics import Metrics
from netra.serve.reasoning import ReasoningCounter
from netra.serve.stream import IncrementalDetokenizer, StopMatcher, TokenTracker, UpstreamProtocolError
from netra.serve.tokenizer import TextTokenizer
from netra.serve.upstream import Upstream, UpstreamStream
from netra.web.errors import OpenAIError

# One output token's logprob: (logprob, token id, top alternatives as (logprob, token id), best first).
TokenLogprob = tuple[float, int, list[tuple[float, int]]]


@dataclass
class Delta:
    index: int
    text: str
    finish_reason: str | None = None
    matched_stop: int | str | None = None
    logprobs: list[TokenLogprob] = field(default_factory=list)  # the tokens of this delta (when asked)


@dataclass
class Usage:
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0
    reasoning_tokens: int | None = None  # None: the prompt opened no think block

    def add(self, other: Usage, count_prompt: bool) -> None:
        if count_prompt:
            self.prompt_tokens += other.prompt_tokens
            self.cached_tokens += other.cached_tokens
        self.completion_tokens += other.completion_tokens
        if other.reasoning_tokens is not None:
            self.reasoning_tokens = (self.reasoning_tokens or 0) + other.reasoning_tokens

    def body(self) -> dict[str, Any]:
        out: dict[str, Any] = {"prompt_tokens": self.prompt_tokens, "completion_tokens": self.completion_tokens,
                               "total_tokens": self.prompt_tokens + self.completion_tokens,
                               "prompt_tokens_details": {"cached_tokens": self.cached_tokens}}
        if self.reasoning_tokens is not None:
            out["completion_tokens_details"] = {"reasoning_tokens": self.reasoning_tokens}
        return out


def _finish(finish: dict[str, Any]) -> tuple[str, int | str | None]:
    kind = finish.get("type")
    if kind == "length":
        return "length", None
    if kind == "stop":
        return "stop", finish.get("matched")
    if kind == "abort":
        status = finish.get("status_code")
        status = status if isinstance(status, int) and 400 <= status < 500 else 503
        raise OpenAIError(status, f"the worker aborted the request: {finish.get('message', 'no reason given')}")
    raise OpenAIError(502, f"worker sent an unknown finish_reason {finish!r}")


@dataclass
class Choice:
    """One upstream request and the state that turns its events into client text."""

    index: int
    body: dict[str, Any]
    tokenizer: TextTokenizer
    stops: list[str]
    keep_stop: bool
    skip_special_tokens: bool
    endpoint: str
    metrics: Metrics
    t0: float
    usage: Usage = field(default_factory=Usage)
    stream: UpstreamStream | None = None
    first_token_at: float | None = None
    timed: bool = True  # TTFT and inter-token times mean something only for streamed requests
    finalized: bool = False  # its upstream request was completed or aborted
    reasoning: ReasoningCounter | None = None  # counts the think block's tokens, when the prompt opened one

    def __post_init__(self) -> None:
        skip = self.skip_special_tokens
        tok = self.tokenizer
        self._detok = IncrementalDetokenizer(lambda ids: tok.decode(ids, skip_special_tokens=skip))
        self._stopper = StopMatcher(self.stops, keep_stop=self.keep_stop)
        self._tracker = TokenTracker()
        self._last_token_at = self.t0
        self.logprobs: list[TokenLogprob] = []  # one per visible output token, when the request asked
        self._logprobs_sent = 0

    @property
    def rid(self) -> str:
        return str(self.body["rid"])

    def _meta(self, meta: dict[str, Any], completion_tokens: int) -> None:
        self.usage.prompt_tokens = int(meta.get("prompt_tokens", self.usage.prompt_tokens) or 0)
        self.usage.cached_tokens = int(meta.get("cached_tokens", self.usage.cached_tokens) or 0)
        self.usage.completion_tokens = completion_tokens

    def _tokens_arrived(self, n: int) -> None:
        if n <= 0 or not self.timed:
            return
        now = time.monotonic()
        if self.first_token_at is None:
            self.first_token_at = now
            self.metrics.ttft.labels(self.endpoint).observe(now - self.t0)
            n -= 1  # the first token's wait is TTFT, the rest of its event are inter-token gaps of 0
            if n:
                self.metrics.observe_tokens(self.endpoint, 0.0, n)
        else:
            self.metrics.observe_tokens(self.endpoint, now - self._last_token_at, n)
        self._last_token_at = now

    def _apply(self, event: dict[str, Any]) -> tuple[str, bool, tuple[str, int | str | None] | None]:
        """Feed one event: (new client text, whether a stop string ended it, upstream finish)."""
        try:
            p = self._tracker.feed(event)
        except UpstreamProtocolError as exc:
            raise OpenAIError(502, f"worker broke the stream contract: {exc}") from exc
        self._tokens_arrived(len(p.new_ids))
        self._meta(p.meta, p.completion_tokens)
        if self.reasoning is not None:
            self.reasoning.push(p.new_ids)
            self.usage.reasoning_tokens = self.reasoning.tokens
        self._take_logprobs(p.meta)
        text = self._stopper.push(self._detok.push(p.new_ids))
        if self._stopper.matched is not None:
            return text, True, None
        if p.finish is None:
            return text, False, None
        finish = _finish(p.finish)
        text += self._stopper.push(self._detok.flush())
        if self._stopper.matched is not None:
            return text, True, None
        return text + self._stopper.flush(), False, finish

    def _take_logprobs(self, meta: dict[str, Any]) -> None:
        """Collect SGLang's `output_token_logprobs` / `output_top_logprobs` entries: cumulative lists
        in cumulative streaming (and in a whole response), only the new ones in incremental streaming.
        A matched stop token's entry (outside the visible output) is dropped."""
        entries = meta.get("output_token_logprobs")
        if not isinstance(entries, list):
            return
        tops = meta.get("output_top_logprobs") or [[] for _ in entries]
        start = 0 if self._tracker.mode == "incremental" else len(self.logprobs)
        try:
            for e, top in zip(entries[start:], tops[start:], strict=True):
                self.logprobs.append((float(e[0]), int(e[1]), [(float(t[0]), int(t[1])) for t in top or []]))
        except (TypeError, ValueError, IndexError) as exc:
            raise OpenAIError(502, f"worker sent malformed logprobs: {exc}") from exc
        del self.logprobs[len(self._tracker.ids):]

    def take_logprobs(self) -> list[TokenLogprob]:
        """Logprobs of the tokens that arrived since the last call."""
        new = self.logprobs[self._logprobs_sent:]
        self._logprobs_sent = len(self.logprobs)
        return new

    def _stop_delta(self, text: str) -> Delta:
        return Delta(self.index, text, "stop", self._stopper.matched, self.take_logprobs())

    async def run_whole(self, upstream: Upstream) -> tuple[str, Delta]:
        """Non-streaming: the whole text and the final delta (finish reason)."""
        if self.stops:
            # Stream from the worker even so: a stop string found midway ends the request early.
            self.body["stream"] = True
            parts: list[str] = []
            last = Delta(self.index, "")
            lps: list[TokenLogprob] = []
            async for d in self.run_stream(upstream, interval=1 << 30):
                parts.append(d.text)
                lps += d.logprobs
                last = d
            last.logprobs = lps
            return "".join(parts), last
        result = await upstream.generate(self.body)
        text, stopped, finish = self._apply(result)
        if stopped:
            return text, self._stop_delta("")
        if finish is None:
            raise OpenAIError(502, "worker /generate returned no finish_reason")
        return text, Delta(self.index, "", finish[0], finish[1], self.take_logprobs())

    async def open(self, upstream: Upstream) -> None:
        self.stream = await upstream.open_stream(self.body)

    async def run_stream(self, upstream: Upstream, interval: int) -> AsyncGenerator[Delta, None]:
        """Coalesced deltas: one when `interval` tokens are pending (and their text is printable),
        and always a final one carrying the finish reason. Leaving early (client gone, stop string,
        error) aborts the request at the worker."""
        if self.stream is None:
            await self.open(upstream)
        stream = self.stream
        assert stream is not None
        done = False
        abort_reason = "client_disconnect"
        pending_text = ""
        pending_tokens = 0
        final: Delta | None = None
        try:
            async for event in stream.events():
                before = self._tracker.completion_tokens
                text, stopped, finish = self._apply(event)
                pending_text += text
                pending_tokens += self._tracker.completion_tokens - before
                if stopped:
                    abort_reason = "stop_string"
                    final = self._stop_delta(pending_text)
                    break
                if finish is not None:
                    final = Delta(self.index, pending_text, finish[0], finish[1], self.take_logprobs())
                    continue  # read on to [DONE] so the connection goes back to the pool
                if pending_tokens >= interval and pending_text:
                    yield Delta(self.index, pending_text, logprobs=self.take_logprobs())
                    pending_text, pending_tokens = "", 0
            if final is None:
                raise OpenAIError(502, "the worker's stream ended before the request finished")
            done = self._tracker.finished
            yield final
        except OpenAIError:
            abort_reason = "error"
            raise
        finally:
            aborted_already = self.finalized  # the response's close callback got here first
            self.finalized = True
            self.metrics.upstream_bytes.inc(stream.bytes_received)
            stream.bytes_received = 0
            if not done and not aborted_already:
                self.metrics.aborts.labels(abort_reason).inc()
                upstream.abort_soon(self.rid, stream)
            elif done:
                try:
                    await stream.aclose()
                except Exception:  # the request is complete; a failing close costs only the connection
                    pass
