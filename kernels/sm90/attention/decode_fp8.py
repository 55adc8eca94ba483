"""Split-sequence (flash-decoding) GQA attention decode over the FP8 E4M3 KV cache, Triton, sm90.

One program owns one (request, KV head, split): the group's ``G = q_heads / kv_heads`` query heads
(8 for Qwen3.6) are the M side of both MMAs (padded to 16 rows), so every K/V byte of a request's KV
head is read from HBM exactly once. Split ``s`` of ``S`` covers blocks ``[s·n, (s+1)·n)`` of the
request's ``cdiv(seq_len, BLOCK_N)`` blocks, ``n = cdiv(blocks, S)``; ``seq_len`` is read on the
device, so one launch shape (grid from the call's dims only) serves every length: a captured graph
replays with new lengths. ``S`` comes from the batch and the pool's context length only
(`splits`); ``S == 1`` writes the output (and the output gate) straight from the main kernel,
otherwise the splits write normalised partials plus their log2-sum-exp and a second kernel merges
them (it recomputes which splits are empty from ``seq_len`` with the same arithmetic).

Numerics (why FP16 MMAs while q is BF16):
* K and V are converted E4M3 -> FP16 (exact: every E4M3 value is an FP16 normal) with one
  ``cvt.rn.f16x2.e4m3x2`` per two elements; E4M3 -> BF16 costs three conversions per two on sm90
  (Triton goes through FP16), and conversions, not MMAs, are the ALU cost of this kernel.
* q is moved into FP16 exactly: each query row is multiplied by a power of two ``2^(13-e)``
  (``e`` = the exponent of the row's max |q|), so the row max lands in [2^13, 2^14) and every BF16
  value within 2^-27 of the row max keeps all its bits (FP16 has 3 more mantissa bits than BF16);
  the power of two is divided back out of the FP32 scores, with the softmax scale. Smaller
  elements become FP16 subnormals: their absolute error is below 2^-38 of the row max.
* Scores, the running max/sum and the output accumulate in FP32; the probabilities enter the P·V
  MMA as FP16 (11-bit mantissa, better than BF16's 8), the sum of probabilities stays FP32.
* The output is rounded to the query dtype once; with the gate it is rounded, multiplied by
  ``sigmoid(gate)`` in FP32 and rounded again, exactly as `attention_decode_ref` followed by
  `output_gate_ref` do.

Byte floor (the bytes a call must move): K and V of every request, ``2 · seq_len · kv_heads · D``
bytes (one byte per element), plus q, gate and output in BF16 (``2 · B · Hq · D`` each). At
Qwen3.6 shapes (Hkv 2, D 256, Hq 16): B=128, L=4096: 536.9 MB + 3.1 MB = 540.0 MB -> 128.6 µs at
4.2 TB/s; B=1, L=49152: 50.3 MB -> 12.0 µs. Split partials are extra traffic on top (FP32,
``B·Hq·S·(D+1)·4`` bytes written and read; mostly L2 hits): 2.2 MB at B=1, S=132.

Prediction before the first H200 run (graph replay): B=128 L=4096 at S=1: 256 CTAs, about 0.85 of
the floor (~150 µs); B=1 L=49152 at S=132: ~17-20 µs (main kernel ~14 µs at 0.85 of the floor plus
the merge kernel and the ramp), against FlashInfer XQA's 29.0 µs (issue 19's table).
"""

from __future__ import annotations

from typing import Any

import torch
import triton
import triton.language as tl

from netra.runtime import grid_size

LOG2E = 1.4426950408889634


@triton.jit
def _q_to_f16(q, ROW_EXP: tl.constexpr):
    """``(q · 2^(ROW_EXP-e)) as f16, 2^(e-ROW_EXP)`` per row, ``e`` the exponent of the row's max |q|."""
    amax = tl.max(tl.abs(q), axis=1)
    e = ((amax.to(tl.int32, bitcast=True) >> 23) & 0xFF) - 127
    e = tl.minimum(tl.maximum(e, -100), 127)
    up = ((127 + ROW_EXP - e) << 23).to(tl.float32, bitcast=True)
    down = ((127 - ROW_EXP + e) << 23).to(tl.float32, bitcast=True)
    return (q * up[:, None]).to(tl.float16), down


