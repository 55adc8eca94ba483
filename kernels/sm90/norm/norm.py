"""RMSNorm family on sm90, in Triton: Gemma RMSNorm, residual add + Gemma RMSNorm, and GDN's gated RMSNorm.

Contracts: ``rmsnorm_gemma_rows``, ``add_rmsnorm_gemma_rows``, ``gated_rmsnorm_rows`` (netra/ops/norm.py holds the
references). One program normalises ROWS rows of one width (<= 4096) in registers: every input read once and every
output written once, so each op runs at its byte floor's launch-bound limit at decode sizes (a few KB per call);
the residual add writes the new residual (rounded to BF16, as torch's BF16 add) and normalises that rounded value,
as the reference does. FP32 inside; the row's mean of squares is a tree reduction (the reference's order differs,
so the contracts declare a relative-L2 tolerance at BF16 resolution). The gated norm reads z in place from the
engine's strided view of the in-projection (it copied z contiguous first: one more launch per GDN layer, 30 copies
in the 128-row decode step, results/serving/decode_step_h200_float32.json; at one row the view is already
contiguous).

FP8 output (contracts ``*_fp8_rows`` / ``*_fp8_prefill``, dispatch quant ``fp8_e4m3_group128``): the same kernel also
writes the BF16 rows' per-token-group E4M3 form (amax of each 128 values of the rounded row, scale = max(amax, 1e-10) /
448, q = e4m3(clamp(y / scale)) with IEEE divisions), the arithmetic of linear.py's `_act_quant_kernel`, so an FP8
projection reading them skips that kernel: one launch less per projection input (70 of the decode step's 80
quantization launches, results/serving/decode_step_h200_float32.json). The BF16 rows
are still written (GDN's b|a projection and the references read them). ``PDL``: the kernel releases its programmatic
dependent (the GEMM, launched so by its contract) at entry, as the quantization kernel did; the GEMM's wait still
sees every write of this grid.

The prediction for the decode step made before any H200 run of the FP8 output: results/sm90/NOTES.md.
"""

from __future__ import annotations

from typing import Any

import torch
import triton
import triton.language as tl


