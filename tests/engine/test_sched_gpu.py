"""The scheduler on a CUDA device (tiny preset): the decode rows of mixed steps against decode-only steps
(and requests served alone, reported), pools sized from the free device memory, and the step clock
(host time, device idle gap) read from CUDA events."""

from __future__ import annotations

import pytest
import torch

from netra.engine.engine import Engine, build_engine
from netra.engine.memory import slot_bytes
from netra.engine.options import EngineOptions
from netra.engine.request import Output, Request, SamplingParams

pytestmark = pytest.mark.gpu

GREEDY = SamplingParams(max_new_tokens=40, temperature=0.0, ignore_eos=True)
SHORT = SamplingParams(max_new_tokens=8, temperature=0.0, ignore_eos=True)
RUNNING = [("a", [3, 1, 4, 1, 5], GREEDY), ("b", list(range(60, 85)), GREEDY)]  # one 32-token prefill step
ARRIVING = [(f"p{i}", [(i * 13 + j * 7) % 251 for j in range(40 + 23 * i)], SHORT) for i in range(4)]


def _engine(**kw: object) -> Engine:
    opts = {"device": "cuda", "context_length": 512, "max_running_requests": 8, "chunked_prefill_size": 32,
            "cuda_graph_bs": (1, 2, 4, 8), **kw}
    return build_engine(EngineOptions(**opts))  # type: ignore[arg-type]


def _collect(e: Engine, reqs: list[tuple[str, list[int], SamplingParams]], got: dict[str, list[int]],
             then: list[tuple[str, list[int], SamplingParams]] | None = None) -> None:
    def sink(out: Output) -> None:
        got.setdefault(out.rid, []).extend(out.new_ids)

    s = e.scheduler
    for rid, p, params in reqs:
        s.submit(Request(rid, p, params, sink))
    if then:
        for _ in range(4):  # the first requests decode, then the prompts arrive
            s._drain(block=False)
            s.step()
        for rid, p, params in then:
            s.submit(Request(rid, p, params, sink))
    s.run_until_idle()
    torch.cuda.synchronize()


def _spy_logits(e: Engine, n: int) -> list[torch.Tensor]:
    """The first ``n`` rows of the logits each sampling call of ``e`` sees (the decode rows come first)."""
    seen: list[torch.Tensor] = []
    real = e.scheduler._sample

    def spy(reqs, logits, slots, **kw):  # type: ignore[no-untyped-def]
        seen.append(logits[:n].clone())
        return real(reqs, logits, slots, **kw)

    e.scheduler._sample = spy  # type: ignore[method-assign]
    return seen


@pytest.mark.parametrize("graphs", [True, False])
def test_decode_rows_of_mixed_steps_equal_decode_only_steps_on_cuda(graphs: bool) -> None:
    """Two requests decode; in one engine prompts arrive (mixed steps), in its twin none do (decode steps).
    While the same two requests are the decode rows, their logits must be the decode-only path's:
    bitwise for split (the same bucket's graph or eager decode forward); fused is reported."""
    engines = {}
    for mode in ("base", "split", "fused"):
        e = _engine(mixed_chunk="split" if mode == "base" else mode, disable_cuda_graph=not graphs)
        _collect_start(e)
        engines[mode] = e
    base_seen = _spy_logits(engines["base"], 2)
    for mode in ("split", "fused"):
        e = engines[mode]
        seen = _spy_logits(e, 2)
        for rid, p, params in reversed(ARRIVING):  # 109 tokens first: 4 chunks of <= 32 before it decodes
            e.scheduler.submit(Request(rid, p, params, lambda out: None))
        e.scheduler._drain(block=False)
        steps = 0
        while (e.scheduler.waiting or e.scheduler.prefilling) and len(e.scheduler.decoding) == 2:
            e.scheduler.step()
            steps += 1
        assert e.scheduler.stats.mixed_steps == steps >= 3
        while len(base_seen) < steps:
            engines["base"].scheduler.step()
        same = [torch.equal(a, b) for a, b in zip(seen[:steps], base_seen[:steps], strict=True)]
        diff = max(float((a - b).abs().max()) for a, b in zip(seen[:steps], base_seen[:steps], strict=True))
        print(f"graphs {graphs} {mode}: {steps} mixed steps, decode-row logits bitwise equal to decode-only in "
              f"{sum(same)} of {steps} (max |dlogit| {diff:.3g})")
        if mode == "split":
            assert all(same)
    torch.cuda.synchronize()


