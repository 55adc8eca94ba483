"""The fused GDN decode tactic (kernels/sm90/gdn/gdn_decode.py) under Triton's CPU interpreter,
against `gdn_decode_fused_ref` per each contract's declared tolerance: fresh random and adversarial
inputs, pad rows, strided q/k/v/a/b views, consecutive steps."""

from __future__ import annotations

import pytest
import torch

from netra.ops import gdn
from netra.validate.compare import compare

pytestmark = pytest.mark.triton_interp

CONTRACTS = ["gdn_decode_f32_hv32",
             "gdn_decode_bf16_hv32",
             "gdn_decode_f32_small_hv32",
             "gdn_decode_bf16_small_hv32"]
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}
# Small head counts keep the interpreter quick; head dims are the model's (the kernel's tile shape).
HK, HV, DK, DV = 2, 4, 128, 128


def make(bsz: int, state_dtype: torch.dtype, seed: int, n_slots: int = 9) -> dict[str, torch.Tensor]:
    """Inputs shaped as the engine makes them: q/k/v strided views of one packed row, a/b views of one
    projection, bf16 dt_bias, fp32 A_log."""
    g = torch.Generator().manual_seed(seed)
    width = 2 * HK * DK + HV * DV
    qkv = torch.randn(bsz, width + 64, generator=g).bfloat16()  # + z-like tail: rows are strided
    ba = torch.randn(bsz, 2 * HV, generator=g).bfloat16()
    return {
        "q": qkv[:, :HK * DK].reshape(bsz, HK, DK), "k": qkv[:, HK * DK:2 * HK * DK].reshape(bsz, HK, DK),
        "v": qkv[:, 2 * HK * DK:width].reshape(bsz, HV, DV), "b": ba[:, :HV], "a": ba[:, HV:],
        "a_log": torch.log(torch.rand(HV, generator=g) * 15 + 1),
        "dt_bias": (torch.randn(HV, generator=g) * 0.5).bfloat16(),
        "state_pool": (torch.randn(n_slots, HV, DK, DV, generator=g) * 0.3).to(state_dtype),
    }


def run_both(entry, doc, args: dict[str, torch.Tensor], slots: torch.Tensor):
    pool = args["state_pool"]
    mine, ref = pool.clone(), pool.clone()
    common = {k: v for k, v in args.items() if k != "state_pool"}
    o = entry(doc["launch"], **common, state_pool=mine, slots=slots)
    o_ref = gdn.gdn_decode_fused_ref(**common, state_pool=ref, slots=slots)
    return o, o_ref, mine, ref


def assert_close(doc, o, o_ref, mine, ref, slots: torch.Tensor, before: torch.Tensor) -> None:
    rep = compare(doc["numerics"], o, o_ref)
    assert rep["ok"], f"output off the reference: {rep}"
    live = sorted({int(s) for s in slots if int(s) != gdn.PAD_SLOT})
    rep = compare(doc["numerics"], mine[live], ref[live])
    assert rep["ok"], f"state off the reference: {rep}"
    untouched = [i for i in range(mine.shape[0]) if i not in live]
    assert torch.equal(mine[untouched], before[untouched]), "a pool row outside slots (or slot 0) changed"
    pad = slots == gdn.PAD_SLOT
    assert torch.equal(o[pad], torch.zeros_like(o[pad]))


@pytest.mark.parametrize("path", CONTRACTS)
@pytest.mark.parametrize("seed", [0, 1])
def test_fresh_random_with_pad_rows(interp_entry, path: str, seed: int) -> None:
    entry, doc = interp_entry(path)
    sd = DTYPES[doc["match"]["dtypes"]["state"][0]]
    args = make(4, sd, seed)
    slots = torch.tensor([5, 0, 2, 8]) if seed == 0 else torch.tensor([1, 3, 0, 0])
    o, o_ref, mine, ref = run_both(entry, doc, args, slots)
    assert o.dtype == torch.bfloat16 and o.shape == (4, HV, DV)
    assert_close(doc, o, o_ref, mine, ref, slots, args["state_pool"])


@pytest.mark.parametrize("path", CONTRACTS[:2])  # one per state dtype
@pytest.mark.parametrize("bv,reload,bk", [(16, 0, 0), (32, 1, 0), (64, 1, 0), (128, 0, 0), (128, 0, 32)])
def test_launch_variants(interp_entry, path: str, bv: int, reload: int, bk: int) -> None:
    """Launch variants (value tile BV, the tile re-read after the reductions, and the two-pass row-block
    kernel of BK-row blocks that the 2026-12-02 sweep measured and no contract uses) compute the same
    step: each within the contract's tolerance, pad rows inert."""
    entry, doc = interp_entry(path)
    sd = DTYPES[doc["match"]["dtypes"]["state"][0]]
    args = make(3, sd, seed=bv + reload + bk)
    slots = torch.tensor([4, 0, 7])
    launch = {**doc["launch"], "meta": {**doc["launch"]["meta"], "BV": bv, "RELOAD": reload, "BK": bk}}
    pool = args["state_pool"]
    mine, ref = pool.clone(), pool.clone()
    common = {k: v for k, v in args.items() if k != "state_pool"}
    o = entry(launch, **common, state_pool=mine, slots=slots)
    o_ref = gdn.gdn_decode_fused_ref(**common, state_pool=ref, slots=slots)
    assert_close(doc, o, o_ref, mine, ref, slots, pool)


