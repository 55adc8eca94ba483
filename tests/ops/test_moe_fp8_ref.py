"""CPU oracle tests for the MoE decode references (netra/ops/moe_fp8.py), cross-checked against the
engine's own layer reference (netra/ops/moe.py, netra/ops/fp8.py) so both describe one numerics."""

from __future__ import annotations

import pytest
import torch

from netra.ops import fp8
from netra.ops.moe import expert_mlp_ref
from netra.ops.moe_fp8 import (
    MoeShapeError,
    act_quant_ref,
    moe_routed_ref,
    quant_group_ref,
    quant_weight_blocks_ref,
    route_ref,
    silu_mul_ref,
)


def test_group_quant_matches_engine_helper_and_bounds() -> None:
    g = torch.Generator().manual_seed(0)
    x = (torch.randn(7, 512, generator=g) * torch.logspace(-6, 3, 7).unsqueeze(1)).to(torch.bfloat16)
    x[3] = 0
    q, s = quant_group_ref(x)
    eq, es = fp8.quantize_per_token_group(x)
    assert torch.equal(q.view(torch.uint8), eq.view(torch.uint8))  # CPU: scalar and tensor division agree
    assert torch.equal(s, es)
    deq = q.float().reshape(7, 4, 128) * s.unsqueeze(-1)
    err = (deq.reshape(7, 512) - x.float()).abs()
    assert bool((err <= x.float().abs() * 2**-3 + s.repeat_interleave(128, 1) * 2**-9).all())
    assert torch.equal(s[3], torch.full((4,), 1e-10 / 448.0))


def test_act_quant_ref_is_the_two_step_definition() -> None:
    g = torch.Generator().manual_seed(1)
    gu = torch.randn(9, 1024, generator=g).to(torch.bfloat16)
    h = silu_mul_ref(gu)
    expect = (torch.nn.functional.silu(gu[:, :512].float()) * gu[:, 512:].float()).to(torch.bfloat16)
    assert torch.equal(h, expect)
    q, s = act_quant_ref(gu)
    q2, s2 = quant_group_ref(expect)
    assert torch.equal(q.view(torch.uint8), q2.view(torch.uint8)) and torch.equal(s, s2)
    with pytest.raises(MoeShapeError):
        act_quant_ref(gu[:, :1023])


def test_route_ref_ties_go_to_lowest_index() -> None:
    logits = torch.zeros(3, 256, dtype=torch.bfloat16)
    logits[1, 200] = 1.0
    logits[1, 5] = 1.0
    logits[2, 17:40] = 2.0
    ids, w, shared = route_ref(logits, torch.tensor([0.0, 1.0, -1.0], dtype=torch.bfloat16))
    assert ids[0].tolist() == list(range(8))
    assert ids[1].tolist() == [5, 200, 0, 1, 2, 3, 4, 6]
    assert ids[2].tolist() == list(range(17, 25))
    assert torch.allclose(w.sum(-1), torch.ones(3))
    assert torch.allclose(w[0], torch.full((8,), 0.125))
    assert shared is not None and torch.allclose(shared, torch.sigmoid(torch.tensor([0.0, 1.0, -1.0])))


def test_moe_routed_ref_matches_engine_expert_mlp() -> None:
    g = torch.Generator().manual_seed(2)
    e, m = 6, 3
    w13, s13 = quant_weight_blocks_ref(torch.randn(e, 1024, 2048, generator=g) * 0.02)
    w2, s2 = quant_weight_blocks_ref(torch.randn(e, 2048, 512, generator=g) * 0.04)
    x = torch.randn(m, 2048, generator=g).to(torch.bfloat16)
    ids = torch.tensor([[0, 1, 2, 3, 4, 5, 0, 1]] * m, dtype=torch.int32)[:, :8]
    ids[1] = torch.tensor([5, 4, 3, 2, 1, 0, 5, 4])
    ids = ids[:, :6].contiguous()  # distinct experts per token
    w = torch.softmax(torch.randn(m, 6, generator=g), -1)
    got = moe_routed_ref(x, ids, w, w13, s13, w2, s2)
    routes = torch.zeros(m, 6, 2048)
    for t in range(m):
        for k in range(6):
            ex = int(ids[t, k])
            routes[t, k] = expert_mlp_ref(x[t:t + 1], fp8.block_dequantize_weight(w13[ex], s13[ex]),
                                          fp8.block_dequantize_weight(w2[ex], s2[ex]), w[t, k:k + 1], True)[0].float()
    want = routes.sum(1).to(torch.bfloat16)
    assert torch.allclose(got.float(), want.float(), rtol=1e-2, atol=1e-3)
    rel = (got.float() - want.float()).norm() / want.float().norm()
    assert rel < 2e-3