def _collect_start(e: Engine) -> None:
    """RUNNING submitted and stepped until both decode (a prefill step, then decode steps)."""
    for rid, p, params in RUNNING:
        e.scheduler.submit(Request(rid, p, params, lambda out: None))
    e.scheduler._drain(block=False)
    for _ in range(3):
        e.scheduler.step()
    assert len(e.scheduler.decoding) == 2 and not e.scheduler.prefilling


def test_mixed_steps_on_cuda_against_requests_served_alone() -> None:
    """Reported, not asserted beyond completion: on a GPU the reference ops are not batch-invariant (FP32
    accumulation order depends on the row count), so served-alone equality is a property of the ops, not
    of the scheduler; this line shows how far it holds per mode."""
    alone: dict[str, list[int]] = {}
    base = _engine()
    for r in RUNNING + ARRIVING:
        _collect(base, [r], alone)
    for mode in ("off", "split", "fused"):
        e = _engine(mixed_chunk=mode)
        got: dict[str, list[int]] = {}
        _collect(e, RUNNING, got, then=ARRIVING)
        st = e.scheduler.stats
        same = [rid for rid, *_ in RUNNING + ARRIVING if got[rid] == alone[rid]]
        print(f"mixed-chunk {mode}: {st.mixed_steps} mixed steps; identical to served alone: "
              f"{len(same)} of {len(RUNNING + ARRIVING)} ({same}); host {1e3 * st.host_s / st.steps:.2f} ms/step, "
              f"device gap {1e3 * st.gap_s / st.steps:.2f} ms/step")
        assert (st.mixed_steps > 0) == (mode != "off")
        assert all(len(got[rid]) == p.max_new_tokens for rid, _, p in RUNNING + ARRIVING)


def test_pools_are_sized_from_the_free_device_memory() -> None:
    import gc

    torch.cuda.empty_cache()
    free, total = torch.cuda.mem_get_info()
    want = 0.06 * total  # a budget of 6% of the device: mem_fraction_static leaving exactly that after the weights
    frac = 1 - (free - want) / total
    e = _engine(max_running_requests=1 << 20, context_length=4096, mem_fraction_static=round(frac, 6))
    per = slot_bytes(e.config, 4096, "fp8_e4m3", e.options.mamba_ssm_dtype or "float32")
    budget = e.pool_plan.budget_bytes
    assert budget is not None and abs(budget - want) < 2**28  # the tiny weights and the rounding of frac
    assert e.pools.nbytes() == (e.pool_plan.slots + 1) * per <= budget < (e.pool_plan.slots + 2) * per
    print(f"tiny, 4096 tokens: {e.pool_plan.describe()}")
    del e
    gc.collect()
    torch.cuda.empty_cache()


def test_step_clock_reads_cuda_events() -> None:
    e = _engine()
    got: dict[str, list[int]] = {}
    _collect(e, RUNNING, got, then=ARRIVING)
    st = e.scheduler.stats
    assert st.steps >= 30 and 0 < st.host_s < st.step_s and 0 <= st.gap_s < st.step_s
    assert 0 < st.device_s < st.step_s  # every decode step waits for its tokens: its device time is read
    print(f"tiny cuda: {st.steps} steps, {1e3 * st.step_s / st.steps:.2f} ms/step, host "
          f"{1e3 * st.host_s / st.steps:.2f} ms/step, device idle gap {1e3 * st.gap_s / st.steps:.2f} ms/step, "
          f"device {1e3 * st.device_s / st.steps:.2f} ms/step")


@pytest.mark.parametrize("graphs", [True, False])
def test_decode_overlap_on_cuda_gives_the_tokens_of_plain_decode(graphs: bool) -> None:
    """--decode-overlap on a CUDA device (captured buckets replayed back to back from the previous step's tokens,
    and eagerly): the same tokens as plain decode for running requests and prompts arriving mid-way; the chain ran."""
    got: dict[bool, dict[str, list[int]]] = {}
    chained = {}
    for overlap in (False, True):
        e = _engine(decode_overlap=overlap, disable_cuda_graph=not graphs)
        got[overlap] = {}
        _collect(e, RUNNING, got[overlap], then=ARRIVING)
        chained[overlap] = e.scheduler.stats.chained_steps
    assert got[True] == got[False]
    assert chained[False] == 0 < chained[True]
    print(f"tiny cuda, graphs={graphs}: {chained[True]} chained decode steps, tokens equal")