# The split count and the pool's context are runtime values (one compile serves every batch bucket
# and pool); only "one split" (DIRECT: this kernel writes the output) is a compile-time choice.
@triton.jit(do_not_specialize=["splits", "ctx_len"])
def _decode_fp8_kernel(
    Q, K, V, Slots, SeqLens, Gate, Out, PartO, PartLse,
    stride_qb, stride_qh, stride_qd, stride_gb, stride_gh, stride_gd, stride_ob, stride_oh,
    stride_kslot, stride_ktok, stride_vslot, stride_vtok,
    qk_scale, v_scale, ctx_len, splits,
    DIRECT: tl.constexpr, GROUP: tl.constexpr, KV_HEADS: tl.constexpr, HEAD_DIM: tl.constexpr,
    BLOCK_H: tl.constexpr, BLOCK_N: tl.constexpr, HAS_GATE: tl.constexpr,
):
    pid = tl.program_id(0)
    split = tl.program_id(1)
    b = pid // KV_HEADS
    kvh = pid % KV_HEADS
    seq_len = tl.minimum(tl.load(SeqLens + b).to(tl.int32), ctx_len)
    n_blocks = tl.cdiv(seq_len, BLOCK_N)
    per_split = tl.cdiv(n_blocks, splits)
    start = split * per_split * BLOCK_N
    end = tl.minimum(start + per_split * BLOCK_N, seq_len)
    if start < end:
        offs_h = tl.arange(0, BLOCK_H)
        mask_h = offs_h < GROUP
        heads = kvh * GROUP + offs_h
        offs_d = tl.arange(0, HEAD_DIM)
        q = tl.load(Q + b * stride_qb + heads[:, None] * stride_qh + offs_d[None, :] * stride_qd, mask=mask_h[:, None],
                    other=0.0).to(tl.float32)
        q16, down = _q_to_f16(q, 13)
        row_scale = down * qk_scale  # qk_scale = sm_scale · k_scale · log2(e): scores in log2 units
        slot = tl.load(Slots + b).to(tl.int64)
        k_base = K + slot * stride_kslot + kvh * HEAD_DIM + offs_d[None, :]
        v_base = V + slot * stride_vslot + kvh * HEAD_DIM + offs_d[None, :]
        m_i = tl.full([BLOCK_H], float("-inf"), tl.float32)
        l_i = tl.zeros([BLOCK_H], tl.float32)
        acc = tl.zeros([BLOCK_H, HEAD_DIM], tl.float32)
        for n0 in range(start, end, BLOCK_N):
            offs_n = n0 + tl.arange(0, BLOCK_N)
            mask_n = offs_n < end
            tok = offs_n.to(tl.int64)[:, None]
            k = tl.load(k_base + tok * stride_ktok, mask=mask_n[:, None], other=0.0)
            s = tl.dot(q16, tl.trans(k.to(tl.float16)))
            s = tl.where(mask_n[None, :], s * row_scale[:, None], float("-inf"))
            m_new = tl.maximum(m_i, tl.max(s, axis=1))
            alpha = tl.exp2(m_i - m_new)
            p = tl.exp2(s - m_new[:, None])
            l_i = l_i * alpha + tl.sum(p, axis=1)
            v = tl.load(v_base + tok * stride_vtok, mask=mask_n[:, None], other=0.0)
            acc = acc * alpha[:, None] + tl.dot(p.to(tl.float16), v.to(tl.float16))
            m_i = m_new
        o = acc / l_i[:, None]
        if DIRECT:
            o = (o * v_scale).to(Out.dtype.element_ty)
            if HAS_GATE:
                g = tl.load(Gate + b * stride_gb + heads[:, None] * stride_gh + offs_d[None, :] * stride_gd,
                            mask=mask_h[:, None], other=0.0).to(tl.float32)
                o = (o.to(tl.float32) * tl.sigmoid(g)).to(Out.dtype.element_ty)
            tl.store(Out + b * stride_ob + heads[:, None] * stride_oh + offs_d[None, :], o, mask=mask_h[:, None])
        else:
            row = (b * (KV_HEADS * GROUP) + heads).to(tl.int64) * splits + split
            tl.store(PartO + row[:, None] * HEAD_DIM + offs_d[None, :], o, mask=mask_h[:, None])
            tl.store(PartLse + row, m_i + tl.log2(l_i), mask=mask_h)


