"""The kernel benchmarks' verdict logic on the CPU (the timing itself needs a GPU): the one promotion rule
(`netra.validate.promotion`) as the argmax and MoE specs feed it, their issue targets, and the CLI front."""

from __future__ import annotations

import argparse
from typing import Any

import pytest

from netra.validate.promotion import judge, promote

F32, CLUSTER, BF16 = "argmax_f32_v248320", "argmax_f32_cluster_v248320", "argmax_bf16_v248320"


def _row(op: str, shape: dict[str, int], dtype: str, provider: str, median: float, floor: float) -> dict[str, Any]:
    return {"op": op, "shape": shape, "dtype": dtype, "provider": provider, "median_us": median,
            "floor_fraction": round(floor / median, 3)}


def _argmax_row(dtype: str, rows: int, provider: str, median: float, floor: float = 1.0) -> dict[str, Any]:
    return _row("argmax", {"rows": rows, "vocab": 248320}, dtype, provider, median, floor)


def test_argmax_targets_are_the_issue_thresholds_reported_not_deciding() -> None:
    from netra.bench.specs import argmax

    rows = [_argmax_row("float32", 16, "netra", 5.0), _argmax_row("float32", 16, "torch.argmax", 16.0),
            _argmax_row("float32", 128, "netra", 35.0, 30.0), _argmax_row("bfloat16", 128, "netra", 25.0, 15.0)]
    t = argmax.targets({"rows": rows})
    assert t["float32[16] speedup >= 3.0"] == {"need": 3.0, "value": 3.2, "pass": True}
    assert t["float32[128] floor_fraction >= 0.8"]["pass"] is True  # 30/35 = 0.857
    assert t["bfloat16[128] floor_fraction >= 0.7"] == {"need": 0.7, "value": 0.6, "pass": False}
    assert argmax.targets({"rows": []})["float32[16] speedup >= 3.0"] == {"need": 3.0, "value": None, "pass": False}
    # an exploration case's rows (op argmax_explore) are not the contract's
    explore = [_row("argmax_explore", {"rows": 16, "vocab": 248320}, "float32", "netra", 1.0, 1.0)]
    assert argmax.targets({"rows": explore})["float32[16] speedup >= 3.0"]["value"] is None


def test_moe_targets_read_the_peer_and_the_floor() -> None:
    from netra.bench.specs import moe

    rows = [_row("moe_fp8_block", {"tokens": 1}, "fp8", "netra", 20.0, 10.0),
            _row("moe_fp8_block", {"tokens": 1}, "fp8", "sglang", 38.0, 10.0),
            _row("moe_fp8_routed", {"tokens": 128}, "fp8", "netra", 100.0, 96.0)]
    t = moe.targets({"rows": rows})
    assert t["block_1_token"] == {"need": 1.8, "value": 1.9, "pass": True}
    assert t["routed_floor_128"] == {"need": 0.95, "value": 0.96, "pass": True}
    assert t["block_8_tokens"] == {"need": 1.15, "value": None, "pass": False}


def test_promotion_needs_exactness_and_a_win_at_every_shape() -> None:
    ok = [{"ok": True, "eager_equals_replay": True}] * 3
    timings = {"float32 rows=16": {"netra": 5.0, "torch.argmax": 11.0},
               "float32 rows=128": {"netra": 35.0, "torch.argmax": 52.0}}
    assert promote(ok, timings, "netra")["pass"] is True
    # one failed check (a mismatch, or eager != replay: the spec's check folds both into ok)
    bad = promote([*ok, {"ok": False, "eager_equals_replay": False}], timings, "netra")
    assert bad["pass"] is False and bad["oracle"] is False
    # slower than the fallback at one shape
    slower = {**timings, "float32 rows=256": {"netra": 70.0, "torch.argmax": 69.5}}
    g = promote(ok, slower, "netra")
    assert g["pass"] is False and [x["shape"] for x in g["lost"]] == ["float32 rows=256"]
    assert g["lost"][0]["best_other"] == "torch.argmax"
    # a tie is not a loss; nothing timed is not a win; no checks is not an oracle
    assert promote(ok, {"s": {"netra": 5.0, "torch.argmax": 5.0}}, "netra")["pass"] is True
    assert promote(ok, {}, "netra")["pass"] is False
    assert promote([], timings, "netra")["pass"] is False
    assert promote(ok, {"s": {"netra": 5.0}}, "netra")["pass"] is False  # nothing to beat: not a win


