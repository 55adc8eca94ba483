"""Continuous-batching scheduler: admission queue, request slots, chunked prefill, bucketed decode.

One thread owns the model, the pools and every request's state; other threads talk to it only
through `submit` / `abort` (a queue). Each step is either a prefill step (chunks of waiting
prompts, at most ``chunked_prefill_size`` tokens, prefill first like SGLang) or a decode step (one
token for every running request, the batch padded to the next graph bucket with rows on the pad
slot). A prompt is always cut at multiples of the chunk size of its own positions, whatever else is
queued, so a request's arithmetic does not depend on what it shares a batch with.

Outputs go to each request's ``sink`` (called on the scheduler thread; it must not block): the
tokens since the previous emission, the cumulative completion count and the finish reason.

This module is the policy: what runs in a step and what its tokens do to the requests. The model runner
(netra/engine/runner.py) runs it: decode buffers, graphs, the warm-up, the decode-overlap chain's launches.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch

from netra.engine.cache import StatePools
from netra.engine.model import Model, prefill_batch
from netra.engine.options import EngineOptions
from netra.engine.overlap import StepClock
from netra.engine.request import LOGPROB_FLOOR, Output, Request
from netra.engine.runner import InFlight, ModelRunner, StepStats
from netra.engine.sampler import SlotSampler, StepResult

if TYPE_CHECKING:
    from netra.engine.spec.step import SpecStep

log = logging.getLogger("netra.engine")


class Scheduler:
    def __init__(self, model: Model, pools: StatePools, options: EngineOptions, eos_ids: tuple[int, ...]) -> None:
        self.model, self.pools, self.opt = model, pools, options
        self.device = model.device  # by index on CUDA (build_engine): the scheduler thread sets it as current
        self.eos = frozenset(eos_ids)
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
        self.runner = ModelRunner(model, pools, options, eos_ids, self.stats)
        self._inflight: InFlight | None = None  # --decode-overlap: the chained step on the device
        self.spec: SpecStep | None = None  # speculative decoding: every decode step is a verify step (`speculate`)

    def speculate(self, spec: SpecStep | None) -> None:
        """Decode through ``spec`` (draft, verify, accept, commit) from now on; None: plain decode. Set it before the
        first request (the drafter sees requests from their admission)."""
        self.spec = spec

    @property
    def sampler(self) -> SlotSampler:
        """Per-slot sampling state (the runner's: its sampling graphs read it)."""
        return self.runner.sampler

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
                    self.runner.warm_up()
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
            if self.spec is not None:
                self.spec.drafter.release(req.slot)
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
        ct = req.spec_verify_ct
        req.sink(Output(req.rid, new, len(req.output), req.finish_reason, lp, top, ct,
                        len(req.output) / ct if ct else 0.0))

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
            if self.spec is not None:
                self.spec.drafter.admit(req.slot, req)
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

    def _prefill_forward(self, chunks: list[tuple[int, list[int], int, bool]]) -> torch.Tensor:
        """A prefill forward of ``chunks``; with a drafter that reads the target's layers, each chunk's tokens go
        to its context (committed now)."""
        fb = prefill_batch(self.device, chunks)
        if self.spec is None or not self.spec.drafter.capture_layers:
            return self.runner.forward(fb)
        out = self.runner.run(fb, self.spec.drafter.capture_layers)
        assert out.features is not None
        offset = 0
        for slot, toks, _, _ in chunks:
            n = len(toks)
            self.spec.drafter.extend(self.runner.dev([slot]), out.features[offset:offset + n][None],
                                     self.runner.dev([n]))
            offset += n
        return out.logits

    def _prefill_step(self) -> None:
        batch, chunks, _ = self._plan_chunks(self.opt.chunked_prefill_size)
        logits = self._prefill_forward(chunks)
        self.stats.prefill_steps += 1
        done = self._advance(batch, chunks)
        if done:
            tokens = self._sample(done, logits, self.runner.dev([r.slot for r in done]))
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
        if self.spec is not None:  # the verify step of the decode rows, then the chunks' prefill behind it
            self._spec_mixed_step(reqs)
            return
        self.stats.decode_rows += n
        if fused:
            batch, chunks, _ = self._plan_chunks(max(0, self.opt.chunked_prefill_size - n))
            decode = [(r.slot, r.output[-1], r.cached + 1) for r in reqs]
            logits = self.runner.forward(prefill_batch(self.device, chunks, decode))  # n decode rows, then prompts
            slots = self.runner.dev([r.slot for r in reqs])
        else:
            _, out, _ = self.runner.launch_decode(reqs)
            batch, chunks, _ = self._plan_chunks(self.opt.chunked_prefill_size)  # host work while it runs
            logits = torch.cat([out[:n], self.runner.forward(prefill_batch(self.device, chunks))])
            slots = self.runner.slots[:n]
        for r in reqs:
            r.cached += 1
        done = self._advance(batch, chunks)
        if done:
            slots = torch.cat([slots, self.runner.dev([r.slot for r in done])])
        tokens = self._sample(reqs + done, logits, slots)
        self._start_decoding(done)
        self._append(reqs + done, tokens)

    def _decode_step(self, chain: bool = False) -> None:
        """chain: `step` found the in-flight chained step continuing into this one (``_chainable`` already true)."""
        reqs = list(self.decoding)
        if self.spec is not None:
            self._spec_decode_step(reqs)
            return
        if chain or (self.opt.decode_overlap and self._chainable(reqs)):
            self._chained_decode_step(reqs)
            return
        bucket, logits, graphed = self._decode_launch(reqs)
        tokens = self._sample(reqs, logits, self.runner.slots[:bucket], graphed=graphed)
        self._append(reqs, tokens)

    def _decode_launch(self, reqs: list[Request]) -> tuple[int, torch.Tensor, bool]:
        """A decode step's forward from the host's view of ``reqs`` (counted; their positions advanced): its
        bucket, logits, and whether they are a captured bucket's static output."""
        bucket, logits, graphed = self.runner.launch_decode(reqs)
        self.stats.decode_steps += 1
        self.stats.decode_rows += len(reqs)
        for r in reqs:
            r.cached += 1
        return bucket, logits, graphed

    # ---- --decode-overlap: decode steps chained on the device ----------------------------------------------
    # While every running request is greedy and unconstrained (no penalties, bias, grammar or logprobs: nothing the
    # host must prepare from the previous token) and no prompt can be admitted, step N+1 is launched from step N's
    # tokens on the device (ids, positions and lengths advanced in the persistent buffers), then the host waits for
    # step N only and processes its outputs while N+1 runs. Requests that finish at N ride in N+1 as dead rows
    # (their slot's state moves once more before the slot is released; stream order puts any later reuse's zeroing
    # after it); their N+1 tokens are dropped. Any change of the running set, a prompt to admit, or a row near the
    # end of the context ends the chain: the in-flight step completes first (`step`).
    def _chainable(self, reqs: list[Request]) -> bool:
        if not reqs or len(reqs) > max(self.runner.buckets) or self.spec is not None:
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

    def _chained_decode_step(self, reqs: list[Request]) -> None:
        cur = self._inflight
        if cur is None:  # the first step of a chain: buffers filled from the host, as a plain decode step
            bucket, logits, graphed = self._decode_launch(reqs)
            _, res = self.runner.sample_launch(reqs, logits, self.runner.slots[:bucket], graphed)
            cur = self.runner.snapshot(reqs, res, bucket, graphed)
        nxt = self.runner.chain(cur)
        self._inflight = None
        self._complete(cur)
        live = {id(r) for r in self.decoding}
        for r in nxt.reqs:
            if id(r) in live:
                r.cached += 1  # the chained step's position, now that step N's outputs are processed
        if any(id(r) in live for r in nxt.reqs):
            self._inflight = nxt

    def _complete(self, fl: InFlight) -> None:
        """Wait for ``fl`` only, read its tokens and process them for the rows still running."""
        t, c = time.perf_counter(), time.thread_time()
        self.clock.wait(fl.event)
        tokens: list[int] = fl.tokens.tolist()
        self.stats.sample_s += time.perf_counter() - t
        self.stats.sample_cpu_s += time.thread_time() - c
        live = {id(r) for r in self.decoding}
        rows = [(r, tok) for r, tok in zip(fl.reqs, tokens, strict=True) if id(r) in live]
        self._append([r for r, _ in rows], [tok for _, tok in rows])

    def _sample(self, reqs: list[Request], logits: torch.Tensor, slots: torch.Tensor, graphed: bool = False) -> list[int]:
        """Tokens for ``reqs`` (the first ``len(reqs)`` rows of ``logits``; rows past them are padding
        on the pad slot), through the per-slot sampler; logprobs recorded on the requests that asked.
        graphed: ``logits`` are a captured bucket's static output and ``slots`` its persistent buffer: the
        step replays that bucket's sampling graph for this step's variant."""
        t, c = time.perf_counter(), time.thread_time()
        variant, res = self.runner.sample_launch(reqs, logits, slots, graphed, timed=False)
        self.clock.sync()  # the step's one wait for the device: its tokens are read next
        n = len(reqs)
        tokens: list[int] = res.tokens[:n].tolist()
        if variant.logprobs:
            self._record_logprobs(reqs, res)
        self.stats.sample_s += time.perf_counter() - t
        self.stats.sample_cpu_s += time.thread_time() - c
        return tokens

    @staticmethod
    def _record_logprobs(reqs: list[Request], res: StepResult, rows: list[int] | None = None) -> None:
        """Logprob entries of ``res``'s rows for the requests that asked (``rows``: only those rows)."""
        assert res.logprob is not None and res.top_values is not None and res.top_ids is not None
        n = len(reqs)
        # A token the step ruled out has logprob -inf: reported as -9999.0 (vLLM's floor), as JSON has no -inf.
        chosen: list[float] = res.logprob[:n].clamp(min=LOGPROB_FLOOR).tolist()
        values: list[list[float]] = res.top_values[:n].clamp(min=LOGPROB_FLOOR).tolist()
        ids: list[list[int]] = res.top_ids[:n].tolist()
        tokens: list[int] = res.tokens[:n].tolist()
        for i, req in enumerate(reqs):
            if not req.params.return_logprob or (rows is not None and i not in rows):
                continue
            req.logprobs.append((chosen[i], tokens[i]))
            k = req.params.top_logprobs_num
            req.top_logprobs.append(list(zip(values[i][:k], ids[i][:k], strict=True)))

    def _append(self, reqs: list[Request], tokens: list[int]) -> None:
        """One new token for each of ``reqs`` (their ``cached`` already advanced past its input)."""
        interval = self.opt.stream_interval
        for req, tok in zip(reqs, tokens, strict=True):
            if not self._take(req, tok):
                n = len(req.output)
                if req.stream and (n == 1 or n % interval == 0):
                    self._emit(req)

    def _append_block(self, req: Request, tokens: list[int]) -> int:
        """A verify step's committed tokens for ``req``, one by one as decode steps would take them (``cached``
        advanced per token, the output cut at its finish); one stream event for the block, where decode steps
        would have emitted at least one. Returns the tokens taken."""
        before = len(req.output)
        for i, tok in enumerate(tokens):
            req.cached += 1
            if self._take(req, tok):
                return i + 1
        n, interval = len(req.output), self.opt.stream_interval
        if req.stream and (before == 0 or n // interval > before // interval):
            self._emit(req)
        return len(tokens)

    def _take(self, req: Request, tok: int) -> bool:
        """Append ``tok`` to ``req``'s output and finish the request where it ends there: whether it did."""
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
        elif n >= p.max_new_tokens or req.cached + 1 >= self.pools.context_length:
            self._finish(req, {"type": "length", "length": n})
        else:
            return False
        return True

    # ---- speculative decoding (netra/engine/spec/step.py) --------------------------------------------------
    def _spec_decode_step(self, reqs: list[Request]) -> None:
        assert self.spec is not None
        launched = self.spec.verify(reqs)
        self._spec_finish(reqs, launched)

    def _spec_mixed_step(self, reqs: list[Request]) -> None:
        """The decode rows' verify step, then the chunks' prefill forward launched behind it (``--mixed-chunk
        fused`` too: a verify batch does not fuse with prompt chunks); one wait."""
        assert self.spec is not None
        launched = self.spec.verify(reqs)
        batch, chunks, _ = self._plan_chunks(self.opt.chunked_prefill_size)
        logits = self._prefill_forward(chunks)
        done = self._advance(batch, chunks)
        tokens = self._sample(done, logits, self.runner.dev([r.slot for r in done])) if done else []
        self._spec_finish(reqs, launched)
        self._start_decoding(done)
        self._append(done, tokens)

    def _spec_finish(self, reqs: list[Request], launched: Any) -> None:
        """Read a verify step's tokens (after the step's wait) and append them, counted."""
        assert self.spec is not None
        t, c = time.perf_counter(), time.thread_time()
        self.clock.sync()
        v = self.spec.read(launched)
        if v.solo is not None and v.solo.logprob is not None:
            self._record_logprobs(reqs, v.solo, v.solo_rows)
        self.stats.sample_s += time.perf_counter() - t
        self.stats.sample_cpu_s += time.thread_time() - c
        st = self.stats
        st.decode_steps += 1
        st.decode_rows += len(reqs)
        st.verify_steps += 1
        for req, toks, offered in zip(reqs, v.tokens, v.offered, strict=True):
            req.spec_verify_ct += 1
            taken = self._append_block(req, toks)
            if offered:  # drafts committed to the output (a finish inside the block cuts them too)
                accepted = min(taken, len(toks) - 1)
                st.drafts += 1
                st.draft_tokens += offered
                st.accepted_tokens += accepted
                for i in range(accepted):
                    st.accepted_per_pos[i] = st.accepted_per_pos.get(i, 0) + 1
