"""The attention prologue in one kernel: q/k Gemma RMSNorm, partial NeoX RoPE, K/V store into the cache.

One program per (token, head) over the ``q_heads + kv_heads`` heads: programs ``h < q_heads`` write
the normalised, rotated query head to ``q_out [T, Hq, D]``; the others normalise and rotate key head
``h - q_heads``, then store it and the value head into the cache at ``[token_slots[t], positions[t]]``
(E4M3, ``x / scale`` saturated to ±448, as `kv_store_ref`).

It rounds where the unfused references round, so it reproduces ``rmsnorm_ref -> rope_ref ->
kv_store_ref`` (`qk_norm_rope_store_ref`): the normalised head is rounded to the input dtype
before the rotation, the rotation runs in FP32 from the rounded values (``x1·cos - x2·sin``, no FMA
contraction: ``enable_fp_fusion=False``), the rotated head is rounded again, then quantized. The
rotation partner of element ``d`` (``d ± rotary_dim/2``) is loaded a second time (L1 hit) and
normalised alongside rather than moved between lanes. What can differ from the references is the
FP32 sum of squares (its order) and ``rsqrt``'s last bit, which can flip a BF16 rounding.

Byte floor: per token, q|k|v in BF16 (``2·(Hq+2·Hkv)·D`` = 10 KB at Qwen3.6 shapes) read, q
written (8 KB), K/V written in E4M3 (1 KB): 19 KB per token, 2.4 MB at 128 tokens (0.6 µs at
4.2 TB/s): the op is launch-latency bound (a few µs); its win is three launches fewer (two norms,
RoPE and the store run as four kernels today, plus their casts).
"""

from __future__ import annotations

from typing import Any

import torch
import triton
import triton.language as tl

from netra.runtime import grid_size

E4M3_MAX = 448.0


@triton.jit
def _norm_rope(row, step, w_row, d, partner, rotary, cos, sin, eps, HEAD_DIM: tl.constexpr):
    """One head: Gemma RMSNorm (rounded to the input dtype), then the rotation (FP32, rounded again)."""
    x = tl.load(row + d * step).to(tl.float32)
    xp = tl.load(row + partner * step).to(tl.float32)
    rstd = tl.math.rsqrt(tl.sum(x * x, axis=0) / HEAD_DIM + eps)
    w1 = 1.0 + tl.load(w_row + d).to(tl.float32)
    w1p = 1.0 + tl.load(w_row + partner).to(tl.float32)
    dt = row.dtype.element_ty
    y = (x * rstd * w1).to(dt).to(tl.float32)
    yp = (xp * rstd * w1p).to(dt).to(tl.float32)
    return tl.where(rotary, y * cos + yp * sin, y).to(dt)


