"""Dense projections of the decode step on sm90, in Triton: FP8 block-scaled (W8A8) and BF16 weights, 1..128 rows.

Contracts (configuration per m-bucket is contract data: ``launch.meta``, the grid rule):

* ``linear_fp8_block_decode`` (m 1..16), ``linear_fp8_block_decode_m64`` (17..64), ``linear_fp8_block_decode_m128``
  (65..128): op ``linear_fp8_block`` -> `_fp8_gemm_kernel`;
* ``linear_group_fp8_decode`` / ``_m64`` / ``_m128``: op ``linear_group`` (FP8 projections sharing an input, the
  weights stacked once) -> the same kernel;
* ``linear_bf16_decode`` (lm_head, m 1..32) and ``linear_group_bf16_decode`` (GDN b|a, 2048 -> 32 + 32):
  `_linear_kernel`; ``linear_bf16_cublas_decode`` (lm_head, m 33..128): `linear_cublas` (torch.mm, FP32 out).

Byte floor: decode projections are weight-bound (M <= 128 rows against N x K weights): the floor is N*K bytes (FP8) or
2*N*K (BF16) over the copy rate measured in the same run; GDN b|a (64 x 2048 BF16) is launch-bound. Each projection's
floor: results/sm90/NOTES.md.

FP8 design (`_fp8_gemm_kernel`): swap AB -- the weight tile ``[BLOCK_N, 128]`` is the MMA's M side (wgmma needs 64 rows)
and the activation rows ``[128, BM]`` (BM = 16..128) its N side, so one decode row costs a 16-wide MMA instead of a
64-row tile; every weight byte is read once per call (one row tile when m <= BLOCK_M). Grids with too few column
tiles for the 132 SMs split K over ``split`` CTAs; each writes its FP32 partial tile and takes a ticket from a
per-tile counter, and the last of a tile's CTAs sums the partials in split order (bitwise deterministic, one launch,
no second pass); it resets the counter, so the counter array stays zero between calls (workspace, zeroed once).
Activation quantization (``QUANT_IN=0``, every contract): one small pre-kernel (`_act_quant_kernel`) quantizes x
once (E4M3 rows + FP32 group scales) and the GEMM reads them -- or the norm in front wrote them with its rows
(kernels/sm90/norm, the ``*_fp8_*`` contracts; ``xq`` / ``xs``), and no pre-kernel runs. ``QUANT_IN=1`` (each CTA quantizes its rows' K block in
the loop) is kept as a launch option: the per-element IEEE divisions sit on every iteration's critical path and
it measured slower (results/sm90/dense_fp8_h200.md). Launch options (contract meta), measured in
results/sm90/dense_fp8_h200_tune1.json: ``SWAP=0`` (the activation rows as the MMA's M side, SGLang's orientation:
the winner at m 17..128 for the groups and at 65..128 for o / out); ``MFAST=1`` (the CTA order walks a column tile's
row tiles first, so the CTAs reading one weight tile run side by side; same tiles, same sums: bitwise the plain
order); ``PDL=1`` (the GEMM launched as the quantization kernel's programmatic dependent: faster at m = 1..128, bitwise the
same output; slower for o / out at m = 128, left off there); ``PREFETCH=1`` (each CTA's
weight slice prefetched into L2 at entry, ahead of the PDL wait: slower everywhere, kept off).

FP8 numerics (netra/ops/linear.py linear_ref): the activation is quantized per token in groups of 128 (amax,
scale = max(amax, 1e-10) / 448 and q = e4m3(clamp(x / scale)) with IEEE divisions, as netra/ops/fp8.py), each K
block's E4M3 dot is accumulated in FP32 by the tensor cores and scaled by the activation group scale times the weight
block's scale, blocks summed in K order within a split and the splits' partials summed in split order; rounded once
to the output dtype. BF16: FP32 accumulation of exact BF16 products. The contracts declare a relative-L2 tolerance
against the FP32 references (the tensor cores' internal accumulation order differs from a CPU/cuBLAS GEMM).

The design stays well below the floor: a 64 x 128 E4M3 tile per pipelined step with a wgmma wait per K block (the
block scale is applied before the next block) keeps too few bytes in flight per SM, and the quantization pre-kernel is
one more launch. The prediction made before the H200 records, the contracts' launches measured against SGLang's linear,
and the analysis: results/sm90/NOTES.md and results/sm90/dense_fp8_h200.md.
"""