@triton.jit
def _norm_kernel(x_ptr, r_ptr, z_ptr, w_ptr, out_ptr, res_out_ptr, q_ptr, s_ptr, n_rows, width, eps, z_heads,
                 z_s0, z_s1, MODE: tl.constexpr, BLOCK: tl.constexpr, ROWS: tl.constexpr, OUT_F32: tl.constexpr,
                 QUANT: tl.constexpr = 0, PDL: tl.constexpr = 0):
    # MODE 0: rmsnorm (1 + w); 1: residual add + rmsnorm (1 + w); 2: gated (w * silu(z)). QUANT: also the BF16 rows'
    # E4M3 form per group of 128 (q [rows, width], s [rows, width / 128]).
    if PDL:
        tl.extra.cuda.gdc_launch_dependents()
    rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    cols = tl.arange(0, BLOCK)
    rmask = rows < n_rows
    cmask = cols < width
    mask = rmask[:, None] & cmask[None, :]
    offs = rows[:, None] * width + cols[None, :]
    x = tl.load(x_ptr + offs, mask=mask, other=0.0)
    if MODE == 1:
        r = tl.load(r_ptr + offs, mask=mask, other=0.0)
        s = (x.to(tl.float32) + r.to(tl.float32)).to(tl.bfloat16)
        tl.store(res_out_ptr + offs, s, mask=mask)
        xf = s.to(tl.float32)
    else:
        xf = x.to(tl.float32)
    var = tl.sum(xf * xf, axis=1) / width
    inv = 1.0 / tl.sqrt_rn(var + eps)
    w = tl.load(w_ptr + cols, mask=cmask, other=0.0).to(tl.float32)
    if MODE == 2:
        # z as the engine holds it: a strided view [tokens, heads, width] of the in-projection (row r is token
        # r // heads, head r % heads), read in place instead of copied contiguous first
        zrow = (rows // z_heads).to(tl.int64) * z_s0 + (rows % z_heads).to(tl.int64) * z_s1
        z = tl.load(z_ptr + zrow[:, None] + cols[None, :], mask=mask, other=0.0).to(tl.float32)
        y = xf * inv[:, None] * w[None, :] * (z / (1.0 + tl.exp(-z)))
    else:
        y = xf * inv[:, None] * (1.0 + w[None, :])
    if OUT_F32:
        tl.store(out_ptr + offs, y, mask=mask)
    else:
        yb = y.to(tl.bfloat16)
        tl.store(out_ptr + offs, yb, mask=mask)
        if QUANT:  # the rounded rows, as the quantization kernel reads them back
            g = tl.reshape(yb.to(tl.float32), (ROWS, BLOCK // 128, 128))
            sc = tl.math.div_rn(tl.maximum(tl.max(tl.abs(g), axis=2), 1e-10), 448.0)
            q = tl.clamp(tl.math.div_rn(g, sc[:, :, None]), -448.0, 448.0).to(tl.float8e4nv)
            tl.store(q_ptr + offs, tl.reshape(q, (ROWS, BLOCK)), mask=mask)
            gi = tl.arange(0, BLOCK // 128)
            tl.store(s_ptr + rows[:, None] * (width // 128) + gi[None, :], sc,
                     mask=rmask[:, None] & (gi[None, :] < width // 128))


def _z_layout(z: torch.Tensor | None, width: int) -> tuple[torch.Tensor | None, int, int, int]:
    """(z, heads, token stride, head stride) for the kernel's in-place read: z ``[..., heads, width]`` (or
    ``[rows, width]``) with its last dim contiguous; any other layout is copied contiguous first."""
    if z is None:
        return None, 1, 0, 0
    if z.dim() == 2 and z.stride(1) == 1:
        return z, 1, z.stride(0), 0
    if z.dim() == 3 and z.stride(2) == 1:
        return z, z.shape[1], z.stride(0), z.stride(1)
    zc = z.contiguous().view(-1, width)
    return zc, 1, width, 0


def _run(launch: dict[str, Any], mode: int, x: torch.Tensor, r: torch.Tensor | None, z: torch.Tensor | None,
         w: torch.Tensor, eps: float, out_dtype: torch.dtype, quant: bool = False
         ) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None, torch.Tensor | None]:
    """(out, new residual or None, E4M3 rows or None, their group scales or None)."""
    from netra.runtime import grid_size

    width = x.shape[-1]
    z, z_heads, z_s0, z_s1 = _z_layout(z, width)
    n_rows = x.numel() // width
    rows = int(launch["meta"]["ROWS"])
    block = triton.next_power_of_2(width)
    out = torch.empty(x.shape, dtype=out_dtype, device=x.device)
    res = torch.empty_like(x) if mode == 1 else None
    q = s = None
    if quant:
        if out_dtype != torch.bfloat16 or width % 128 or block != width:
            raise ValueError(f"norm fp8: rows of {width} in {out_dtype}: the E4M3 form needs BF16 rows whose width "
                             "is a power of two and a multiple of 128")
        q = torch.empty(x.shape, dtype=torch.float8_e4m3fn, device=x.device)
        s = torch.empty(*x.shape[:-1], width // 128, dtype=torch.float32, device=x.device)
    # PDL (launch meta): release the FP8 GEMM launched behind this kernel as its programmatic dependent (not on
    # Triton's interpreter, which has no PDL)
    pdl = quant and bool(int(launch["meta"].get("PDL", 0))) and x.is_cuda
    (gx,) = grid_size(launch["grid"], {"rows": n_rows, "ROWS": rows})
    _norm_kernel[(gx,)](x, r if r is not None else x, z if z is not None else x, w, out,
                        res if res is not None else out, q if q is not None else out, s if s is not None else out,
                        n_rows, width, eps, z_heads, z_s0, z_s1, MODE=mode, BLOCK=block, ROWS=rows,
                        OUT_F32=out_dtype == torch.float32, QUANT=int(quant), PDL=int(pdl),
                        num_warps=launch["block"] // 32)
    return out, res, q, s


def rmsnorm(launch: dict[str, Any], *, x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    return _run(launch, 0, x, None, None, weight, eps, x.dtype)[0]


def add_rmsnorm(launch: dict[str, Any], *, x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor,
                eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    out, res, _, _ = _run(launch, 1, x, residual, None, weight, eps, x.dtype)
    assert res is not None
    return out, res


def gated_rmsnorm(launch: dict[str, Any], *, x: torch.Tensor, z: torch.Tensor, weight: torch.Tensor, eps: float,
                  out_dtype: torch.dtype | None = None) -> torch.Tensor:
    return _run(launch, 2, x, None, z, weight, eps, out_dtype or z.dtype)[0]


def _fp8(out: tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None, torch.Tensor | None]
         ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    rows, _, q, s = out
    assert q is not None and s is not None
    return rows, q, s


def rmsnorm_fp8(launch: dict[str, Any], *, x: torch.Tensor, weight: torch.Tensor, eps: float
                ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """`rmsnorm` plus the rows' E4M3 form: (BF16 rows, E4M3 rows, FP32 scales per group of 128)."""
    return _fp8(_run(launch, 0, x, None, None, weight, eps, x.dtype, quant=True))


def add_rmsnorm_fp8(launch: dict[str, Any], *, x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor,
                    eps: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """`add_rmsnorm` plus the rows' E4M3 form: (BF16 rows, E4M3 rows, FP32 scales, new residual)."""
    out = _run(launch, 1, x, residual, None, weight, eps, x.dtype, quant=True)
    assert out[1] is not None
    return (*_fp8(out), out[1])


def gated_rmsnorm_fp8(launch: dict[str, Any], *, x: torch.Tensor, z: torch.Tensor, weight: torch.Tensor,
                      eps: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """`gated_rmsnorm` (BF16 out) plus the rows' E4M3 form: (BF16 rows, E4M3 rows, FP32 scales)."""
    return _fp8(_run(launch, 2, x, None, z, weight, eps, torch.bfloat16, quant=True))
