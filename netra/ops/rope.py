"""Partial rotary embedding (NeoX rotate-half on the first ``rotary_dim`` dims of each head).

Qwen3.5/3.6 text positions use interleaved M-RoPE with all three position streams equal, which is
exactly 1-D RoPE; so one position per token. The cos/sin table is a persistent buffer indexed by
position (graph-safe: no per-step allocation of the table).
"""

from __future__ import annotations

import torch

from netra.ops._common import route


def rope_cache(max_positions: int, rotary_dim: int, theta: float, device: torch.device | str = "cpu"
               ) -> torch.Tensor:
    """``[max_positions, rotary_dim]`` FP32: cos in the first half, sin in the second."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, rotary_dim, 2, dtype=torch.float64) / rotary_dim))
    t = torch.arange(max_positions, dtype=torch.float64)
    freqs = torch.outer(t, inv_freq)
    return torch.cat([freqs.cos(), freqs.sin()], dim=-1).to(torch.float32).to(device)


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, rotary_dim: int) -> torch.Tensor:
    half = rotary_dim // 2
    xf = x.float()
    x1, x2 = xf[..., :half], xf[..., half:rotary_dim]
    rot = torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)
    return torch.cat([rot, xf[..., rotary_dim:]], dim=-1).to(x.dtype)


def rope_ref(q: torch.Tensor, k: torch.Tensor, positions: torch.Tensor, cache: torch.Tensor,
             rotary_dim: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``q [T, Hq, D]``, ``k [T, Hk, D]``, ``positions [T]`` -> rotated (q, k), FP32 inside, input dtype out."""
    cs = cache.index_select(0, positions)[:, None, :]  # [T, 1, rd]
    half = rotary_dim // 2
    cos, sin = cs[..., :half], cs[..., half:]
    return _rotate(q, cos, sin, rotary_dim), _rotate(k, cos, sin, rotary_dim)


def rope(q: torch.Tensor, k: torch.Tensor, positions: torch.Tensor, cache: torch.Tensor,
         rotary_dim: int) -> tuple[torch.Tensor, torch.Tensor]:
    hit = route("rope_neox_partial", {"q": q, "k": k, "positions": positions},
                {"tokens": q.shape[0], "q_heads": q.shape[1], "k_heads": k.shape[1], "head_dim": q.shape[2],
                 "rotary_dim": rotary_dim})
    if hit is not None:
        out: tuple[torch.Tensor, torch.Tensor] = hit[0](hit[1], q=q, k=k, positions=positions, cache=cache,
                                                        rotary_dim=rotary_dim)
        return out
    return rope_ref(q, k, positions, cache, rotary_dim)
