"""Causal depthwise conv1d, one decode step, width 4, SiLU, state shifted in place.

Per row ``i`` (slot ``s = slots[i]``) and channel ``c``, with the state ``pool[s, c, 0:3]`` (oldest
first) and the weight ``w[c, 0:4]`` (``w[c, 3]`` multiplies the current input), FP32 inside:

    y = w0·s0 + w1·s1 + w2·s2 + w3·x;   out = silu(y) (x's dtype);   pool[s, c] ← (s1, s2, x)

Rows whose slot is the pad slot (0) write a zero output and never touch the pool. The state keeps
its dtype exactly: the shift stores the loaded values and x unchanged (bitwise, NaN payloads too).

Program ``(i, j)`` owns row ``i``, channels ``[j·BC, (j+1)·BC)``; grid ``[batch, cdiv(channels, BC)]``
(no two programs share a (row, channel) state; rows never share a slot except pad rows, which
touch nothing). The pool is ``[slots, C, 3]`` contiguous, so a program's state is ONE contiguous run
of ``3·BC`` elements. The tap loads ``s0, s1, s2`` are per channel (stride 3, one warp instruction
spans 3·64 contiguous elements); the new state is written as that flat run — ``new[m] = old[m+1]``
where ``m % 3 != 2``, ``x[m // 3]`` where ``m % 3 == 2`` — in two power-of-two blocks (``2·BC`` and
``BC`` elements), so the stores are full 16-byte vectors instead of three strided 2-byte stores per
channel. The re-reads (``old[m+1]``, ``x[m//3]``) hit lines this program just loaded (L1/L2).

The first version (``[BB rows, BC channels]`` tiles, 4 warps over an ``[8, 256]`` tile) put 8
consecutive channels on a thread, so one warp instruction of a stride-3 tap load or state store
touched 12 cache lines for 64 useful bytes, and ran far behind SGLang's kernel (results/sm90/NOTES.md).

``USE_PDL`` (meta ``PDL``): launched as a programmatic dependent (``griddepcontrol``): the program
waits for its predecessor grid before reading anything, then lets its own dependents launch, so
back-to-back launches overlap their prologues (SGLang's causal_conv1d_update does the same on sm90).

Byte floor (Qwen3.6-35B-A3B, 8192 channels, bf16): per row x 16 KB + state 48 KB read, state 48 KB +
out 16 KB written = 128 KB; B = 128: 16.8 MB, B = 1: 131 KB (launch-bound). The floors in time, the
prediction before this version's H200 record and the outcome: results/sm90/NOTES.md, results/kernel-history.md (conv).
"""

from __future__ import annotations

from typing import Any

import torch
import triton
import triton.language as tl

from netra.runtime import grid_size

PAD_SLOT = 0


