"""Sparse MoE block: softmax router, top-k with renormalisation, FP8 SiLU-gated experts, a gated shared expert.

`moe_ref` is the layer oracle of the deployed numerics (SGLang's FP8 fused-MoE path), step by step:

1. router logits ``x @ Wrᵀ`` rounded to BF16; softmax in FP32; top-k; renormalised to sum 1 when
   ``norm_topk_prob`` (FP32 weights).
2. shared-expert gate ``sigmoid(bf16(x · w_sg))`` in FP32, written as one more route: the shared
   expert is route k (after the k routed ones) with that weight. This is the route-metadata form a
   fused kernel uses; the result equals ``routed + sigmoid(x·w_sg)·shared`` up to where rounding happens.
3. per route: ``x`` quantized per token in groups of 128 (E4M3, FP32 scale); gate_up GEMM against
   the expert's E4M3 ``w13 [2I, H]`` (128x128 block scales) accumulated in FP32, rounded to BF16;
   ``SiLU(gate)·up`` in FP32 rounded to BF16; quantized again per token-group; down GEMM against
   ``w2 [H, I]``, accumulated in FP32, multiplied by the route weight in FP32 and rounded to BF16.
4. the k+1 route outputs are summed in FP32 in route order and rounded once to BF16.

Expert weights are stacked: ``w13 [E, 2I, H]`` (gate rows first, then up) with scales
``[E, 2I/128, H/128]``, ``w2 [E, H, I]`` with ``[E, H/128, I/128]``; I must be a multiple of 128
so the gate/up halves are whole scale blocks.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from netra.ops import fp8
from netra.ops._common import acc_dtype, route
from netra.ops.linear import Weight, linear_ref


@dataclass
class MoEWeights:
    router: Weight  # [E, H] BF16
    w13: Weight  # [E, 2I, H] E4M3 (or BF16)
    w2: Weight  # [E, H, I]
    shared_w13: Weight  # [2Is, H]
    shared_w2: Weight  # [H, Is]
    shared_gate: Weight  # [1, H] BF16
    top_k: int
    renormalize: bool

    @property
    def num_experts(self) -> int:
        return int(self.router.out_features)


_fp8_stacks: dict[int, tuple[MoEWeights, tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]]] = {}


def stack_shared_expert(w: MoEWeights) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """The kernels' layout (netra/ops/moe_fp8.py): routed experts with the shared expert appended as
    expert E: ``(w13 [E+1, 2I, H], w13_scale [E+1, 2I/128, H/128], w2 [E+1, H, I], w2_scale)``,
    E4M3 data and FP32 scales, built once per layer (the copy costs one expert's worth of memory)."""
    hit = _fp8_stacks.get(id(w))
    if hit is not None and hit[0] is w:
        return hit[1]
    parts = (w.w13, w.w2, w.shared_w13, w.shared_w2)
    if not all(p.is_fp8 and p.scale_inv is not None for p in parts):
        raise ValueError("stack_shared_expert needs FP8 block-scaled expert and shared-expert weights")
    if w.shared_w13.data.shape != w.w13.data.shape[1:] or w.shared_w2.data.shape != w.w2.data.shape[1:]:
        raise ValueError(f"shared expert {tuple(w.shared_w13.data.shape)} does not match the experts' "
                         f"{tuple(w.w13.data.shape[1:])}")
    assert w.w13.scale_inv is not None and w.shared_w13.scale_inv is not None
    assert w.w2.scale_inv is not None and w.shared_w2.scale_inv is not None
    out = (torch.cat([w.w13.data, w.shared_w13.data[None]]), torch.cat([w.w13.scale_inv, w.shared_w13.scale_inv[None]]),
           torch.cat([w.w2.data, w.shared_w2.data[None]]), torch.cat([w.w2.scale_inv, w.shared_w2.scale_inv[None]]))
    _fp8_stacks[id(w)] = (w, out)
    return out


def moe_route_ref(router_logits: torch.Tensor, top_k: int, renormalize: bool
                  ) -> tuple[torch.Tensor, torch.Tensor]:
    """``router_logits [T, E]`` (BF16) -> (``weights [T, k]`` FP32, ``ids [T, k]`` int64), highest first.

    Ranking by logit with ties to the lowest expert index (a stable descending sort; `torch.topk`
    leaves the order of ties unspecified), the same selection as ranking the softmax; the weights
    are the FP32 softmax over all experts gathered at the k ids, renormalised to sum 1.
    """
    logits = router_logits.float()
    ids = torch.sort(logits, dim=-1, descending=True, stable=True).indices[:, :top_k]
    weights = torch.softmax(logits, dim=-1).gather(1, ids)
    if renormalize:
        weights = weights / weights.sum(dim=-1, keepdim=True)
    return weights, ids


def _expert(w: Weight, e: int | None, acc: torch.dtype) -> torch.Tensor:
    """Expert e's weight in the accumulator dtype (the cached dequantized copy when the engine made one)."""
    if w._dequant is not None and w._dequant.dtype == acc:
        return w._dequant if e is None else w._dequant[e]
    data = w.data if e is None else w.data[e]
    if not w.is_fp8:
        return data.to(acc)
    assert w.scale_inv is not None
    scale = w.scale_inv if e is None else w.scale_inv[e]
    return fp8.block_dequantize_weight(data, scale, w.block, acc)


def _act_dequant(x: torch.Tensor, fp8_act: bool, acc: torch.dtype) -> torch.Tensor:
    if not fp8_act:
        return x.to(acc)
    return fp8.fake_quantize_per_token_group(x, fp8.BLOCK, acc)


def expert_mlp_ref(x: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor, route_w: torch.Tensor,
                   fp8_act: bool) -> torch.Tensor:
    """One expert on its tokens: ``x [n, H]`` BF16, dequantized ``w13 [2I, H]``, ``w2 [H, I]`` (acc dtype),
    ``route_w [n]`` FP32 -> ``[n, H]`` BF16 = bf16(route_w · down(bf16(silu(gate)·up)))."""
    acc = w13.dtype
    inter = w13.shape[0] // 2
    gate_up = (_act_dequant(x, fp8_act, acc) @ w13.t()).to(torch.bfloat16)
    act = (torch.nn.functional.silu(gate_up[:, :inter].float()) * gate_up[:, inter:].float()).to(torch.bfloat16)
    down = _act_dequant(act, fp8_act, acc) @ w2.t()
    return (down.float() * route_w[:, None]).to(torch.bfloat16)


def moe_ref(x: torch.Tensor, w: MoEWeights) -> torch.Tensor:
    """``x [T, H]`` BF16 -> ``[T, H]`` BF16 (see the module docstring for the exact arithmetic)."""
    acc = acc_dtype(x.device)
    t, k = x.shape[0], w.top_k
    logits = linear_ref(x, w.router, torch.bfloat16)
    weights, ids = moe_route_ref(logits, k, w.renormalize)
    shared_weight = torch.sigmoid(linear_ref(x, w.shared_gate, torch.bfloat16).float())[:, 0]
    routes = torch.zeros(t, k + 1, x.shape[1], dtype=torch.bfloat16, device=x.device)
    flat_ids = ids.reshape(-1)
    order = torch.argsort(flat_ids, stable=True)  # route rows grouped by expert, token order inside
    counts = torch.bincount(flat_ids, minlength=w.num_experts).tolist()
    start = 0
    for e, n in enumerate(counts):
        if n == 0:
            continue
        rows = order[start:start + n]
        start += n
        tok, slot = rows // k, rows % k
        out = expert_mlp_ref(x[tok], _expert(w.w13, e, acc), _expert(w.w2, e, acc), weights[tok, slot],
                             w.w13.is_fp8)
        routes[tok, slot] = out
    routes[:, k] = expert_mlp_ref(x, _expert(w.shared_w13, None, acc), _expert(w.shared_w2, None, acc),
                                  shared_weight, w.shared_w13.is_fp8)
    return routes.float().sum(dim=1).to(x.dtype)


def moe_dense_ref(x: torch.Tensor, w: MoEWeights) -> torch.Tensor:
    """`moe_ref`'s arithmetic evaluated for every (token, expert) pair at once, then the routes picked.

    Same numbers as `moe_ref` (each route's values are the same dot products, accumulated in
    `acc_dtype`), a few ops instead of a loop over experts: the fallback uses it while
    ``tokens · experts`` is small (the tiny preset on a CPU), where the E/k-fold extra arithmetic
    costs less than the per-expert launches.
    """
    acc = acc_dtype(x.device)
    t, k, e = x.shape[0], w.top_k, w.num_experts
    stack = _dense_stack(w, acc)
    if stack is not None:  # router and shared-expert gate as one GEMM (the same dot products)
        both = (x.to(acc) @ stack[2]).to(torch.bfloat16)
        logits, gate_logit = both[:, :e], both[:, e:]
    else:
        logits = linear_ref(x, w.router, torch.bfloat16)
        gate_logit = linear_ref(x, w.shared_gate, torch.bfloat16)
    weights, ids = moe_route_ref(logits, k, w.renormalize)
    shared_weight = torch.sigmoid(gate_logit.float())[:, 0]
    if stack is not None:  # the shared expert is expert E of the stack: one pass for all k+1 routes
        w13, w2 = stack[0], stack[1]
        ids = torch.cat([ids, torch.full((t, 1), e, dtype=ids.dtype, device=ids.device)], dim=1)
        weights = torch.cat([weights, shared_weight[:, None]], dim=1)
    else:
        w13, w2 = _expert(w.w13, None, acc), _expert(w.w2, None, acc)  # [E, 2I, H], [E, H, I]
    n_exp, inter = w13.shape[0], w13.shape[1] // 2
    xa = _act_dequant(x, w.w13.is_fp8, acc)
    gate_up = (xa @ w13.reshape(n_exp * 2 * inter, -1).t()).to(torch.bfloat16).view(t, n_exp, 2 * inter)
    act = (torch.nn.functional.silu(gate_up[..., :inter].float()) * gate_up[..., inter:].float()).to(torch.bfloat16)
    down = torch.bmm(_act_dequant(act, w.w13.is_fp8, acc).transpose(0, 1), w2.transpose(1, 2))  # [E, T, H]
    picked = down.transpose(0, 1)[torch.arange(t, device=x.device)[:, None], ids]  # [T, routes, H]
    routes = (picked.float() * weights[:, :, None]).to(torch.bfloat16)
    if stack is None:
        shared = expert_mlp_ref(x, _expert(w.shared_w13, None, acc), _expert(w.shared_w2, None, acc),
                                shared_weight, w.shared_w13.is_fp8)
        routes = torch.cat([routes, shared[:, None]], dim=1)
    return routes.float().sum(dim=1).to(x.dtype)


_stacks: dict[tuple[int, int], tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = {}


def _dense_stack(w: MoEWeights, acc: torch.dtype) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None:
    """Routed experts plus the shared expert as one ``[E+1, ...]`` stack of the cached dequantized
    weights, and ``[router; shared gate]ᵀ`` (only when the engine cached them all and the widths
    agree); built once per layer."""
    parts = (w.w13, w.w2, w.shared_w13, w.shared_w2, w.router, w.shared_gate)
    if any(p._dequant is None or p._dequant.dtype != acc for p in parts) or \
            w.shared_w13.out_features != w.w13.data.shape[-2] or \
            len({p.is_fp8 for p in parts[:4]}) != 1:
        return None
    key = (id(w.w13._dequant), id(w.shared_w13._dequant))
    stack = _stacks.get(key)
    if stack is None:
        assert w.w13._dequant is not None and w.w2._dequant is not None
        assert w.shared_w13._dequant is not None and w.shared_w2._dequant is not None
        assert w.router._dequant is not None and w.shared_gate._dequant is not None
        stack = (torch.cat([w.w13._dequant, w.shared_w13._dequant[None]]),
                 torch.cat([w.w2._dequant, w.shared_w2._dequant[None]]),
                 torch.cat([w.router._dequant, w.shared_gate._dequant]).t().contiguous())
        _stacks[key] = stack
    return stack


# The fallback evaluates every expert densely while tokens·experts stays below this and the expert
# count is small (it dequantizes the whole expert stack: fine for 8 experts, not for 256).
DENSE_FALLBACK_MAX_PAIRS = 2048
DENSE_FALLBACK_MAX_EXPERTS = 64


def fallback_is_graph_safe(w: MoEWeights) -> bool:
    """Whether the fallback of a decode-sized call can be captured in a CUDA graph: the dense form
    can (no host synchronisation); the grouped form reads per-expert counts on the host."""
    return w.num_experts <= DENSE_FALLBACK_MAX_EXPERTS


def moe(x: torch.Tensor, w: MoEWeights) -> torch.Tensor:
    """The MoE block through dispatch (op ``moe_fp8_block``); fallback `moe_dense_ref` for small
    ``tokens · experts``, `moe_ref` otherwise (identical arithmetic)."""
    hit = route("moe_fp8_block" if w.w13.is_fp8 else "moe_bf16", {"x": x, "w13": w.w13.data, "w2": w.w2.data},
                {"tokens": x.shape[0], "hidden": x.shape[1], "experts": w.num_experts, "top_k": w.top_k,
                 "inter": w.w2.in_features}, quant="fp8_e4m3_block128" if w.w13.is_fp8 else "none")
    if hit is not None:
        return hit[0](hit[1], x=x, weights=w)
    if w.num_experts <= DENSE_FALLBACK_MAX_EXPERTS and x.shape[0] * w.num_experts <= DENSE_FALLBACK_MAX_PAIRS:
        return moe_dense_ref(x, w)
    return moe_ref(x, w)