from __future__ import annotations

from typing import Any

import torch
import triton
import triton.language as tl

_stacks: dict[tuple[int, ...], tuple[list[Any], torch.Tensor, torch.Tensor | None]] = {}


@triton.jit
def _linear_kernel(x_ptr, w_ptr, out_ptr, part_ptr, cnt_ptr, M, N, K,
                   KB_PER_SPLIT: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                   SPLIT: tl.constexpr, OUT_F32: tl.constexpr, TICKET: tl.constexpr = 0):
    """BF16 GEMM (lm_head, GDN b|a): acc[BLOCK_M, BLOCK_N] over one K range; split partials summed in split order,
    by `_split_sum_kernel` (a second launch) or, with ``TICKET``, by the tile's last CTA (`_fp8_gemm_kernel`'s
    ticket sum: the same additions in the same order, one launch)."""
    pid_n = tl.program_id(0)
    pid_m = tl.program_id(1)
    pid_k = tl.program_id(2)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    m_mask = offs_m < M
    n_mask = offs_n < N
    kb0 = pid_k * KB_PER_SPLIT
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    x_rows = x_ptr + offs_m[:, None] * K + offs_k[None, :]
    w_cols = w_ptr + offs_n[None, :] * K + offs_k[:, None]
    for i in range(0, KB_PER_SPLIT):
        kb = kb0 + i
        a = tl.load(x_rows + kb * BLOCK_K, mask=m_mask[:, None], other=0.0)
        w = tl.load(w_cols + kb * BLOCK_K, mask=n_mask[None, :], other=0.0)
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
        if TICKET:
            _ticket_sum(part_ptr, out_ptr, cnt_ptr, pid_m * tl.num_programs(0) + pid_n,
                        offs_m[:, None] * N + offs_n[None, :], mask, M, N, SPLIT, OUT_F32)


@triton.jit
def _ticket_sum(part_ptr, out_ptr, cnt_ptr, tile, o_offs, mask, M, N, SPLIT: tl.constexpr, OUT_F32: tl.constexpr):
    """Fixed-order split-K in one launch (after this CTA stored its partial): take a ticket of the tile's counter;
    the tile's last CTA, whichever it is, sums the partials in split order and resets the counter."""
    tl.debug_barrier()
    ticket = tl.atomic_add(cnt_ptr + tile, 1, sem="acq_rel", scope="gpu")
    if ticket == SPLIT - 1:
        tl.debug_barrier()
        tot = tl.load(part_ptr + o_offs, mask=mask, other=0.0, cache_modifier=".cg")
        for s in tl.static_range(1, SPLIT):
            tot += tl.load(part_ptr + s * M * N + o_offs, mask=mask, other=0.0, cache_modifier=".cg")
        if OUT_F32:
            tl.store(out_ptr + o_offs, tot, mask=mask)
        else:
            tl.store(out_ptr + o_offs, tot.to(tl.bfloat16), mask=mask)
        tl.atomic_xchg(cnt_ptr + tile, 0, sem="relaxed", scope="gpu")


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


@triton.jit
def _act_quant_kernel(x_ptr, xq_ptr, xs_ptr, K, NKB: tl.constexpr, KB_P2: tl.constexpr, PDL: tl.constexpr):
    """One row: x [K] BF16 -> xq [K] E4M3 and xs [K / 128] FP32 (per group of 128, IEEE divisions). ``PDL``: let the
    GEMM (launched as its programmatic dependent) start now; its ``gdc_wait`` still sees every write of this grid."""
    if PDL:
        tl.extra.cuda.gdc_launch_dependents()
    row = tl.program_id(0)
    g = tl.arange(0, KB_P2)
    c = tl.arange(0, 128)
    gmask = g < NKB
    offs = row * K + g[:, None] * 128 + c[None, :]
    x = tl.load(x_ptr + offs, mask=gmask[:, None], other=0.0).to(tl.float32)
    amax = tl.max(tl.abs(x), axis=1)
    sa = tl.math.div_rn(tl.maximum(amax, 1e-10), 448.0)
    q = tl.clamp(tl.math.div_rn(x, sa[:, None]), -448.0, 448.0).to(tl.float8e4nv)
    tl.store(xq_ptr + offs, q, mask=gmask[:, None])
    tl.store(xs_ptr + row * NKB + g, sa, mask=gmask)


