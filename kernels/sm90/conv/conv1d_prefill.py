"""Causal depthwise conv1d over prefill chunks, width 4, SiLU, each sequence continuing from its pool state.

The concatenated chunks ``x [T, C]`` (any row stride, channels contiguous or not) hold sequence ``i`` at rows
``cu[i]..cu[i+1]``; it continues from ``pool[slots[i], :, 0:3]`` (oldest input first) and leaves there its last
three inputs. Per token ``t`` of a sequence of length ``L`` and channel ``c`` (``seq = state ++ x``, FP32 inside):

    y_t = w0·seq[t] + w1·seq[t+1] + w2·seq[t+2] + w3·seq[t+3];   out_t = silu(y_t) (x's dtype)
    pool[slot, c] ← (seq[L], seq[L+1], seq[L+2])  (the values moved, bitwise: no FP32 round trip)

Two launches, so that no program overwrites a state another program still reads:

1. ``_conv1d_prefill_kernel``, grid ``[sequences, cdiv(max_len, BT), cdiv(C, BC)]``: program ``(i, j, k)`` computes
   tokens ``[j·BT, (j+1)·BT)`` of sequence ``i`` on channels ``[k·BC, (k+1)·BC)`` (tiles past the sequence's end
   return at once), one token after another with the last three inputs in registers, so each input row is read
   once (plus the three before the tile). A tap before the sequence's first token reads the old state; only tile 0
   has such taps. (The first version loaded each tap as a shifted [BT, BC] tile, four reads per input, and was
   well behind SGLang's causal_conv1d_fn: results/sm90/NOTES.md.)
2. ``_conv1d_state_kernel``, grid ``[sequences, cdiv(C, BS)]``: writes each sequence's new state (stream-ordered
   after every read of the old one).

Sequences must have distinct slots (the scheduler's prefill batch never repeats one). No host synchronisation:
the chunk offsets and slots reach the device through pinned memory, asynchronously.

Byte floor (Qwen3.6-35B-A3B: 8192 channels, bf16): x read once + out written once = 4 bytes per token-channel,
8192 tokens: 268 MB (the taps re-read x from L1/L2). The FP32 reference it replaces runs a Python loop per
sequence and a dozen full-size FP32 ops (its cost in a prefill forward, scripts/gpu/prefill_profile.py:
results/sm90/NOTES.md).
"""

from __future__ import annotations

from typing import Any

import torch
import triton
import triton.language as tl

from netra.runtime import grid_size


@triton.jit
def _conv1d_prefill_kernel(
    x_ptr, w_ptr, state_ptr, slots_ptr, cu_ptr, out_ptr, channels,
    sx_t, sx_c, sw_c, sw_k, ss_n, ss_c, ss_k,
    BT: tl.constexpr, BC: tl.constexpr, UNROLL: tl.constexpr,
):
    i_s = tl.program_id(0)
    i_t = tl.program_id(1)
    i_c = tl.program_id(2)
    start = tl.load(cu_ptr + i_s)
    length = tl.load(cu_ptr + i_s + 1) - start
    t0 = i_t * BT
    if t0 >= length:
        return
    slot = tl.load(slots_ptr + i_s).to(tl.int64)
    offs_c = i_c * BC + tl.arange(0, BC)
    mask_c = offs_c < channels
    st = state_ptr + slot * ss_n + offs_c * ss_c  # [BC]: this slot's state of each channel
    w0 = tl.load(w_ptr + offs_c * sw_c, mask=mask_c, other=0.0).to(tl.float32)
    w1 = tl.load(w_ptr + offs_c * sw_c + sw_k, mask=mask_c, other=0.0).to(tl.float32)
    w2 = tl.load(w_ptr + offs_c * sw_c + 2 * sw_k, mask=mask_c, other=0.0).to(tl.float32)
    w3 = tl.load(w_ptr + offs_c * sw_c + 3 * sw_k, mask=mask_c, other=0.0).to(tl.float32)
    x_col = x_ptr + offs_c * sx_c
    # the window before the tile's first token: inputs t0-3..t0-1, from x, or from the old state before position 0
    # (state element 3 + p holds input p < 0)
    c0 = tl.where(t0 >= 3, tl.load(x_col + (start + t0 - 3).to(tl.int64) * sx_t, mask=mask_c & (t0 >= 3), other=0.0),
                  tl.load(st + (t0 * ss_k), mask=mask_c & (t0 < 3), other=0.0)).to(tl.float32)
    c1 = tl.where(t0 >= 2, tl.load(x_col + (start + t0 - 2).to(tl.int64) * sx_t, mask=mask_c & (t0 >= 2), other=0.0),
                  tl.load(st + ((t0 + 1) * ss_k), mask=mask_c & (t0 < 2), other=0.0)).to(tl.float32)
    c2 = tl.where(t0 >= 1, tl.load(x_col + (start + t0 - 1).to(tl.int64) * sx_t, mask=mask_c & (t0 >= 1), other=0.0),
                  tl.load(st + ((t0 + 2) * ss_k), mask=mask_c & (t0 < 1), other=0.0)).to(tl.float32)
    # the tile's tokens in order, the window sliding in registers: each input is read once
    if UNROLL:  # unrolled: the row loads are independent of the arithmetic, so they can all be in flight
        for i in tl.static_range(BT):
            c0, c1, c2 = _conv_token(x_col, out_ptr, start, t0 + i, length, channels, offs_c, mask_c, sx_t,
                                     c0, c1, c2, w0, w1, w2, w3)
    else:
        for i in range(BT):
            c0, c1, c2 = _conv_token(x_col, out_ptr, start, t0 + i, length, channels, offs_c, mask_c, sx_t,
                                     c0, c1, c2, w0, w1, w2, w3)


