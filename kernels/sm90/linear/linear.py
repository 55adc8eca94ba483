"""Dense projections of the decode step on sm90, in Triton: FP8 block-scaled (W8A8) and BF16 weights, 1..128 rows.

Contracts: ``linear_fp8_block_decode`` (op ``linear_fp8_block``), ``linear_group_fp8_decode`` (op ``linear_group``:
projections sharing an input, stacked once), ``linear_bf16_decode`` (op ``linear_bf16``: lm_head, GDN b / a).

Byte floor: decode projections are weight-bound (M <= 128 rows against N x K weights): the floor is N*K bytes
(FP8) or 2*N*K (BF16) over the copy rate, e.g. GDN's qkv+z (12288 x 2048 FP8, 25 MB) ~6 us, lm_head (248320 x 2048
BF16, 1.0 GB) ~240 us. So every weight byte is read once per call: a CTA owns BLOCK_N output columns for every row
tile (one pass over its weight columns per row tile; M <= 64 is one tile), and a call with too few column tiles to
fill the 132 SMs splits K over `split` CTAs whose FP32 partials a second kernel sums in a fixed order (bitwise
deterministic, no atomics).

FP8 numerics (netra/ops/linear.py linear_ref): the activation is quantized per token in groups of 128 inside the
GEMM (each K block of 128 is one group: amax, scale = max(amax, 1e-10) / 448 and q = e4m3(clamp(x / scale)) with
IEEE divisions, as netra/ops/fp8.py), the block's E4M3 dot is accumulated in FP32 by the tensor cores and scaled by
the activation group scale times the weight block's scale, blocks summed in K order; rounded once to the output
dtype. BF16: FP32 accumulation of exact BF16 products. The contracts declare a relative-L2 tolerance against the
FP32 references (the tensor cores' internal accumulation order differs from a CPU/cuBLAS GEMM).
"""

from __future__ import annotations

from typing import Any

import torch
import triton
import triton.language as tl

_stacks: dict[tuple[int, ...], tuple[list[Any], torch.Tensor, torch.Tensor]] = {}