@triton.jit
def _fp8_gemm_kernel(x_ptr, xq_ptr, xs_ptr, w_ptr, ws_ptr, out_ptr, part_ptr, cnt_ptr, M, N, K, kb_per_split,
                     BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, SPLIT: tl.constexpr, QUANT_IN: tl.constexpr,
                     SWAP: tl.constexpr, OUT_F32: tl.constexpr, PDL: tl.constexpr, MFAST: tl.constexpr = 0,
                     PREFETCH: tl.constexpr = 0):
    """W8A8 block GEMM over one K range, per K block scaled: swap AB (``SWAP``) acc[BLOCK_N, BLOCK_M] =
    W[n, k] . Xq[m, k]^T (the weight is the MMA's M side), else acc[BLOCK_M, BLOCK_N] = Xq[m, k] . W[n, k]^T."""
    BLOCK_K: tl.constexpr = 128
    if MFAST:  # the launch order (x fastest) walks the row tiles first: a column tile's CTAs run side by side
        lin = tl.program_id(0) + tl.num_programs(0) * (tl.program_id(1) + tl.num_programs(1) * tl.program_id(2))
        pid_m = lin % tl.num_programs(2)
        pid_n = (lin // tl.num_programs(2)) % tl.num_programs(0)
        pid_k = lin // (tl.num_programs(2) * tl.num_programs(0))
    else:
        pid_n = tl.program_id(0)
        pid_k = tl.program_id(1)
        pid_m = tl.program_id(2)
    n_kb = K // BLOCK_K
    kb0 = pid_k * kb_per_split
    if PREFETCH:  # the CTA's whole weight slice into L2 at once (one 128-byte line per row and K block); the
        # weights are never written by the kernels before, so this may run ahead of the PDL wait
        p_rows = w_ptr + tl.minimum(pid_n * BLOCK_N + tl.arange(0, BLOCK_N), N - 1) * K + kb0 * BLOCK_K
        for i in range(0, kb_per_split):
            tl.inline_asm_elementwise("prefetch.global.L2 [$1]; // $0", "=r,l", [p_rows + i * BLOCK_K],
                                      dtype=tl.int32, is_pure=False, pack=1)
    if PDL:  # launched early behind the quantization kernel: wait for its rows (and everything before it)
        tl.extra.cuda.gdc_wait()
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_k = tl.arange(0, BLOCK_K)
    n_mask = offs_n < N
    m_mask = offs_m < M
    w_ptrs = w_ptr + offs_n[:, None] * K + (kb0 * BLOCK_K + offs_k[None, :])
    ws_ptrs = ws_ptr + ((pid_n * BLOCK_N) // 128) * n_kb + kb0
    if QUANT_IN:
        a_ptrs = x_ptr + offs_m[:, None] * K + (kb0 * BLOCK_K + offs_k[None, :])
    else:
        a_ptrs = xq_ptr + offs_m[:, None] * K + (kb0 * BLOCK_K + offs_k[None, :])
        s_ptrs = xs_ptr + offs_m * n_kb + kb0
    if SWAP:
        acc = tl.zeros([BLOCK_N, BLOCK_M], dtype=tl.float32)
    else:
        acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for _ in range(0, kb_per_split):
        w = tl.load(w_ptrs, mask=n_mask[:, None], other=0.0)
        if QUANT_IN:
            af = tl.load(a_ptrs, mask=m_mask[:, None], other=0.0).to(tl.float32)
            sa = tl.math.div_rn(tl.maximum(tl.max(tl.abs(af), axis=1), 1e-10), 448.0)
            aq = tl.clamp(tl.math.div_rn(af, sa[:, None]), -448.0, 448.0).to(tl.float8e4nv)
        else:
            aq = tl.load(a_ptrs, mask=m_mask[:, None], other=0.0)
            sa = tl.load(s_ptrs, mask=m_mask, other=0.0)
            s_ptrs += 1
        ws = tl.load(ws_ptrs)
        if SWAP:
            acc += tl.dot(w, tl.trans(aq), out_dtype=tl.float32) * (sa[None, :] * ws)
        else:
            acc += tl.dot(aq, tl.trans(w), out_dtype=tl.float32) * (sa[:, None] * ws)
        w_ptrs += BLOCK_K
        a_ptrs += BLOCK_K
        ws_ptrs += 1
    if SWAP:
        mask = m_mask[None, :] & n_mask[:, None]
        o_offs = offs_m[None, :] * N + offs_n[:, None]
    else:
        mask = m_mask[:, None] & n_mask[None, :]
        o_offs = offs_m[:, None] * N + offs_n[None, :]
    if SPLIT == 1:
        if OUT_F32:
            tl.store(out_ptr + o_offs, acc, mask=mask)
        else:
            tl.store(out_ptr + o_offs, acc.to(tl.bfloat16), mask=mask)
    else:
        # every CTA stores its partial, then the tile's last one sums them (`_ticket_sum`)
        tl.store(part_ptr + pid_k * M * N + o_offs, acc, mask=mask)
        _ticket_sum(part_ptr, out_ptr, cnt_ptr, pid_m * tl.num_programs(0) + pid_n, o_offs, mask, M, N, SPLIT,
                    OUT_F32)


def _block_m(m: int) -> int:
    """Rows per tile: all of a decode batch in one tile (every weight byte read once per call)."""
    return 16 if m <= 16 else (32 if m <= 32 else (64 if m <= 64 else 128))


_COUNTERS = 4096  # split-K tickets: one per output tile of a split call (at most cdiv(12288, 64) * 1 here)
_counters: dict[Any, torch.Tensor] = {}


def _tickets(device: torch.device) -> torch.Tensor:
    """The per-device ticket counters (zeroed once; every split call leaves them zero)."""
    t = _counters.get(device)
    if t is None:
        if device.type == "cuda" and torch.cuda.is_current_stream_capturing():
            raise RuntimeError("linear: split-K counters first made inside a capture; run the op eagerly first")
        t = torch.zeros(_COUNTERS, dtype=torch.int32, device=device)
        _counters[device] = t
    return t


def fp8_plan(meta: dict[str, Any], m: int, n: int, k: int) -> dict[str, int]:
    """The FP8 launch of one call from the contract's meta (the m-bucket's data): the row tile (16..BLOCK_M, the
    rows' power of two), and the K split -- doubled while the tiles do not reach TARGET_CTAS, up to MAX_SPLIT, and
    only while it divides the K blocks."""
    bm_max, bn = int(meta["BLOCK_M"]), int(meta["BLOCK_N"])
    bm = 16
    while bm < m and bm < bm_max:
        bm *= 2
    n_kb = k // 128
    tiles = triton.cdiv(n, bn) * triton.cdiv(m, bm)
    split = 1
    while tiles * split < int(meta["TARGET_CTAS"]) and split * 2 <= int(meta["MAX_SPLIT"]) \
            and n_kb % (split * 2) == 0:
        split *= 2
    return {"BLOCK_M": bm, "BLOCK_N": bn, "split": split, "kb_per_split": n_kb // split, "tiles": tiles}


def quantize_rows(x: torch.Tensor, pdl: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """``x [m, K]`` BF16 -> (E4M3 ``[m, K]``, FP32 group scales ``[m, K / 128]``): the pre-kernel, one CTA per row
    (``pdl``: it releases the next kernel, launched with programmatic dependent launch, at its start)."""
    m, k = x.shape
    n_kb = k // 128
    xq = torch.empty(m, k, dtype=torch.float8_e4m3fn, device=x.device)
    xs = torch.empty(m, n_kb, dtype=torch.float32, device=x.device)
    _act_quant_kernel[(m,)](x, xq, xs, k, NKB=n_kb, KB_P2=triton.next_power_of_2(n_kb), PDL=pdl, num_warps=4)
    return xq, xs


def _launch_fp8(launch: dict[str, Any], x: torch.Tensor, w: torch.Tensor, ws: torch.Tensor,
                out_dtype: torch.dtype, pre: tuple[torch.Tensor, torch.Tensor] | None = None) -> torch.Tensor:
    """``pre``: the rows' E4M3 form and group scales made by the op in front (a norm's FP8 output), read instead of
    running the quantization kernel (bitwise its output)."""
    from netra.runtime import grid_size

    meta = launch["meta"]
    m, k = x.shape
    n = w.shape[0]
    if k % 128 or x.stride(-1) != 1 or x.stride(0) != k:
        raise ValueError(f"linear fp8: x [{m}, {k}] must be contiguous with K a multiple of 128")
    pl = fp8_plan(meta, m, n, k)
    quant_in = int(meta["QUANT_IN"])
    out = torch.empty(m, n, dtype=out_dtype, device=x.device)
    # PDL (launch meta): the GEMM is launched as the programmatic dependent of the kernel that quantized its rows
    # (the quantization kernel, or the norm writing them), so its CTAs are resident when the rows land (not on
    # Triton's interpreter, which has no PDL)
    pdl = bool(int(meta.get("PDL", 0))) and not quant_in and x.is_cuda
    if quant_in:
        xq, xs = x, x
    elif pre is not None:
        xq, xs = pre[0].reshape(m, k), pre[1].reshape(m, k // 128)
        if xq.dtype != torch.float8_e4m3fn or xs.dtype != torch.float32 or not (xq.is_contiguous()
                                                                                and xs.is_contiguous()):
            raise ValueError(f"linear fp8: pre-quantized rows must be contiguous E4M3 [{m}, {k}] with FP32 scales "
                             f"[{m}, {k // 128}], not {xq.dtype} / {xs.dtype}")
    else:
        xq, xs = quantize_rows(x, pdl)
    split = pl["split"]
    if split > 1:
        if pl["tiles"] > _COUNTERS:
            raise ValueError(f"linear fp8: {pl['tiles']} split tiles exceed the {_COUNTERS} counters")
        part = torch.empty(split, m, n, dtype=torch.float32, device=x.device)
        cnt = _tickets(x.device)
    else:
        part, cnt = out, out
    gx, gy, gz = grid_size(launch["grid"], {"n": n, "m": m, "k": k, **{a: int(b) for a, b in meta.items()}, **pl})
    _fp8_gemm_kernel[(gx, gy, gz)](x, xq, xs, w, ws, out, part, cnt, m, n, k, pl["kb_per_split"],
                                   BLOCK_M=pl["BLOCK_M"], BLOCK_N=pl["BLOCK_N"], SPLIT=split, QUANT_IN=quant_in,
                                   SWAP=int(meta.get("SWAP", 1)), PDL=pdl, **({"launch_pdl": True} if pdl else {}),
                                   MFAST=int(meta.get("MFAST", 0)), PREFETCH=int(meta.get("PREFETCH", 0)),
                                   OUT_F32=out_dtype == torch.float32, num_warps=int(launch["block"]) // 32,
                                   num_stages=int(meta["num_stages"]))
    return out


def _launch(launch: dict[str, Any], x: torch.Tensor, w: torch.Tensor, out_dtype: torch.dtype) -> torch.Tensor:
    """The BF16 path (`_linear_kernel`)."""
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
    from netra.runtime import grid_size

    gx, gy, gz = grid_size(launch["grid"], {"n": n, "m": m, "BLOCK_N": bn, "BLOCK_M": bm, "split": split})
    grid = (gx, gy, gz)
    # TICKET (launch meta): the split partials summed by each tile's last CTA instead of a second launch
    ticket = split > 1 and bool(int(meta.get("TICKET", 0)))
    if ticket and gx * gy > _COUNTERS:
        raise ValueError(f"linear bf16: {gx * gy} split tiles exceed the {_COUNTERS} counters")
    cnt = _tickets(x.device) if ticket else out
    _linear_kernel[grid](x, w, out, part, cnt, m, n, k, KB_PER_SPLIT=kb_per_split, BLOCK_M=bm, BLOCK_N=bn,
                         BLOCK_K=bk, SPLIT=split, OUT_F32=out_dtype == torch.float32, TICKET=int(ticket),
                         num_warps=launch["block"] // 32, num_stages=int(meta["num_stages"]))
    if split > 1 and not ticket:
        total = m * n
        _split_sum_kernel[(triton.cdiv(total, 1024),)](part, out, total, SPLIT=split, BLOCK=1024,
                                                       OUT_F32=out_dtype == torch.float32, num_warps=4)
    return out


def _pre(xq: torch.Tensor | None, xs: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor] | None:
    return None if xq is None or xs is None else (xq, xs)


def linear(launch: dict[str, Any], *, x: torch.Tensor, weight: Any, out_dtype: torch.dtype,
           xq: torch.Tensor | None = None, xs: torch.Tensor | None = None) -> torch.Tensor:
    """Op ``linear_fp8_block`` / ``linear_bf16``: ``x [..., K]`` -> ``[..., N]`` in ``out_dtype`` (FP8: ``xq`` /
    ``xs``, x's E4M3 form and group scales where the op in front made them)."""
    lead = x.shape[:-1]
    x2 = x.reshape(-1, x.shape[-1])
    if weight.is_fp8:
        out = _launch_fp8(launch, x2.contiguous(), weight.data, weight.scale_inv, out_dtype, _pre(xq, xs))
    else:
        out = _launch(launch, x2, weight.data, out_dtype)
    return out.reshape(*lead, out.shape[-1])


def linear_group(launch: dict[str, Any], *, x: torch.Tensor, weights: list[Any], out_dtype: torch.dtype,
                 xq: torch.Tensor | None = None, xs: torch.Tensor | None = None) -> list[torch.Tensor]:
    """Op ``linear_group`` (projections sharing an input, all FP8 or all BF16): the weights stacked once (cached),
    one GEMM, the outputs as column views (the reference's split)."""
    key = tuple(id(w.data) for w in weights)
    hit = _stacks.get(key)
    if hit is None or any(a is not b.data for a, b in zip(hit[0], weights, strict=True)):
        if x.is_cuda and torch.cuda.is_current_stream_capturing():
            raise RuntimeError("linear_group: weights first stacked inside a capture; run the op eagerly first")
        fp8 = weights[0].is_fp8
        hit = ([w.data for w in weights], torch.cat([w.data for w in weights]).contiguous(),
               torch.cat([w.scale_inv for w in weights]).contiguous() if fp8 else None)
        _stacks[key] = hit
    lead = x.shape[:-1]
    x2 = x.reshape(-1, x.shape[-1])
    if hit[2] is not None:
        out = _launch_fp8(launch, x2.contiguous(), hit[1], hit[2], out_dtype, _pre(xq, xs))
    else:
        out = _launch(launch, x2, hit[1], out_dtype)
    parts = out.split([w.data.shape[0] for w in weights], dim=-1)
    return [p.reshape(*lead, p.shape[-1]) for p in parts]


def linear_cublas(launch: dict[str, Any], *, x: torch.Tensor, weight: Any, out_dtype: torch.dtype) -> torch.Tensor:
    """Op ``linear_bf16`` through cuBLAS (``torch.mm`` with an FP32 accumulator and ``out_dtype`` output, one
    kernel): the lm_head's rows where the record shows cuBLAS ahead of `_linear_kernel` (contract
    ``linear_bf16_cublas_decode``; ``launch`` carries no tunables)."""
    lead = x.shape[:-1]
    x2 = x.reshape(-1, x.shape[-1])
    w = weight.data
    out = torch.mm(x2, w.t()) if out_dtype == x.dtype else torch.mm(x2, w.t(), out_dtype=out_dtype)
    return out.reshape(*lead, out.shape[-1])