@triton.jit
def _conv_token(x_col, out_ptr, start, t, length, channels, offs_c, mask_c, sx_t, c0, c1, c2, w0, w1, w2, w3):
    ok = mask_c & (t < length)
    row = (start + t).to(tl.int64)
    c3 = tl.load(x_col + row * sx_t, mask=ok, other=0.0).to(tl.float32)
    y = c0 * w0  # fixed summation order j = 0..3, as the reference
    y = y + c1 * w1
    y = y + c2 * w2
    y = y + c3 * w3
    y = y / (1.0 + tl.exp(-y))
    tl.store(out_ptr + row * channels + offs_c, y.to(out_ptr.dtype.element_ty), mask=ok)
    return c1, c2, c3


@triton.jit
def _conv1d_state_kernel(
    x_ptr, state_ptr, slots_ptr, cu_ptr, channels, sx_t, sx_c, ss_n, ss_c, ss_k,
    BS: tl.constexpr,
):
    i_s = tl.program_id(0)
    i_c = tl.program_id(1)
    start = tl.load(cu_ptr + i_s)
    length = tl.load(cu_ptr + i_s + 1) - start
    slot = tl.load(slots_ptr + i_s).to(tl.int64)
    offs_c = i_c * BS + tl.arange(0, BS)
    mask_c = offs_c < channels
    st = state_ptr + slot * ss_n + offs_c * ss_c
    o0 = tl.load(st, mask=mask_c, other=0.0)
    o1 = tl.load(st + ss_k, mask=mask_c, other=0.0)
    o2 = tl.load(st + 2 * ss_k, mask=mask_c, other=0.0)
    x_row = x_ptr + offs_c * sx_c
    # new state i = seq[length + i] (seq = old state ++ x): an input where length + i >= 3, else the old state
    # shifted left by `length` (a chunk of 1 or 2 tokens)
    x0 = tl.load(x_row + (start + length - 3).to(tl.int64) * sx_t, mask=mask_c & (length >= 3), other=0.0)
    x1 = tl.load(x_row + (start + length - 2).to(tl.int64) * sx_t, mask=mask_c & (length >= 2), other=0.0)
    x2 = tl.load(x_row + (start + length - 1).to(tl.int64) * sx_t, mask=mask_c & (length >= 1), other=0.0)
    dt = state_ptr.dtype.element_ty
    n0 = tl.where(length >= 3, x0.to(dt), tl.where(length == 2, o2, tl.where(length == 1, o1, o0)))
    n1 = tl.where(length >= 2, x1.to(dt), tl.where(length == 1, o2, o1))
    n2 = tl.where(length >= 1, x2.to(dt), o2)
    # every old-state load is performed before the state is overwritten (one channel's three elements are loaded
    # and stored by one thread here, but keep the order explicit, as conv1d_update does)
    tl.debug_barrier()
    tl.store(st, n0, mask=mask_c)
    tl.store(st + ss_k, n1, mask=mask_c)
    tl.store(st + 2 * ss_k, n2, mask=mask_c)


def conv1d_prefill(launch: dict[str, Any], *, x: torch.Tensor, weight: torch.Tensor, state_pool: torch.Tensor,
                   seq_slots: list[int], q_lens: list[int]) -> torch.Tensor:
    """Host entry (contract ``kernel.symbol``): ``x [T, C]`` (any strides), ``weight [C, 4]``, ``state_pool
    [slots, C, 3]`` (any strides), the chunks' slots and lengths (host lists, ``sum(q_lens) == T``); returns
    ``silu(conv) [T, C]`` in x's dtype, contiguous; the pool's rows of ``seq_slots`` hold the new states."""
    tokens, channels = x.shape
    if sum(q_lens) != tokens or len(seq_slots) != len(q_lens):
        raise ValueError(f"conv1d_prefill: chunk lengths {q_lens} (slots {seq_slots}) do not cover {tokens} rows")
    if len(set(seq_slots)) != len(seq_slots):
        raise ValueError(f"conv1d_prefill: a slot appears twice in one prefill batch ({seq_slots})")
    if weight.shape[1] != 4 or state_pool.shape[2] != 3:
        raise ValueError(f"conv1d_prefill: width 4 only (weight {tuple(weight.shape)}, state {tuple(state_pool.shape)})")
    out = torch.empty((tokens, channels), dtype=x.dtype, device=x.device)
    if tokens == 0:
        return out
    from netra.ops._common import device_ints

    offsets = [0]
    for n in q_lens:
        offsets.append(offsets[-1] + n)
    cu = device_ints(tuple(offsets), x.device)  # once per chunk layout: every layer of the forward shares it
    slots = device_ints(tuple(seq_slots), x.device)
    meta = launch["meta"]
    dims = {"sequences": len(q_lens), "max_len": max(q_lens), "channels": channels}
    grid = tuple(grid_size(launch["grid"], {**dims, **meta}))
    _conv1d_prefill_kernel[grid](
        x, weight, state_pool, slots, cu, out, channels,
        x.stride(0), x.stride(1), weight.stride(0), weight.stride(1), state_pool.stride(0), state_pool.stride(1),
        state_pool.stride(2),
        BT=meta["BT"], BC=meta["BC"], UNROLL=int(meta.get("UNROLL", 0)), num_warps=int(launch["block"]) // 32,
        num_stages=int(meta.get("num_stages", 1)),
    )
    bs = int(meta["BS"])
    _conv1d_state_kernel[(len(q_lens), triton.cdiv(channels, bs))](
        x, state_pool, slots, cu, channels, x.stride(0), x.stride(1), state_pool.stride(0), state_pool.stride(1),
        state_pool.stride(2),
        BS=bs, num_warps=4, num_stages=1,
    )
    return out
