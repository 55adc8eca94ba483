"""The argmax and MoE specs' smoke paths (netra/bench/specs/argmax.py, moe.py, moe_prefill.py) through the harness in
a fresh process (the interpreter must be on before triton's import), and their checks failing on corrupted outputs:
the check the GPU run uses is the one the smoke path runs, so a check that cannot fail would pass anything there."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

REPO = Path(__file__).resolve().parents[2]
SPECS = ("argmax", "moe", "moe_prefill")


@pytest.mark.triton_interp
def test_moe_smoke_covers_every_contract_and_input_kind(smoke_record) -> None:  # type: ignore[no-untyped-def]
    moe = smoke_record("moe")["checks"]["by_case"]
    assert {v["contract"] for v in moe.values()} == {"moe_block_t1", "moe_block_stream_fold", "moe_routed_t1",
                                                     "moe_routed_stream"}
    assert all(len(v["cases"]) == 6 for v in moe.values())  # every input kind, router ties included


def test_argmax_check_fails_on_a_corrupted_output() -> None:
    from netra.bench.specs import argmax

    emulate = argmax.emulation(3, "float32")

    def corrupted(x: Any, out: Any) -> Any:
        emulate(x, out)
        out[1] += 1  # one index off by one
        return out

    scen = ("tie_boundary", "nan_middle")
    assert argmax.check(3, "float32", "cpu", emulate, scenarios=scen)["ok"]
    bad = argmax.check(3, "float32", "cpu", corrupted, scenarios=scen)
    assert not bad["ok"] and bad["mismatches"] == 2 and "oracle" in bad["failures"][0]
    # an output the provider never wrote (still the poison) fails too
    unwritten = argmax.check(3, "float32", "cpu", lambda x, out: out, scenarios=scen[:1], vs_emulation=False)
    assert not unwritten["ok"]


def test_moe_checks_fail_on_a_corrupted_output_or_routing() -> None:
    from netra.bench.specs import moe

    w = moe.small_layer()
    ties = moe.with_router_ties(w)
    run = moe.engine_run("block")
    assert moe.check("block", 1, "moe_block_t1", w, ties, run, "cpu", kinds=("normal",))["ok"]
    scaled = moe.check("block", 1, "moe_block_t1", w, ties, lambda *a: run(*a) * 1.05, "cpu", kinds=("normal",))
    assert not scaled["ok"] and scaled["failing"] == ["normal"]
    assert scaled["cases"][0]["compare"]["rel_l2"] > 0.01

    def wrong_routing(x: Any) -> tuple[Any, Any]:  # the top-1 expert swapped for the worst one
        ids, tw = moe.routing(w, x)
        logits = x.float() @ w.router.data.float().t()
        ids = ids.clone()
        ids[:, 0] = logits.argmin(dim=-1).to(ids.dtype)
        return ids, tw

    routed_wrong = moe.check("block", 5, "moe_block_stream_fold", w, ties, run, "cpu", kinds=("normal",),
                             own_routing=wrong_routing)
    assert not routed_wrong["ok"] and routed_wrong["cases"][0]["routing"]["errors"] == 5
    # a routed output with one token's row zeroed (the largest: under rel_l2 a small row's error can hide behind it)
    w2k = moe.small_layer(**{**moe.SMALL, "hidden": moe.HIDDEN})

    def zero_row(*a: Any) -> Any:
        out = moe.routed_composed(*a).clone()
        out[out.float().norm(dim=1).argmax()] = 0
        return out

    bad = moe.check("routed", 2, "moe_routed_stream", w2k, w2k, zero_row, "cpu", kinds=("normal",))
    assert not bad["ok"]
    assert torch.isfinite(torch.tensor(bad["worst_rel_l2"]))
