"""GDN decode, fused: gating + L2-normalised q/k + the delta-rule state update in place + the output.

One token per batch row. Per row ``i`` (slot ``s = slots[i]``) and value head ``h`` (key head
``h // (Hv/Hk)``), with the state ``S = pool[s, h] [dk, dv]`` read once and written once, FP32 inside:

    g = −exp(A_log[h])·softplus(a[i,h] + dt_bias[h]);  β = sigmoid(b[i,h])
    q̂ = q/‖q‖·dk^-½,  k̂ = k/‖k‖  (‖x‖ = sqrt(Σx² + 1e-6))
    S ← exp(g)·S;  δ = β·(v − Sᵀk̂);  S ← S + k̂ δᵀ;  o = Sᵀq̂

computed as ``Sᵀk̂`` and ``Sᵀq̂`` of the loaded state in one pass (both reductions at once), then
``o = e·Sᵀq̂ + (k̂·q̂)·δ`` and ``S' = e·S + k̂ δᵀ`` (the same quantities; FP32 summation order differs
from the reference's, which is why the contract's policy is a tolerance). Rows whose slot is the
pad slot (0) write a zero output and never touch the pool.

Program ``(j, i·Hv + h)`` owns the ``[dk, BV]`` column tile ``j`` of ``pool[s, h]`` (dv contiguous,
so each of the dk rows of the tile is one ``BV``-element run): no two programs share state, so the
update needs no synchronisation. Grid ``[cdiv(v_dim, BV), batch * v_heads]``.

Byte floor (H200, Qwen3.6-35B-A3B: Hv = 32, dk = dv = 128): the state read and written once,
``2 · B · 32 · 128 · 128 · bytes`` = B · 4.19 MB (fp32) or B · 2.10 MB (bf16); q/k/v/a/b/o add
B · 24.8 KB. B = 128: 537 MB fp32 (≈ 128 µs at 4.2 TB/s), 269 MB bf16 (≈ 64 µs); B = 1: 4.2 / 2.1 MB
(≈ 1.0 / 0.5 µs, far below the launch + one dependent DRAM round trip, ≈ 2.5–3 µs in graph replay).
Prediction before the first H200 run: B = 128 at 0.90–0.95 of the copy-rate floor (fp32 ≈ 135 µs,
bf16 ≈ 68–70 µs), B = 1 ≈ 3–3.5 µs. Measured (results/sm90/gdn_h200.json, 2026-12-02, BV 32, 4 warps):
fp32 141.4 µs (0.90), bf16 103.8 µs (0.62; SGLang 73.8), B = 1 3.7 / 4.3 µs.

Why bf16 fell short, and ``RELOAD`` (meta): a program's life is two dependent DRAM round trips (the
slot, then the tile) plus the compute, so the rate is the bytes resident programs have in flight.
With BV 32 / 4 warps a bf16 tile is 8 KB at 80 registers a thread: ≈ 6 programs an SM, ≈ 48 KB in
flight (ptxas, sm_90a), against ≈ 112 KB for the fp32 tile (16 KB, 72 registers) that reached 0.90.
``RELOAD = 1`` reads the tile a second time (``ld.global.ca``: L1) after the two reductions instead of
keeping it live in FP32 across them: with one warp and BV 32 that is 128 registers (255 without), so
≈ 16 one-warp programs an SM hold ≈ 128 KB of bf16 state in flight — SGLang's shape of program
(one warp, BV 32) with fewer live registers. DRAM traffic is unchanged (the re-read hits L1/L2).
Prediction before the second H200 run (bf16: BV 32, 1 warp, RELOAD): B = 128 ≈ 68–72 µs (0.88–0.93 of
the floor; SGLang 73.8), B = 1 ≈ 3.5–4 µs (SGLang 3.9); fp32 unchanged unless the sweep says otherwise.
Measured (second run, 2026-12-02): wrong — bf16 B = 128 90.0 µs with RELOAD, 89.0 without (1 warp),
95.9 at BV 64 / 4 warps, 132 at BV 128 / 8 warps; SGLang 73.4. Registers and resident bytes were not
the limit: ptxas gives SGLang's program 168 registers (≈ 12 one-warp programs an SM, 96 KB), ours
with RELOAD 128 (≈ 16, 128 KB) and still slower. What differs is the access: SGLang's [BV, dk] tile
(dk contiguous) is 8 KB in one run, each warp instruction 512 contiguous bytes; our [dk, BV] column
strip is 128 runs of 64 bytes (BV 32 bf16), half-lines to L2. fp32 BV 32 is 128-byte runs (0.92);
fp32 BV 64 / 4 warps, 256-byte runs, 136.5 µs (0.95, SGLang 137.7) — the fp32 contract's launch now.

The row-block kernel (``BK`` > 0, `_gdn_decode_rows_kernel`, contract gdn_decode_bf16_rows_hv32 for
17–128 rows) takes the whole head (BV = dv = 128: each block of BK rows is one contiguous run) in two
passes, all blocks' loads in flight at once (unrolled): 160 registers at 4 warps, ≈ 3 programs an SM
(96 KB). One program per (row, head) is too few programs for one row (32), so 1–16 rows keep the
one-pass tiles (BV 32, one warp: 3.5 µs at B = 1 vs SGLang 4.0, 7.0 vs 8.0 at B = 8).
Prediction before the third H200 run: bf16 rows kernel B = 128 ≈ 72–80 µs (0.80–0.88), B = 32 ≈ 21–24;
fp32 BV 64 B = 128 ≈ 136 µs, B = 1 ≈ 4.6 µs.
"""

