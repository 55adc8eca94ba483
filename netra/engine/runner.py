"""The model runner: the decode path's persistent buffers, per-bucket CUDA graphs, the warm-up, and the
launches of the decode-overlap chain.

The scheduler (netra/engine/scheduler.py) decides what runs; this module runs it on the device. A decode
step fills a prefix of persistent buffers (token ids, positions, slots, lengths: fixed addresses, so a
captured graph replays from them), pads the batch to the next graph bucket with rows on the pad slot, and
launches the bucket's graph (captured on first use) or the eager forward; the sampling step of a captured
bucket is a graph of its own per variant, replayed right behind it. The chain (``--decode-overlap``)
launches step N+1 from step N's tokens on the device; `InFlight` is a step launched whose tokens the host
has not read yet.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import Any

import torch

from netra.engine.cache import PAD_SLOT, StatePools
from netra.engine.model import ForwardBatch, ForwardOut, Model, prefill_batch
from netra.engine.options import EngineOptions
from netra.engine.request import Request, SamplingParams
from netra.engine.sampler import SlotSampler, StepResult, StepVariant
from netra.ops._common import to_device

log = logging.getLogger("netra.engine")


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
    # Speculative decoding (vLLM's counters): verify steps; rows offered drafts, drafts offered, drafts committed to
    # the output, and per draft position (0-based) how often it was.
    verify_steps: int = 0
    drafts: int = 0
    draft_tokens: int = 0
    accepted_tokens: int = 0
    accepted_per_pos: dict[int, int] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        d = dict(self.__dict__)
        d["accepted_per_pos"] = {str(k): v for k, v in sorted(self.accepted_per_pos.items())}
        d["overhead_s"] = self.step_s - self.forward_s - self.sample_s
        d["overhead_ms_per_step"] = 1e3 * d["overhead_s"] / max(1, self.steps)
        d["forward_ms_per_step"] = 1e3 * self.forward_s / max(1, self.steps)
        d["forward_cpu_ms_per_step"] = 1e3 * self.forward_cpu_s / max(1, self.steps)
        d["host_ms_per_step"] = 1e3 * self.host_s / max(1, self.steps)
        d["gap_ms_per_step"] = 1e3 * self.gap_s / max(1, self.steps)
        d["overhead_cpu_ms_per_step"] = 1e3 * (self.step_cpu_s - self.forward_cpu_s - self.sample_cpu_s) / max(1, self.steps)
        return d


@dataclass(eq=False)
class InFlight:
    """A decode step launched, its tokens not yet read: the rows' requests, a copy of the sampled tokens (the
    sampling graph's static output is overwritten by the next step; on CUDA a pinned host buffer filled
    asynchronously), and the event after that copy (None on a CPU)."""
    reqs: list[Request]
    tokens: torch.Tensor
    event: Any
    bucket: int
    graphed: bool


# A warm-up forward: (prompt chunks, decode rows), in `prefill_batch`'s terms.
WarmShape = tuple[list[tuple[int, list[int], int, bool]], list[tuple[int, int, int]]]


class ModelRunner:
    def __init__(self, model: Model, pools: StatePools, options: EngineOptions, eos_ids: tuple[int, ...],
                 stats: StepStats) -> None:
        self.model, self.pools, self.opt, self.stats = model, pools, options, stats
        self.device = model.device
        self.buckets = tuple(b for b in options.cuda_graph_bs)
        # Persistent decode inputs (fixed addresses for graph replay); a step fills a prefix.
        cap = max(max(self.buckets), options.max_running_requests)
        self.ids = torch.zeros(cap, dtype=torch.int64, device=self.device)
        self.pos = torch.zeros(cap, dtype=torch.int64, device=self.device)
        self.slots = torch.full((cap,), PAD_SLOT, dtype=torch.int64, device=self.device)
        self.lens = torch.ones(cap, dtype=torch.int64, device=self.device)
        self.rows = torch.arange(cap, dtype=torch.int64, device=self.device)
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
        self.graphs: dict[int, tuple[Any, torch.Tensor]] = {}
        # The sampling step of a captured bucket, one graph per (bucket, variant), replayed right behind the
        # forward's graph on its static logits: penalties, bias, min-tokens, grammar masks, the draw and the
        # logprobs run inside captured graphs too (the masks are copied in by `prepare` before the replay).
        self.sample_graphs: dict[tuple[int, StepVariant], tuple[Any, StepResult]] = {}
        self.graph_pool: Any = None
        self._tok_host: list[torch.Tensor] | None = None  # the chain's two pinned token buffers (CUDA)
        self._tok_flip = 0

    # ---- forwards --------------------------------------------------------------------------------
    def dev(self, v: list[int]) -> torch.Tensor:
        """A host list as an int64 tensor on the engine's device, without a host-device synchronisation."""
        return to_device(v, self.device)

    def forward(self, fb: ForwardBatch) -> torch.Tensor:
        """An eager forward, timed into the stats."""
        t, c = time.perf_counter(), time.thread_time()
        logits = self.model.forward(fb)
        self.stats.forward_s += time.perf_counter() - t
        self.stats.forward_cpu_s += time.thread_time() - c
        return logits

    def run(self, fb: ForwardBatch, capture: tuple[int, ...] = ()) -> ForwardOut:
        """An eager `Model.run` (the capture of layers ``capture``, a verify batch's GDN stash), timed."""
        t, c = time.perf_counter(), time.thread_time()
        out = self.model.run(fb, capture)
        self.stats.forward_s += time.perf_counter() - t
        self.stats.forward_cpu_s += time.thread_time() - c
        return out

    def bucket(self, n: int) -> int:
        """The decode bucket of ``n`` rows: the smallest graph batch size that holds them (``n`` past the largest)."""
        return next((b for b in self.buckets if b >= n), n)

    def launch_decode(self, reqs: list[Request]) -> tuple[int, torch.Tensor, bool]:
        """Fill the persistent decode buffers for ``reqs`` (padded to the next bucket with rows on the pad
        slot) and launch the decode forward (graph replay where captured): its bucket, its logits, and whether
        they are a captured bucket's static output."""
        n = len(reqs)
        bucket = self.bucket(n)
        ids = [r.output[-1] for r in reqs] + [0] * (bucket - n)
        lens = [r.cached + 1 for r in reqs] + [1] * (bucket - n)
        slots = [r.slot for r in reqs] + [PAD_SLOT] * (bucket - n)
        graphed = self.use_graphs and bucket in self.buckets and bucket not in self.eager_buckets
        if graphed and bucket not in self.graphs:
            self.capture(bucket)
        self.ids[:bucket].copy_(self.dev(ids), non_blocking=True)
        self.lens[:bucket].copy_(self.dev(lens), non_blocking=True)
        self.pos[:bucket].copy_(self.lens[:bucket] - 1)
        self.slots[:bucket].copy_(self.dev(slots), non_blocking=True)
        t, c = time.perf_counter(), time.thread_time()
        if graphed:
            graph, out = self.graphs[bucket]
            graph.replay()
            logits = out
        else:
            logits = self.model.forward(self.decode_batch(bucket, max(lens)))
        self.stats.forward_s += time.perf_counter() - t
        self.stats.forward_cpu_s += time.thread_time() - c
        self.stats.padded_rows += bucket - n
        return bucket, logits, graphed

    def decode_batch(self, bucket: int, max_len: int) -> ForwardBatch:
        """The decode batch over the persistent buffers' first ``bucket`` rows."""
        slot_view = self.slots[:bucket]
        return ForwardBatch(decode=True, input_ids=self.ids[:bucket], positions=self.pos[:bucket],
                            token_slots=slot_view, slots=slot_view, seq_lens=self.lens[:bucket],
                            max_len=max_len, logits_rows=self.rows[:bucket], seq_slots=[], seq_starts=[], q_lens=[])

    # ---- sampling --------------------------------------------------------------------------------
    def sample_launch(self, reqs: list[Request], logits: torch.Tensor, slots: torch.Tensor, graphed: bool,
                      timed: bool = True) -> tuple[StepVariant, StepResult]:
        """The sampling step on the device (no wait): its variant and result (a captured bucket's static one).
        graphed: ``logits`` are a captured bucket's static output and ``slots`` its persistent buffer: the step
        replays that bucket's sampling graph for this step's variant."""
        t, c = time.perf_counter(), time.thread_time()
        params: list[SamplingParams] = [r.params for r in reqs]
        variant = self.sampler.variant(params, [r.slot for r in reqs])
        self.sampler.prepare([r.slot for r in reqs])
        if graphed:
            graph, res = self.sample_graph(logits.shape[0], variant)
            graph.replay()
        else:
            res = self.sampler.step(logits, slots, variant)
        if timed:
            self.stats.sample_s += time.perf_counter() - t
            self.stats.sample_cpu_s += time.thread_time() - c
        return variant, res

    def sample_graph(self, bucket: int, variant: StepVariant) -> tuple[Any, StepResult]:
        """The sampling step of a captured bucket as a CUDA graph over the forward graph's static logits and
        the persistent slot buffer, captured on first use. Warm-up and capture run with every row on the pad
        slot (the slots' counts and lengths do not move), then the buffer gets this step's slots back."""
        key = (bucket, variant)
        if key not in self.sample_graphs:
            logits = self.graphs[bucket][1]
            slots = self.slots[:bucket]
            saved = slots.clone()
            slots.fill_(PAD_SLOT)
            side = torch.cuda.Stream(self.device)
            side.wait_stream(torch.cuda.current_stream(self.device))
            with torch.cuda.stream(side):
                self.sampler.step(logits, slots, variant)
            torch.cuda.current_stream(self.device).wait_stream(side)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=self.graph_pool):
                res = self.sampler.step(logits, slots, variant)
            self.graph_pool = graph.pool()
            slots.copy_(saved)
            self.sample_graphs[key] = (graph, res)
            log.info("captured the sampling graph for batch bucket %d, %s", bucket, variant)
        return self.sample_graphs[key]

    # ---- --decode-overlap: the chain's launches --------------------------------------------------
    def snapshot(self, reqs: list[Request], res: StepResult, bucket: int, graphed: bool) -> InFlight:
        """``res``'s tokens, kept for the host: on CUDA an asynchronous copy into one of two pinned buffers (the one
        the step before did not use: its tokens may still be read) and an event after it, so reading them later
        waits for this step only (a ``.tolist()`` of a device tensor would wait for the chained step too)."""
        n = len(reqs)
        if self.device.type != "cuda":
            return InFlight(reqs, res.tokens[:n].clone(), None, bucket, graphed)
        if self._tok_host is None:
            cap = self.ids.shape[0]
            self._tok_host = [torch.empty(cap, dtype=torch.int64, pin_memory=True) for _ in range(2)]
        self._tok_flip ^= 1
        host = self._tok_host[self._tok_flip][:n]
        host.copy_(res.tokens[:n], non_blocking=True)
        event = torch.cuda.Event()
        event.record(torch.cuda.current_stream(self.device))
        return InFlight(reqs, host, event, bucket, graphed)

    def chain(self, cur: InFlight) -> InFlight:
        """Launch the step after ``cur`` for the same rows from ``cur``'s tokens on the device (no host sync)."""
        n, bucket = len(cur.reqs), cur.bucket
        t, c = time.perf_counter(), time.thread_time()
        self.ids[:n].copy_(cur.tokens, non_blocking=True)  # CUDA: from the pinned copy, stream-ordered after it
        self.pos[:n] += 1
        self.lens[:n] += 1
        if cur.graphed:
            graph, logits = self.graphs[bucket]
            graph.replay()
        else:
            logits = self.model.forward(self.decode_batch(bucket, max(r.cached for r in cur.reqs) + 1))
        self.stats.forward_s += time.perf_counter() - t
        self.stats.forward_cpu_s += time.thread_time() - c
        self.stats.decode_steps += 1
        self.stats.decode_rows += n
        self.stats.padded_rows += bucket - n
        self.stats.chained_steps += 1
        _, res = self.sample_launch(cur.reqs, logits, self.slots[:bucket], cur.graphed)
        return self.snapshot(cur.reqs, res, bucket, cur.graphed)

    # ---- graphs and warm-up ----------------------------------------------------------------------
    def capture(self, bucket: int) -> None:
        """Capture the decode forward of one bucket as a CUDA graph over the persistent buffers.

        The buffers point every row at the pad slot while warming up and capturing, so no request's
        state moves; the attention span is the whole context (a fixed shape for replay, masked by
        length). Warm-up runs fill the fallbacks' caches (dequantized weights) and load tactics
        outside the capture.
        """
        self.ids[:bucket].zero_()
        self.lens[:bucket].fill_(1)
        self.pos[:bucket].zero_()
        self.slots[:bucket].fill_(PAD_SLOT)
        fb = self.decode_batch(bucket, self.pools.context_length)
        side = torch.cuda.Stream(self.device)
        side.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(side):
            for _ in range(2):
                self.model.forward(fb)
        torch.cuda.current_stream(self.device).wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self.graph_pool):
            out = self.model.forward(fb)
        self.graph_pool = graph.pool()
        self.graphs[bucket] = (graph, out)
        log.info("captured the decode graph for batch bucket %d", bucket)

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
        prompt otherwise waited for Triton compiles and fla autotuning, the first step of each bucket waited for
        its capture, and the compiles of the other shapes stalled every running stream (measured:
        docs/engine.md, results/serving/NOTES.md; run results/serving/dp1-h200-20261202-prefill)."""
        t0 = time.perf_counter()
        n = self.opt.chunked_prefill_size
        piece = max(1, min(n, 1024, self.pools.context_length - 1))
        want = -(-n // piece)
        slots = [self.pools.alloc() for _ in range(min(want, self.pools.free_slots))]
        try:
            shapes = self.warm_shapes(n, piece, slots)
            for chunks, decode in shapes:
                self.model.forward(prefill_batch(self.device, chunks, decode=decode or None))
            captured = 0
            if self.use_graphs:
                greedy = StepVariant(greedy=True, processed=False, logprobs=False)
                for b in self.buckets:
                    if b not in self.eager_buckets:
                        if b not in self.graphs:
                            self.capture(b)
                        self.sample_graph(b, greedy)
                        captured += 1
        finally:
            for slot in [PAD_SLOT, *slots]:
                self.zero_slot(slot)
            for slot in reversed(slots):
                self.pools.release(slot)
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        log.info("warmed up in %.1f s: %d prefill forwards (up to %d tokens, %d slots borrowed), %d decode bucket(s) "
                 "captured", time.perf_counter() - t0, len(shapes), n, len(slots), captured)

    def warm_shapes(self, n: int, piece: int, slots: list[int]) -> list[WarmShape]:
        """The warm-up's forwards: (prompt chunks, decode rows) each, within the chunk budget ``n``."""
        if not slots:  # no slot to borrow (every one taken): one prompt on the pad slot
            return [([(PAD_SLOT, [0] * piece, 0, True)], [])]
        wide = [(slot, [0] * min(piece, n - i * piece), 0, True) for i, slot in enumerate(slots) if i * piece < n]
        shapes: list[WarmShape] = [(wide, [])]
        rows = min(self.opt.max_running_requests, max(0, n - 2))
        for nd in sorted({rows, 1, 7}):
            span = min(piece, n - nd)
            length = span - 1 + span % 2  # the longest odd chunk that fits (not a multiple of 16)
            if nd <= rows and length >= 1:
                shapes.append(([(slots[0], [0] * length, 0, True)], [(PAD_SLOT, 0, 1)] * nd))
        shapes.append(([(slots[0], [0], 0, True)], []))
        return shapes

    def zero_slot(self, slot: int) -> None:
        p = self.pools
        for pool in (p.k, p.v, p.ssm, p.conv):
            pool[:, slot].zero_()
