"""The kernel benchmark's verdict logic and its CPU behaviour (the timing itself needs a GPU)."""

from __future__ import annotations

import argparse

import pytest

from netra.bench import kernels as kb


def _row(dtype: str, rows: int, provider: str, median: float, floor: float) -> dict[str, object]:
    return {"shape": [rows, 248320], "dtype": dtype, "provider": provider, "median_us": median,
            "floor_us": floor, "floor_fraction": round(floor / median, 3)}


def test_gates_apply_issue_thresholds() -> None:
    rows = [_row("float32", 128, "netra", 35.0, 30.0), _row("bfloat16", 128, "netra", 25.0, 15.0)]
    speedups = {"float32[16,248320]": {"netra_vs_torch.argmax": 3.2}}
    g = kb.gates(rows, speedups, 248320)
    assert g["float32[16] speedup >= 3.0"] == {"value": 3.2, "pass": True}
    assert g["float32[128] floor_fraction >= 0.8"]["pass"] is True  # 30/35 = 0.857
    assert g["bfloat16[128] floor_fraction >= 0.7"] == {"value": 0.6, "pass": False}
    assert kb.gates([], {}, 248320)["float32[16] speedup >= 3.0"] == {"value": None, "pass": False}


def test_promotion_needs_exactness_and_a_win_at_every_shape() -> None:
    checks = {"adversarial_cases": 232, "mismatches": 0, "eager_equals_replay": True}
    speedups = {"float32[16,248320]": {"netra_vs_torch.argmax": 2.2, "netra+pdl_vs_torch.argmax (exploration)": 0.5},
                "bfloat16[128,248320]": {"netra_vs_torch.argmax": 2.6}}
    record = {"rows": [], "speedups": speedups, "checks": checks}
    kb.judge(record, 248320)
    assert record["verdict"] == "accepted"  # exploration rows do not decide
    assert record["targets"]["float32[16] speedup >= 3.0"] == {"value": 2.2, "pass": False}  # reported only
    slower = {**speedups, "float32[256,248320]": {"netra_vs_torch.argmax": 0.97}}
    kb.judge(record := {"rows": [], "speedups": slower, "checks": checks}, 248320)
    assert record["verdict"] == "rejected"
    kb.judge(record := {"rows": [], "speedups": speedups, "checks": {**checks, "mismatches": 1}}, 248320)
    assert record["verdict"] == "rejected"
    kb.judge(record := {"rows": [], "speedups": speedups, "checks": {**checks, "eager_equals_replay": False}}, 248320)
    assert record["verdict"] == "rejected"
    kb.judge(record := {"rows": [], "speedups": {}, "checks": checks}, 248320)
    assert record["verdict"] == "rejected"


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


def test_bench_refuses_without_gpu(capsys: object) -> None:
    import torch

    if torch.cuda.is_available():
        return
    p = argparse.ArgumentParser()
    kb.add_arguments(p)
    assert kb.main(p.parse_args([])) == 2


def test_promotion_by_contract_judges_each_tactic_on_its_own_shapes() -> None:
    checks = {"adversarial_cases": 260, "mismatches": 0, "eager_equals_replay": True}
    speedups = {
        "float32[1,248320]": {"netra_vs_torch.argmax": 2.6, "tactic": "argmax_f32_v248320"},
        "float32[16,248320]": {"netra_vs_torch.argmax": 3.1, "tactic": "argmax_f32_cluster_v248320",
                               "netra:chunked_vs_torch.argmax (exploration)": 2.2},
        "float32[2,248320]": {"netra_vs_torch.argmax": 0.9, "tactic": "argmax_f32_cluster_v248320"},
        "exploration_errors": ["netra:cluster-c16 float32 rows 8: something"],
    }
    record = {"rows": [], "speedups": speedups, "checks": checks}
    kb.judge(record, 248320)
    by = record["promotion_by_contract"]
    assert by["argmax_f32_v248320"]["pass"] is True
    assert by["argmax_f32_cluster_v248320"]["pass"] is False  # loses at 2 rows
    assert record["verdict"] == "rejected"
    speedups["float32[2,248320]"]["netra_vs_torch.argmax"] = 1.5
    kb.judge(record := {"rows": [], "speedups": speedups, "checks": checks}, 248320)
    assert record["promotion_by_contract"]["argmax_f32_cluster_v248320"]["pass"] is True
    assert record["verdict"] == "accepted"
    assert record["targets"]["float32[16] speedup >= 3.0"] == {"value": 3.1, "pass": True}
    kb.judge(record := {"rows": [], "speedups": speedups, "checks": {**checks, "mismatches": 2}}, 248320)
    assert not any(e["pass"] for e in record["promotion_by_contract"].values())
    # Faster than torch everywhere but beaten by the other contract's tactic at one shape: not promoted.
    speedups["float32[2,248320]"]["netra:chunked_vs_torch.argmax (exploration)"] = 2.5
    kb.judge(record := {"rows": [], "speedups": speedups, "checks": checks}, 248320)
    e = record["promotion_by_contract"]["argmax_f32_cluster_v248320"]
    assert e["pass"] is False and e["beaten_by"] == {"float32[2,248320]": {"netra:chunked": 2.5}}
    assert record["promotion_by_contract"]["argmax_f32_v248320"]["pass"] is True


def test_benchmarked_families_come_from_the_catalog() -> None:
    """`netra bench kernels --family` offers exactly the catalog's families that have a benchmark."""
    assert kb.families() == kb.FAMILIES