from __future__ import annotations

from typing import Any

import torch
import triton
import triton.language as tl

from netra.runtime import grid_size

PAD_SLOT = 0
L2_EPS = 1e-6


@triton.jit
def _log1p(y):
    # log(1 + y) for y >= 0 without losing a small y (Goldberg's trick): exact when 1 + y rounds to 1.
    u = 1.0 + y
    d = tl.where(u == 1.0, 1.0, u - 1.0)
    return tl.where(u == 1.0, y, tl.log(u) * (y / d))


@triton.jit
def _gates(a, b, a_log, dt_bias):
    # gating: softplus(x) = max(x, 0) + log1p(exp(-|x|)) (torch's threshold 20 returns x there: the
    # same fp32 number), decay e = exp(g), beta = sigmoid(b)
    x = a + dt_bias
    softplus = tl.maximum(x, 0.0) + _log1p(tl.exp(-tl.abs(x)))
    decay = tl.exp(-tl.exp(a_log) * softplus)
    beta = 1.0 / (1.0 + tl.exp(-b))
    return decay, beta


@triton.jit
def _gdn_decode_fused_kernel(
    q_ptr, k_ptr, v_ptr, a_ptr, b_ptr, a_log_ptr, dt_bias_ptr, state_ptr, slots_ptr, o_ptr,
    sq_b, sq_h, sq_d, sk_b, sk_h, sk_d, sv_b, sv_h, sv_d, sa_b, sa_h, sb_b, sb_h,
    HV: tl.constexpr, HK: tl.constexpr, DK: tl.constexpr, DV: tl.constexpr, BV: tl.constexpr,
    PAD: tl.constexpr, EPS: tl.constexpr, SCALE: tl.constexpr, RELOAD: tl.constexpr,
):
    i_v = tl.program_id(0)
    i_bh = tl.program_id(1)
    i_b = i_bh // HV
    i_hv = i_bh % HV
    i_hk = i_hv // (HV // HK)
    offs_v = i_v * BV + tl.arange(0, BV)
    offs_k = tl.arange(0, DK)
    o_ptrs = o_ptr + i_bh.to(tl.int64) * DV + offs_v

    slot = tl.load(slots_ptr + i_b).to(tl.int64)
    if slot == PAD:
        tl.store(o_ptrs, tl.zeros([BV], dtype=tl.float32).to(o_ptr.dtype.element_ty))
        return

    s_ptrs = state_ptr + (slot * HV + i_hv) * (DK * DV) + offs_k[:, None] * DV + offs_v[None, :]
    s = tl.load(s_ptrs).to(tl.float32)

    row = i_b.to(tl.int64)
    q = tl.load(q_ptr + row * sq_b + i_hk * sq_h + offs_k * sq_d).to(tl.float32)
    k = tl.load(k_ptr + row * sk_b + i_hk * sk_h + offs_k * sk_d).to(tl.float32)
    v = tl.load(v_ptr + row * sv_b + i_hv * sv_h + offs_v * sv_d).to(tl.float32)
    a = tl.load(a_ptr + row * sa_b + i_hv * sa_h).to(tl.float32)
    b = tl.load(b_ptr + row * sb_b + i_hv * sb_h).to(tl.float32)
    a_log = tl.load(a_log_ptr + i_hv).to(tl.float32)
    dt_bias = tl.load(dt_bias_ptr + i_hv).to(tl.float32)

    decay, beta = _gates(a, b, a_log, dt_bias)

    q = q * (tl.rsqrt(tl.sum(q * q, axis=0) + EPS) * SCALE)
    k = k * tl.rsqrt(tl.sum(k * k, axis=0) + EPS)

    sk = tl.sum(s * k[:, None], axis=0)  # [BV]  (Sᵀk̂ of the loaded state)
    sq = tl.sum(s * q[:, None], axis=0)  # [BV]  (Sᵀq̂ of the loaded state)
    kq = tl.sum(k * q, axis=0)
    delta = beta * (v - decay * sk)
    o = decay * sq + kq * delta
    if RELOAD:  # read the tile again (L1/L2) instead of keeping it live across the reductions
        s = tl.load(s_ptrs, cache_modifier=".ca").to(tl.float32)
    s = s * decay + k[:, None] * delta[None, :]
    tl.store(s_ptrs, s.to(state_ptr.dtype.element_ty))
    tl.store(o_ptrs, o.to(o_ptr.dtype.element_ty))


