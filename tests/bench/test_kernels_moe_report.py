"""MoE side-by-side bench (netra/bench/kernels_moe.py) on CPU: provider parsing, the gates computed
from synthetic rows (a passing case, each gate failing once), the records, and the peer's stubs."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from netra.bench import kernels_moe as km
from netra.records import validate

FLOOR = 50.0


def layer_rows(ratios: dict[int, float], floor128: float = 0.96, judged: str = "netra-v3",
               unfused_extra: float | dict[int, float] = 2.0, shared_delta: float = 4.0,
               mlp_us: float = 12.0) -> list[dict[str, Any]]:
    """netra at 100 µs per batch (floor set so 128 tokens reaches ``floor128``), SGLang at ratio x 100."""
    rows: list[dict[str, Any]] = []
    for m in km.BATCHES:
        ours = 100.0
        floor = floor128 * ours if m == 128 else FLOOR
        extra = unfused_extra[m] if isinstance(unfused_extra, dict) else unfused_extra

        def row(provider: str, us: float, m: int = m, floor: float = floor) -> dict[str, Any]:
            return {"section": "layer", "shape": [m, 2048], "tokens": m, "dtype": "fp8_e4m3_block128",
                    "provider": provider, "mode": "graph", "median_us": us, "p90_us": us * 1.05,
                    "floor_us": floor, "floor_fraction": floor / us, "samples": 60, "calls_per_replay": 8}

        rows += [row(judged, ours), row("sglang", ratios[m] * ours),
                 row(judged + km.SHARED_SUFFIX, ours + shared_delta), row("sglang-shared-mlp", mlp_us)]
        if judged == "netra-v3":
            rows.append(row("netra-v3-unfused", ours + extra))
        rows.append({**row(judged, ours * 1.3), "mode": "eager"})
    return rows


PASSING = {1: 2.5, 8: 1.3, 16: 1.1, 32: 1.05, 64: 1.02, 128: 1.01}


def test_parse_providers() -> None:
    assert km.parse_providers("all") == list(km.PROVIDERS)
    assert km.parse_providers("") == list(km.PROVIDERS)
    assert km.parse_providers("sglang, netra-v1,sglang") == ["sglang", "netra-v1"]
    with pytest.raises(SystemExit):
        km.parse_providers("netra-v1,nope")


def test_main_rejects_bad_providers_before_touching_a_gpu(tmp_path: Path) -> None:
    with pytest.raises(SystemExit):
        km.main(["--out", str(tmp_path), "--providers", "netra-v9"])
    with pytest.raises(SystemExit):
        km.main(["--out", str(tmp_path), "--mode", "report"])


def test_judged_provider() -> None:
    rows = layer_rows(PASSING)
    assert km.judged_provider(rows) == "netra-v3"
    assert km.judged_provider(rows, "netra-v3-unfused") == "netra-v3-unfused"
    assert km.judged_provider(rows, "netra-v1") is None
    assert km.judged_provider(layer_rows(PASSING, judged="netra-v1")) == "netra-v1"
    assert km.judged_provider([]) is None


def test_layer_gates_pass() -> None:
    g = km.layer_gates(layer_rows(PASSING), "netra-v3", True)
    assert g["pass"], g["gates"]
    assert g["per_batch"]["1"]["ratio_sglang_over_netra"] == pytest.approx(2.5)
    assert g["per_batch"]["128"]["floor_fraction"] == pytest.approx(0.96)
    assert g["gates"]["never_slower"]["value"] == pytest.approx(1.01)
    assert g["per_batch"]["8"]["netra-v3-unfused_vs_sglang"] == pytest.approx(130 / 102)


@pytest.mark.parametrize(("change", "failing"), [
    ({32: 0.99}, "never_slower"),
    ({1: 1.99}, "1_token_ratio"),
    ({8: 1.19}, "8_tokens_ratio"),
])
def test_layer_gates_each_ratio_gate_fails_once(change: dict[int, float], failing: str) -> None:
    g = km.layer_gates(layer_rows({**PASSING, **change}), "netra-v3", True)
    assert not g["pass"]
    assert [k for k, v in g["gates"].items() if not v["pass"]] == [failing]


def test_layer_gates_floor_and_tolerance_fail() -> None:
    g = km.layer_gates(layer_rows(PASSING, floor128=0.94), "netra-v3", True)
    assert [k for k, v in g["gates"].items() if not v["pass"]] == ["128_tokens_floor_fraction"]
    g = km.layer_gates(layer_rows(PASSING), "netra-v3", False)
    assert [k for k, v in g["gates"].items() if not v["pass"]] == ["layer_within_tolerance"]


def test_layer_gates_missing_peer_batch_fails() -> None:
    rows = [r for r in layer_rows(PASSING) if not (r["provider"] == "sglang" and r["tokens"] == 64)]
    g = km.layer_gates(rows, "netra-v3", True)
    assert not g["gates"]["never_slower"]["pass"] and g["gates"]["never_slower"]["value"] is None
    assert km.layer_gates(layer_rows(PASSING), None, True)["pass"] is False


def aq_rows(netra_us: dict[int, float], pair_us: dict[int, float], provider: str = "netra-v1") -> list[dict[str, Any]]:
    rows = []
    for m in km.AQ_BATCHES:
        for p, us in ((provider, netra_us[m]), ("sglang_triton_pair", pair_us[m])):
            rows.append({"section": "act_quant", "tokens": m, "provider": p, "mode": "graph", "median_us": us})
    return rows


def test_act_quant_gate_standalone_and_eliminated() -> None:
    ok_checks = {"netra-v1": {"act_quant": {"bitwise_equal": True}}}
    rows = aq_rows({1: 1.0, 16: 1.0, 128: 2.0}, {1: 1.6, 16: 1.5, 128: 3.0})
    g = km.act_quant_gates(rows, ok_checks)
    assert g["standalone_pass"] and g["pass"] and not g["eliminated_pass"]
    # 1.4x at 16 tokens fails the standalone route
    rows = aq_rows({1: 1.0, 16: 1.0, 128: 2.0}, {1: 1.6, 16: 1.4, 128: 3.0})
    assert not km.act_quant_gates(rows, ok_checks)["pass"]
    # not bitwise fails it too
    rows = aq_rows({1: 1.0, 16: 1.0, 128: 2.0}, {1: 1.6, 16: 1.5, 128: 3.0})
    assert not km.act_quant_gates(rows, {"netra-v1": {"act_quant": {"bitwise_equal": False}}})["pass"]
    # eliminated: v3 fused saves time at every batch over v3-unfused
    v3_checks = {**ok_checks, "netra-v3": {"layer": {"within_tolerance": True}}}
    lrows = layer_rows(PASSING, unfused_extra=2.0)
    g = km.act_quant_gates(rows + lrows, v3_checks)
    assert g["eliminated_pass"] and g["pass"]
    assert g["layer_saving_us_unfused_minus_fused"]["1"] == pytest.approx(2.0)
    # ... but not when one batch shows no saving, or when v3 is off the reference
    lrows = layer_rows(PASSING, unfused_extra={1: 2.0, 8: 2.0, 16: 0.0, 32: 2.0, 64: 2.0, 128: 2.0})
    assert not km.act_quant_gates(lrows, v3_checks)["pass"]
    lrows = layer_rows(PASSING)
    assert not km.act_quant_gates(lrows, {"netra-v3": {"layer": {"within_tolerance": False}}})["pass"]
    # a tuning build is an A/B only against its own act+quant twin (UNFUSED_TWINS): ml yes, st8 no
    lrows = layer_rows(PASSING, unfused_extra=2.0)
    g = km.act_quant_gates(lrows, v3_checks, v3_tune="ml")
    assert g["eliminated_pass"] and g["eliminated_note"].startswith("A/B")
    g = km.act_quant_gates(lrows, v3_checks, v3_tune="st8")
    assert not g["eliminated_pass"] and g["layer_saving_us_unfused_minus_fused"]["1"] is None


def test_shared_table() -> None:
    st = km.shared_table(layer_rows(PASSING, shared_delta=4.0, mlp_us=12.0))
    e = st["8"]
    assert e["netra-v3_shared_delta_us"] == pytest.approx(4.0)
    assert e["netra-v3_sglang_mlp_over_delta"] == pytest.approx(3.0)
    assert e["sglang_routed_plus_shared_mlp_us"] == pytest.approx(130.0 + 12.0)


def _bench_doc(rows: list[dict[str, Any]]) -> dict[str, Any]:
    checks = {"netra-v3": {"layer": {"within_tolerance": True}, "act_quant": {"bitwise_equal": True},
                           "route": {"ids_exact": True, "meta_mismatches": 0}, "align": {"meta_mismatches": 0}}}
    return {"device": "NVIDIA H200", "rot": 8, "samples": 60, "copy_bw_Bps": 4.2e12, "copy_bw_after_Bps": 4.2e12,
            "providers": ["netra-v3", "netra-v3-unfused", "sglang", "sglang-shared-mlp"],
            "providers_skipped": {"netra-v1": "construction failed"}, "rows": rows, "checks": checks,
            "peer_checks": [{"provider": "sglang", "tokens": 1, "rel_l2": 1e-3, "cosine": 0.99999, "max_abs": 0.01,
                             "ref_max_abs": 1.0}], "distinct_experts": {str(m): 8.0 for m in km.BATCHES},
            "git_sha": "abc123", "budget_events": []}


def test_write_records_v3(tmp_path: Path) -> None:
    src = tmp_path / "run"
    src.mkdir()
    rows = layer_rows(PASSING) + aq_rows({1: 1.0, 16: 1.0, 128: 2.0}, {1: 1.2, 16: 1.2, 128: 3.0}, "netra-v3") + [
        {"section": "route", "tokens": m, "provider": "netra-v3", "mode": "graph", "median_us": 10.0}
        for m in km.BATCHES]
    (src / "bench.json").write_text(json.dumps(_bench_doc(rows)))
    out = tmp_path / "results"
    paths = km.write_records_v3(src, out, "_v3", "")
    names = sorted(p.name for p in paths)
    assert names == ["moe_act_quant_v3.json", "moe_layer_v3.json", "moe_layer_v3.md", "moe_route_v3.json",
                     "moe_shared_v3.json"]
    recs = {p.stem: json.loads(p.read_text()) for p in paths if p.suffix == ".json"}
    for r in recs.values():
        validate(r)
        assert r["git_sha"] == "abc123" and r["copy_bw_Bps"] == 4.2e12 and "moe_h200.sh" in r["command"]
    assert recs["moe_layer_v3"]["verdict"] == "accepted"
    assert recs["moe_layer_v3"]["judged_provider"] == "netra-v3"
    # standalone 1.2x fails, but the fused v3 saves 2 µs at every batch: eliminated
    assert recs["moe_act_quant_v3"]["verdict"] == "accepted"
    assert recs["moe_act_quant_v3"]["gates"]["eliminated_pass"]
    assert recs["moe_route_v3"]["verdict"] == "accepted"
    assert recs["moe_shared_v3"]["verdict"] == "info"
    md = (out / "moe_layer_v3.md").read_text()
    assert "accepted" in md and "| 128 |" in md
    # one gate failing flips the layer verdict
    (src / "bench.json").write_text(json.dumps(_bench_doc(layer_rows({**PASSING, 128: 0.9}))))
    paths = km.write_records_v3(src, out, "_v3x", "")
    assert json.loads((out / "moe_layer_v3x.json").read_text())["verdict"] == "rejected"


def test_summary_prints_gates(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "bench.json").write_text(json.dumps(_bench_doc(layer_rows(PASSING))))
    km.main(["--out", str(tmp_path), "--mode", "summary", "--from", str(tmp_path)])
    out = capsys.readouterr().out
    assert "never_slower=PASS" in out and "layer graph" in out


FAKE_TRITON = textwrap.dedent('''
    import sys, types
    class _Any:
        def __getattr__(self, n): return _Any()
        def __call__(self, *a, **k):
            return a[0] if len(a) == 1 and callable(a[0]) and not k else _Any()
        def __getitem__(self, k): return _Any()
    class _Mod(types.ModuleType):
        def __getattr__(self, n):
            if n.startswith("__"): raise AttributeError(n)
            return _Any()
    t = _Mod("triton"); t.__path__ = []
    t.jit = lambda f=None, **k: f if f is not None else (lambda g: g)
    t.cdiv = lambda a, b: -(-a // b)
    tl = _Mod("triton.language"); t.language = tl; tl.__path__ = []
    ex = _Mod("triton.language.extra"); tl.extra = ex
    sys.modules.update({"triton": t, "triton.language": tl, "triton.language.extra": ex})
''')


def test_peer_stubs_import_on_cpu(tmp_path: Path) -> None:
    """The staged peer files import through the stubs (Triton faked: there is none on CPU), and the
    dense GEMM finds the wheel's tuned H200 config for the shared expert's down projection only."""
    from importlib.metadata import PackageNotFoundError, distribution

    try:  # installed with --no-deps: the distribution's files are there, importing it is not possible
        distribution("sglang")
    except PackageNotFoundError:
        pytest.skip("the pinned sglang wheel is not installed")
    from netra.bench.peers import sglang_moe

    sglang_moe.stage(tmp_path / "peer")
    # torch (and its dynamo) first: they probe the real Triton backends when a "triton" is importable
    code = "import torch, torch._dynamo\n" + FAKE_TRITON + textwrap.dedent(f'''
        from pathlib import Path
        from netra.bench.peers import sglang_moe as s
        p = s.load(Path({str(tmp_path / "peer")!r}))
        assert p["gemm"] is not None, s.PEER_NOTES
        assert p["gemm"].get_w8a8_block_fp8_configs(2048, 512, 128, 128)[1]["BLOCK_SIZE_N"] == 32
        assert p["gemm"].get_w8a8_block_fp8_configs(1024, 2048, 128, 128) is None
        assert hasattr(p["fp8k"], "_per_token_group_quant_8bit_raw")
        assert hasattr(p["fmk"], "act_and_mul_triton")
        print("ok")
    ''')
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                       cwd=Path(km.__file__).resolve().parents[2])
    assert r.returncode == 0 and "ok" in r.stdout, r.stderr[-3000:]
