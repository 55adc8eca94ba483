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