@triton.jit
def _gdn_decode_rows_kernel(
    q_ptr, k_ptr, v_ptr, a_ptr, b_ptr, a_log_ptr, dt_bias_ptr, state_ptr, slots_ptr, o_ptr,
    sq_b, sq_h, sq_d, sk_b, sk_h, sk_d, sv_b, sv_h, sv_d, sa_b, sa_h, sb_b, sb_h,
    HV: tl.constexpr, HK: tl.constexpr, DK: tl.constexpr, DV: tl.constexpr, BV: tl.constexpr,
    BK: tl.constexpr, PAD: tl.constexpr, EPS: tl.constexpr, SCALE: tl.constexpr,
):
    """The same step over ``[BK, BV]`` row blocks of the tile (``BV = dv``: each block is ``BK·dv``
    contiguous elements): pass 1 accumulates Sᵀk̂ and Sᵀq̂ block by block, pass 2 re-reads each block
    (L2) and writes ``e·S + k̂ δᵀ``. Few registers whatever the tile, long contiguous runs."""
    i_v = tl.program_id(0)
    i_bh = tl.program_id(1)
    i_b = i_bh // HV
    i_hv = i_bh % HV
    i_hk = i_hv // (HV // HK)
    offs_v = i_v * BV + tl.arange(0, BV)
    offs_k = tl.arange(0, DK)
    o_ptrs = o_ptr + i_bh.to(tl.int64) * DV + offs_v

    slot = tl.load(slots_ptr + i_b).to(tl.int64)
    if slot == PAD:
        tl.store(o_ptrs, tl.zeros([BV], dtype=tl.float32).to(o_ptr.dtype.element_ty))
        return

    row = i_b.to(tl.int64)
    q_row = q_ptr + row * sq_b + i_hk * sq_h
    k_row = k_ptr + row * sk_b + i_hk * sk_h
    q = tl.load(q_row + offs_k * sq_d).to(tl.float32)
    k = tl.load(k_row + offs_k * sk_d).to(tl.float32)
    v = tl.load(v_ptr + row * sv_b + i_hv * sv_h + offs_v * sv_d).to(tl.float32)
    a = tl.load(a_ptr + row * sa_b + i_hv * sa_h).to(tl.float32)
    b = tl.load(b_ptr + row * sb_b + i_hv * sb_h).to(tl.float32)
    a_log = tl.load(a_log_ptr + i_hv).to(tl.float32)
    dt_bias = tl.load(dt_bias_ptr + i_hv).to(tl.float32)
    decay, beta = _gates(a, b, a_log, dt_bias)
    rq = tl.rsqrt(tl.sum(q * q, axis=0) + EPS) * SCALE
    rk = tl.rsqrt(tl.sum(k * k, axis=0) + EPS)
    kq = tl.sum((k * rk) * (q * rq), axis=0)

    s_base = state_ptr + (slot * HV + i_hv) * (DK * DV)
    offs_r = tl.arange(0, BK)
    sk = tl.zeros([BV], dtype=tl.float32)
    sq = tl.zeros([BV], dtype=tl.float32)
    for r0 in tl.static_range(0, DK, BK):  # unrolled: every block's load is in flight at once
        rows = r0 + offs_r
        s = tl.load(s_base + rows[:, None] * DV + offs_v[None, :]).to(tl.float32)
        kb = tl.load(k_row + rows * sk_d).to(tl.float32) * rk
        qb = tl.load(q_row + rows * sq_d).to(tl.float32) * rq
        sk += tl.sum(s * kb[:, None], axis=0)
        sq += tl.sum(s * qb[:, None], axis=0)
    delta = beta * (v - decay * sk)
    o = decay * sq + kq * delta
    tl.store(o_ptrs, o.to(o_ptr.dtype.element_ty))
    for r0 in tl.static_range(0, DK, BK):
        rows = r0 + offs_r
        p = s_base + rows[:, None] * DV + offs_v[None, :]
        s = tl.load(p).to(tl.float32)
        kb = tl.load(k_row + rows * sk_d).to(tl.float32) * rk
        tl.store(p, (s * decay + kb[:, None] * delta[None, :]).to(state_ptr.dtype.element_ty))


