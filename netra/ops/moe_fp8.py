"""MoE with FP8 block-scaled experts: plain-PyTorch references of the routed path (the oracles of the sm90
tactics' routed experts; the whole block's oracle is netra/ops/moe.py moe_ref).

Shapes (Qwen3.6-35B-A3B class): hidden 2048, 256 routed experts top-8 (width 512) + 1 shared expert
gated by sigmoid(w_gate . x). Expert weights are E4M3 with one FP32 scale per 128x128 block:

    w13 [E, 1024, 2048] e4m3 (rows [0, 512) gate, [512, 1024) up), w13_scale [E, 8, 16] fp32
    w2  [E, 2048, 512]  e4m3,                                       w2_scale  [E, 16, 4] fp32

(``moe_routed_ref`` takes the shared expert as expert index 256 of a 257-expert stack when ``shared_w``
is given.)

Numerics (the sm90 kernels in kernels/sm90/moe/ follow them; see docs/moe.md):
  * activations are quantized per token in groups of 128: scale = max(amax, 1e-10) / 448, q =
    e4m3(clamp(v / scale, +-448)), both divisions IEEE (tensor / tensor, never a reciprocal);
  * SiLU(gate) * up in FP32, rounded once to BF16, then quantized (``act_quant_ref``);
  * router logits are BF16 (FP32 dot products rounded once), the top-8 is taken on them with
    ties to the LOWEST expert index, and the weights are the softmax renormalised over the 8;
  * the shared expert's weight is sigmoid of its BF16 gate logit, in FP32;
  * expert GEMMs accumulate in FP32 per 128-wide K block, scaled by weight-block * token-group
    scale; gate_up is rounded to BF16 before SiLU*up; each route's down output times its weight is
    rounded to BF16; the routes are summed in FP32 in rank order (shared expert last) and
    rounded once to BF16 (the engine's netra/ops/moe.py:moe_ref does the same).

References import no kernel code and run on the CPU or the GPU.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

HIDDEN = 2048
INTER = 512
NUM_EXPERTS = 256
TOPK = 8
GROUP = 128
FP8_MAX = 448.0
AMAX_EPS = 1e-10
ROUTE_STRIDE = 9  # y rows per token: 8 routed ranks + the shared expert
MAX_TOKENS = 128


class MoeShapeError(ValueError):
    """An input whose shape, dtype or range the MoE op does not cover."""


def _torch() -> object:
    import torch

    return torch


def quant_group_ref(v: torch.Tensor, group: int = GROUP) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-row group quantization of ``v`` [R, C] (C % group == 0) -> (e4m3 [R, C], fp32 [R, C/group])."""
    import torch

    if v.dim() != 2 or v.shape[1] % group:
        raise MoeShapeError(f"quant_group_ref needs [rows, k*{group}], got {tuple(v.shape)}")
    r, c = v.shape
    f = v.float().reshape(r, c // group, group)
    amax = f.abs().amax(dim=-1).clamp(min=AMAX_EPS)
    scale = amax / torch.full_like(amax, FP8_MAX)  # tensor division: IEEE, as in the kernel
    q = (f / scale.unsqueeze(-1)).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn)
    return q.reshape(r, c), scale


