from __future__ import annotations

import torch

from netra.ops import fp8
from netra.ops.linear import Weight
from netra.ops.moe import MoEWeights, moe, moe_dense_ref, moe_ref, moe_route_ref


def _weights(e: int = 8, h: int = 128, inter: int = 128, sh: int = 128, k: int = 2, quant: bool = True,
             seed: int = 0) -> tuple[MoEWeights, dict[str, torch.Tensor]]:
    g = torch.Generator().manual_seed(seed)
    raw = {"router": torch.randn(e, h, generator=g) / h ** 0.5, "w13": torch.randn(e, 2 * inter, h, generator=g) / h ** 0.5,
           "w2": torch.randn(e, h, inter, generator=g) / inter ** 0.5, "sw13": torch.randn(2 * sh, h, generator=g) / h ** 0.5,
           "sw2": torch.randn(h, sh, generator=g) / sh ** 0.5, "sg": torch.randn(1, h, generator=g) / h ** 0.5}

    def proj(name: str) -> Weight:
        if quant:
            q, s = fp8.block_quantize_weight(raw[name])
            return Weight(q, s)
        return Weight(raw[name].bfloat16())

    w = MoEWeights(router=Weight(raw["router"].bfloat16()), w13=proj("w13"), w2=proj("w2"), shared_w13=proj("sw13"),
                   shared_w2=proj("sw2"), shared_gate=Weight(raw["sg"].bfloat16()), top_k=k, renormalize=True)
    return w, raw


def _deq(w: Weight, e: int | None = None) -> torch.Tensor:
    data = w.data if e is None else w.data[e]
    if not w.is_fp8:
        return data.double()
    s = w.scale_inv if e is None else w.scale_inv[e]
    return fp8.block_dequantize_weight(data, s, dtype=torch.float64)


def _per_token_oracle(x: torch.Tensor, w: MoEWeights) -> torch.Tensor:
    """The deployed arithmetic written token by token, route by route (no grouping, no scatter)."""
    out = torch.empty_like(x)
    for t in range(x.shape[0]):
        xt = x[t:t + 1]
        logits = (xt.double() @ w.router.data.double().t()).bfloat16()
        p = torch.softmax(logits.float(), -1)[0]
        top = torch.topk(p, w.top_k)  # no ties among random logits
        weights = top.values / top.values.sum()
        sg = torch.sigmoid((xt.double() @ w.shared_gate.data.double().t()).bfloat16().float())[0, 0]
        routes = [(_deq(w.w13, int(e)), _deq(w.w2, int(e)), weights[j]) for j, e in enumerate(top.indices)]
        routes.append((_deq(w.shared_w13), _deq(w.shared_w2), sg))
        acc = torch.zeros(x.shape[1], dtype=torch.float32)
        for w13, w2, rw in routes:
            xa = fp8.fake_quantize_per_token_group(xt, dtype=torch.float64)
            gu = (xa @ w13.t()).bfloat16()
            half = w13.shape[0] // 2
            act = (torch.nn.functional.silu(gu[:, :half].float()) * gu[:, half:].float()).bfloat16()
            down = fp8.fake_quantize_per_token_group(act, dtype=torch.float64) @ w2.t()
            acc += (down.float() * rw).bfloat16()[0].float()
        out[t] = acc.bfloat16()
    return out


def test_route_softmax_topk_renormalised() -> None:
    logits = torch.tensor([[1.0, 3.0, 2.0, -1.0], [0.0, 0.0, 5.0, 0.1]]).bfloat16()
    w, ids = moe_route_ref(logits, 2, True)
    assert ids.tolist() == [[1, 2], [2, 3]]
    p = torch.softmax(logits.float(), -1)
    assert torch.allclose(w[0], p[0, [1, 2]] / p[0, [1, 2]].sum())
    assert torch.allclose(w.sum(-1), torch.ones(2))
    w2, _ = moe_route_ref(logits, 2, False)
    assert torch.allclose(w2[1], p[1, [2, 3]])
    # ties go to the lowest expert index
    tied = torch.tensor([[0.5, 2.0, 2.0, 2.0, -1.0]]).bfloat16()
    _, tie_ids = moe_route_ref(tied, 2, True)
    assert tie_ids.tolist() == [[1, 2]]


def test_moe_matches_token_by_token_oracle_bitwise() -> None:
    w, _ = _weights()
    x = torch.randn(13, 128, generator=torch.Generator().manual_seed(5)).bfloat16()
    got = moe(x, w)
    assert got.dtype == torch.bfloat16
    assert torch.equal(got, _per_token_oracle(x, w))
    # a row's result does not depend on the other rows; the grouped and dense forms agree bitwise
    assert torch.equal(moe(x[4:5], w), got[4:5])
    assert torch.equal(moe_ref(x, w), got) and torch.equal(moe_dense_ref(x, w), got)
    for p in (w.w13, w.w2, w.shared_w13, w.shared_w2, w.router, w.shared_gate):  # cached copies: same numbers
        p.dequantized(torch.float64)
    assert torch.equal(moe_ref(x, w), got) and torch.equal(moe_dense_ref(x, w), got)


def test_moe_close_to_unquantized_math() -> None:
    w, raw = _weights(quant=True, seed=3)
    x = torch.randn(6, 128, generator=torch.Generator().manual_seed(9)).bfloat16()
    got = moe(x, w).double()
    xd = x.double()
    ref = torch.zeros_like(xd)
    p = torch.softmax(xd @ raw["router"].bfloat16().double().t(), -1)
    top = torch.topk(p, 2)

    def mlp(w13: torch.Tensor, w2: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        gu = v @ w13.double().t()
        half = w13.shape[0] // 2
        return (torch.nn.functional.silu(gu[:, :half]) * gu[:, half:]) @ w2.double().t()

    for t in range(6):
        wt = top.values[t] / top.values[t].sum()
        for j, e in enumerate(top.indices[t].tolist()):
            ref[t] += wt[j] * mlp(raw["w13"][e], raw["w2"][e], xd[t:t + 1])[0]
        ref[t] += torch.sigmoid(xd[t] @ raw["sg"].bfloat16().double()[0]) * mlp(raw["sw13"], raw["sw2"], xd[t:t + 1])[0]
    assert (got - ref).abs().max() < 0.08 * ref.abs().max()