def gdn_decode_fused(launch: dict[str, Any], *, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                     a: torch.Tensor, b: torch.Tensor, a_log: torch.Tensor, dt_bias: torch.Tensor,
                     state_pool: torch.Tensor, slots: torch.Tensor, out: torch.Tensor | None = None
                     ) -> torch.Tensor:
    """Host entry (contract ``kernel.symbol``): ``q, k [B, Hk, dk]``, ``v [B, Hv, dv]`` (any strides),
    ``a, b [B, Hv]`` (any strides), ``a_log, dt_bias [Hv]``, ``state_pool [slots, Hv, dk, dv]``
    contiguous, ``slots [B]``; returns ``o [B, Hv, dv]`` in v's dtype (``out`` if given). No host
    synchronisation; graph-capturable."""
    bsz, hk, dk = q.shape
    hv, dv = v.shape[1], v.shape[2]
    meta = dict(launch["meta"])
    num_stages = int(meta.pop("num_stages", 1))
    dims = {"batch": bsz, "k_heads": hk, "v_heads": hv, "k_dim": dk, "v_dim": dv}
    grid = tuple(grid_size(launch["grid"], {**dims, **meta}))
    if out is None:
        out = torch.empty((bsz, hv, dv), dtype=v.dtype, device=v.device)
    args = (q, k, v, a, b, a_log, dt_bias, state_pool, slots, out,
            q.stride(0), q.stride(1), q.stride(2), k.stride(0), k.stride(1), k.stride(2),
            v.stride(0), v.stride(1), v.stride(2), a.stride(0), a.stride(1), b.stride(0), b.stride(1))
    consts = {"HV": hv, "HK": hk, "DK": dk, "DV": dv, "BV": meta["BV"], "PAD": PAD_SLOT, "EPS": L2_EPS,
              "SCALE": dk ** -0.5, "num_warps": int(launch["block"]) // 32, "num_stages": num_stages}
    if int(meta.get("BK", 0)):  # row blocks of BK rows, two passes
        _gdn_decode_rows_kernel[grid](*args, BK=int(meta["BK"]), **consts)
    else:
        _gdn_decode_fused_kernel[grid](*args, RELOAD=int(meta.get("RELOAD", 0)), **consts)
    return out