@triton.jit
def _conv1d_update_kernel(
    x_ptr, w_ptr, state_ptr, slots_ptr, out_ptr, channels,
    sx_b, sx_c, sw_c, sw_k, ss_n,
    BC: tl.constexpr, PAD: tl.constexpr, USE_PDL: tl.constexpr,
):
    if USE_PDL:
        tl.extra.cuda.gdc_wait()
        tl.extra.cuda.gdc_launch_dependents()
    i_r = tl.program_id(0)
    i_c = tl.program_id(1)
    c0 = i_c * BC
    lc = tl.arange(0, BC)
    offs_c = c0 + lc
    mask_c = offs_c < channels
    row = i_r.to(tl.int64)
    out_ptrs = out_ptr + row * channels + offs_c

    slot = tl.load(slots_ptr + i_r).to(tl.int64)
    if slot == PAD:
        tl.store(out_ptrs, tl.zeros([BC], dtype=tl.float32).to(out_ptr.dtype.element_ty), mask=mask_c)
        return

    x_row = x_ptr + row * sx_b
    x = tl.load(x_row + offs_c * sx_c, mask=mask_c, other=0.0)
    w0 = tl.load(w_ptr + offs_c * sw_c, mask=mask_c, other=0.0).to(tl.float32)
    w1 = tl.load(w_ptr + offs_c * sw_c + sw_k, mask=mask_c, other=0.0).to(tl.float32)
    w2 = tl.load(w_ptr + offs_c * sw_c + 2 * sw_k, mask=mask_c, other=0.0).to(tl.float32)
    w3 = tl.load(w_ptr + offs_c * sw_c + 3 * sw_k, mask=mask_c, other=0.0).to(tl.float32)

    # this program's state: one contiguous run of 3·BC elements (pool [slots, C, 3] contiguous)
    st = state_ptr + slot * ss_n + c0 * 3
    s0 = tl.load(st + lc * 3, mask=mask_c, other=0.0)
    s1 = tl.load(st + lc * 3 + 1, mask=mask_c, other=0.0)
    s2 = tl.load(st + lc * 3 + 2, mask=mask_c, other=0.0)

    # the shifted state, flat: new[m] = old[m + 1] (m % 3 != 2) or x[m // 3] (m % 3 == 2)
    n_flat = 3 * (channels - c0)  # elements of this program's run that exist (the last block may be short)
    m_a = tl.arange(0, 2 * BC)
    m_b = 2 * BC + tl.arange(0, BC)
    in_a = m_a < n_flat
    in_b = m_b < n_flat
    tap_a = (m_a % 3) == 2
    tap_b = (m_b % 3) == 2
    old_a = tl.load(st + m_a + 1, mask=in_a & ~tap_a, other=0.0)
    old_b = tl.load(st + m_b + 1, mask=in_b & ~tap_b, other=0.0)
    xg_a = tl.load(x_row + (c0 + m_a // 3) * sx_c, mask=in_a & tap_a, other=0.0)
    xg_b = tl.load(x_row + (c0 + m_b // 3) * sx_c, mask=in_b & tap_b, other=0.0)
    new_a = tl.where(tap_a, xg_a.to(state_ptr.dtype.element_ty), old_a)
    new_b = tl.where(tap_b, xg_b.to(state_ptr.dtype.element_ty), old_b)

    y = s0.to(tl.float32) * w0
    y = y + s1.to(tl.float32) * w1
    y = y + s2.to(tl.float32) * w2
    y = y + x.to(tl.float32) * w3
    y = y / (1.0 + tl.exp(-y))

    # Every thread's state loads (s0..s2, old_a/b) must be performed before any thread overwrites the run: the taps
    # s0..s2 of channel c (thread c's layout) and the flat run (m_a / m_b's layout) give one element to threads of
    # different warps, and Triton orders global memory only per thread (no barrier of its own here: the PTX had
    # none), so a warp running ahead stored the shifted state under a slower warp's tap loads (issue 19).
    tl.debug_barrier()
    tl.store(st + m_a, new_a, mask=in_a)
    tl.store(st + m_b, new_b, mask=in_b)
    tl.store(out_ptrs, y.to(out_ptr.dtype.element_ty), mask=mask_c)


def conv1d_update(launch: dict[str, Any], *, x: torch.Tensor, weight: torch.Tensor, state_pool: torch.Tensor,
                  slots: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """Host entry (contract ``kernel.symbol``): ``x [B, C]`` (any strides), ``weight [C, 4]`` (any
    strides), ``state_pool [slots, C, 3]`` with its last two dims contiguous, ``slots [B]``; returns
    ``silu(conv) [B, C]`` in x's dtype, contiguous (``out`` if given). No host synchronisation;
    graph-capturable."""
    bsz, channels = x.shape
    if state_pool.stride(2) != 1 or state_pool.stride(1) != 3 or state_pool.shape[2] != 3:
        raise ValueError(f"conv1d_update: state_pool must be [slots, C, 3] with its last two dims contiguous "
                         f"(got shape {tuple(state_pool.shape)}, strides {state_pool.stride()})")
    meta = dict(launch["meta"])
    num_stages = int(meta.pop("num_stages", 1))
    pdl = bool(meta.get("PDL", 0)) and x.is_cuda
    dims = {"batch": bsz, "channels": channels, "width": weight.shape[1]}
    grid = tuple(grid_size(launch["grid"], {**dims, **meta}))
    if out is None:
        out = torch.empty((bsz, channels), dtype=x.dtype, device=x.device)
    _conv1d_update_kernel[grid](
        x, weight, state_pool, slots, out, channels,
        x.stride(0), x.stride(1), weight.stride(0), weight.stride(1), state_pool.stride(0),
        BC=meta["BC"], PAD=PAD_SLOT, USE_PDL=pdl,
        num_warps=int(launch["block"]) // 32, num_stages=num_stages,
        **({"launch_pdl": True} if pdl else {}),
    )
    return out
