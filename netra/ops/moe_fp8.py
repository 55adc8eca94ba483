"""MoE decode path with FP8 block-scaled experts: plain-PyTorch references (the oracles).

Shapes (Qwen3.6-35B-A3B class): hidden 2048, 256 routed experts top-8 + 1 shared expert (width
512) gated by sigmoid(w_gate . x). Expert weights are E4M3 with one FP32 scale per 128x128 block,
stored with the shared expert appended as expert index 256:

    w13 [257, 1024, 2048] e4m3 (rows [0, 512) gate, [512, 1024) up), w13_scale [257, 8, 16] fp32
    w2  [257, 2048, 512]  e4m3,                                       w2_scale  [257, 16, 4] fp32

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

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

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


@dataclass(frozen=True)
class RouteMetaRef:
    """Expected route metadata (see kernels/sm90/moe/route.cu for the order)."""

    slot_expert: list[int]
    slot_start: list[int]
    route_token: list[int]
    route_dst: list[int]
    route_w: list[float]


def route_meta_ref(ids: torch.Tensor, weights: torch.Tensor, shared_w: torch.Tensor | None) -> RouteMetaRef:
    """Group routes by expert (increasing id, shared expert last), tokens increasing inside one."""
    m, k = ids.shape
    ids_l = ids.tolist()
    w_l = weights.tolist()
    by_expert: dict[int, list[tuple[int, int, float]]] = {}
    for t in range(m):
        for r in range(k):
            by_expert.setdefault(int(ids_l[t][r]), []).append((t, t * ROUTE_STRIDE + r, float(w_l[t][r])))
    if shared_w is not None:
        sw = shared_w.tolist()
        by_expert[NUM_EXPERTS] = [(t, t * ROUTE_STRIDE + TOPK, float(sw[t])) for t in range(m)]
    slot_expert: list[int] = []
    slot_start: list[int] = []
    tok: list[int] = []
    dst: list[int] = []
    wts: list[float] = []
    for e in sorted(by_expert):
        slot_expert.append(e)
        slot_start.append(len(tok))
        for t, d, w in by_expert[e]:
            tok.append(t)
            dst.append(d)
            wts.append(w)
    slot_start.append(len(tok))
    return RouteMetaRef(slot_expert, slot_start, tok, dst, wts)


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


# ---------------------------------------------------------------------------------------------
# sm90 tactic bindings (kernels/sm90/moe/*.contract.json through netra.runtime).
# ---------------------------------------------------------------------------------------------

import ctypes  # noqa: E402  (kept next to the bindings; the references above need none of it)

CONTRACTS = {
    "act_quant": "moe_act_quant_w512",
    "route": "moe_route_e256_k8",
    "align": "moe_align_e256_k8",
    "gate_up": "moe_gate_up_e256",
    "down": "moe_down_e256",
}
# v3 (weight streaming, kernels/sm90/moe/expert_stream.cu): the routing kernels are v1's source built
# for PDL, moe_act_quant is v1's; the GEMMs are persistent (grid = SM count) with PDL.
CONTRACTS_V3 = {
    "act_quant": "moe_act_quant_w512",
    "route": "moe_route_v3_e256_k8",      # v1 source built with -DMOE_PDL=1 (PDL launch, early trigger)
    "align": "moe_align_v3_e256_k8",
    "gate_up": "moe_gate_up_v3_e256",
    "down": "moe_down_v3_e256",           # SiLU*up + quantization fused into the prologue
}
DOWN_V3_UNFUSED = "moe_down_v3_nofuse_e256"  # reads moe_act_quant's output (the A/B build)
# v3 tuning builds of the same source (round 2 A/B, fused only): "p" = pipelined gate_up + down,
# "p6" = pipelined gate_up + down with 6 consumer warps / 6 stages / 8-token h chunks; "p6s" = p6 with
# token-split work items.
V3_TUNES: dict[str, dict[str, str]] = {
    "": {},
    "p": {"gate_up": "moe_gate_up_v3p_e256", "down": "moe_down_v3p_e256"},
    "p6": {"gate_up": "moe_gate_up_v3p_e256", "down": "moe_down_v3w6_e256"},
    # + token-split items (slot, row tile, 8-token chunk): the shared expert / skewed slots spread over CTAs
    "p6s": {"gate_up": "moe_gate_up_v3ps_e256", "down": "moe_down_v3w6s_e256"},
    # + the down warps' top-k arrivals of two consecutive chunks under one release fence
    "p6sb": {"gate_up": "moe_gate_up_v3ps_e256", "down": "moe_down_v3w6sb_e256"},
    # round 3: p6s's gate_up + the streaming down (h once per (slot, chunk) group per CTA, no per-item
    # fence/atomic, one arrival per CTA, the last CTAs sum the top-k); 16- and 8-token chunks
    "st": {"gate_up": "moe_gate_up_v3ps_e256", "down": "moe_down_v3st_e256"},
    "st8": {"gate_up": "moe_gate_up_v3ps_e256", "down": "moe_down_v3st8_e256"},
    # round 4 experiment: st8 + the expert's w2 scales once per group (no global load per item) and the
    # last arrival ticket summing the largest top-k share
    "st8w": {"gate_up": "moe_gate_up_v3ps_e256", "down": "moe_down_v3st8w_e256"},
    # round 4: the p6s/st8 gate_up + the down picked per call by the token count: p6s's down below
    # AUTO_STREAM_MIN_M tokens (the streaming down's grid-wide arrival + top-k tail costs ~3 us at 1 token),
    # st8's streaming down at and above it. Both downs read the same gate|up cache; each has its own
    # self-resetting workspace, so a call is bitwise the build it picks.
    "auto": {"gate_up": "moe_gate_up_v3ps_e256", "down": "moe_down_v3st8_e256",
             "down_small": "moe_down_v3w6s_e256"},
    # round 4 experiment: a small-M pair whose gate_up (3 warps / 3 stages, 96 KB) and down (3 warps / 3 stages)
    # fit on one SM together (~211 KB smem, 2 x 128 threads), so under PDL the down CTAs become resident while
    # gate_up runs and their producers stream w2 during gate_up; both bitwise their 6-stage siblings (ps / p6s)
    "s3": {"gate_up": "moe_gate_up_v3ps3_e256", "down": "moe_down_v3w3s_e256"},
    "auto3": {"gate_up": "moe_gate_up_v3ps_e256", "down": "moe_down_v3st8_e256",
              "gate_up_small": "moe_gate_up_v3ps3_e256", "down_small": "moe_down_v3w3s_e256"},
    # round 5 experiment: the whole routed layer for ONE token in one cooperative kernel (moe_m1.cu: every
    # CTA's weights in flight at entry, one grid barrier between gate_up and down, top-k sum CTA-local);
    # align + st8 otherwise (M > 1, the shared expert as a 9th route, or fewer than M1_CTAS SMs)
    "m1": {"gate_up": "moe_gate_up_v3ps_e256", "down": "moe_down_v3st8_e256", "m1": "moe_m1_e256_k8"},
    # the same kernel with a plain (non-cooperative) launch: the A/B of the cooperative attribute, and the hedge
    # if a cooperative launch cannot be captured into a CUDA graph
    "m1nc": {"gate_up": "moe_gate_up_v3ps_e256", "down": "moe_down_v3st8_e256", "m1": "moe_m1nc_e256_k8"},
    # round 6 experiment: the routed layer for 1..8 tokens in one cooperative kernel with one continuous weight
    # stream per SM (moe_ms.cu: gate_up items, then the CTA's w2 rows of every active expert, through one TMA
    # ring; grid barrier between the GEMMs while the producer keeps streaming); align + st8 otherwise
    "ms": {"gate_up": "moe_gate_up_v3ps_e256", "down": "moe_down_v3st8_e256", "ms": "moe_ms_e256_k8"},
    # round 6: the fastest of each measured: m1 at 1 token, ms at 2..8 tokens, the st8 sequence above (or with
    # the shared expert)
    "m1s": {"gate_up": "moe_gate_up_v3ps_e256", "down": "moe_down_v3st8_e256", "m1": "moe_m1_e256_k8",
            "ms": "moe_ms_e256_k8"},
    # round 7 experiment: the routed layer for 1..128 tokens in one cooperative kernel (moe_ml.cu: every operand
    # through the TMA queue, x / h quantized in place per chunk, per-chunk counters between the GEMMs, one grid
    # barrier before the top-k sum); align + st8 with the shared route
    "ml": {"gate_up": "moe_gate_up_v3ps_e256", "down": "moe_down_v3st8_e256", "ml": "moe_ml_e256_k8"},
    # round 7: m1 at 1 token, ml at 2..128 (ml measured faster than ms at 8 tokens: 59.2 vs 62.2 us, run16 r7e), st8 with the
    # shared route
    "m1l": {"gate_up": "moe_gate_up_v3ps_e256", "down": "moe_down_v3st8_e256", "m1": "moe_m1_e256_k8",
            "ml": "moe_ml_e256_k8"},
    # round 8: m1f (moe_m1f.cu: m1's plan with x read at entry and the scales ahead of their tiles, the down share
    # requested once gate_up tile 2 has landed, 8 MMA warps on every gate_up tile as it lands + a chain warp per tile,
    # h computed by the gate_up CTA, per-route arrival counters instead of a grid barrier) in m1's place (same params);
    # m1fl = m1f at 1 token, ml at 2..128 (run17 record: 2.01x SGLang at 1 token)
    "m1f": {"gate_up": "moe_gate_up_v3ps_e256", "down": "moe_down_v3st8_e256", "m1": "moe_m1f_e256_k8"},
    "m1fl": {"gate_up": "moe_gate_up_v3ps_e256", "down": "moe_down_v3st8_e256", "m1": "moe_m1f_e256_k8",
             "ml": "moe_ml_e256_k8"},
}
# tune -> its act+quant A/B twin (MoeSm90(variant="v3", fuse_act=False, tune=...)): the same one-kernel layer with
# SiLU*up + quantization as their own grid-wide step (the other kernels stay the base unfused sequence)
# (round 11: m1fl's twin = moe_m1f / moe_ml rebuilt with act+quant as their own step on today's defaults; "ml" keeps round 7's)
UNFUSED_TWINS: dict[str, dict[str, str]] = {"ml": {"ml": "moe_ml_aq_e256_k8"},
                                            "m1fl": {"m1": "moe_m1f_aq_e256_k8", "ml": "moe_ml_aq2_e256_k8"}}
M1_CTAS = 128  # moe_m1's / moe_ms's / moe_ml's fixed grid (one CTA per SM, cooperative launch)
ONE_KERNEL_MAX_TOKENS = {"m1": 1, "ms": 8, "ml": MAX_TOKENS}  # V3_TUNES key of the one-kernel layer -> the tokens it covers
MS_PROBE_SYMBOL = "moe_ms_probe"  # exploration entry point of moe_ms's code object: the weight stream alone
# code objects that must share an SM with the next kernel: shared-memory carveout set to the maximum
CARVEOUT_MAX = frozenset(("moe_gate_up_v3ps3_e256", "moe_down_v3w3s_e256"))
AUTO_STREAM_MIN_M = 6  # tune "auto": M < this -> "down_small" (run9: 1 tok p6s 20.9 vs st8 24.0 us; 8 tok 74.5 vs 73.4)
VARIANTS = ("v1", "v3")
GU_CTAS_PER_SLOT = 32
DOWN_CTAS_PER_SLOT = 32


class _ActQuantParams(ctypes.Structure):
    _fields_ = [("gu", ctypes.c_void_p), ("q", ctypes.c_void_p), ("scale", ctypes.c_void_p),
                ("rows", ctypes.c_int32), ("width", ctypes.c_int32)]


class _RouteParams(ctypes.Structure):
    _fields_ = [(n, ctypes.c_void_p) for n in (
        "x", "w_router", "w_shared", "logits", "shared_logit", "topk_ids_in", "topk_w_in", "topk_ids", "topk_w",
        "shared_w", "counters", "num_slots", "slot_expert", "slot_start", "route_token", "route_dst", "route_w",
        "xq", "xs")
    ] + [("M", ctypes.c_int32), ("_pad", ctypes.c_int32)]


class _GemmParams(ctypes.Structure):
    _fields_ = [(n, ctypes.c_void_p) for n in (
        "w13", "w13_scale", "w2", "w2_scale", "xq", "xs", "gu", "hq", "hs", "y", "out", "counters", "num_slots",
        "slot_expert", "slot_start", "route_token", "route_dst", "route_w")] + [("M", ctypes.c_int32),
                                                                  ("routes_per_token", ctypes.c_int32)]


class _GemmParamsV3(ctypes.Structure):
    """v1's GemmParams + the fused down kernel's debug copy of h_q / h_s (null in production)."""

    _fields_ = [*_GemmParams._fields_, ("dbg_hq", ctypes.c_void_p), ("dbg_hs", ctypes.c_void_p)]


class _M1Params(ctypes.Structure):
    """kernels/sm90/moe/moe_m1.cu M1Params (96 bytes)."""

    _fields_ = [(n, ctypes.c_void_p) for n in (
        "x", "topk_ids", "topk_w", "w13", "w13_scale", "w2", "w2_scale", "gu", "out", "bar", "dbg_hq", "dbg_hs")]


class _MsParams(ctypes.Structure):
    """kernels/sm90/moe/moe_ms.cu MsParams (88 bytes)."""

    _fields_ = [(n, ctypes.c_void_p) for n in (
        "x", "topk_ids", "topk_w", "w13", "w13_scale", "w2", "w2_scale", "hbuf", "out", "bar")] + [
        ("M", ctypes.c_int32), ("_pad", ctypes.c_int32)]


class _MlParams(ctypes.Structure):
    """kernels/sm90/moe/moe_ml.cu MlParams (112 bytes)."""

    _fields_ = [(n, ctypes.c_void_p) for n in (
        "x", "topk_ids", "topk_w", "w13", "w13_scale", "w2", "w2_scale", "hbuf", "y", "out",
        "bar", "hq", "hs")] + [("M", ctypes.c_int32), ("_pad", ctypes.c_int32)]


def _fill_layer_inputs(p: _M1Params | _MsParams | _MlParams, pending: tuple[torch.Tensor, torch.Tensor, torch.Tensor],
                       w13: torch.Tensor, w13_scale: torch.Tensor, w2: torch.Tensor, w2_scale: torch.Tensor) -> None:
    """The inputs of a one-kernel layer (x, top-k ids / weights, expert weights and scales) into its params."""
    x, ids, tw = pending
    p.x, p.topk_ids, p.topk_w = x.data_ptr(), ids.data_ptr(), tw.data_ptr()
    p.w13, p.w13_scale, p.w2, p.w2_scale = w13.data_ptr(), w13_scale.data_ptr(), w2.data_ptr(), w2_scale.data_ptr()


def max_slots(tokens: int, shared: bool) -> int:
    """Upper bound of active experts (grid size is derived from it; the kernel exits idle slots)."""
    return min(tokens * TOPK, NUM_EXPERTS) + (1 if shared else 0)


class MoeSm90:
    """The sm90 MoE decode sequence on one device: route (or align) -> gate_up -> down.

    ``variant="v1"``: one CTA per (active expert, row tile), whole weight tile in registers, with
    ``moe_act_quant`` between the GEMMs. ``variant="v3"``: persistent weight-streaming GEMMs (TMA
    bulk copies into a shared-memory ring, grid = SM count, PDL); with ``fuse_act=True`` (default)
    SiLU*up + quantization run in the down kernel's prologue (3 launches per layer), with
    ``fuse_act=False`` ``moe_act_quant`` runs between them (4 launches; the A/B build).
    ``debug_h=True`` (v3 fused only, tests) makes the down kernel copy its h_q / h_s into
    ``dbg_hq`` / ``dbg_hs``. ``tune`` (v3 fused only) picks tuning builds of the GEMMs (``V3_TUNES``);
    ``tune="auto"`` picks the down kernel per call by the token count (``AUTO_STREAM_MIN_M``), ``"auto3"``
    both GEMMs (the small-M pair "s3" below the threshold). ``tune="m1"``: ``align`` at one token without the
    shared route launches nothing and ``experts`` runs the whole routed layer as ONE cooperative kernel
    (``moe_m1_e256_k8``; gu / dbg_hq written in route order as st8's, no metadata / xq written); every other
    call (M > 1, shared route, fewer than ``M1_CTAS`` SMs) is the st8 sequence. ``tune="ms"`` / ``"ml"`` do the
    same with the one-kernel layers for 1..8 (``moe_ms``) / 1..128 (``moe_ml``) tokens; ``"m1s"`` / ``"m1l"`` add m1
    at one token (``_launch_one_kernel`` picks the smallest that covers the call).

    ``prepare`` loads every code object and allocates every buffer (for up to 128 tokens) before any
    graph capture; the ``run_*`` methods then only fill launch structs and launch on the current
    stream (no allocation except the returned output views, no host synchronisation), so a whole
    layer is captured into the caller's CUDA graph as three kernel nodes.
    """

    def __init__(self, device: int = 0, variant: str = "v1", fuse_act: bool = True, debug_h: bool = False,
                 tune: str = "") -> None:
        import torch

        from netra.catalog import Catalog
        from netra.runtime import load_tactic

        if variant not in VARIANTS:
            raise ValueError(f"MoeSm90 variant must be one of {VARIANTS}, got {variant!r}")
        if variant == "v1" and (not fuse_act or debug_h):
            raise ValueError("fuse_act / debug_h apply to variant='v3' only (v1 always runs moe_act_quant)")
        if debug_h and not fuse_act:
            raise ValueError("debug_h needs the fused down kernel (fuse_act=True)")
        if tune not in V3_TUNES or (tune and (variant != "v3" or (not fuse_act and tune not in UNFUSED_TWINS))):
            raise ValueError(f"tune must be one of {sorted(V3_TUNES)} (non-empty: variant='v3', fused, or unfused with "
                             f"one of {sorted(UNFUSED_TWINS)}), got {tune!r}")
        self.device = device
        self.variant = variant
        self.fuse_act = variant == "v3" and fuse_act
        cat = Catalog.load()
        names = dict(CONTRACTS if variant == "v1" else CONTRACTS_V3)
        if variant == "v3" and not fuse_act:
            names["down"] = DOWN_V3_UNFUSED
        names.update(V3_TUNES[tune] if fuse_act else UNFUSED_TWINS.get(tune, {}))
        self.tune = tune
        self.t = {k: load_tactic(cat.by_name(v), device) for k, v in names.items()}
        self._names = names
        self.num_sms = int(torch.cuda.get_device_properties(device).multi_processor_count)
        dev = f"cuda:{device}"
        r = MAX_TOKENS * ROUTE_STRIDE
        i32, f32, bf = torch.int32, torch.float32, torch.bfloat16
        self.topk_ids = torch.zeros(MAX_TOKENS, TOPK, dtype=i32, device=dev)
        self.topk_w = torch.zeros(MAX_TOKENS, TOPK, dtype=f32, device=dev)
        self.shared_w = torch.zeros(MAX_TOKENS, dtype=f32, device=dev)
        self.logits = torch.zeros(MAX_TOKENS, NUM_EXPERTS, dtype=bf, device=dev)
        self.shared_logit = torch.zeros(MAX_TOKENS, dtype=bf, device=dev)
        self.num_slots = torch.zeros(1, dtype=i32, device=dev)
        self.slot_expert = torch.zeros(NUM_EXPERTS + 1, dtype=i32, device=dev)
        self.slot_start = torch.zeros(NUM_EXPERTS + 2, dtype=i32, device=dev)
        self.route_token = torch.zeros(r, dtype=i32, device=dev)
        self.route_dst = torch.zeros(r, dtype=i32, device=dev)
        self.route_w = torch.zeros(r, dtype=f32, device=dev)
        self.xq = torch.zeros(MAX_TOKENS, HIDDEN, dtype=torch.float8_e4m3fn, device=dev)
        self.xs = torch.zeros(MAX_TOKENS, HIDDEN // GROUP, dtype=f32, device=dev)
        self.gu = torch.zeros(r, 2 * INTER, dtype=bf, device=dev)
        self.y = torch.zeros(r, HIDDEN, dtype=bf, device=dev)
        self.out = torch.zeros(MAX_TOKENS, HIDDEN, dtype=bf, device=dev)
        self.aq_q = torch.zeros(r, INTER, dtype=torch.float8_e4m3fn, device=dev)
        self.aq_s = torch.zeros(r, INTER // GROUP, dtype=f32, device=dev)
        self._allow_dynamic_smem()
        self._aq = _ActQuantParams.from_buffer(self.t["act_quant"].params)
        self._rt = _RouteParams.from_buffer(self.t["route"].params)
        self._al = _RouteParams.from_buffer(self.t["align"].params)
        gp = _GemmParams if variant == "v1" else _GemmParamsV3
        self._gu = gp.from_buffer(self.t["gate_up"].params)
        self._dn = gp.from_buffer(self.t["down"].params)
        self._dn_small = gp.from_buffer(self.t["down_small"].params) if "down_small" in self.t else None
        self._gu_small = gp.from_buffer(self.t["gate_up_small"].params) if "gate_up_small" in self.t else None
        # tune "m1" / "ms" / "ml": align() at M <= 1 / 8 / 128 without the shared route defers to experts(), which
        # runs the one-kernel layer alone
        self._m1 = _M1Params.from_buffer(self.t["m1"].params) if "m1" in self.t and self.num_sms >= M1_CTAS \
            else None
        self._ms = _MsParams.from_buffer(self.t["ms"].params) if "ms" in self.t and self.num_sms >= M1_CTAS \
            else None
        self._ml = _MlParams.from_buffer(self.t["ml"].params) if "ml" in self.t and self.num_sms >= M1_CTAS \
            else None
        self._probe: Any = None  # (function, launch config) of MS_PROBE_SYMBOL, made on first use (exploration)
        self._m1_pending: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None
        self.dbg_hq = self.dbg_hs = None
        if debug_h:
            self.dbg_hq = torch.zeros(r, INTER, dtype=torch.float8_e4m3fn, device=dev)
            self.dbg_hs = torch.zeros(r, INTER // GROUP, dtype=f32, device=dev)
        # No _fill_meta here: load_tactic caches one Tactic (and its params buffer) per (contract,
        # device), shared by every MoeSm90 on the device; route()/align() fill all pointers per call.

    def _allow_dynamic_smem(self) -> None:
        """The GEMMs stage weights in dynamic shared memory (up to 64 KB): above 48 KB a kernel must be
        allowed explicitly (cuFuncSetAttribute), which netra.runtime.load_tactic does not do."""
        from netra.runtime import check, driver

        cu = driver()
        attr = cu.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES
        carve = cu.CUfunction_attribute.CU_FUNC_ATTRIBUTE_PREFERRED_SHARED_MEMORY_CARVEOUT
        for key in ("gate_up", "down", "gate_up_small", "down_small"):
            if key not in self.t:
                continue
            t = self.t[key]
            if t.smem_bytes > 0:
                check(cu.cuFuncSetAttribute(t.function, attr, t.smem_bytes), f"cuFuncSetAttribute {key}")
            if self._names[key] in CARVEOUT_MAX:  # 100 = CU_SHAREDMEM_CARVEOUT_MAX_SHARED
                check(cu.cuFuncSetAttribute(t.function, carve, 100), f"cuFuncSetAttribute carveout {key}")

    @staticmethod
    def _stream() -> int:
        import torch

        return int(torch.cuda.current_stream().cuda_stream)

    def _fill_meta(self, p: _RouteParams) -> None:
        p.topk_ids, p.topk_w = self.topk_ids.data_ptr(), self.topk_w.data_ptr()
        p.logits, p.shared_logit = self.logits.data_ptr(), self.shared_logit.data_ptr()
        p.num_slots, p.slot_expert = self.num_slots.data_ptr(), self.slot_expert.data_ptr()
        p.slot_start, p.route_token = self.slot_start.data_ptr(), self.route_token.data_ptr()
        p.route_dst, p.route_w = self.route_dst.data_ptr(), self.route_w.data_ptr()
        p.xq, p.xs = self.xq.data_ptr(), self.xs.data_ptr()

    def act_quant(self, gu: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """gu [rows, 1024] BF16 -> (q [rows, 512] e4m3, scale [rows, 4] fp32), views of persistent buffers."""
        import torch

        rows = gu.shape[0]
        if gu.dtype != torch.bfloat16 or gu.shape[1:] != (2 * INTER,) or not gu.is_contiguous() \
                or not 1 <= rows <= MAX_TOKENS * ROUTE_STRIDE:
            raise MoeShapeError(f"act_quant needs contiguous BF16 [1..1152, 1024], got {gu.dtype} {tuple(gu.shape)}")
        t = self.t["act_quant"]
        with t.lock:
            self._aq.gu, self._aq.q, self._aq.scale = gu.data_ptr(), self.aq_q.data_ptr(), self.aq_s.data_ptr()
            self._aq.rows, self._aq.width = rows, INTER
            t.launch((rows + 1) // 2, self._stream())
        return self.aq_q[:rows], self.aq_s[:rows]

    def route(self, x: torch.Tensor, w_router: torch.Tensor, w_shared_gate: torch.Tensor | None) -> None:
        """Routing + metadata for x [M, 2048] (the shared expert becomes slot 'last' when its gate is given)."""
        m = self._check_x(x)
        self._m1_pending = None
        t = self.t["route"]
        p = self._rt
        with t.lock:
            p.x, p.w_router = x.data_ptr(), w_router.data_ptr()
            p.w_shared = w_shared_gate.data_ptr() if w_shared_gate is not None else None
            p.shared_w = self.shared_w.data_ptr()
            p.counters = t.workspace.data_ptr()
            p.M = m
            self._fill_meta(p)  # every call: the params buffer is shared with other instances
            t.launch(((m + 3) // 4) * 17, self._stream())

    def align(self, x: torch.Tensor, topk_ids: torch.Tensor, topk_w: torch.Tensor,
              shared_w: torch.Tensor | None = None) -> None:
        """Metadata from given ids [M, 8] int32 and weights [M, 8] fp32 (+ optional shared weights [M]),
        and x [M, 2048] BF16 quantized for the gate_up GEMM."""
        import torch

        m = self._check_x(x)
        if topk_ids.shape[0] != m:
            raise MoeShapeError(f"align: {topk_ids.shape[0]} id rows for {m} tokens")
        if topk_ids.dtype != torch.int32 or topk_w.dtype != torch.float32 or topk_ids.shape != (m, TOPK) \
                or topk_w.shape != (m, TOPK) or not 1 <= m <= MAX_TOKENS:
            raise MoeShapeError("align needs int32 ids and fp32 weights of shape [1..128, 8]")
        self._m1_pending = None
        if m <= self._one_kernel_max() and shared_w is None:
            if not (topk_ids.is_contiguous() and topk_w.is_contiguous()):
                raise MoeShapeError(f"align (tune {self.tune}) needs contiguous ids and weights")
            self._m1_pending = (x, topk_ids, topk_w)  # experts() runs the one-kernel layer
            return
        self._launch_align(x, topk_ids, topk_w, shared_w)

    def _launch_align(self, x: torch.Tensor, topk_ids: torch.Tensor, topk_w: torch.Tensor,
                      shared_w: torch.Tensor | None) -> None:
        m = self._check_x(x)
        t = self.t["align"]
        p = self._al
        with t.lock:
            p.x, p.topk_ids_in, p.topk_w_in = x.data_ptr(), topk_ids.data_ptr(), topk_w.data_ptr()
            p.shared_w = shared_w.data_ptr() if shared_w is not None else None
            p.counters = t.workspace.data_ptr()
            p.M = m
            self._fill_meta(p)  # every call: the params buffer is shared with other instances
            t.launch(1 + (m + 3) // 4, self._stream())

    def experts(self, x: torch.Tensor, w13: torch.Tensor, w13_scale: torch.Tensor, w2: torch.Tensor,
                w2_scale: torch.Tensor, shared: bool) -> torch.Tensor:
        """gate_up -> act+quant -> down(+top-k sum) over the metadata and quantized x of the last
        route/align call (x itself only sets the token count); BF16 [M, 2048]."""
        m = self._check_x(x)
        ns = max_slots(m, shared)
        if w13.shape[0] < (NUM_EXPERTS + 1 if shared else NUM_EXPERTS):
            raise MoeShapeError(f"w13 holds {w13.shape[0]} experts; the shared route needs index {NUM_EXPERTS}")
        routes = m * (TOPK + (1 if shared else 0))
        pending, self._m1_pending = getattr(self, "_m1_pending", None), None
        if pending is not None:
            if m <= self._one_kernel_max() and not shared and pending[0].shape[0] == m:
                self._launch_one_kernel(m, pending, w13, w13_scale, w2, w2_scale)
                return self.out[:m]
            self._launch_align(pending[0], pending[1], pending[2], None)  # not the m1 case after all: the deferred align, then st8
        if self.variant == "v3":  # persistent grids; the work list comes from num_slots on the device
            if self._gu_small is not None and m < AUTO_STREAM_MIN_M:  # tune "auto3", small batch
                self._gemm("gate_up_small", self._gu_small, self.num_sms, m, shared, w13, w13_scale, w2, w2_scale)
            else:
                self._gemm("gate_up", self._gu, self.num_sms, m, shared, w13, w13_scale, w2, w2_scale)
            if not self.fuse_act:
                self.act_quant(self.gu[:routes])
            if self._dn_small is not None and m < AUTO_STREAM_MIN_M:  # tune "auto", small batch
                self._gemm("down_small", self._dn_small, self.num_sms, m, shared, w13, w13_scale, w2, w2_scale)
            else:
                self._gemm("down", self._dn, self.num_sms, m, shared, w13, w13_scale, w2, w2_scale)
            return self.out[:m]
        self._gemm("gate_up", self._gu, ns * GU_CTAS_PER_SLOT, m, shared, w13, w13_scale, w2, w2_scale)
        self.act_quant(self.gu[:routes])
        self._gemm("down", self._dn, ns * DOWN_CTAS_PER_SLOT, m, shared, w13, w13_scale, w2, w2_scale)
        return self.out[:m]

    def _gemm(self, key: str, p: _GemmParams | _GemmParamsV3, grid: int, m: int, shared: bool, w13: torch.Tensor,
              w13_scale: torch.Tensor, w2: torch.Tensor, w2_scale: torch.Tensor) -> None:
        t = self.t[key]
        with t.lock:
            p.w13, p.w13_scale, p.w2, p.w2_scale = (w13.data_ptr(), w13_scale.data_ptr(), w2.data_ptr(),
                                                    w2_scale.data_ptr())
            p.xq, p.xs, p.gu = self.xq.data_ptr(), self.xs.data_ptr(), self.gu.data_ptr()
            p.hq, p.hs = self.aq_q.data_ptr(), self.aq_s.data_ptr()
            p.y, p.out = self.y.data_ptr(), self.out.data_ptr()
            p.counters = t.workspace.data_ptr()
            p.num_slots, p.slot_expert, p.slot_start = (self.num_slots.data_ptr(), self.slot_expert.data_ptr(),
                                                        self.slot_start.data_ptr())
            p.route_token, p.route_dst, p.route_w = (self.route_token.data_ptr(), self.route_dst.data_ptr(),
                                                     self.route_w.data_ptr())
            p.M, p.routes_per_token = m, TOPK + (1 if shared else 0)
            if isinstance(p, _GemmParamsV3):
                p.dbg_hq = self.dbg_hq.data_ptr() if self.dbg_hq is not None else None
                p.dbg_hs = self.dbg_hs.data_ptr() if self.dbg_hs is not None else None
            t.launch(grid, self._stream())

    def _one_kernel_max(self) -> int:
        """The most tokens the one-kernel layers of this tune cover (0: none)."""
        if getattr(self, "_ml", None) is not None:
            return ONE_KERNEL_MAX_TOKENS["ml"]
        if getattr(self, "_ms", None) is not None:
            return ONE_KERNEL_MAX_TOKENS["ms"]
        return ONE_KERNEL_MAX_TOKENS["m1"] if getattr(self, "_m1", None) is not None else 0

    def _launch_one_kernel(self, m: int, pending: tuple[torch.Tensor, torch.Tensor, torch.Tensor], w13: torch.Tensor,
                           w13_scale: torch.Tensor, w2: torch.Tensor, w2_scale: torch.Tensor) -> None:
        """The smallest one-kernel layer of this tune that covers m tokens: m1 (1), ms (<= 8), ml (<= 128)."""
        if m == 1 and getattr(self, "_m1", None) is not None:
            self._launch_m1(pending, w13, w13_scale, w2, w2_scale)
        elif m <= ONE_KERNEL_MAX_TOKENS["ms"] and getattr(self, "_ms", None) is not None:
            self._launch_ms(pending, w13, w13_scale, w2, w2_scale)
        else:  # m <= _one_kernel_max(): ml covers every m the branches above do not
            self._launch_ml(pending, w13, w13_scale, w2, w2_scale)

    def _launch_ml(self, pending: tuple[torch.Tensor, torch.Tensor, torch.Tensor], w13: torch.Tensor,
                   w13_scale: torch.Tensor, w2: torch.Tensor, w2_scale: torch.Tensor) -> None:
        def fill(p: Any) -> None:
            p.hbuf, p.y = self.gu.data_ptr(), self.y.data_ptr()
            p.hq, p.hs = self.aq_q.data_ptr(), self.aq_s.data_ptr()  # the A/B twin's h_q / h_s (unused by moe_ml)
            p.out, p.bar = self.out.data_ptr(), self.t["ml"].workspace.data_ptr()
            p.M = int(pending[0].shape[0])

        self._launch_layer("ml", self._ml, pending, (w13, w13_scale, w2, w2_scale), fill)

    def _launch_layer(self, key: str, p: Any, pending: tuple[torch.Tensor, torch.Tensor, torch.Tensor],
                      weights: tuple[torch.Tensor, ...], fill: Any) -> None:
        """One cooperative one-kernel layer (``key`` in self.t): its inputs, then ``fill(p)``, then the launch."""
        t = self.t[key]
        assert p is not None
        with t.lock:
            _fill_layer_inputs(p, pending, *weights)
            fill(p)
            t.launch(M1_CTAS, self._stream())

    def _launch_ms(self, pending: tuple[torch.Tensor, torch.Tensor, torch.Tensor], w13: torch.Tensor,
                   w13_scale: torch.Tensor, w2: torch.Tensor, w2_scale: torch.Tensor, probe: bool = False) -> None:
        t = self.t["ms"]
        p = self._ms
        assert p is not None
        with t.lock:
            _fill_layer_inputs(p, pending, w13, w13_scale, w2, w2_scale)
            p.hbuf, p.out, p.bar = self.gu.data_ptr(), self.out.data_ptr(), t.workspace.data_ptr()
            p.M = int(pending[0].shape[0])
            if not probe:
                t.launch(M1_CTAS, self._stream())
                return
            from netra import runtime as rt

            fn, cfg = self._probe
            cfg.gridDimX, cfg.hStream = M1_CTAS, self._stream()
            rt.check(rt.driver().cuLaunchKernelEx(cfg, fn, t._param_ptrs_addr, 0), f"launch {MS_PROBE_SYMBOL}")

    def probe_stream(self, x: torch.Tensor, topk_ids: torch.Tensor, topk_w: torch.Tensor, w13: torch.Tensor,
                     w13_scale: torch.Tensor, w2: torch.Tensor, w2_scale: torch.Tensor) -> None:
        """Exploration (tune "ms"): moe_ms's weight stream alone (``moe_ms_probe``: same metadata, x
        quantization and ring, no MMA, no grid barrier, no output). Call once before any capture."""
        from netra import runtime as rt

        if getattr(self, "_ms", None) is None:
            raise MoeShapeError("probe_stream needs tune 'ms'")
        if self._probe is None:
            t = self.t["ms"]
            fn = rt.check(rt.driver().cuModuleGetFunction(t.module, MS_PROBE_SYMBOL.encode()),
                          f"cuModuleGetFunction {MS_PROBE_SYMBOL}")
            cu = rt.driver()
            rt.check(cu.cuFuncSetAttribute(fn, cu.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                                           t.smem_bytes), "cuFuncSetAttribute probe smem")
            self._probe = (fn, rt._launch_config(t.block, t.smem_bytes, cooperative=True))
        self._launch_ms((x, topk_ids, topk_w), w13, w13_scale, w2, w2_scale, probe=True)

    def _launch_m1(self, pending: tuple[torch.Tensor, torch.Tensor, torch.Tensor], w13: torch.Tensor,
                   w13_scale: torch.Tensor, w2: torch.Tensor, w2_scale: torch.Tensor) -> None:
        def fill(p: Any) -> None:
            p.gu, p.out, p.bar = self.gu.data_ptr(), self.out.data_ptr(), self.t["m1"].workspace.data_ptr()
            p.dbg_hq = self.dbg_hq.data_ptr() if self.dbg_hq is not None else None
            p.dbg_hs = self.dbg_hs.data_ptr() if self.dbg_hs is not None else None

        self._launch_layer("m1", self._m1, pending, (w13, w13_scale, w2, w2_scale), fill)

    @staticmethod
    def _check_x(x: torch.Tensor) -> int:
        import torch

        m = x.shape[0]
        if x.dtype != torch.bfloat16 or x.shape[1:] != (HIDDEN,) or not x.is_contiguous() or not 1 <= m <= MAX_TOKENS:
            raise MoeShapeError(f"x must be contiguous BF16 [1..128, 2048], got {x.dtype} {tuple(x.shape)}")
        return int(m)
