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

from netra import dispatch
from netra.contract import Signature
from netra.ops import fp8
from netra.ops._common import acc_dtype, bind, route
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


def routing_agreement(logits: torch.Tensor, ids: torch.Tensor, ref_ids: torch.Tensor) -> dict[str, int]:
    """Compare a tactic's top-k ``ids`` with the reference's on the reference's BF16 ``logits`` [T, E]: rows
    whose expert sets differ, and of those, how many are near-ties (every expert in either set but not both has
    a logit within one BF16 ulp of the k-th largest: FP32 dot products summed in another order may round the
    other way there). A difference that is not a near-tie is a routing error."""
    lf = logits.float()
    kth = torch.sort(lf, dim=-1, descending=True).values[:, ids.shape[1] - 1]
    ulp = torch.clamp(kth.abs(), min=2.0 ** -126) * 2.0 ** -7
    differ = near = 0
    for t in range(ids.shape[0]):
        a, b = set(ids[t].tolist()), set(ref_ids[t].tolist())
        if a == b:
            continue
        differ += 1
        if all(abs(float(lf[t, e]) - float(kth[t])) <= float(ulp[t]) for e in a ^ b):
            near += 1
    return {"rows": int(ids.shape[0]), "rows_differ": differ, "near_ties": near, "errors": differ - near}


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


def moe_ref(x: torch.Tensor, w: MoEWeights,
            routing: tuple[torch.Tensor, torch.Tensor] | None = None) -> torch.Tensor:
    """``x [T, H]`` BF16 -> ``[T, H]`` BF16 (see the module docstring for the exact arithmetic).

    ``routing`` = (weights FP32 [T, k], ids [T, k]) replaces step 1 (an oracle check uses it to judge the
    experts' arithmetic apart from the routing, which `routing_agreement` judges)."""
    acc = acc_dtype(x.device)
    t, k = x.shape[0], w.top_k
    if routing is None:
        weights, ids = moe_route_ref(linear_ref(x, w.router, torch.bfloat16), k, w.renormalize)
    else:
        weights, ids = routing[0].float(), routing[1].long()
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
BLOCK_OP, ROUTED_OP = "moe_fp8_block", "moe_fp8_routed"
FP8_QUANT = "fp8_e4m3_block128"


def _block_call(x: torch.Tensor, w: MoEWeights) -> tuple[str, dict[str, torch.Tensor], dict[str, int], str]:
    """(op, tensors, dims, quant) of the block call: what dispatch matches against the contracts."""
    fp8_ = w.w13.is_fp8
    tensors = {"x": x, "router": w.router.data, "w13": w.w13.data, "w2": w.w2.data,
               "shared_w13": w.shared_w13.data, "shared_w2": w.shared_w2.data, "shared_gate": w.shared_gate.data}
    dims = {"tokens": x.shape[0], "hidden": x.shape[1], "experts": w.num_experts, "top_k": w.top_k,
            "inter": w.w2.in_features, "shared_inter": w.shared_w2.in_features, "norm_topk": int(w.renormalize)}
    return (BLOCK_OP if fp8_ else "moe_bf16"), tensors, dims, (FP8_QUANT if fp8_ else "none")


def block_signature(x: torch.Tensor, w: MoEWeights, graph_phase: str | None = None) -> Signature:
    op, tensors, dims, quant = _block_call(x, w)
    return Signature.of(op=op, tensors=tensors, params=dims, quant=quant, reduction_order="fixed",
                        graph_phase=graph_phase)


def routed_signature(x: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor, topk_ids: torch.Tensor,
                     topk_w: torch.Tensor, graph_phase: str | None = None) -> Signature:
    """The routed-experts call (SGLang's ``fused_experts``): x [T, H] BF16, w13 [E, 2I, H] / w2 [E, H, I] E4M3,
    top-k ids int32 / weights FP32 [T, k]."""
    return Signature.of(op=ROUTED_OP, tensors={"x": x, "w13": w13, "w2": w2, "topk_ids": topk_ids, "topk_w": topk_w},
                        params={"tokens": x.shape[0], "hidden": x.shape[1], "experts": w13.shape[0],
                                "top_k": topk_ids.shape[1], "inter": w2.shape[2]},
                        quant=FP8_QUANT, reduction_order="fixed", graph_phase=graph_phase)


def graph_blocker(w: MoEWeights, tokens: int, device: torch.device) -> str | None:
    """Why a decode call of ``tokens`` rows cannot be captured in a CUDA graph, or None: a tactic can (it
    never synchronises), the dense fallback can; the grouped fallback reads per-expert counts on the host."""
    x = torch.empty(tokens, w.router.in_features, dtype=torch.bfloat16, device=device)
    decision = dispatch.select(block_signature(x, w, graph_phase="capture"))
    if decision.tactic is not None or w.num_experts <= DENSE_FALLBACK_MAX_EXPERTS:
        return None
    return (f"the MoE fallback for {w.num_experts} experts synchronises with the host (grouped per-expert loop): "
            f"{decision.reason}")


