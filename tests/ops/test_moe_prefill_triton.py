"""The prefill MoE block tactic (kernels/sm90/moe/moe_prefill.py, contract ``moe_block_prefill``) under Triton's
CPU interpreter, against the block oracle `moe_ref` per the contract's declared relative-L2 tolerance, on a small
shape (16 experts top-4, hidden 256, expert and shared width 128): random chunks, adversarial rows (1e4 / 1e-4
magnitudes, zero rows, an outlier group), router ties (duplicated router rows: the lowest expert wins, as the
oracle); the routing and sort/align kernels against plain PyTorch; the contract's domain through dispatch (129..8192
tokens, eager only: the decode contracts keep 1..128)."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
import torch

from netra.catalog import Catalog, contract_doc
from netra.dispatch import plan
from netra.ops import fp8
from netra.ops.linear import Weight
from netra.ops.moe import MoEWeights, explain_signatures, moe_ref, moe_route_ref
from netra.validate.compare import rel_l2

CONTRACT = "moe_block_prefill"
E, K, H, WIDTH = 16, 4, 256, 128


def weights(seed: int, tie: bool = False) -> MoEWeights:
    g = torch.Generator().manual_seed(seed)

    def q(t: torch.Tensor) -> Weight:
        return Weight(*fp8.block_quantize_weight(t))

    router = torch.randn(E, H, generator=g) / H ** 0.5
    if tie:  # experts 3 and 9, 5 and 6 have identical router rows: every token ties them
        router[9], router[6] = router[3], router[5]
    w13 = torch.randn(E, 2 * WIDTH, H, generator=g) / H ** 0.5
    w13[2] *= 30.0  # an expert with large weights (its own block scales)
    return MoEWeights(router=Weight(router.bfloat16()), w13=q(w13), w2=q(torch.randn(E, H, WIDTH, generator=g) / WIDTH ** 0.5),
                      shared_w13=q(torch.randn(2 * WIDTH, H, generator=g) / H ** 0.5),
                      shared_w2=q(torch.randn(H, WIDTH, generator=g) / WIDTH ** 0.5),
                      shared_gate=Weight((torch.randn(1, H, generator=g) / H ** 0.5).bfloat16()), top_k=K,
                      renormalize=True)


def chunk(t: int, seed: int, adversarial: bool = False) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(t, H, generator=g)
    if adversarial:
        x[0::7] *= 1e4
        x[1::7] *= 1e-4
        x[2::11] = 0.0
        x[:, 128:256] *= torch.where(torch.arange(t) % 3 == 0, 50.0, 1.0)[:, None]
    return x.bfloat16()


@pytest.fixture(scope="module")
def prefill(interp_source: Any) -> tuple[Any, dict[str, Any], Any]:
    doc = contract_doc(CONTRACT)
    mod = interp_source(doc["kernel"]["source"])
    return getattr(mod, doc["kernel"]["symbol"]), doc, mod


# SiLU of a large negative gate: exp overflows to inf in NumPy and g / inf = -0, as on the GPU
pytestmark = [pytest.mark.triton_interp, pytest.mark.filterwarnings("ignore:overflow encountered in exp")]


@pytest.mark.parametrize("tokens,seed,adversarial,tie", [(40, 1, False, False), (300, 2, False, True),
                                                         (173, 3, True, False)])
def test_block_against_the_oracle(prefill, tokens: int, seed: int, adversarial: bool, tie: bool) -> None:
    entry, doc, _ = prefill
    w = weights(seed, tie=tie)
    x = chunk(tokens, seed, adversarial)
    got = entry(doc["launch"], x=x, weights=w)
    ref = moe_ref(x, w)
    assert got.shape == ref.shape and got.dtype == torch.bfloat16
    assert bool(torch.isfinite(got).all())
    err = rel_l2(got, ref)
    assert err <= doc["numerics"]["rtol"], err
    # row by row too: a small row (1e-4 scale, or a zero row) must not hide behind the large ones
    scale = ref.double().norm(dim=1).clamp(min=1e-30)
    row_err = (got.double() - ref.double()).norm(dim=1) / scale
    assert float(row_err.max()) <= 4 * doc["numerics"]["rtol"], float(row_err.max())
    zero = x.float().abs().amax(dim=1) == 0
    assert bool((got[zero] == ref[zero]).all())


def test_ties_route_to_the_lowest_expert(prefill) -> None:
    """With duplicated router rows the tactic's output equals the oracle's on routing the tie to the lowest index
    and differs clearly from a routing that sends it to the higher one."""
    entry, doc, _ = prefill
    w = weights(5, tie=True)
    x = chunk(48, 5)
    logits = (x.double() @ w.router.data.double().t()).to(torch.bfloat16)
    tw, ids = moe_route_ref(logits, K, True)
    assert bool(((ids == 3) | (ids == 5)).any())
    assert not bool(((ids == 9) & ~(ids == 3).any(dim=1, keepdim=True)).any())  # 9 only behind 3
    got = entry(doc["launch"], x=x, weights=w)
    swapped = torch.where(ids == 3, torch.full_like(ids, 9), torch.where(ids == 9, torch.full_like(ids, 3), ids))
    ref, wrong = moe_ref(x, w, routing=(tw, ids)), moe_ref(x, w, routing=(tw, swapped))
    assert rel_l2(got, ref) <= doc["numerics"]["rtol"]
    assert rel_l2(got, wrong) > 10 * rel_l2(got, ref)


def test_router_kernel_quantizes_x_as_the_oracle(prefill) -> None:
    """The router kernel's first column block writes x's E4M3 form bitwise `fp8.quantize_per_token_group` (rows past
    one 64-row block, a zero row, an outlier group), beside the logits of the plain BF16 GEMM."""
    _, _, mod = prefill
    w = weights(4)
    x = chunk(70, 4, adversarial=True)
    logits = torch.empty(70, E + 1, dtype=torch.bfloat16)
    xq = torch.empty(70, H, dtype=torch.float8_e4m3fn)
    xs = torch.empty(70, H // 128, dtype=torch.float32)
    mod._router_kernel[(-(-(E + 1) // 64), 2)](x, w.router.data, w.shared_gate.data, logits, xq, xs, 70, E, H,
                                               BLOCK_M=64, BLOCK_N=64, BLOCK_K=64)
    q_ref, s_ref = fp8.quantize_per_token_group(x)
    assert torch.equal(xq.view(torch.uint8), q_ref.view(torch.uint8)) and torch.equal(xs, s_ref)
    ref = (x.double() @ torch.cat([w.router.data, w.shared_gate.data]).double().t()).to(torch.bfloat16)
    assert rel_l2(logits, ref) <= 1e-2


def tile_table_ref(ids: torch.Tensor, experts: int, block_m: int, max_tiles: int) -> tuple[torch.Tensor, ...]:
    """The sort/align in plain PyTorch: a stable argsort of the routes' expert ids, and per tile of ``block_m`` sorted
    rows of one expert (in expert order) its expert (-1 past the last tile), first sorted row and row count."""
    flat = ids.reshape(-1).long()
    order = torch.argsort(flat, stable=True)
    counts = torch.bincount(flat, minlength=experts + 1)
    seg = torch.cumsum(counts, 0) - counts
    t_exp, t_row, t_cnt = (torch.full((max_tiles,), v, dtype=torch.int64) for v in (-1, 0, 0))
    j = 0
    for e in range(experts + 1):
        for r0 in range(0, int(counts[e]), block_m):
            t_exp[j], t_row[j], t_cnt[j] = e, int(seg[e]) + r0, min(block_m, int(counts[e]) - r0)
            j += 1
    return order, t_exp, t_row, t_cnt, j


@pytest.mark.parametrize("experts,top_k,tokens,block_m", [(16, 4, 97, 16), (256, 8, 300, 64), (256, 8, 5, 64)])
def test_route_align_is_the_oracles_routing_and_a_stable_sort(prefill, experts: int, top_k: int, tokens: int,
                                                               block_m: int) -> None:
    """`route_align` on the device against plain PyTorch: the oracle's ids (ties to the lowest expert) and FP32
    weights (`moe_route_ref`: softmax gathered and renormalised; the shared expert's sigmoid as route k), the route
    order bitwise a stable argsort (several blocks of the scatter kernel, a partial last block), the tile table and
    the token of every sorted row."""
    _, _, mod = prefill
    g = torch.Generator().manual_seed(tokens)
    logits = (torch.randn(tokens, experts + 1, generator=g) * 3).bfloat16()
    logits[::3, 1] = logits[::3, experts - 2]  # ties: the lower expert first
    logits[1::4, :experts] = logits[1::4, :1]  # a row of all-equal logits: experts 0..k-1
    s = top_k + 1
    max_tiles = -(-tokens * s // block_m) + experts + 1
    rw, order, tok, t_exp, t_row, t_cnt = mod.route_align(logits, experts, top_k, True, block_m, max_tiles)
    w_ref, ids_ref = moe_route_ref(logits[:, :experts], top_k, True)
    ids_all = torch.cat([ids_ref, torch.full((tokens, 1), experts)], dim=1)
    w_all = torch.cat([w_ref, torch.sigmoid(logits[:, experts].float())[:, None]], dim=1)
    o_ref, e_ref, r_ref, c_ref, used = tile_table_ref(ids_all, experts, block_m, max_tiles)
    assert torch.equal(order.long(), o_ref)  # implies the ids: a route sorts where its expert's segment is
    assert torch.equal(tok.long(), o_ref // s)
    assert torch.allclose(rw.view(tokens, s), w_all, rtol=2e-6, atol=0)
    assert torch.equal(t_exp.long(), e_ref)
    assert torch.equal(t_row[:used].long(), r_ref[:used]) and torch.equal(t_cnt.long(), c_ref)
    assert torch.equal(ids_all.reshape(-1)[o_ref], torch.sort(ids_all.reshape(-1)).values)


def test_contract_covers_prefill_chunks_only() -> None:
    """Through dispatch at experiment maturity: 129..8192 eager tokens of the full shape select moe_block_prefill;
    128 tokens keep the decode contract; a capture and 8193 tokens are outside it."""
    cat = Catalog.load()
    base = dict(explain_signatures())["block, prefill chunk of 2048 tokens"]

    def pick(tokens: int, phase: str = "eager") -> str | None:
        dims = tuple((k, tokens if k == "tokens" else v) for k, v in base.dims)
        sig = dataclasses.replace(base, dims=dims, graph_phase=phase)
        d = plan(sig, cat, "experiment")
        return d.contract.name if d.contract is not None else None

    assert pick(129) == pick(2048) == pick(8192) == "moe_block_prefill"
    assert pick(128) == "moe_block_stream_fold"
    assert pick(8193) is None and pick(2048, "capture") is None