def _adversarial(name: str, args: dict[str, torch.Tensor]) -> None:
    q, k = args["q"], args["k"]
    if name == "zero_qk":
        q[0].zero_()
        k[1].zero_()
    elif name == "huge_qk":  # the sum of squares overflows FP32 in row 0 (q̂ = 0 there); row 1 is large but finite
        q[0].fill_(3e38)
        k[0].fill_(-2e19)
        q[1].mul_(1e15)
        k[1].mul_(1e15)
    elif name == "tiny_qk":
        q.mul_(1e-30)
        k.mul_(1e-30)
    elif name == "beta_extremes":  # sigmoid saturated at 0 and 1
        args["b"][0].fill_(-60.0)
        args["b"][1].fill_(60.0)
    elif name == "decay_extremes":  # exp(g) underflows to 0 (row 0); softplus ~ 1e-26, exp(g) = 1 (row 1)
        args["a"][0].fill_(80.0)
        args["a"][1].fill_(-60.0)
        args["a_log"].copy_(torch.log(torch.full_like(args["a_log"], 16.0)))
    elif name == "huge_v_state":
        args["v"].mul_(1e4)
        args["state_pool"].mul_(1e3)
    elif name == "rank_one_cancellation":  # v equals Sᵀk̂ (δ = 0): the update only decays
        pass
    else:
        raise AssertionError(name)


@pytest.mark.parametrize("path", CONTRACTS)
@pytest.mark.parametrize("case", ["zero_qk", "huge_qk", "tiny_qk", "beta_extremes", "decay_extremes", "huge_v_state"])
def test_adversarial(interp_entry, path: str, case: str) -> None:
    entry, doc = interp_entry(path)
    sd = DTYPES[doc["match"]["dtypes"]["state"][0]]
    args = make(3, sd, seed=10)
    _adversarial(case, args)
    slots = torch.tensor([4, 7, 0])
    o, o_ref, mine, ref = run_both(entry, doc, args, slots)
    assert torch.isfinite(o).all()
    assert_close(doc, o, o_ref, mine, ref, slots, args["state_pool"])


@pytest.mark.parametrize("path", CONTRACTS)
def test_consecutive_steps_follow_the_reference(interp_entry, path: str) -> None:
    """Three decode steps in a row on one pool: the tactic's state feeds its next step. With an FP32
    pool every step stays within the per-element tolerance; a BF16 pool rounds each step, so a one-ulp
    flip of a state element is inherited by later outputs: there the trajectory is judged by
    relative L2 (<= rtol) after the first step."""
    entry, doc = interp_entry(path)
    sd = DTYPES[doc["match"]["dtypes"]["state"][0]]
    pool = make(2, sd, seed=20)["state_pool"]
    mine, ref = pool.clone(), pool.clone()
    slots = torch.tensor([6, 3])
    rtol = doc["numerics"]["rtol"]
    for step in range(3):
        args = make(2, sd, seed=30 + step)
        common = {k: v for k, v in args.items() if k != "state_pool"}
        o = entry(doc["launch"], **common, state_pool=mine, slots=slots)
        o_ref = gdn.gdn_decode_fused_ref(**common, state_pool=ref, slots=slots)
        for got, want in ((o, o_ref), (mine, ref)):
            rep = compare(doc["numerics"], got, want)
            if sd == torch.float32 or step == 0:
                assert rep["ok"], (step, rep)
            else:
                assert rep["rel_l2"] <= rtol, (step, rep)


def test_full_model_heads_one_row(interp_entry) -> None:
    """The contract's own head counts (16 key / 32 value heads) at batch 1."""
    global HK, HV
    entry, doc = interp_entry(CONTRACTS[0])
    saved = HK, HV
    HK, HV = 16, 32
    try:
        args = make(1, torch.float32, seed=40, n_slots=2)
    finally:
        HK, HV = saved
    slots = torch.tensor([1])
    o, o_ref, mine, ref = run_both(entry, doc, args, slots)
    assert_close(doc, o, o_ref, mine, ref, slots, args["state_pool"])


def test_fused_reference_is_gating_then_decode() -> None:
    """Off the pad slot, the fused oracle is exactly the engine's two ops (gdn_gating, gdn_decode)."""
    args = make(3, torch.float32, seed=50)
    slots = torch.tensor([2, 5, 1])
    common = {k: v for k, v in args.items() if k != "state_pool"}
    p1, p2 = args["state_pool"].clone(), args["state_pool"].clone()
    o1 = gdn.gdn_decode_fused(**common, state_pool=p1, slots=slots)  # CPU: dispatch falls back to the oracle
    g, beta = gdn.gdn_gating_ref(args["a"], args["b"], args["a_log"], args["dt_bias"])
    o2 = gdn.gdn_decode_ref(args["q"], args["k"], args["v"], g, beta, p2, slots)
    assert torch.equal(o1, o2) and torch.equal(p1, p2)
