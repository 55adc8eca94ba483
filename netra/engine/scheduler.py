"""Continuous-batching scheduler: admission queue, request slots, chunked prefill, bucketed decode.

One thread owns the model, the pools and every request's state; other threads talk to it only
through `submit` / `abort` (a queue). Each step is either a prefill step (chunks of waiting
prompts, at most ``chunked_prefill_size`` tokens, prefill first like SGLang) or a decode step (one
token for every running request, the batch padded to the next graph bucket with rows on the pad
slot). A prompt is always cut at multiples of the chunk size of its own positions, whatever else is
queued, so a request's arithmetic does not depend on what it shares a batch with.

Outputs go to each request's ``sink`` (called on the scheduler thread; it must not block): the
tokens since the previous emission, the cumulative completion count and the finish reason.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from netra.engine.cache import PAD_SLOT, StatePools
from netra.engine.grammar import Grammar
from netra.engine.model import ForwardBatch, Model, prefill_batch
from netra.engine.options import EngineOptions
from netra.engine.overlap import StepClock
from netra.engine.sampler import SlotSampler, StepResult, StepVariant
from netra.ops._common import to_device

log = logging.getLogger("netra.engine")


@dataclass(frozen=True)
class SamplingParams:
    max_new_tokens: int = 128
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    min_p: float = 0.0
    ignore_eos: bool = False
    stop_token_ids: tuple[int, ...] = ()
    skip_special_tokens: bool = True
    sampling_seed: int | None = None
    no_stop_trim: bool = False
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    repetition_penalty: float = 1.0
    min_new_tokens: int = 0
    logit_bias: tuple[tuple[int, float], ...] = ()  # (token id, bias), added to the logits
    return_logprob: bool = False
    top_logprobs_num: int = 0


LOGPROB_FLOOR = -9999.0
# One generated token's logprob entry: (logprob, token id), and its top alternatives, best first.
TokenLogprob = tuple[float, int]


@dataclass
class Output:
    rid: str
    new_ids: list[int]  # tokens since the previous emission (a trimmed stop token excluded)
    completion_tokens: int  # every generated token so far, a matched stop token included
    finish_reason: dict[str, Any] | None
    # With return_logprob: entries for the tokens since the previous emission, a matched stop token
    # included (one per completion token, as SGLang counts them).
    logprobs: list[TokenLogprob] = field(default_factory=list)
    top_logprobs: list[list[TokenLogprob]] = field(default_factory=list)


@dataclass(eq=False)  # identity semantics: list membership and removal must not compare fields
class Request:
    rid: str
    prompt: list[int]
    params: SamplingParams
    sink: Callable[[Output], None]
    stream: bool = False
    seed: int = 0
    output: list[int] = field(default_factory=list)
    slot: int = -1
    cached: int = 0  # tokens whose KV / state are in the slot
    emitted: int = 0  # output tokens already sent to the sink
    trimmed: bool = False  # last output token is a stop token kept out of the visible output
    finish_reason: dict[str, Any] | None = None
    admitted: float | None = None  # perf_counter when it got a slot
    grammar: Grammar | None = None  # structured output: the request's matcher (host side)
    logprobs: list[TokenLogprob] = field(default_factory=list)
    top_logprobs: list[list[TokenLogprob]] = field(default_factory=list)
    emitted_logprobs: int = 0


@dataclass
class StepStats:
    steps: int = 0
    prefill_steps: int = 0
    decode_steps: int = 0
    decode_rows: int = 0  # real rows over all decode steps
    padded_rows: int = 0  # pad rows added to reach a bucket
    prefill_tokens: int = 0
    output_tokens: int = 0
    forward_s: float = 0.0  # model forward (logits on the host side included)
    sample_s: float = 0.0
    step_s: float = 0.0  # whole steps: batch building + forward + sampling + output processing
    # The scheduler thread's CPU time (time.thread_time): on a shared, oversubscribed machine wall
    # time includes waiting for a core; this is the engine's own cost.
    forward_cpu_s: float = 0.0
    sample_cpu_s: float = 0.0
    step_cpu_s: float = 0.0
    mixed_steps: int = 0  # steps carrying decode rows and prompt chunks (--mixed-chunk split or fused)
    # Host time per step (on CUDA: the step less its wait for the device) and the device's idle time
    # between steps (CUDA events; on a CPU, the host time).
    host_s: float = 0.0
    gap_s: float = 0.0
    device_s: float = 0.0  # CUDA events: each waiting step's first device work to its last wait's end
    chained_steps: int = 0  # decode steps launched from the previous step's tokens on the device (--decode-overlap)

    def to_json(self) -> dict[str, Any]:
        d = dict(self.__dict__)
        d["overhead_s"] = self.step_s - self.forward_s - self.sample_s
        d["overhead_ms_per_step"] = 1e3 * d["overhead_s"] / max(1, self.steps)
        d["forward_ms_per_step"] = 1e3 * self.forward_s / max(1, self.steps)
        d["forward_cpu_ms_per_step"] = 1e3 * self.forward_cpu_s / max(1, self.steps)
        d["host_ms_per_step"] = 1e3 * self.host_s / max(1, self.steps)
        d["gap_ms_per_step"] = 1e3 * self.gap_s / max(1, self.steps)
        d["overhead_cpu_ms_per_step"] = 1e3 * (self.step_cpu_s - self.forward_cpu_s - self.sample_cpu_s) / max(1, self.steps)
        return d


@dataclass(eq=False)
class _InFlight:
    """A decode step launched, its tokens not yet read: the rows' requests, a copy of the sampled tokens (the
    sampling graph's static output is overwritten by the next step; on CUDA a pinned host buffer filled
    asynchronously), and the event after that copy (None on a CPU)."""
    reqs: list[Request]
    tokens: torch.Tensor
    event: Any
    bucket: int
    graphed: bool


class Scheduler:
    def __init__(self, model: Model, pools: StatePools, options: EngineOptions, eos_ids: tuple[int, ...]) -> None:
        self.model, self.pools, self.opt = model, pools, options
        self.device = model.device  # by index on CUDA (build_engine): the scheduler thread sets it as current
        self.eos = frozenset(eos_ids)
        self.buckets = tuple(b for b in options.cuda_graph_bs)
        self.waiting: deque[Request] = deque()
        self.prefilling: list[Request] = []
        self.decoding: list[Request] = []
        self.by_rid: dict[str, Request] = {}
        self.inbox: queue.Queue[tuple[str, Any]] = queue.Queue()
        self.stats = StepStats()
        self.clock = StepClock(self.device)
        # Called after every step with (kind: prefill | decode | mixed, host seconds, device idle gap seconds,
        # device seconds from the step's first device work to its last wait: None where the step did not wait).
        self.step_observer: Callable[[str, float, float, float | None], None] | None = None
        # Called from the scheduler thread if it dies (an error outside a step): the server ends the process,
        # so its supervisor restarts it instead of a listener that accepts requests no thread will serve.
        self.on_fatal: Callable[[BaseException], None] | None = None
        self.warm = threading.Event()  # set once the warm-up (or its skipping) is done: /health answers 503 before
        self.progress_at = time.monotonic()  # start or end of the latest step (liveness: /health)
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        # Persistent decode inputs (fixed addresses for graph replay); a step fills a prefix.
        cap = max(max(self.buckets), options.max_running_requests)
        self._ids = torch.zeros(cap, dtype=torch.int64, device=self.device)
        self._pos = torch.zeros(cap, dtype=torch.int64, device=self.device)
        self._slots = torch.full((cap,), PAD_SLOT, dtype=torch.int64, device=self.device)
        self._lens = torch.ones(cap, dtype=torch.int64, device=self.device)
        self._rows = torch.arange(cap, dtype=torch.int64, device=self.device)
        # Per-slot sampling state (penalties, bias, grammar masks) and the step's token sampler.
        self.sampler = SlotSampler(pools.num_slots, model.cfg.vocab_size, self.device, eos_ids)
        # CUDA graphs: one per decode bucket, captured on first use, sharing one memory pool.
        self.use_graphs = self.device.type == "cuda" and not options.disable_cuda_graph
        # A bucket whose forward cannot be captured (an op on a host-synchronising fallback) decodes eagerly.
        self.eager_buckets: dict[int, str] = {}
        if self.use_graphs:
            for b in self.buckets:
                why = model.decode_capture_blocker(b)
                if why is not None:
                    self.eager_buckets[b] = why
                    log.warning("decode CUDA graph off for bucket %d: %s", b, why)
        self._graphs: dict[int, tuple[Any, torch.Tensor]] = {}
        # The sampling step of a captured bucket, one graph per (bucket, variant), replayed right behind the
        # forward's graph on its static logits: penalties, bias, min-tokens, grammar masks, the draw and the
        # logprobs run inside captured graphs too (the masks are copied in by `prepare` before the replay).
        self._sample_graphs: dict[tuple[int, StepVariant], tuple[Any, StepResult]] = {}
        self._graph_pool: Any = None
        self._inflight: _InFlight | None = None  # --decode-overlap: the chained step on the device
        self._tok_host: list[torch.Tensor] | None = None  # its two pinned token buffers (CUDA)
        self._tok_flip = 0

    # ---- thread-safe interface -------------------------------------------------------------------
    def submit(self, req: Request) -> None:
        self.inbox.put(("add", req))

    def abort(self, rid: str, message: str = "aborted") -> None:
        self.inbox.put(("abort", (rid, message)))

    def start(self) -> None:
        if not (self.device.type == "cuda" and self.opt.warmup):
            self.warm.set()  # nothing to warm: healthy as soon as the thread runs
        self._thread = threading.Thread(target=self._loop, name="netra-scheduler", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self.inbox.put(("wake", None))
        if self._thread is not None:
            self._thread.join(timeout=10)

    @property
    def started(self) -> bool:
        return self._thread is not None

    @property
    def alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def load(self) -> dict[str, int]:
        return {"waiting": len(self.waiting), "prefilling": len(self.prefilling), "running": len(self.decoding),
                "free_slots": self.pools.free_slots}

    def run_until_idle(self, max_steps: int = 1_000_000) -> None:
        """Synchronous driving (tests, offline measurement): process the inbox and step until no work is left.
        Never call it while the scheduler thread runs."""
        for _ in range(max_steps):
            self._drain(block=False)
            if not (self.waiting or self.prefilling or self.decoding):
                return
            self.step()
        raise RuntimeError(f"still busy after {max_steps} steps")

    # ---- scheduler thread ------------------------------------------------------------------------
    def _loop(self) -> None:
        try:
            self._serve()
        except BaseException as exc:
            log.critical("the scheduler thread has stopped", exc_info=True)
            if self.on_fatal is not None:
                self.on_fatal(exc)

    def _serve(self) -> None:
        if self.device.type == "cuda":  # this thread's current device (streams, graphs) is the engine's
            torch.cuda.set_device(self.device)
            if self.opt.warmup:
                try:
                    self.warm_up()
                except Exception:  # serving cold beats not serving: the requests meet the same error, one by one
                    log.exception("warm-up failed; serving without it")  # (warm_up zeroed what it touched)
                self.warm.set()
        while not self._stop.is_set():
            try:
                self._drain(block=not (self.waiting or self.prefilling or self.decoding))
                if self._stop.is_set():
                    break
                if self.waiting or self.prefilling or self.decoding:
                    self.step()
            except Exception as exc:  # a failed step must not take the server down: fail its requests
                log.exception("engine step failed")
                for req in list(self.prefilling) + list(self.decoding):
                    try:
                        self._finish(req, {"type": "abort", "message": f"engine error: {exc}"})
                    except Exception:
                        log.exception("could not fail request %s", req.rid)

    def warm_up(self) -> None:
        """Compile and capture before the first request; no request's state moves (the slots it borrows are zeroed
        and handed back in their order, the pad slot is zeroed after). Prefill forwards of the shapes serving makes,
        so that Triton compiles each kernel's specialisations (an integer argument equal to 1, or a multiple of 16,
        is a specialisation of its own) and fla autotunes before a request waits for it:

        * a chunk's width of prompts of at most 1024 tokens, each on its own slot (a prefill batch never repeats a
          slot: the conv prefill tactic refuses one);
        * mixed steps: decode rows on the pad slot (as many as the chunk budget leaves, 1, 7) beside a chunk of an
          odd length, so the decode ops' eager paths at those row counts compile too;
        * a one-token prompt;

        then every decode bucket's graph and its greedy sampling graph. At the full shape on an H200 the first
        prompt otherwise waited ~70 s (Triton compiles, fla autotuning), the first step of each bucket waited for
        its capture, and the compiles of the other shapes stalled every running stream for up to 1.2 s in the
        first C=128 run (results/serving/dp1-h200-20261202-prefill)."""
        t0 = time.perf_counter()
        n = self.opt.chunked_prefill_size
        piece = max(1, min(n, 1024, self.pools.context_length - 1))
        want = -(-n // piece)
        slots = [self.pools.alloc() for _ in range(min(want, self.pools.free_slots))]
        try:
            shapes = self._warm_shapes(n, piece, slots)
            for chunks, decode in shapes:
                self.model.forward(prefill_batch(self.device, chunks, decode=decode or None))
            captured = 0
            if self.use_graphs:
                greedy = StepVariant(greedy=True, processed=False, logprobs=False)
                for b in self.buckets:
                    if b not in self.eager_buckets:
                        if b not in self._graphs:
                            self._capture(b)
                        self._sample_graph(b, greedy)
                        captured += 1
        finally:
            for slot in [PAD_SLOT, *slots]:
                self._zero_slot(slot)
            for slot in reversed(slots):
                self.pools.release(slot)
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        log.info("warmed up in %.1f s: %d prefill forwards (up to %d tokens, %d slots borrowed), %d decode bucket(s) "
                 "captured", time.perf_counter() - t0, len(shapes), n, len(slots), captured)

    def _warm_shapes(self, n: int, piece: int, slots: list[int]
                     ) -> list[tuple[list[tuple[int, list[int], int, bool]], list[tuple[int, int, int]]]]:
        """The warm-up's forwards: (prompt chunks, decode rows) each, within the chunk budget ``n``."""
        if not slots:  # no slot to borrow (every one taken): one prompt on the pad slot
            return [([(PAD_SLOT, [0] * piece, 0, True)], [])]
        wide = [(slot, [0] * min(piece, n - i * piece), 0, True) for i, slot in enumerate(slots) if i * piece < n]
        shapes: list[tuple[list[tuple[int, list[int], int, bool]], list[tuple[int, int, int]]]] = [(wide, [])]
        rows = min(self.opt.max_running_requests, max(0, n - 2))
        for nd in sorted({rows, 1, 7}):
            span = min(piece, n - nd)
            length = span - 1 + span % 2  # the longest odd chunk that fits (not a multiple of 16)
            if nd <= rows and length >= 1:
                shapes.append(([(slots[0], [0] * length, 0, True)], [(PAD_SLOT, 0, 1)] * nd))
        shapes.append(([(slots[0], [0], 0, True)], []))
        return shapes

    def _zero_slot(self, slot: int) -> None:
        p = self.pools
        for pool in (p.k, p.v, p.ssm, p.conv):
            pool[:, slot].zero_()

    def _drain(self, block: bool) -> None:
        try:
            item = self.inbox.get(timeout=0.5) if block else self.inbox.get_nowait()
        except queue.Empty:
            return
        while True:
            kind, payload = item
            if kind == "add":
                self._add(payload)
            elif kind == "abort":
                self._abort(*payload)
            try:
                item = self.inbox.get_nowait()
            except queue.Empty:
                return

    def _add(self, req: Request) -> None:
        if req.rid in self.by_rid:
            req.sink(Output(req.rid, [], 0, {"type": "abort", "message": f"duplicate request id {req.rid!r}"}))
            return
        if req.params.max_new_tokens == 0:
            req.sink(Output(req.rid, [], 0, {"type": "length", "length": 0}))
            return
        self.by_rid[req.rid] = req
        self.waiting.append(req)

    def _abort(self, rid: str, message: str) -> None:
        req = self.by_rid.get(rid)
        if req is not None:
            self._finish(req, {"type": "abort", "message": message})

    def _finish(self, req: Request, reason: dict[str, Any]) -> None:
        req.finish_reason = reason
        for lst in (self.prefilling, self.decoding):
            if req in lst:
                lst.remove(req)
        if req in self.waiting:
            self.waiting.remove(req)
        if req.slot >= 0:
            self.sampler.release(req.slot)
            self.pools.release(req.slot)
            req.slot = -1
        self.by_rid.pop(req.rid, None)
        self._emit(req)

    def _emit(self, req: Request) -> None:
        visible = len(req.output) - (1 if req.trimmed else 0)
        new = req.output[req.emitted:visible]
        req.emitted = max(req.emitted, visible)
        lp, top = req.logprobs[req.emitted_logprobs:], req.top_logprobs[req.emitted_logprobs:]
        req.emitted_logprobs = len(req.logprobs)
        req.sink(Output(req.rid, new, len(req.output), req.finish_reason, lp, top))

    def step(self) -> None:
        self.progress_at = time.monotonic()
        t0, c0 = time.perf_counter(), time.thread_time()
        self.clock.begin()
        chain = self._inflight is not None and self._keep_chain()
        if self._inflight is not None and not chain:
            # prompts to admit or prefill, or the running set changed: the chained step completes first (its
            # tokens to the host), as a decode step of its own
            fl, self._inflight = self._inflight, None
            f0, s0 = self.stats.forward_s, self.stats.sample_s
            self._complete(fl)
            self._account("decode", t0, c0, f0, s0)
            return
        while self.waiting and self.pools.free_slots:
            req = self.waiting.popleft()
            req.slot = self.pools.alloc()
            req.admitted = time.perf_counter()  # queue time ends here (sglang:queue_time_seconds)
            self.sampler.admit(req.slot, req.params, req.seed, req.grammar)
            self.prefilling.append(req)
        f0, s0 = self.stats.forward_s, self.stats.sample_s
        if self.prefilling and self.decoding and self.opt.mixed_chunk != "off":
            kind = "mixed"
            self._mixed_step(fused=self.opt.mixed_chunk == "fused")
        elif self.prefilling:
            kind = "prefill"
            self._prefill_step()
        else:
            kind = "decode"
            self._decode_step(chain)
        self._account(kind, t0, c0, f0, s0)

    def _account(self, kind: str, t0: float, c0: float, f0: float, s0: float) -> None:
        """The end of a step: its wall and CPU time, host time, device gap and device time, to the stats and the
        step observer (``f0``, ``s0``: the forward and sampling seconds before the step)."""
        wall = time.perf_counter() - t0
        self.stats.steps += 1
        self.stats.step_s += wall
        self.stats.step_cpu_s += time.thread_time() - c0
        gap = self.clock.end()
        if self.clock.on_device:  # host time: the step less its wait for the device; the gap: CUDA events
            host = wall - self.clock.wait_s
        else:  # on a CPU the "device" work is the forward and the sampling; the rest is host time, all of it a gap
            host = wall - (self.stats.forward_s - f0) - (self.stats.sample_s - s0)
            gap = host
        self.stats.host_s += host
        self.stats.gap_s += gap
        if self.clock.device_s is not None:
            self.stats.device_s += self.clock.device_s
        if self.step_observer is not None:
            self.step_observer(kind, host, gap, self.clock.device_s)
        self.progress_at = time.monotonic()

    def _dev(self, v: list[int]) -> torch.Tensor:
        """A host list as an int64 tensor on the engine's device, without a host-device synchronisation."""
        return to_device(v, self.device)

    def _plan_chunks(self, budget: int) -> tuple[list[Request], list[tuple[int, list[int], int, bool]], int]:
        """The prompt chunks of this step: each prompt is cut at a multiple of ``chunked_prefill_size``
        of its own positions; whole chunks are taken in admission order while they fit in ``budget``
        tokens (the first one always, so a prompt always progresses)."""
        size = self.opt.chunked_prefill_size
        chunks: list[tuple[int, list[int], int, bool]] = []
        batch: list[Request] = []
        total = 0
        for req in self.prefilling:
            n = min(len(req.prompt) - req.cached, size - req.cached % size)
            if batch and total + n > budget:
                break
            last = req.cached + n == len(req.prompt)
            chunks.append((req.slot, req.prompt[req.cached:req.cached + n], req.cached, last))
            batch.append(req)
            total += n
        self.stats.prefill_tokens += total
        return batch, chunks, total

    def _advance(self, batch: list[Request], chunks: list[tuple[int, list[int], int, bool]]) -> list[Request]:
        """Account the chunks as cached; the requests whose prompt is now complete (they want a token)."""
        done = []
        for req, (_, toks, _, last) in zip(batch, chunks, strict=True):
            req.cached += len(toks)
            if last:
                done.append(req)
        return done

    def _start_decoding(self, done: list[Request]) -> None:
        for req in done:
            self.prefilling.remove(req)
            self.decoding.append(req)

    def _forward(self, fb: ForwardBatch) -> torch.Tensor:
        t, c = time.perf_counter(), time.thread_time()
        logits = self.model.forward(fb)
        self.stats.forward_s += time.perf_counter() - t
        self.stats.forward_cpu_s += time.thread_time() - c
        return logits

    def _prefill_step(self) -> None:
        batch, chunks, _ = self._plan_chunks(self.opt.chunked_prefill_size)
        logits = self._forward(prefill_batch(self.device, chunks))
        self.stats.prefill_steps += 1
        done = self._advance(batch, chunks)
        if done:
            tokens = self._sample(done, logits, self._dev([r.slot for r in done]))
            self._start_decoding(done)
            self._append(done, tokens)

    def _mixed_step(self, fused: bool) -> None:
        """Every running request decodes one token and waiting prompts advance by a chunk budget.

        fused: one eager forward carrying the decode rows then the chunks (weights read once; the
        budget is ``chunked_prefill_size`` less the decode rows). split: the decode rows go through the
        decode path (its CUDA graph) and the chunks through a prefill forward launched right behind it,
        while the device still runs the decode; one sampling call serves both.
        """
        reqs = list(self.decoding)
        n = len(reqs)
        self.stats.mixed_steps += 1
        self.stats.decode_rows += n
        if fused:
            batch, chunks, _ = self._plan_chunks(max(0, self.opt.chunked_prefill_size - n))
            decode = [(r.slot, r.output[-1], r.cached + 1) for r in reqs]
            logits = self._forward(prefill_batch(self.device, chunks, decode))  # n decode rows, then prompts
            slots = self._dev([r.slot for r in reqs])
        else:
            _, out = self._launch_decode(reqs)
            batch, chunks, _ = self._plan_chunks(self.opt.chunked_prefill_size)  # host work while it runs
            logits = torch.cat([out[:n], self._forward(prefill_batch(self.device, chunks))])
            slots = self._slots[:n]
        for r in reqs:
            r.cached += 1
        done = self._advance(batch, chunks)
        if done:
            slots = torch.cat([slots, self._dev([r.slot for r in done])])
        tokens = self._sample(reqs + done, logits, slots)
        self._start_decoding(done)
        self._append(reqs + done, tokens)

    def _launch_decode(self, reqs: list[Request]) -> tuple[int, torch.Tensor]:
        """Fill the persistent decode buffers for ``reqs`` (padded to the next bucket with rows on the pad
        slot) and launch the decode forward (graph replay where captured); its bucket and logits."""
        n = len(reqs)
        bucket = next((b for b in self.buckets if b >= n), n)
        ids = [r.output[-1] for r in reqs] + [0] * (bucket - n)
        lens = [r.cached + 1 for r in reqs] + [1] * (bucket - n)
        slots = [r.slot for r in reqs] + [PAD_SLOT] * (bucket - n)
        graphed = self.use_graphs and bucket in self.buckets and bucket not in self.eager_buckets
        if graphed and bucket not in self._graphs:
            self._capture(bucket)
        self._ids[:bucket].copy_(self._dev(ids), non_blocking=True)
        self._lens[:bucket].copy_(self._dev(lens), non_blocking=True)
        self._pos[:bucket].copy_(self._lens[:bucket] - 1)
        self._slots[:bucket].copy_(self._dev(slots), non_blocking=True)
        t, c = time.perf_counter(), time.thread_time()
        if graphed:
            graph, out = self._graphs[bucket]
            graph.replay()
            logits = out
        else:
            logits = self.model.forward(self._decode_batch(bucket, max(lens)))
        self.stats.forward_s += time.perf_counter() - t
        self.stats.forward_cpu_s += time.thread_time() - c
        self.stats.padded_rows += bucket - n
        return bucket, logits

    def _decode_step(self, chain: bool = False) -> None:
        """chain: `step` found the in-flight chained step continuing into this one (``_chainable`` already true)."""
        reqs = list(self.decoding)
        if chain or (self.opt.decode_overlap and self._chainable(reqs)):
            self._chained_decode_step(reqs)
            return
        bucket, logits, graphed = self._decode_launch(reqs)
        tokens = self._sample(reqs, logits, self._slots[:bucket], graphed=graphed)
        self._append(reqs, tokens)

    def _decode_launch(self, reqs: list[Request]) -> tuple[int, torch.Tensor, bool]:
        """A decode step's forward from the host's view of ``reqs`` (counted; their positions advanced): its
        bucket, logits, and whether they are a captured bucket's static output."""
        bucket, logits = self._launch_decode(reqs)
        self.stats.decode_steps += 1
        self.stats.decode_rows += len(reqs)
        for r in reqs:
            r.cached += 1
        return bucket, logits, bucket in self._graphs and logits is self._graphs[bucket][1]

    # ---- --decode-overlap: decode steps chained on the device ----------------------------------------------
    # While every running request is greedy and unconstrained (no penalties, bias, grammar or logprobs: nothing the
    # host must prepare from the previous token) and no prompt can be admitted, step N+1 is launched from step N's
    # tokens on the device (ids, positions and lengths advanced in the persistent buffers), then the host waits for
    # step N only and processes its outputs while N+1 runs. Requests that finish at N ride in N+1 as dead rows
    # (their slot's state moves once more before the slot is released; stream order puts any later reuse's zeroing
    # after it); their N+1 tokens are dropped. Any change of the running set, a prompt to admit, or a row near the
    # end of the context ends the chain: the in-flight step completes first (`step`).
    def _chainable(self, reqs: list[Request]) -> bool:
        if not reqs or len(reqs) > max(self.buckets):
            return False
        v = self.sampler.variant([r.params for r in reqs], [r.slot for r in reqs])
        if not v.greedy or v.processed or v.logprobs:
            return False
        # the chained step writes position cached + 1 of every row: it must stay inside the context
        if any(r.cached + 3 >= self.pools.context_length for r in reqs):
            return False
        fl = self._inflight
        return fl is None or (len(fl.reqs) == len(reqs) and all(a is b for a, b in zip(fl.reqs, reqs, strict=True)))

    def _keep_chain(self) -> bool:
        """The in-flight step may stay in flight into this step: a decode step of the same running set follows."""
        admit = bool(self.waiting) and self.pools.free_slots > 0
        return not admit and not self.prefilling and self._chainable(list(self.decoding))

    def _snapshot(self, reqs: list[Request], res: StepResult, bucket: int, graphed: bool) -> _InFlight:
        """``res``'s tokens, kept for the host: on CUDA an asynchronous copy into one of two pinned buffers (the one
        the step before did not use: its tokens may still be read) and an event after it, so reading them later
        waits for this step only (a ``.tolist()`` of a device tensor would wait for the chained step too)."""
        n = len(reqs)
        if self.device.type != "cuda":
            return _InFlight(reqs, res.tokens[:n].clone(), None, bucket, graphed)
        if self._tok_host is None:
            cap = self._ids.shape[0]
            self._tok_host = [torch.empty(cap, dtype=torch.int64, pin_memory=True) for _ in range(2)]
        self._tok_flip ^= 1
        host = self._tok_host[self._tok_flip][:n]
        host.copy_(res.tokens[:n], non_blocking=True)
        event = torch.cuda.Event()
        event.record(torch.cuda.current_stream(self.device))
        return _InFlight(reqs, host, event, bucket, graphed)

    def _chained_decode_step(self, reqs: list[Request]) -> None:
        cur = self._inflight
        if cur is None:  # the first step of a chain: buffers filled from the host, as a plain decode step
            bucket, logits, graphed = self._decode_launch(reqs)
            _, res = self._sample_launch(reqs, logits, self._slots[:bucket], graphed)
            cur = self._snapshot(reqs, res, bucket, graphed)
        nxt = self._chain(cur)
        self._inflight = None
        self._complete(cur)
        live = {id(r) for r in self.decoding}
        for r in nxt.reqs:
            if id(r) in live:
                r.cached += 1  # the chained step's position, now that step N's outputs are processed
        if any(id(r) in live for r in nxt.reqs):
            self._inflight = nxt

    def _chain(self, cur: _InFlight) -> _InFlight:
        """Launch the step after ``cur`` for the same rows from ``cur``'s tokens on the device (no host sync)."""
        n, bucket = len(cur.reqs), cur.bucket
        t, c = time.perf_counter(), time.thread_time()
        self._ids[:n].copy_(cur.tokens, non_blocking=True)  # CUDA: from the pinned copy, stream-ordered after it
        self._pos[:n] += 1
        self._lens[:n] += 1
        if cur.graphed:
            graph, logits = self._graphs[bucket]
            graph.replay()
        else:
            logits = self.model.forward(self._decode_batch(bucket, max(r.cached for r in cur.reqs) + 1))
        self.stats.forward_s += time.perf_counter() - t
        self.stats.forward_cpu_s += time.thread_time() - c
        self.stats.decode_steps += 1
        self.stats.decode_rows += n
        self.stats.padded_rows += bucket - n
        self.stats.chained_steps += 1
        _, res = self._sample_launch(cur.reqs, logits, self._slots[:bucket], cur.graphed)
        return self._snapshot(cur.reqs, res, bucket, cur.graphed)

    def _complete(self, fl: _InFlight) -> None:
        """Wait for ``fl`` only, read its tokens and process them for the rows still running."""
        t, c = time.perf_counter(), time.thread_time()
        self.clock.wait(fl.event)
        tokens: list[int] = fl.tokens.tolist()
        self.stats.sample_s += time.perf_counter() - t
        self.stats.sample_cpu_s += time.thread_time() - c
        live = {id(r) for r in self.decoding}
        rows = [(r, tok) for r, tok in zip(fl.reqs, tokens, strict=True) if id(r) in live]
        self._append([r for r, _ in rows], [tok for _, tok in rows])

    def _sample_graph(self, bucket: int, variant: StepVariant) -> tuple[Any, StepResult]:
        """The sampling step of a captured bucket as a CUDA graph over the forward graph's static logits and
        the persistent slot buffer, captured on first use. Warm-up and capture run with every row on the pad
        slot (the slots' counts and lengths do not move), then the buffer gets this step's slots back."""
        key = (bucket, variant)
        if key not in self._sample_graphs:
            logits = self._graphs[bucket][1]
            slots = self._slots[:bucket]
            saved = slots.clone()
            slots.fill_(PAD_SLOT)
            side = torch.cuda.Stream(self.device)
            side.wait_stream(torch.cuda.current_stream(self.device))
            with torch.cuda.stream(side):
                self.sampler.step(logits, slots, variant)
            torch.cuda.current_stream(self.device).wait_stream(side)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=self._graph_pool):
                res = self.sampler.step(logits, slots, variant)
            self._graph_pool = graph.pool()
            slots.copy_(saved)
            self._sample_graphs[key] = (graph, res)
            log.info("captured the sampling graph for batch bucket %d, %s", bucket, variant)
        return self._sample_graphs[key]

    def _decode_batch(self, bucket: int, max_len: int) -> ForwardBatch:
        """The decode batch over the persistent buffers' first ``bucket`` rows."""
        slot_view = self._slots[:bucket]
        return ForwardBatch(decode=True, input_ids=self._ids[:bucket], positions=self._pos[:bucket],
                            token_slots=slot_view, slots=slot_view, seq_lens=self._lens[:bucket],
                            max_len=max_len, logits_rows=self._rows[:bucket], seq_slots=[], seq_starts=[], q_lens=[])

    def _capture(self, bucket: int) -> None:
        """Capture the decode forward of one bucket as a CUDA graph over the persistent buffers.

        The buffers point every row at the pad slot while warming up and capturing, so no request's
        state moves; the attention span is the whole context (a fixed shape for replay, masked by
        length). Warm-up runs fill the fallbacks' caches (dequantized weights) and load tactics
        outside the capture.
        """
        self._ids[:bucket].zero_()
        self._lens[:bucket].fill_(1)
        self._pos[:bucket].zero_()
        self._slots[:bucket].fill_(PAD_SLOT)
        fb = self._decode_batch(bucket, self.pools.context_length)
        side = torch.cuda.Stream(self.device)
        side.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(side):
            for _ in range(2):
                self.model.forward(fb)
        torch.cuda.current_stream(self.device).wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self._graph_pool):
            out = self.model.forward(fb)
        self._graph_pool = graph.pool()
        self._graphs[bucket] = (graph, out)
        log.info("captured the decode graph for batch bucket %d", bucket)

    def _sample(self, reqs: list[Request], logits: torch.Tensor, slots: torch.Tensor, graphed: bool = False) -> list[int]:
        """Tokens for ``reqs`` (the first ``len(reqs)`` rows of ``logits``; rows past them are padding
        on the pad slot), through the per-slot sampler; logprobs recorded on the requests that asked.
        graphed: ``logits`` are a captured bucket's static output and ``slots`` its persistent buffer: the
        step replays that bucket's sampling graph for this step's variant."""
        t, c = time.perf_counter(), time.thread_time()
        variant, res = self._sample_launch(reqs, logits, slots, graphed, timed=False)
        self.clock.sync()  # the step's one wait for the device: its tokens are read next
        n = len(reqs)
        tokens: list[int] = res.tokens[:n].tolist()
        if variant.logprobs:
            self._record_logprobs(reqs, res)
        self.stats.sample_s += time.perf_counter() - t
        self.stats.sample_cpu_s += time.thread_time() - c
        return tokens

    def _sample_launch(self, reqs: list[Request], logits: torch.Tensor, slots: torch.Tensor, graphed: bool,
                       timed: bool = True) -> tuple[StepVariant, StepResult]:
        """The sampling step on the device (no wait): its variant and result (a captured bucket's static one)."""
        t, c = time.perf_counter(), time.thread_time()
        variant = self.sampler.variant([r.params for r in reqs], [r.slot for r in reqs])
        self.sampler.prepare([r.slot for r in reqs])
        if graphed:
            graph, res = self._sample_graph(logits.shape[0], variant)
            graph.replay()
        else:
            res = self.sampler.step(logits, slots, variant)
        if timed:
            self.stats.sample_s += time.perf_counter() - t
            self.stats.sample_cpu_s += time.thread_time() - c
        return variant, res

    @staticmethod
    def _record_logprobs(reqs: list[Request], res: StepResult) -> None:
        assert res.logprob is not None and res.top_values is not None and res.top_ids is not None
        n = len(reqs)
        # A token the step ruled out has logprob -inf: reported as -9999.0 (vLLM's floor), as JSON has no -inf.
        chosen: list[float] = res.logprob[:n].clamp(min=LOGPROB_FLOOR).tolist()
        values: list[list[float]] = res.top_values[:n].clamp(min=LOGPROB_FLOOR).tolist()
        ids: list[list[int]] = res.top_ids[:n].tolist()
        tokens: list[int] = res.tokens[:n].tolist()
        for i, req in enumerate(reqs):
            if not req.params.return_logprob:
                continue
            req.logprobs.append((chosen[i], tokens[i]))
            k = req.params.top_logprobs_num
            req.top_logprobs.append(list(zip(values[i][:k], ids[i][:k], strict=True)))

    def _append(self, reqs: list[Request], tokens: list[int]) -> None:
        interval = self.opt.stream_interval
        ctx = self.pools.context_length
        for req, tok in zip(reqs, tokens, strict=True):
            req.output.append(tok)
            self.stats.output_tokens += 1
            p = req.params
            n = len(req.output)
            if req.grammar is not None and not req.grammar.accept(tok):
                self._finish(req, {"type": "abort", "message": f"grammar refused token {tok}: {req.grammar.error}",
                                   "status_code": 500})
            elif ((tok in self.eos and (not p.ignore_eos or (req.grammar is not None and req.grammar.done)))
                  or tok in p.stop_token_ids):
                req.trimmed = not p.no_stop_trim
                self._finish(req, {"type": "stop", "matched": tok})
            elif req.grammar is not None and req.grammar.done:
                # The grammar is complete and allows nothing more, not even EOS: the output ends here.
                self._finish(req, {"type": "stop", "matched": None})
            elif n >= p.max_new_tokens or req.cached + 1 >= ctx:
                self._finish(req, {"type": "length", "length": n})
            elif req.stream and (n == 1 or n % interval == 0):
                self._emit(req)
