"""GPU tests of the MoE family's contracts (sm90): each contract against its own oracle and policy, on the seeded
full Qwen3.6 layer, with adversarial inputs, poisoned outputs, and eager == graph replay == run to run bitwise
(netra.bench.specs.moe.check_contract); and the engine-facing dispatch (what `moe()` picks, and the fallback)."""

from __future__ import annotations

from typing import Any

import pytest

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def layer() -> Any:
    from netra import dispatch
    from netra.bench.specs.moe import moe_layer, with_router_ties

    dispatch.reset(dispatch.Dispatcher(min_maturity="experiment"))
    w = moe_layer()
    return w, with_router_ties(w)


def _moe_contracts() -> list[str]:
    """Every sm90 MoE contract of the catalog (the catalog is the one registry: a new contract is tested here)."""
    from netra.catalog import Catalog

    return sorted(c.name for c in Catalog.load().contracts if c.family == "moe" and c.target == "sm90")


@pytest.mark.parametrize("name", _moe_contracts())
def test_contract_against_its_oracle(name: str, layer: Any) -> None:
    from netra.bench.specs import moe, moe_prefill
    from netra.catalog import Catalog

    w, ties = layer
    # decode sizes, and prefill chunks for moe_block_prefill (129..8192); each contract takes those in its domain
    check = moe_prefill.check_contract if name == "moe_block_prefill" else moe.check_contract
    got = check(Catalog.load().by_name(name), w, ties, tokens=(1, 3, 8, 33, 128, 129, 300, 2048))
    assert got["cases"] >= 6 and got["ok"], got["failing"]


def test_engine_op_selects_the_tactics_and_falls_back_outside(layer: Any) -> None:
    import torch

    from netra.ops import _common
    from netra.ops.moe import moe, moe_ref

    w, _ = layer
    _common.reset_decisions()
    x = torch.randn(8200, 2048, device="cuda").to(torch.bfloat16)  # wider than every contract (prefill: <= 8192)
    out = moe(x, w)
    ref = moe_ref(x, w)
    assert torch.equal(out, ref)  # the fallback is the reference itself
    moe(x[:5], w)
    moe(x[:300], w)
    labels = _common.decisions()["moe_fp8_block"]
    assert {"moe_block_stream_fold", "moe_block_prefill"} <= set(labels)
    assert any("tokens=8200" in lab for lab in labels)
