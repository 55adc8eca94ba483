"""Admission by memory: the pools get as many request slots as the budget holds; requests beyond them
wait in the admission queue (FIFO) and are never failed for want of memory."""

from __future__ import annotations

import pytest
import torch

from netra.engine.config import preset
from netra.engine.engine import build_engine
from netra.engine.memory import plan_pools, slot_bytes
from netra.engine.options import EngineOptions, OptionsError
from netra.engine.request import Output, Request, SamplingParams

CPU = torch.device("cpu")


def test_slot_bytes_match_the_pools_and_the_budget_sets_the_slot_count() -> None:
    e = build_engine(EngineOptions(context_length=128, max_running_requests=3))
    per = slot_bytes(e.config, 128, "fp8_e4m3", e.options.mamba_ssm_dtype or "float32")
    assert e.pools.nbytes() == e.pools.num_slots * per == 4 * per
    cfg = preset("tiny")
    for gib_slots, cap, want in ((5.0, 64, 4), (5.99, 64, 4), (6.0, 64, 5), (40.0, 8, 8)):
        opts = EngineOptions(context_length=128, max_running_requests=cap, pool_memory_gib=gib_slots * per / 2**30)
        assert plan_pools(opts, cfg, CPU, "float32").slots == want
    with pytest.raises(OptionsError, match=r"pools need .* for one request of --context-length 128"):
        plan_pools(EngineOptions(context_length=128, pool_memory_gib=1.5 * per / 2**30), cfg, CPU, "float32")
    with pytest.raises(OptionsError, match="pool-memory-gib"):
        EngineOptions(pool_memory_gib=0.0)
    with pytest.raises(OptionsError, match="mem-fraction-static"):
        EngineOptions(mem_fraction_static=1.5)


def test_five_requests_through_a_pool_with_room_for_two_all_complete_in_order() -> None:
    cfg = preset("tiny")
    per = slot_bytes(cfg, 256, "fp8_e4m3", cfg.mamba_ssm_dtype)
    e = build_engine(EngineOptions(context_length=256, max_running_requests=64, pool_memory_gib=3 * per / 2**30))
    assert e.pools.free_slots == 2 and e.pool_plan.slots == 2
    finished: list[str] = []
    outs: dict[str, Output] = {}

    def sink(out: Output) -> None:
        if out.finish_reason is not None:
            finished.append(out.rid)
            outs[out.rid] = out

    params = SamplingParams(max_new_tokens=8, temperature=0.0, ignore_eos=True)
    for i in range(5):
        e.scheduler.submit(Request(f"r{i}", [(7 * i + j) % 200 for j in range(12)], params, sink))
    e.scheduler._drain(block=False)
    e.scheduler.step()
    assert len(e.scheduler.waiting) == 3 and e.pools.free_slots == 0  # queued, not failed
    e.scheduler.run_until_idle()
    assert finished == [f"r{i}" for i in range(5)]
    assert all(outs[f"r{i}"].finish_reason == {"type": "length", "length": 8} for i in range(5))
    assert e.pools.free_slots == 2