def dequant_group_ref(q: torch.Tensor, scale: torch.Tensor, group: int = GROUP) -> torch.Tensor:
    r, c = q.shape
    return (q.float().reshape(r, c // group, group) * scale.unsqueeze(-1)).reshape(r, c)


def silu_mul_ref(gu: torch.Tensor) -> torch.Tensor:
    """SiLU(gate) * up in FP32 rounded to BF16; ``gu`` [R, 2*I] holds gate then up."""
    import torch
    import torch.nn.functional as F

    if gu.dim() != 2 or gu.shape[1] % 2:
        raise MoeShapeError(f"silu_mul_ref needs [rows, 2*width], got {tuple(gu.shape)}")
    i = gu.shape[1] // 2
    return (F.silu(gu[:, :i].float()) * gu[:, i:].float()).to(torch.bfloat16)


def act_quant_ref(gu: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The two-step reference of the fused kernel: silu_mul_ref, then quant_group_ref."""
    return quant_group_ref(silu_mul_ref(gu))


def quant_weight_blocks_ref(w: torch.Tensor, block: int = GROUP) -> tuple[torch.Tensor, torch.Tensor]:
    """[..., N, K] real weights -> (e4m3 [..., N, K], fp32 [..., N/128, K/128]) one scale per block."""
    import torch

    *lead, n, k = w.shape
    if n % block or k % block:
        raise MoeShapeError(f"weight [{n}, {k}] is not a multiple of {block}x{block} blocks")
    f = w.float().reshape(*lead, n // block, block, k // block, block)
    amax = f.abs().amax(dim=(-3, -1)).clamp(min=AMAX_EPS)
    scale = amax / torch.full_like(amax, FP8_MAX)
    q = (f / scale[..., :, None, :, None]).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn)
    return q.reshape(*lead, n, k), scale


def dequant_weight_blocks_ref(q: torch.Tensor, scale: torch.Tensor, block: int = GROUP) -> torch.Tensor:
    *lead, n, k = q.shape
    f = q.float().reshape(*lead, n // block, block, k // block, block)
    return (f * scale[..., :, None, :, None]).reshape(*lead, n, k)


def router_logits_ref(x: torch.Tensor, w_router: torch.Tensor,
                      w_shared_gate: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor | None]:
    """BF16 router logits [M, 256] (FP32 dots rounded once) and the BF16 shared-gate logit [M]."""
    import torch

    xf = x.double()
    logits = (xf @ w_router.double().t()).float().to(torch.bfloat16)
    shared = None
    if w_shared_gate is not None:
        shared = (xf @ w_shared_gate.double()).float().to(torch.bfloat16)
    return logits, shared


def route_ref(logits: torch.Tensor, shared_logit: torch.Tensor | None = None,
              topk: int = TOPK) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """Top-k of BF16 logits [M, E]: (ids int32 [M, k], renormalised fp32 weights, shared fp32 [M]).

    Ranking is by logit value (equivalently the exact softmax), ties to the lowest expert index:
    a stable descending sort keeps equal values in index order.
    """
    import torch

    if logits.dim() != 2 or logits.dtype != torch.bfloat16:
        raise MoeShapeError(f"route_ref needs BF16 [tokens, experts], got {logits.dtype} {tuple(logits.shape)}")
    lf = logits.float()
    order = torch.sort(lf, dim=-1, descending=True, stable=True).indices[:, :topk]
    probs = torch.softmax(lf.double(), dim=-1)
    top = torch.gather(probs, 1, order)
    weights = (top / top.sum(dim=-1, keepdim=True)).float()
    shared = None
    if shared_logit is not None:
        shared = torch.sigmoid(shared_logit.float())
    return order.to(torch.int32), weights, shared


def moe_routed_ref(x: torch.Tensor, ids: torch.Tensor, weights: torch.Tensor,
                   w13: torch.Tensor, w13_scale: torch.Tensor, w2: torch.Tensor, w2_scale: torch.Tensor,
                   shared_w: torch.Tensor | None = None) -> torch.Tensor:
    """FP32 reference of the routed (+ optional shared, as expert 256) MoE emulating the FP8 path.

    x [M, 2048] BF16; ids/weights [M, 8]; shared_w [M] or None. Returns BF16 [M, 2048].
    """
    import torch

    m = x.shape[0]
    xq, xs = quant_group_ref(x)
    xd = dequant_group_ref(xq, xs)
    ids_l, w_l = ids.tolist(), weights.tolist()
    routes = [(t, int(ids_l[t][r]), float(w_l[t][r])) for t in range(m) for r in range(ids.shape[1])]
    if shared_w is not None:
        routes += [(t, NUM_EXPERTS, float(w)) for t, w in enumerate(shared_w.tolist())]
    y = torch.zeros(m, ROUTE_STRIDE, HIDDEN, dtype=torch.float32, device=x.device)
    experts = sorted({e for _, e, _ in routes})
    for e in experts:
        toks = [(t, w, i) for i, (t, ee, w) in enumerate(routes) if ee == e]
        tt = torch.tensor([t for t, _, _ in toks], device=x.device)
        w13d = dequant_weight_blocks_ref(w13[e], w13_scale[e])
        gu = (xd[tt] @ w13d.t()).to(torch.bfloat16)  # SGLang's BF16 gate_up cache
        hq, hs = act_quant_ref(gu)
        w2d = dequant_weight_blocks_ref(w2[e], w2_scale[e])
        ye = dequant_group_ref(hq, hs) @ w2d.t()
        for j, (t, w, i) in enumerate(toks):
            slot = i % ids.shape[1] if i < m * ids.shape[1] else TOPK
            y[t, slot] = (ye[j] * w).to(torch.bfloat16).float()  # each route rounded to BF16
    n_slots = ids.shape[1] + (1 if shared_w is not None else 0)
    out = y[:, 0].clone()
    for s in range(1, n_slots):
        out = out + y[:, s]
    return out.to(torch.bfloat16)