def test_host_structs_match_every_contract_params_layout() -> None:
    """The ctypes struct of each MoE code object equals its contract's params_layout (the runtime checks the
    device side at load)."""
    from netra.catalog import Catalog
    from netra.ops import moe_sm90

    seen = set()
    for c in Catalog.load().contracts:
        if c.family != "moe":
            continue
        for o in c.objects:
            if o.kind == "triton":  # moe_block_prefill: a Triton module, no launch struct
                continue
            moe_sm90.check_struct(o.name, o.kernel["params_layout"])
            seen.add(o.name)
    assert seen == set(moe_sm90.STRUCTS)
    with pytest.raises(Exception, match="params_layout"):
        moe_sm90.check_struct(moe_sm90.ROUTE, {"size": 64})


def test_dispatch_serves_each_token_range_and_explains_the_rest() -> None:
    from netra.catalog import Catalog
    from netra.dispatch import plan
    from netra.ops import moe

    cat = Catalog.load()
    got = {label: plan(sig, cat, "experiment") for label, sig in moe.explain_signatures()}
    assert got["block, 1 token(s)"].contract.name == "moe_block_t1"
    for t in (2, 8, 64, 128):
        assert got[f"block, {t} token(s)"].contract.name == "moe_block_stream_fold"
    assert got["routed (SGLang fused_experts), 1 token(s)"].contract.name == "moe_routed_t1"
    assert got["routed (SGLang fused_experts), 128 token(s)"].contract.name == "moe_routed_stream"
    assert got["block, prefill chunk of 2048 tokens"].contract.name == "moe_block_prefill"
    for label, why in (("block, prefill chunk of 16384 tokens", "tokens=16384"), ("block, 128 experts", "experts=128"),
                       ("block, no shared expert", "shared_inter=0"), ("block, strided x", "layout x=strided"),
                       ("block, float16 x", "dtype x=float16"), ("block, cpu", "target cpu"),
                       ("routed, 256 tokens", "tokens=256")):
        assert got[label].contract is None and why in got[label].reason, (label, got[label].reason)


def test_family_is_cut_to_what_the_serving_path_runs() -> None:
    """Issue 18: at most 8 MoE contract files, every one selected by some call, no rejected sources in the tree,
    and every removed contract listed with its source commit in one results file."""
    import json
    from pathlib import Path

    from netra.catalog import Catalog

    root = Path(__file__).parents[2]
    files = sorted((root / "kernels/sm90/moe").glob("*.contract.json"))
    assert 1 <= len(files) <= 8
    assert not (root / "kernels/sm90/moe/rejected").exists()
    moe_contracts = [c for c in Catalog.load().contracts if c.family == "moe"]
    assert all(c.maturity != "rejected" for c in moe_contracts)
    sources = {o.kernel["source"] for c in moe_contracts for o in c.objects}
    on_disk = {str(p.relative_to(root)) for ext in ("*.cu", "*.py") for p in (root / "kernels/sm90/moe").glob(ext)}
    assert on_disk == sources  # no source file that no contract builds
    removed = json.loads((root / "results/sm90/moe_rejected.json").read_text())
    assert all(len(r["source_commit"]) == 40 for r in removed["removed"])
    assert {r["contract"] for r in removed["removed"] if r["contract"]}.isdisjoint({c.name for c in moe_contracts})


def test_routing_agreement_tells_near_ties_from_errors() -> None:
    from netra.ops.moe import routing_agreement

    logits = torch.zeros(2, 16)
    logits[0, :8] = torch.tensor([8.0, 7, 6, 5, 4, 3, 2, 1.0])
    logits[0, 8] = 1.0 + 2 ** -9  # within one BF16 ulp of the 8th largest (1.0): a near-tie
    logits[1, :9] = torch.tensor([9.0, 8, 7, 6, 5, 4, 3, 2, 0.5])
    ref = torch.tensor([[8, 0, 1, 2, 3, 4, 5, 6], [0, 1, 2, 3, 4, 5, 6, 7]])
    ids = torch.tensor([[0, 1, 2, 3, 4, 5, 6, 7], [0, 1, 2, 3, 4, 5, 6, 8]])
    got = routing_agreement(logits.to(torch.bfloat16), ids, ref)
    assert got == {"rows": 2, "rows_differ": 2, "near_ties": 1, "errors": 1}
