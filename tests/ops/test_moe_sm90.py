"""GPU oracle tests of the sm90 MoE decode tactics (skipped without a CUDA GPU; run on the H200 by
scripts/gpu/moe_h200.sh through netra.bench.kernels_moe, whose checks these call)."""

from __future__ import annotations

from typing import Any

import pytest

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def ours() -> Any:
    from netra.ops.moe_fp8 import MoeSm90

    return MoeSm90(0)


@pytest.fixture(scope="module")
def weights() -> Any:
    from netra.bench.kernels_moe import make_weights

    return make_weights()


def test_act_quant_bitwise(ours: Any) -> None:
    from netra.bench.kernels_moe import check_act_quant

    res = check_act_quant(ours)
    assert res["value_mismatches"] == 0 and res["scale_mismatches"] == 0


def test_route_exact(ours: Any, weights: Any) -> None:
    from netra.bench.kernels_moe import check_route

    res = check_route(ours, weights)
    assert res["id_mismatch_tokens"] == 0 and res["meta_mismatches"] == 0 and res["xq_mismatches"] == 0
    assert res["logit_over_1ulp"] == 0 and res["weight_max_rel"] < 1e-5


def test_align_exact(ours: Any) -> None:
    from netra.bench.kernels_moe import check_align

    res = check_align(ours)
    assert res["meta_mismatches"] == 0 and res["xq_mismatches"] == 0


def test_layer_within_declared_tolerance(ours: Any, weights: Any) -> None:
    from netra.bench.kernels_moe import check_layer

    res = check_layer(ours, weights)
    assert res["within_tolerance"], res["cases"]
    assert res["eager_equals_replay"] and res["run_to_run_bitwise"]


def test_bad_shapes_are_refused(ours: Any) -> None:
    import torch

    from netra.ops.moe_fp8 import MoeShapeError

    with pytest.raises(MoeShapeError):
        ours.act_quant(torch.zeros(4, 1000, dtype=torch.bfloat16, device="cuda"))
    with pytest.raises(MoeShapeError):
        ours.align(torch.zeros(129, 2048, dtype=torch.bfloat16, device="cuda"),
                   torch.zeros(129, 8, dtype=torch.int32, device="cuda"), torch.zeros(129, 8, device="cuda"))


# ------------------------------------------------------------------------ v3 (weight streaming)

def _v3_script() -> Any:
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[2] / "scripts" / "gpu" / "moe_v3_check.py"
    spec = importlib.util.spec_from_file_location("moe_v3_check", path)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_v3_layer_fused_and_unfused(tmp_path: Any) -> None:
    """v3 fused and unfused vs moe_routed_ref over 1..128 tokens, shared on/off and skewed loads (every
    token on the same 8 experts): declared tolerance, no NaN through poisoned outputs/intermediates,
    run-to-run and eager == graph replay bitwise, fused h_q/h_s bitwise vs moe_act_quant and the reference."""
    mod = _v3_script()
    res = mod.step_check(tmp_path)
    bad = [c for c in res["cases"] if not c["ok"]]
    assert not bad, bad
    assert {c["provider"] for c in res["cases"]} == set(mod.V3_BUILDS)  # incl. the tuning builds
    # every build that copies its h (fused, not a one-kernel layer keeping h in shared memory) is compared
    copying = {n for n, kw in mod.V3_BUILDS.items() if mod.copies_h(kw)}
    assert copying  # the comparison covers at least one build
    assert all(c["h_mismatch_vs_kernel"] == 0 and c["h_mismatch_vs_ref"] == 0
               for c in res["cases"] if c["provider"] in copying)
    assert res["route_align_ok"], (res.get("route_v3"), res.get("align_v3"), res.get("route_align_error"))


def test_v3_bad_shapes_are_refused() -> None:
    import torch

    from netra.ops.moe_fp8 import MoeShapeError, MoeSm90

    ours = MoeSm90(0, variant="v3")
    with pytest.raises(MoeShapeError):
        ours.experts(torch.zeros(129, 2048, dtype=torch.bfloat16, device="cuda"), *([torch.zeros(1)] * 4), False)


