"""GDN's depthwise causal convolution (width K, SiLU), carrying the last K-1 inputs as state.

State layout (SGLang's): ``[slots, channels, K-1]``, oldest input first; a step shifts it left by
one and appends the new input (a shift, not a ring: no wrap index to get wrong). Weight ``[C, K]``
with ``w[:, K-1]`` multiplying the current input (``conv1d`` with K-1 left padding).
"""

from __future__ import annotations

import torch

from netra.ops._common import bind, route
from netra.ops._triton import launch_tactic

PAD_SLOT = 0  # decode rows on this slot are bucket padding (netra/engine/cache.py never hands it out)


def causal_conv1d_ref(x: torch.Tensor, weight: torch.Tensor, state: torch.Tensor
                      ) -> tuple[torch.Tensor, torch.Tensor]:
    """One sequence: ``x [L, C]``, ``state [C, K-1]`` -> (``silu(conv) [L, C]`` in x's dtype, new state)."""
    k = weight.shape[1]
    seq = torch.cat([state.t().to(torch.float32), x.float()], dim=0)  # [K-1+L, C]
    w = weight.float()
    length = x.shape[0]
    y = seq[0:length] * w[:, 0]
    for j in range(1, k):  # fixed summation order j = 0..K-1
        y = y + seq[j:j + length] * w[:, j]
    # the state moves values in its own dtype, never through FP32 (see causal_conv1d_update_ref)
    new_state = torch.cat([state.t(), x.to(state.dtype)], dim=0)[length:].t()
    return torch.nn.functional.silu(y).to(x.dtype), new_state


def causal_conv1d_update_ref(x: torch.Tensor, weight: torch.Tensor, state_pool: torch.Tensor,
                             slots: torch.Tensor) -> torch.Tensor:
    """One step for a batch: ``x [B, C]``; reads and writes ``state_pool[slots]`` in place.

    Rows on ``PAD_SLOT`` (bucket padding) output zeros and leave the pool as it was: they write
    back slot 0's own old value (no data-dependent shapes, so the step stays graph-capturable).

    The new state is built from the raw values in the pool's dtype (the shift computes nothing): a
    round trip through FP32 would canonicalise NaN payloads on the GPU (``cvt.rn.bf16.f32`` gives
    0x7FFF for every NaN), so the pool would depend on the device, not on the inputs."""
    k = weight.shape[1]
    st = state_pool.index_select(0, slots)  # [B, C, K-1]
    window = torch.cat([st.float(), x.float()[:, :, None]], dim=-1)  # [B, C, K]
    w = weight.float()
    y = window[..., 0] * w[:, 0]
    for j in range(1, k):
        y = y + window[..., j] * w[:, j]
    pad = (slots == PAD_SLOT)[:, None]
    shifted = torch.cat([st[..., 1:], x.to(state_pool.dtype)[:, :, None]], dim=-1)
    state_pool.index_copy_(0, slots, torch.where(pad[:, :, None], st, shifted))
    return torch.where(pad, 0.0, torch.nn.functional.silu(y)).to(x.dtype)


def causal_conv1d_prefill_ref(x: torch.Tensor, weight: torch.Tensor, state_pool: torch.Tensor,
                              seq_slots: list[int], q_lens: list[int]) -> torch.Tensor:
    """Concatenated sequences ``x [T, C]``; sequence i continues from ``state_pool[seq_slots[i]]`` and writes it back."""
    outs = []
    offset = 0
    for slot, n in zip(seq_slots, q_lens, strict=True):
        y, st = causal_conv1d_ref(x[offset:offset + n], weight, state_pool[slot])
        state_pool[slot] = st
        outs.append(y)
        offset += n
    return torch.cat(outs, dim=0)


def causal_conv1d_prefill(x: torch.Tensor, weight: torch.Tensor, state_pool: torch.Tensor,
                          seq_slots: list[int], q_lens: list[int]) -> torch.Tensor:
    hit = route("causal_conv1d_prefill", {"x": x, "w": weight, "state": state_pool},
                {"tokens": x.shape[0], "channels": x.shape[1], "width": weight.shape[1]})
    if hit is not None:
        return hit[0](hit[1], x=x, weight=weight, state_pool=state_pool, seq_slots=seq_slots, q_lens=q_lens)
    return causal_conv1d_prefill_ref(x, weight, state_pool, seq_slots, q_lens)


def causal_conv1d_update(x: torch.Tensor, weight: torch.Tensor, state_pool: torch.Tensor,
                         slots: torch.Tensor) -> torch.Tensor:
    hit = route("causal_conv1d_update", {"x": x, "w": weight, "state": state_pool, "slots": slots},
                {"batch": x.shape[0], "channels": x.shape[1], "width": weight.shape[1]})
    if hit is not None:
        return hit[0](hit[1], x=x, weight=weight, state_pool=state_pool, slots=slots)
    return causal_conv1d_update_ref(x, weight, state_pool, slots)


bind("causal_conv1d_update", launch_tactic)
bind("causal_conv1d_prefill", launch_tactic)