@triton.jit
def _qk_norm_rope_store_kernel(
    Q, K, V, QW, KW, Pos, Table, Slots, KC, VC, QOut,
    stride_qt, stride_qh, stride_qd, stride_kt, stride_kh, stride_kd, stride_vt, stride_vh, stride_vd,
    stride_ot, stride_oh,
    stride_table, stride_cslot, stride_ctok, eps, k_inv_scale, v_inv_scale,
    Q_HEADS: tl.constexpr, HEAD_DIM: tl.constexpr, ROT: tl.constexpr, FP8_MAX: tl.constexpr,
):
    t = tl.program_id(0)
    h = tl.program_id(1)
    d = tl.arange(0, HEAD_DIM)
    HALF: tl.constexpr = ROT // 2
    rotary = d < ROT
    partner = tl.where(d < HALF, d + HALF, tl.where(rotary, d - HALF, d))
    pos = tl.load(Pos + t)
    ang = tl.where(rotary, d % HALF, 0)
    cos = tl.load(Table + pos * stride_table + ang, mask=rotary, other=1.0)
    sin = tl.load(Table + pos * stride_table + HALF + ang, mask=rotary, other=0.0)
    sin = tl.where(d < HALF, -sin, sin)  # x1·cos − x2·sin == x1·cos + x2·(−sin), exactly
    if h < Q_HEADS:
        out = _norm_rope(Q + t * stride_qt + h * stride_qh, stride_qd, QW, d, partner, rotary, cos, sin, eps,
                         HEAD_DIM)
        tl.store(QOut + t * stride_ot + h * stride_oh + d, out)
    else:
        kvh = h - Q_HEADS
        out = _norm_rope(K + t * stride_kt + kvh * stride_kh, stride_kd, KW, d, partner, rotary, cos, sin, eps,
                         HEAD_DIM)
        slot = tl.load(Slots + t).to(tl.int64)
        cache_row = slot * stride_cslot + pos.to(tl.int64) * stride_ctok + kvh * HEAD_DIM + d
        kq = tl.clamp(out.to(tl.float32) * k_inv_scale, -FP8_MAX, FP8_MAX, propagate_nan=tl.PropagateNan.ALL)
        tl.store(KC + cache_row, kq.to(KC.dtype.element_ty))
        v = tl.load(V + t * stride_vt + kvh * stride_vh + d * stride_vd).to(tl.float32)
        vq = tl.clamp(v * v_inv_scale, -FP8_MAX, FP8_MAX, propagate_nan=tl.PropagateNan.ALL)
        tl.store(VC + cache_row, vq.to(VC.dtype.element_ty))


def qk_norm_rope_store_fp8(launch: dict[str, Any], *, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                           q_weight: torch.Tensor, k_weight: torch.Tensor, eps: float, positions: torch.Tensor,
                           rope_table: torch.Tensor, rotary_dim: int, k_cache: torch.Tensor,
                           v_cache: torch.Tensor, token_slots: torch.Tensor, k_scale: float = 1.0,
                           v_scale: float = 1.0) -> torch.Tensor:
    """The contract's entry: grid ``[tokens, q_heads + kv_heads]``, returns ``q_out [T, Hq, D]``."""
    t, hq, d = q.shape
    hkv = k.shape[1]
    if (k_cache.stride() != v_cache.stride() or k_cache.stride()[2:] != (d, 1) or rope_table.stride(1) != 1
            or not q_weight.is_contiguous() or not k_weight.is_contiguous() or q_weight.dtype != k_weight.dtype
            or k.dtype != q.dtype or v.dtype != q.dtype):
        raise ValueError("qk_norm_rope_store: one contiguous cache layout, contiguous weights of one dtype and "
                         "q, k, v of one dtype are needed")
    q_out = torch.empty((t, hq, d), dtype=q.dtype, device=q.device)
    # 1/scale in FP32 (a multiply, as CUDA's division by a Python scalar in kv_store_ref is).
    k_inv = float(torch.tensor(1.0 / k_scale, dtype=torch.float32))
    v_inv = float(torch.tensor(1.0 / v_scale, dtype=torch.float32))
    grid = grid_size(launch["grid"], {"tokens": t, "q_heads": hq, "kv_heads": hkv, "head_dim": d,
                                      "rotary_dim": rotary_dim, **launch.get("meta", {})})
    _qk_norm_rope_store_kernel[tuple(grid)](
        q, k, v, q_weight, k_weight, positions, rope_table, token_slots, k_cache, v_cache, q_out,
        q.stride(0), q.stride(1), q.stride(2), k.stride(0), k.stride(1), k.stride(2), v.stride(0), v.stride(1),
        v.stride(2),
        q_out.stride(0), q_out.stride(1), rope_table.stride(0), k_cache.stride(0), k_cache.stride(1),
        float(eps), k_inv, v_inv, Q_HEADS=hq, HEAD_DIM=d, ROT=rotary_dim, FP8_MAX=E4M3_MAX,
        num_warps=int(launch["block"]) // 32, enable_fp_fusion=False)
    return q_out
