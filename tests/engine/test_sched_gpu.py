"""The scheduler on a CUDA device (tiny preset): mixed steps against requests served alone, pools sized
from the free device memory, and the step clock (host time, device idle gap) read from CUDA events."""

from __future__ import annotations

import pytest
import torch

from netra.engine.engine import Engine, build_engine
from netra.engine.memory import slot_bytes
from netra.engine.options import EngineOptions
from netra.engine.scheduler import Output, Request, SamplingParams

pytestmark = pytest.mark.gpu

GREEDY = SamplingParams(max_new_tokens=40, temperature=0.0, ignore_eos=True)
SHORT = SamplingParams(max_new_tokens=8, temperature=0.0, ignore_eos=True)
RUNNING = [("a", [3, 1, 4, 1, 5], GREEDY), ("b", list(range(60, 90)), GREEDY)]
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


@pytest.mark.parametrize("graphs", [True, False])
def test_mixed_steps_on_cuda_against_requests_served_alone(graphs: bool) -> None:
    alone: dict[str, list[int]] = {}
    base = _engine(disable_cuda_graph=not graphs)
    for r in RUNNING + ARRIVING:
        _collect(base, [r], alone)
    for mode in ("split", "fused"):
        e = _engine(mixed_chunk=mode, disable_cuda_graph=not graphs)
        got: dict[str, list[int]] = {}
        _collect(e, RUNNING, got, then=ARRIVING)
        st = e.scheduler.stats
        same = [rid for rid, *_ in RUNNING + ARRIVING if got[rid] == alone[rid]]
        print(f"graphs {graphs} mixed-chunk {mode}: {st.mixed_steps} mixed steps; identical to served alone: "
              f"{len(same)} of {len(RUNNING + ARRIVING)} ({same}); host {1e3 * st.host_s / st.steps:.2f} ms/step, "
              f"device gap {1e3 * st.gap_s / st.steps:.2f} ms/step")
        assert st.mixed_steps > 0
        assert all(len(got[rid]) == p.max_new_tokens for rid, _, p in RUNNING + ARRIVING)
        if mode == "split":  # decode rows on the decode path itself (its graphs): exact by construction
            assert got == alone
        # fused: decode rows share GEMMs with the prompt tokens (another M): exact only where every row-wise
        # op is batch-invariant on this device; the line above says whether it was


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
    assert st.steps > 40 and 0 < st.host_s < st.step_s and 0 <= st.gap_s < st.step_s
    print(f"tiny cuda: {st.steps} steps, {1e3 * st.step_s / st.steps:.2f} ms/step, host "
          f"{1e3 * st.host_s / st.steps:.2f} ms/step, device idle gap {1e3 * st.gap_s / st.steps:.2f} ms/step")