@triton.jit(do_not_specialize=["splits", "ctx_len"])
def _decode_merge_kernel(
    SeqLens, Gate, Out, PartO, PartLse,
    stride_gb, stride_gh, stride_gd, stride_ob, stride_oh, v_scale, ctx_len, splits,
    Q_HEADS: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_N: tl.constexpr, CHUNK: tl.constexpr,
    HAS_GATE: tl.constexpr, USE_PDL: tl.constexpr,
):
    """One program per (request, query head): merge the non-empty splits, ``CHUNK`` at a time. The
    non-empty splits are a prefix, ``cdiv(blocks, per_split)`` long, by the main kernel's own rule
    (from ``seq_len``), so stale partials of empty splits are never read."""
    if USE_PDL:  # launched as a programmatic dependent of the main kernel: its partials are complete here
        tl.extra.cuda.gdc_wait()
    pid = tl.program_id(0)
    b = pid // Q_HEADS
    h = pid % Q_HEADS
    seq_len = tl.minimum(tl.load(SeqLens + b).to(tl.int32), ctx_len)
    n_blocks = tl.cdiv(seq_len, BLOCK_N)
    live = tl.cdiv(n_blocks, tl.maximum(tl.cdiv(n_blocks, splits), 1))
    base = pid.to(tl.int64) * splits
    offs_c = tl.arange(0, CHUNK)
    top = tl.full([], float("-inf"), tl.float32)
    for c in range(0, live, CHUNK):
        lse = tl.load(PartLse + base + c + offs_c, mask=c + offs_c < live, other=float("-inf"))
        top = tl.maximum(top, tl.max(lse, axis=0))
    offs_d = tl.arange(0, HEAD_DIM)
    acc = tl.zeros([HEAD_DIM], tl.float32)
    wsum = tl.zeros([CHUNK], tl.float32)
    for c in range(0, live, CHUNK):
        mask = c + offs_c < live
        w = tl.where(mask, tl.exp2(tl.load(PartLse + base + c + offs_c, mask=mask, other=0.0) - top), 0.0)
        po = tl.load(PartO + (base + c + offs_c)[:, None] * HEAD_DIM + offs_d[None, :], mask=mask[:, None], other=0.0)
        acc += tl.sum(po * w[:, None], axis=0)
        wsum += w
    o = (acc / tl.sum(wsum, axis=0) * v_scale).to(Out.dtype.element_ty)
    if HAS_GATE:
        g = tl.load(Gate + b * stride_gb + h * stride_gh + offs_d * stride_gd).to(tl.float32)
        o = (o.to(tl.float32) * tl.sigmoid(g)).to(Out.dtype.element_ty)
    tl.store(Out + b * stride_ob + h * stride_oh + offs_d, o)


# ---- host side ------------------------------------------------------------------------------------

def dims_of(q: torch.Tensor, k_cache: torch.Tensor) -> dict[str, int]:
    """The call's dims as the op routes them (netra/ops/attention.py)."""
    return {"batch": q.shape[0], "q_heads": q.shape[1], "kv_heads": k_cache.shape[2], "head_dim": q.shape[2],
            "context": k_cache.shape[1]}