def _bitwise_vs_st8(tune: str, cases: list[tuple[int, Any]], fuse_act: bool = True) -> None:
    """The one-kernel tune is bitwise the st8 sequence, eager and replayed, on (tokens, routing kind) cases,
    routed only and with the shared route (where it falls back to st8; fuse_act=False: the tune's act+quant twin)."""
    import torch

    from netra.bench.kernels_moe import make_weights
    from netra.ops.moe_fp8 import MoeSm90

    mod = _v3_script()
    w = make_weights()
    st8, one = MoeSm90(0, variant="v3", tune="st8"), MoeSm90(0, variant="v3", tune=tune, fuse_act=fuse_act)
    for m, kind in cases:
        x, ids, wts, sw = mod.routing(m, kind, seed=13 + m)
        for shared in (False, True):
            outs = []
            for o in (st8, one):
                mod.poison(o)
                o.align(x, ids, wts, sw if shared else None)
                outs.append(o.experts(x, w["w13"], w["s13"], w["w2"], w["s2"], shared).clone())
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g):
                one.align(x, ids, wts, sw if shared else None)
                one.experts(x, w["w13"], w["s13"], w["w2"], w["s2"], shared)
            mod.poison(one)
            g.replay()
            torch.cuda.synchronize()
            assert torch.equal(mod._bits(outs[0]), mod._bits(outs[1])), (m, kind, shared)
            assert torch.equal(mod._bits(outs[1]), mod._bits(one.out[:m])), (m, kind, shared)


def test_m1_bitwise_vs_st8_at_one_token() -> None:
    """tune "m1" (one cooperative kernel at 1 token, routed only) is bitwise the st8 sequence, eager and
    replayed, on ordinary and adversarial routings; with the shared route it falls back to st8."""
    _bitwise_vs_st8("m1", [(1, k) for k in (False, *_v3_script().ADVERSARIAL_1)])


def test_m1f_bitwise_vs_st8_at_one_token() -> None:
    """tune "m1f" (round 8's one-token kernel, routed only) is bitwise the st8 sequence, eager and replayed, on
    ordinary and adversarial routings; with the shared route it falls back to st8."""
    _bitwise_vs_st8("m1f", [(1, k) for k in (False, *_v3_script().ADVERSARIAL_1)])


def test_m1fl_act_quant_twin_bitwise_vs_st8() -> None:
    """tune "m1fl" unfused (round 11's act+quant A/B twin: moe_m1f / moe_ml with SiLU*up + quantization as their own
    step) is bitwise the st8 sequence, eager and replayed, at 1 token (moe_m1f_aq) and above (moe_ml_aq2)."""
    mod = _v3_script()
    cases = [(1, k) for k in (False, *mod.ADVERSARIAL_1)] + [(m, False) for m in (2, 8, 33, 128)]
    _bitwise_vs_st8("m1fl", [*cases, (128, True), (17, "ties"), (64, "desc_edge")], fuse_act=False)


def test_ms_bitwise_vs_st8_up_to_8_tokens() -> None:
    """tune "ms" (one cooperative kernel at 1..8 tokens, routed only) is bitwise the st8 sequence, eager and
    replayed, on ordinary and adversarial routings; with the shared route it falls back to st8."""
    mod = _v3_script()
    cases = [(1, k) for k in (False, *mod.ADVERSARIAL_1)] + [(m, False) for m in range(2, 9)]
    _bitwise_vs_st8("ms", [*cases, (8, True), (8, "ties"), (4, "lo_hi"), (8, "desc_edge")])


def test_ml_bitwise_vs_st8_up_to_128_tokens() -> None:
    """tune "ml" (one cooperative kernel at 1..128 tokens, routed only) is bitwise the st8 sequence, eager and
    replayed, at odd sizes and on adversarial routings (128 tokens on the same 8 experts: several gate_up and
    down chunks per expert); with the shared route it falls back to st8."""
    cases = [(m, False) for m in (1, 2, 8, 9, 16, 31, 64, 100, 128)]
    _bitwise_vs_st8("ml", [*cases, (128, True), (17, "ties"), (64, "desc_edge"), (127, "lo_hi"), (1, "zero_x"),
                           (128, "wide_x"), (33, "adjacent")])
