"""BF16 projections sharing an input at prefill rows through cuBLAS: one ``torch.mm`` per projection (FP32
accumulation, output rounded once to the activation dtype), for the GDN's b and a projections (2048 -> 32 + 32).

At prefill the FP32 reference converted the chunk's activations to FP32 once per projection and ran an FP32 GEMM
(60 FP32 GEMMs and 60 conversions of [8192, 2048] per 8,192-token prefill forward; their device time,
scripts/gpu/prefill_profile.py: results/sm90/NOTES.md). Contract ``linear_group_bf16_prefill``; ``launch``
carries no tunables. No Triton kernel: the entry is the host function dispatch calls, like ``linear_cublas``.
"""

from __future__ import annotations

from typing import Any

import torch


def linear_group_cublas(launch: dict[str, Any], *, x: torch.Tensor, weights: list[Any],
                        out_dtype: torch.dtype) -> list[torch.Tensor]:
    """Op ``linear_group`` for BF16 weights: ``[x @ w.data.T for w in weights]`` in ``out_dtype``, each one cuBLAS
    GEMM (no stacked copy of the weights to keep)."""
    lead = x.shape[:-1]
    x2 = x.reshape(-1, x.shape[-1])
    outs = []
    for w in weights:
        o = torch.mm(x2, w.data.t()) if out_dtype == x.dtype else torch.mm(x2, w.data.t(), out_dtype=out_dtype)
        outs.append(o.reshape(*lead, o.shape[-1]))
    return outs
