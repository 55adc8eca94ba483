"""The sm90 attention tactics (kernels/sm90/attention/*.py) under Triton's interpreter, on the CPU.

Each test runs the contract's entry with the contract's own launch spec (grid rule included) or the
launcher with an explicit split count, against the op's reference, with the contract's declared
tolerance read from the contract file. Outputs are written into NaN-poisoned buffers where the
launcher takes one, so an unwritten element fails.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from netra.ops import attention, fp8, norm, rope
from netra.validate.compare import rel_l2

pytestmark = pytest.mark.triton_interp

REPO = Path(__file__).resolve().parents[2]
DECODE_SRC = "kernels/sm90/attention/decode_fp8.py"
PROLOGUE_SRC = "kernels/sm90/attention/qk_norm_rope_store.py"
HQ, HKV, D, ROT = 16, 2, 256, 64


def contract(name: str) -> dict[str, Any]:
    from netra.catalog import contract_doc

    return contract_doc(name)


DECODE = contract("attention_decode_fp8_gqa16x2_d256")
GATED = contract("attention_decode_gated_fp8_gqa16x2_d256")
PROLOGUE = contract("qk_norm_rope_store_fp8_h16x2_d256_r64")


def assert_close(got: torch.Tensor, ref: torch.Tensor, rtol: float) -> None:
    """The contract's measure (relative L2 over the whole output) and, per (row, head), a relative L2 of
    at most 2^-6: a swapped, dropped or doubled token shows in the rows it touches even when the global
    figure would hide it."""
    assert not got.isnan().any(), "NaN in the output (an element left unwritten?)"
    assert rel_l2(got, ref) <= rtol, f"relative L2 {rel_l2(got, ref):.2e} > {rtol}"
    g, r = got.double().flatten(0, -2), ref.double().flatten(0, -2)
    row_err = (g - r).norm(dim=-1) / r.norm(dim=-1).clamp_min(1e-300)
    assert float(row_err.max()) <= 2 ** -6, f"worst (row, head) relative L2 {float(row_err.max()):.2e}"


def kv_cache(slots: int, ctx: int, scale: float = 1.0, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    k = (torch.randn(slots, ctx, HKV, D, generator=g) * scale).clamp(-448, 448).to(fp8.E4M3)
    v = (torch.randn(slots, ctx, HKV, D, generator=g) * scale).clamp(-448, 448).to(fp8.E4M3)
    return k, v


def meta(launch: dict[str, Any], **over: int) -> dict[str, Any]:
    return {**launch["meta"], "num_warps": launch["block"] // 32, **over}


def run_decode(mod: Any, q: torch.Tensor, kc: torch.Tensor, vc: torch.Tensor, slots: torch.Tensor,
               lens: torch.Tensor, splits: int, gate: torch.Tensor | None = None, k_scale: float = 1.0,
               v_scale: float = 1.0, **over: int) -> torch.Tensor:
    out = torch.full(q.shape, float("nan"), dtype=q.dtype)
    mod.launch_decode(q, kc, vc, slots, lens, D ** -0.5, k_scale, v_scale, gate, splits,
                      meta(DECODE["launch"], **over), out=out)
    return out


@pytest.fixture(scope="module")
def dk(interp_source: Any) -> Any:
    return interp_source(DECODE_SRC)


@pytest.fixture(scope="module")
def pk(interp_source: Any) -> Any:
    return interp_source(PROLOGUE_SRC)


# ---- decode ----------------------------------------------------------------------------------------

@pytest.mark.parametrize("splits", [1, 2, 5])
def test_decode_fresh_random_with_padded_rows(dk: Any, splits: int) -> None:
    torch.manual_seed(splits)
    kc, vc = kv_cache(6, 320, seed=splits)
    q = torch.randn(5, HQ, D).bfloat16()
    # rows 3 and 4 are bucket padding: the pad slot 0, length 1
    slots, lens = torch.tensor([4, 1, 5, 0, 0]), torch.tensor([300, 1, 129, 1, 1])
    ref = attention.attention_decode_ref(q, kc, vc, slots, lens, 320, D ** -0.5)
    assert_close(run_decode(dk, q, kc, vc, slots, lens, splits), ref, DECODE["numerics"]["rtol"])


def test_decode_long_context_many_splits(dk: Any) -> None:
    torch.manual_seed(1)
    kc, vc = kv_cache(2, 3000, seed=1)
    q = torch.randn(1, HQ, D).bfloat16()
    slots, lens = torch.tensor([1]), torch.tensor([2999])
    ref = attention.attention_decode_ref(q, kc, vc, slots, lens, 3000, D ** -0.5)
    for splits in (1, 13, 47):  # 47 blocks of 64: one block per split, the last one partial
        assert_close(run_decode(dk, q, kc, vc, slots, lens, splits), ref, DECODE["numerics"]["rtol"])


def test_decode_contract_entry_gated_strided_gate(dk: Any) -> None:
    """The contract's entry (its grid rule picks the splits) with the engine's gate view of q|gate."""
    torch.manual_seed(2)
    kc, vc = kv_cache(4, 700, seed=2)
    qg = torch.randn(3, HQ, 2 * D).bfloat16()
    q, gate = qg[..., :D].contiguous(), qg[..., D:]
    slots, lens = torch.tensor([3, 2, 0]), torch.tensor([700, 65, 1])
    kw = {"q": q, "k_cache": kc, "v_cache": vc, "slots": slots, "seq_lens": lens, "max_len": 700,
          "sm_scale": D ** -0.5}
    out = dk.attention_decode_fp8(DECODE["launch"], **kw)
    assert_close(out, attention.attention_decode_ref(q, kc, vc, slots, lens, 700, D ** -0.5),
                 DECODE["numerics"]["rtol"])
    gated = dk.attention_decode_fp8(GATED["launch"], gate=gate, **kw)
    ref = attention.attention_decode_gated_ref(q, gate, kc, vc, slots, lens, 700, D ** -0.5)
    assert_close(gated, ref, GATED["numerics"]["rtol"])
    # the same gate through a transposed (non-unit last stride) view
    gate_t = gate.transpose(0, 2).contiguous().transpose(0, 2)
    assert torch.equal(dk.attention_decode_fp8(GATED["launch"], gate=gate_t, **kw), gated)


@pytest.mark.parametrize("splits", [1, 4])
def test_decode_gate_fused_in_both_epilogues(dk: Any, splits: int) -> None:
    torch.manual_seed(3)
    kc, vc = kv_cache(3, 256, seed=3)
    q, gate = torch.randn(2, HQ, D).bfloat16(), (torch.randn(2, HQ, D) * 4).bfloat16()
    slots, lens = torch.tensor([1, 2]), torch.tensor([256, 200])
    ref = attention.attention_decode_gated_ref(q, gate, kc, vc, slots, lens, 256, D ** -0.5)
    assert_close(run_decode(dk, q, kc, vc, slots, lens, splits, gate=gate), ref, GATED["numerics"]["rtol"])


@pytest.mark.parametrize("where", ["first", "last", "split_edge"])
def test_decode_one_dominant_token(dk: Any, where: str) -> None:
    """One key aligned with every query (score +30 over the rest): the output is that token's value,
    so a token read twice, skipped or taken from the wrong place shows at once."""
    torch.manual_seed(4)
    n, splits = 450, 3
    kc, vc = kv_cache(2, 512, scale=0.25, seed=4)
    t = {"first": 0, "last": n - 1, "split_edge": 192}[where]  # 8 blocks: splits of 3, 3, 2 blocks
    q = torch.zeros(1, HQ, D)
    q[0, :, 0] = 30.0 * 16  # score = q . k / 16 = 30 for the token whose k[0] = 1
    kc[1, :, :, 0] = torch.tensor(0.0).to(fp8.E4M3)
    kc[1, t, :, 0] = torch.tensor(1.0).to(fp8.E4M3)
    q = q.bfloat16()
    slots, lens = torch.tensor([1]), torch.tensor([n])
    ref = attention.attention_decode_ref(q, kc, vc, slots, lens, 512, D ** -0.5)
    out = run_decode(dk, q, kc, vc, slots, lens, splits)
    assert_close(out, ref, DECODE["numerics"]["rtol"])
    expect = vc[1, t].float().repeat_interleave(HQ // HKV, dim=0)
    assert float((out.float() - expect).abs().max()) < 0.02 * float(expect.abs().max())


def test_decode_huge_and_tiny_logits(dk: Any) -> None:
    torch.manual_seed(5)
    kc, vc = kv_cache(2, 200, scale=100.0, seed=5)  # E4M3 values up to the ±448 saturation
    slots, lens = torch.tensor([1, 1]), torch.tensor([200, 130])
    q = torch.randn(2, HQ, D)
    q[0] *= 1e3  # scores ~1e5: a one-hot softmax
    q[1] *= 1e-30  # scores ~1e-26: a uniform softmax (q far below FP16's range before the row scale)
    q = q.bfloat16()
    ref = attention.attention_decode_ref(q, kc, vc, slots, lens, 200, D ** -0.5)
    for splits in (1, 3):
        assert_close(run_decode(dk, q, kc, vc, slots, lens, splits), ref, DECODE["numerics"]["rtol"])


def test_decode_ties_and_one_outlier_channel(dk: Any) -> None:
    """Every key equal (all scores tie: the mean of V), and q rows whose max is 2^20 times the rest (the
    FP16 row scale keeps the small channels)."""
    torch.manual_seed(6)
    kc, vc = kv_cache(2, 256, seed=6)
    kc[1] = kc[1, 7:8].expand(256, HKV, D)
    q = torch.randn(2, HQ, D)
    q[1, :, 5] = 2.0 ** 20
    kc0 = kc.clone()
    kc0[0, :, :, 5] = torch.tensor(0.0).to(fp8.E4M3)  # the outlier channel sees zeros: the small ones decide
    q = q.bfloat16()
    slots, lens = torch.tensor([1, 0]), torch.tensor([256, 256])
    ref = attention.attention_decode_ref(q, kc0, vc, slots, lens, 256, D ** -0.5)
    out = run_decode(dk, q, kc0, vc, slots, lens, 2)
    assert_close(out, ref, DECODE["numerics"]["rtol"])
    mean_v = vc[1, :256].float().mean(0).repeat_interleave(HQ // HKV, dim=0)
    assert float((out[0].float() - mean_v).abs().max()) < 1e-2


def test_decode_scales_and_context_clamp(dk: Any) -> None:
    torch.manual_seed(7)
    kc, vc = kv_cache(3, 128, seed=7)
    q = torch.randn(2, HQ, D).bfloat16()
    slots, lens = torch.tensor([2, 1]), torch.tensor([100, 128])
    ref = attention.attention_decode_ref(q, kc, vc, slots, lens, 128, D ** -0.5, 0.5, 3.0)
    assert_close(run_decode(dk, q, kc, vc, slots, lens, 2, k_scale=0.5, v_scale=3.0), ref,
                 DECODE["numerics"]["rtol"])
    # a length past the pool's context reads the whole context, never past it
    over = run_decode(dk, q, kc, vc, slots, torch.tensor([100, 5000]), 2)
    assert torch.equal(over, run_decode(dk, q, kc, vc, slots, lens, 2))


def test_decode_grid_rule_is_static() -> None:
    """The split count depends on batch and the pool's context only (a captured graph replays any lengths)."""
    from netra.runtime import grid_size

    launch = DECODE["launch"]

    def grid(batch: int, context: int) -> list[int]:
        return grid_size(launch["grid"], {"batch": batch, "q_heads": HQ, "kv_heads": HKV, "head_dim": D,
                                          "context": context, **launch["meta"]})

    target = launch["meta"]["TARGET_CTAS"]
    assert grid(128, 49152) == [256, max(1, target // 256)]
    assert grid(1, 49152) == [2, min(launch["meta"]["MAX_SPLITS"], target // 2)]
    assert grid(1, 100) == [2, 2]  # never more splits than blocks
    assert grid(64, 4096) == [128, max(1, target // 128)]


# ---- prologue --------------------------------------------------------------------------------------

def prologue_inputs(t: int, seed: int, w_scale: float = 0.3, x_scale: float = 1.0, slots: int = 5,
                    ctx: int = 64) -> dict[str, Any]:
    g = torch.Generator().manual_seed(seed)
    proj = (torch.randn(t, 2 * HQ * D + 2 * HKV * D, generator=g) * x_scale).bfloat16()
    qg = proj[:, :2 * HQ * D].reshape(t, HQ, 2 * D)
    k = proj[:, 2 * HQ * D:2 * HQ * D + HKV * D].reshape(t, HKV, D)
    v = proj[:, 2 * HQ * D + HKV * D:].reshape(t, HKV, D)
    kc = torch.randn(slots, ctx, HKV, D, generator=g).to(fp8.E4M3)
    return {"q": qg[..., :D], "k": k, "v": v,
            "q_weight": (torch.randn(D, generator=g) * w_scale).bfloat16(),
            "k_weight": (torch.randn(D, generator=g) * w_scale).bfloat16(), "eps": 1e-6,
            "positions": torch.randint(0, ctx, (t,), generator=g), "rope_table": rope.rope_cache(ctx, ROT, 1e7),
            "rotary_dim": ROT, "k_cache": kc, "v_cache": kc.clone(),
            "token_slots": torch.randperm(slots, generator=g)[:t] if t <= slots else torch.randint(0, slots, (t,), generator=g)}


def check_prologue(pk: Any, args: dict[str, Any], min_equal: float = 0.99) -> None:
    ref_args = {**args, "k_cache": args["k_cache"].clone(), "v_cache": args["v_cache"].clone()}
    ref_q = attention.qk_norm_rope_store_ref(**ref_args)
    got_q = pk.qk_norm_rope_store_fp8(PROLOGUE["launch"], **args)
    rtol = PROLOGUE["numerics"]["rtol"]
    assert rel_l2(got_q, ref_q) <= rtol
    assert (got_q == ref_q).float().mean() >= min_equal
    written = torch.zeros(args["k_cache"].shape[:2], dtype=torch.bool)
    written[args["token_slots"], args["positions"]] = True
    for name in ("k_cache", "v_cache"):
        got, ref = args[name], ref_args[name]
        assert torch.equal(got[~written].view(torch.uint8), ref[~written].view(torch.uint8)), f"{name}: stray write"
        g, r = got[written].float(), ref[written].float()
        assert torch.equal(g.isnan(), r.isnan())
        assert rel_l2(g.nan_to_num(), r.nan_to_num()) <= rtol
    # V is a conversion only: bitwise (NaN included)
    assert torch.equal(args["v_cache"].view(torch.uint8), ref_args["v_cache"].view(torch.uint8))


def test_prologue_fresh_random_strided_views(pk: Any) -> None:
    check_prologue(pk, prologue_inputs(7, seed=10, slots=9))


def test_prologue_positions_zero_and_last_pad_slot(pk: Any) -> None:
    args = prologue_inputs(4, seed=11)
    args["positions"] = torch.tensor([0, 63, 0, 31])
    args["token_slots"] = torch.tensor([0, 0, 3, 4])  # two padded rows on the pad slot (different positions)
    check_prologue(pk, args)


def test_prologue_saturation_and_nonfinite(pk: Any) -> None:
    """Weights of 100 push normalised K past ±448 (saturated, as kv_store_ref); V carries ±inf, NaN and
    values past the E4M3 range; q is huge before the norm."""
    args = prologue_inputs(3, seed=12, w_scale=100.0, x_scale=1e4)
    v = args["v"]
    v[0, 0, :4] = torch.tensor([float("inf"), -float("inf"), float("nan"), 1e6])
    check_prologue(pk, args, min_equal=0.98)
    assert float(args["k_cache"].float().abs().max()) == fp8.E4M3_MAX


def test_prologue_scales(pk: Any) -> None:
    args = prologue_inputs(5, seed=13)
    check_prologue(pk, {**args, "k_scale": 0.5, "v_scale": 4.0})


def test_prologue_ref_composes_todays_chain() -> None:
    """The new op's fallback and reference are exactly today's engine sequence (norms, RoPE, store)."""
    args = prologue_inputs(6, seed=14)
    a = {**args, "k_cache": args["k_cache"].clone(), "v_cache": args["v_cache"].clone()}
    q = attention.qk_norm_rope_store(**a)
    b = {**args, "k_cache": args["k_cache"].clone(), "v_cache": args["v_cache"].clone()}
    qn, kn = norm.rmsnorm(b["q"], b["q_weight"], 1e-6), norm.rmsnorm(b["k"], b["k_weight"], 1e-6)
    qr, kr = rope.rope(qn, kn, b["positions"], b["rope_table"], ROT)
    attention.kv_store(kr, b["v"], b["k_cache"], b["v_cache"], b["token_slots"], b["positions"])
    assert torch.equal(q, qr)
    assert torch.equal(a["k_cache"].view(torch.uint8), b["k_cache"].view(torch.uint8))
    assert torch.equal(a["v_cache"].view(torch.uint8), b["v_cache"].view(torch.uint8))