def moe(x: torch.Tensor, w: MoEWeights) -> torch.Tensor:
    """The model's MoE block ``x [T, H] BF16 -> [T, H] BF16`` through dispatch (op ``moe_fp8_block``).

    Tactics (sm90): ``moe_block_t1`` (1 token), ``moe_block_stream`` (2..128): router + top-8 + routed experts
    + the gated shared expert (docs/moe.md); ``moe_block_prefill`` (129..8192, eager: the Triton grouped GEMMs of
    kernels/sm90/moe/moe_prefill.py). Fallback: `moe_dense_ref` for small ``tokens · experts``, `moe_ref`
    otherwise (identical arithmetic); calls outside every contract (another shape, dtype, layout, more than 8192
    tokens) get it with the reason logged once."""
    op, tensors, dims, quant = _block_call(x, w)
    hit = route(op, tensors, dims, quant=quant, reduction_order="fixed")
    if hit is not None:
        return hit[0](hit[1], x=x, weights=w)
    if w.num_experts <= DENSE_FALLBACK_MAX_EXPERTS and x.shape[0] * w.num_experts <= DENSE_FALLBACK_MAX_PAIRS:
        return moe_dense_ref(x, w)
    return moe_ref(x, w)


def moe_routed(x: torch.Tensor, w13: torch.Tensor, w13_scale: torch.Tensor, w2: torch.Tensor, w2_scale: torch.Tensor,
               topk_ids: torch.Tensor, topk_w: torch.Tensor) -> torch.Tensor:
    """The routed experts from given top-k (op ``moe_fp8_routed``; SGLang's ``fused_experts`` through the plugin):
    ``[T, H]`` BF16. Tactics: ``moe_routed_t1`` / ``moe_routed_stream``; fallback `moe_routed_ref`."""
    tensors = {"x": x, "w13": w13, "w2": w2, "topk_ids": topk_ids, "topk_w": topk_w}
    dims = {"tokens": x.shape[0], "hidden": x.shape[1], "experts": w13.shape[0], "top_k": topk_ids.shape[1],
            "inter": w2.shape[2]}
    hit = route(ROUTED_OP, tensors, dims, quant=FP8_QUANT, reduction_order="fixed")
    if hit is not None:
        return hit[0](hit[1], x=x, w13=w13, w13_scale=w13_scale, w2=w2, w2_scale=w2_scale, topk_ids=topk_ids,
                      topk_w=topk_w)
    from netra.ops.moe_fp8 import moe_routed_ref

    return moe_routed_ref(x, topk_ids, topk_w, w13, w13_scale, w2, w2_scale)


def _launch_block(decision: dispatch.Decision, **kw: object) -> torch.Tensor:
    from netra.ops import moe_sm90

    if getattr(decision.tactic, "obj", None) is not None and decision.tactic.obj.kind == "triton":  # type: ignore[union-attr]
        from netra.ops._triton import launch_tactic

        return launch_tactic(decision, **kw)  # type: ignore[no-any-return]  # moe_block_prefill

    return moe_sm90.launch_block(decision, **kw)  # type: ignore[arg-type]


def _launch_routed(decision: dispatch.Decision, **kw: object) -> torch.Tensor:
    from netra.ops import moe_sm90

    return moe_sm90.launch_routed(decision, **kw)  # type: ignore[arg-type]


bind(BLOCK_OP, _launch_block)
bind(ROUTED_OP, _launch_routed)


def explain_signatures() -> list[tuple[str, Signature]]:
    """`netra explain`: the Qwen3.6 MoE block at each decode size (which contract serves which token range),
    and calls outside every contract."""
    def sig(op: str, tokens: int, phase: str = "capture", target: str = "sm90", experts: int = 256,
            x_dtype: str = "bfloat16", layout: str = "contiguous_align16", shared: int = 512) -> Signature:
        dims = {"tokens": tokens, "hidden": 2048, "experts": experts, "top_k": 8, "inter": 512}
        if op == BLOCK_OP:
            dims |= {"shared_inter": shared, "norm_topk": 1}
            names = {"x": x_dtype, "router": "bfloat16", "w13": "float8_e4m3fn", "w2": "float8_e4m3fn",
                     "shared_w13": "float8_e4m3fn", "shared_w2": "float8_e4m3fn", "shared_gate": "bfloat16"}
        else:
            names = {"x": x_dtype, "w13": "float8_e4m3fn", "w2": "float8_e4m3fn", "topk_ids": "int32",
                     "topk_w": "float32"}
        return Signature(target=target, op=op, dims=tuple(sorted(dims.items())), dtypes=tuple(sorted(names.items())),
                         layouts=tuple(sorted((k, layout if k == "x" else "contiguous_align16") for k in names)),
                         quant=FP8_QUANT, reduction_order="fixed", graph_phase=phase)

    out = [(f"block, {t} token(s)", sig(BLOCK_OP, t)) for t in (1, 2, 8, 64, 128)]
    out += [("block, prefill chunk of 2048 tokens", sig(BLOCK_OP, 2048, phase="eager")),
            ("block, prefill chunk of 16384 tokens", sig(BLOCK_OP, 16384, phase="eager")),
            ("block, 128 experts", sig(BLOCK_OP, 8, experts=128)),
            ("block, no shared expert", sig(BLOCK_OP, 8, shared=0)),
            ("block, strided x", sig(BLOCK_OP, 8, layout="strided")),
            ("block, float16 x", sig(BLOCK_OP, 8, x_dtype="float16")),
            ("block, cpu", sig(BLOCK_OP, 8, target="cpu"))]
    out += [(f"routed (SGLang fused_experts), {t} token(s)", sig(ROUTED_OP, t)) for t in (1, 16, 128)]
    out += [("routed, 256 tokens", sig(ROUTED_OP, 256, phase="eager"))]
    return out