def test_promotion_per_contract_judges_each_on_its_own_shapes() -> None:
    """As the argmax spec records it: each case's check under the contract dispatch picks there, timings keyed by
    case; the cluster tactic (rows 2..16) loses at 2 rows and is not promoted, the chunked one is."""
    checks = {F32: [{"ok": True}] * 2, CLUSTER: [{"ok": True}] * 2, BF16: [{"ok": True}]}
    timings = {F32: {"float32 rows=1": {"netra": 4.0, "torch.argmax": 10.0},
                     "float32 rows=128": {"netra": 35.0, "torch.argmax": 52.0}},
               CLUSTER: {"float32 rows=2": {"netra": 9.0, "torch.argmax": 8.0},
                         "float32 rows=16": {"netra": 5.0, "torch.argmax": 15.0}},
               BF16: {"bfloat16 rows=128": {"netra": 20.0, "torch.argmax": 40.0}}}
    by = {name: promote(checks[name], timings[name], "netra") for name in checks}
    record = judge(by)
    assert set(record["promotion"]) == {F32, BF16}
    assert record["not_promoted"][CLUSTER]["lost"][0]["shape"] == "float32 rows=2"
    assert record["verdict"] == "accepted"  # the record supports promoting exactly those two
    # beaten by the other contract's tactic at one shape (timed there as a provider): not promoted either
    timings[F32]["float32 rows=128"]["netra:argmax_f32_split"] = 30.0
    g = promote(checks[F32], timings[F32], "netra")
    assert g["pass"] is False and g["lost"][0]["best_other"] == "netra:argmax_f32_split"
    # a failed check of one contract does not touch another's verdict
    checks[BF16] = [{"ok": False}]
    record = judge({name: promote(checks[name], timings[name], "netra") for name in checks})
    assert BF16 in record["not_promoted"] and F32 not in record["promotion"]
    assert judge({})["verdict"] == "info"


def test_moe_other_contracts_are_checked_not_promoted() -> None:
    """The MoE spec checks the contracts dispatch does not pick (moe_block_stream, outranked by the fold) on their
    own tactic but times them only as providers beside the fold: checked, no shape of their own, never promoted."""
    from netra.bench.specs import moe

    assert moe.contract_for("block", 1) == "moe_block_t1"
    assert moe.contract_for("block", 64) == "moe_block_stream_fold"
    assert moe.contract_for("routed", 64) == "moe_routed_stream"
    with pytest.raises(LookupError):
        moe.contract_for("routed", 129)
    assert promote([{"ok": True}] * 3, {}, "netra")["pass"] is False


def test_quantiles_and_grid_rules() -> None:
    from netra.bench.timing import quantile
    from netra.runtime import RuntimeBridgeError, grid_size

    xs = [5.0, 1.0, 3.0, 2.0, 4.0]
    assert quantile(xs, 0.5) == 3.0 and quantile(xs, 0.9) == 5.0
    assert grid_size(["cdiv(tokens, 4) * 16"], {"tokens": 5}) == [32]
    assert grid_size(["batch", "cdiv(v, BV)", "min(2, h) + 1"], {"batch": 3, "v": 4096, "BV": 64, "h": 7}) == [3, 64, 3]
    for bad in (["__import__('os')"], ["tokens ** 2"], ["nope"], []):
        with pytest.raises(RuntimeBridgeError):
            grid_size(bad, {"tokens": 1})


def test_bench_kernels_is_the_harness_front() -> None:
    """`netra bench kernels --family F` runs the family's specs; it offers the families that have one, and refuses
    without a GPU (the smoke paths go through the harness)."""
    import torch

    from netra.bench import kernels as kb
    from netra.bench.harness import specs

    assert {"argmax", "moe"} <= set(kb.families())
    assert {"argmax", "moe", "moe_prefill"} <= {n for n, s in specs().items() if s.family in ("argmax", "moe")}
    p = argparse.ArgumentParser()
    kb.add_arguments(p)
    args = p.parse_args(["--family", "moe", "--moe-tokens", "1,8"])
    assert args.moe_tokens == "1,8"
    if not torch.cuda.is_available():
        assert kb.main(args) == 2