@triton.jit
def _linear_kernel(x_ptr, w_ptr, ws_ptr, out_ptr, part_ptr, M, N, K,
                   KB_PER_SPLIT: tl.constexpr, FP8: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                   SPLIT: tl.constexpr, OUT_F32: tl.constexpr):
    pid_n = tl.program_id(0)
    pid_m = tl.program_id(1)
    pid_k = tl.program_id(2)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    m_mask = offs_m < M
    n_mask = offs_n < N
    n_kb = K // BLOCK_K
    kb0 = pid_k * KB_PER_SPLIT
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    x_rows = x_ptr + offs_m[:, None] * K + offs_k[None, :]
    w_cols = w_ptr + offs_n[None, :] * K + offs_k[:, None]
    for i in range(0, KB_PER_SPLIT):
        kb = kb0 + i
        a = tl.load(x_rows + kb * BLOCK_K, mask=m_mask[:, None], other=0.0)
        w = tl.load(w_cols + kb * BLOCK_K, mask=n_mask[None, :], other=0.0)
        if FP8:
            af = a.to(tl.float32)
            amax = tl.max(tl.abs(af), axis=1)
            sa = tl.math.div_rn(tl.maximum(amax, 1e-10), 448.0)
            aq = tl.clamp(tl.math.div_rn(af, sa[:, None]), -448.0, 448.0).to(tl.float8e4nv)
            ws = tl.load(ws_ptr + ((pid_n * BLOCK_N) // 128) * n_kb + kb)
            d = tl.dot(aq, w, out_dtype=tl.float32)
            acc += d * (sa[:, None] * ws)
        else:
            acc += tl.dot(a, w, out_dtype=tl.float32)
    mask = m_mask[:, None] & n_mask[None, :]
    if SPLIT == 1:
        o = out_ptr + offs_m[:, None] * N + offs_n[None, :]
        if OUT_F32:
            tl.store(o, acc, mask=mask)
        else:
            tl.store(o, acc.to(tl.bfloat16), mask=mask)
    else:
        p = part_ptr + (pid_k * M + offs_m[:, None]) * N + offs_n[None, :]
        tl.store(p, acc, mask=mask)


@triton.jit
def _split_sum_kernel(part_ptr, out_ptr, total, SPLIT: tl.constexpr, BLOCK: tl.constexpr, OUT_F32: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < total
    acc = tl.load(part_ptr + offs, mask=mask, other=0.0)
    for s in tl.static_range(1, SPLIT):
        acc += tl.load(part_ptr + s * total + offs, mask=mask, other=0.0)
    if OUT_F32:
        tl.store(out_ptr + offs, acc, mask=mask)
    else:
        tl.store(out_ptr + offs, acc.to(tl.bfloat16), mask=mask)


def _block_m(m: int) -> int:
    """Rows per tile: all of a decode batch in one tile (every weight byte read once per call)."""
    return 16 if m <= 16 else (32 if m <= 32 else (64 if m <= 64 else 128))


def _launch(launch: dict[str, Any], x: torch.Tensor, w: torch.Tensor, ws: torch.Tensor | None,
            out_dtype: torch.dtype) -> torch.Tensor:
    meta = launch.get("meta", {})
    m, k = x.shape
    n = w.shape[0]
    bm, bn, bk = _block_m(m), int(meta["BLOCK_N"]), 128
    tiles = triton.cdiv(n, bn) * triton.cdiv(m, bm)
    n_kb = k // bk
    # split K until the grid covers the SMs (132 on an H200): a decode projection with few column tiles would
    # otherwise read its weights with a fraction of the machine
    split = 1
    while tiles * split < int(meta["TARGET_CTAS"]) and split * 2 <= 8 and n_kb % (split * 2) == 0:
        split *= 2
    kb_per_split = n_kb // split
    out = torch.empty(m, n, dtype=out_dtype, device=x.device)
    part = torch.empty(split, m, n, dtype=torch.float32, device=x.device) if split > 1 else out
    fp8 = ws is not None
    from netra.runtime import grid_size

    gx, gy, gz = grid_size(launch["grid"], {"n": n, "m": m, "BLOCK_N": bn, "BLOCK_M": bm, "split": split})
    grid = (gx, gy, gz)
    _linear_kernel[grid](x, w, ws if fp8 else w, out, part, m, n, k, KB_PER_SPLIT=kb_per_split, FP8=fp8, BLOCK_M=bm, BLOCK_N=bn,
                         BLOCK_K=bk, SPLIT=split, OUT_F32=out_dtype == torch.float32,
                         num_warps=launch["block"] // 32, num_stages=int(meta["num_stages"]))
    if split > 1:
        total = m * n
        _split_sum_kernel[(triton.cdiv(total, 1024),)](part, out, total, SPLIT=split, BLOCK=1024,
                                                       OUT_F32=out_dtype == torch.float32, num_warps=4)
    return out


def linear(launch: dict[str, Any], *, x: torch.Tensor, weight: Any, out_dtype: torch.dtype) -> torch.Tensor:
    """Op ``linear_fp8_block`` / ``linear_bf16``: ``x [..., K]`` -> ``[..., N]`` in ``out_dtype``."""
    lead = x.shape[:-1]
    x2 = x.reshape(-1, x.shape[-1])
    out = _launch(launch, x2, weight.data, weight.scale_inv if weight.is_fp8 else None, out_dtype)
    return out.reshape(*lead, out.shape[-1])


def linear_group(launch: dict[str, Any], *, x: torch.Tensor, weights: list[Any],
                 out_dtype: torch.dtype) -> list[torch.Tensor]:
    """Op ``linear_group`` (FP8 projections sharing an input): the weights stacked once (cached), one GEMM,
    the outputs as column views (the reference's split)."""
    key = tuple(id(w.data) for w in weights)
    hit = _stacks.get(key)
    if hit is None or any(a is not b.data for a, b in zip(hit[0], weights, strict=True)):
        if x.is_cuda and torch.cuda.is_current_stream_capturing():
            raise RuntimeError("linear_group: weights first stacked inside a capture; run the op eagerly first")
        hit = ([w.data for w in weights], torch.cat([w.data for w in weights]).contiguous(),
               torch.cat([w.scale_inv for w in weights]).contiguous())
        _stacks[key] = hit
    lead = x.shape[:-1]
    out = _launch(launch, x.reshape(-1, x.shape[-1]), hit[1], hit[2], out_dtype)
    parts = out.split([w.data.shape[0] for w in weights], dim=-1)
    return [p.reshape(*lead, p.shape[-1]) for p in parts]