def _check(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, gate: torch.Tensor | None) -> None:
    if k_cache.stride()[2:] != (k_cache.shape[3], 1) or v_cache.stride()[2:] != (v_cache.shape[3], 1):
        raise ValueError("attention decode: the KV cache's [kv_heads, head_dim] must be contiguous")
    if gate is not None and gate.shape != q.shape:
        raise ValueError(f"attention decode: gate {tuple(gate.shape)} must have q's shape {tuple(q.shape)}")


def launch_decode(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, slots: torch.Tensor,
                  seq_lens: torch.Tensor, sm_scale: float, k_scale: float, v_scale: float,
                  gate: torch.Tensor | None, splits: int, meta: dict[str, Any],
                  out: torch.Tensor | None = None) -> torch.Tensor:
    """Launch with an explicit split count (the GPU script explores other counts through this)."""
    _check(q, k_cache, v_cache, gate)
    b, hq, d = q.shape
    hkv = k_cache.shape[2]
    if out is None:
        out = torch.empty((b, hq, d), dtype=q.dtype, device=q.device)
    block_n, block_h = int(meta["BLOCK_N"]), int(meta["BLOCK_H"])
    # PDL: the merge kernel launches while the main kernel drains (its gdc_wait orders the reads)
    pdl = bool(meta.get("PDL", 0))
    g = gate if gate is not None else q
    if splits > 1:
        part_o = torch.empty((b * hq * splits, d), dtype=torch.float32, device=q.device)
        part_lse = torch.empty((b * hq * splits,), dtype=torch.float32, device=q.device)
    else:
        part_o = part_lse = out  # not touched: one split stores the output directly
    _decode_fp8_kernel[(b * hkv, splits)](
        q, k_cache, v_cache, slots, seq_lens, g, out, part_o, part_lse,
        q.stride(0), q.stride(1), q.stride(2), g.stride(0), g.stride(1), g.stride(2), out.stride(0), out.stride(1),
        k_cache.stride(0), k_cache.stride(1), v_cache.stride(0), v_cache.stride(1),
        float(sm_scale) * float(k_scale) * LOG2E, float(v_scale), k_cache.shape[1], splits,
        DIRECT=splits == 1, GROUP=hq // hkv, KV_HEADS=hkv, HEAD_DIM=d, BLOCK_H=block_h, BLOCK_N=block_n,
        HAS_GATE=gate is not None, num_warps=int(meta["num_warps"]), num_stages=int(meta["num_stages"]))
    if splits > 1:
        _decode_merge_kernel[(b * hq,)](
            seq_lens, g, out, part_o, part_lse, g.stride(0), g.stride(1), g.stride(2), out.stride(0), out.stride(1),
            float(v_scale), k_cache.shape[1], splits, Q_HEADS=hq, HEAD_DIM=d, BLOCK_N=block_n,
            CHUNK=int(meta["MERGE_CHUNK"]), HAS_GATE=gate is not None, USE_PDL=pdl,
            num_warps=int(meta["merge_warps"]), **({"launch_pdl": True} if pdl else {}))
    return out


def attention_decode_fp8(launch: dict[str, Any], *, q: torch.Tensor, k_cache: torch.Tensor,
                         v_cache: torch.Tensor, slots: torch.Tensor, seq_lens: torch.Tensor, max_len: int,
                         sm_scale: float, k_scale: float = 1.0, v_scale: float = 1.0,
                         gate: torch.Tensor | None = None) -> torch.Tensor:
    """The contract's entry: ``launch["grid"][1]`` is the split count, from the call's dims only
    (``max_len`` is not used: lengths are read on the device)."""
    meta = {**launch["meta"], "num_warps": int(launch["block"]) // 32}
    _, splits = grid_size(launch["grid"], {**dims_of(q, k_cache), **meta})
    return launch_decode(q, k_cache, v_cache, slots, seq_lens, sm_scale, k_scale, v_scale, gate, splits, meta)
