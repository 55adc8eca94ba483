"""RMSNorm family: Gemma-style ``x·(1+w)`` (layer norms, q/k norms) and the GDN output's gated norm.

References compute in FP32 and round once to the input dtype, as SGLang's GemmaRMSNorm and the
FLA gated norm (``norm_before_gate``) do. Shapes: normalisation over the last dim; any leading dims.

The ``*_quant`` variants are the norms whose rows feed FP8 block-scaled projections: with ``quant`` =
``fp8_e4m3_group128`` a contract of that quant writes the rows' per-token-group E4M3 form beside them (a
`fp8.GroupQuantized`, which `netra.ops.linear` reads without quantizing again); outside every such contract, or with
``quant`` = ``none``, they are the plain op and the projection quantizes its input itself (the same numbers).
"""

from __future__ import annotations

from typing import Any

import torch

from netra.ops import fp8
from netra.ops._common import bind, route

_offset_weights: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}


def _one_plus(weight: torch.Tensor) -> torch.Tensor:
    """``1 + w`` in FP32, made once per weight tensor (the same numbers as computing it per call)."""
    hit = _offset_weights.get(id(weight))
    if hit is None or hit[0] is not weight:
        hit = (weight, 1.0 + weight.float())
        _offset_weights[id(weight)] = hit
    return hit[1]


def rmsnorm_ref(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """Gemma RMSNorm: ``x / rms(x) · (1 + w)``, FP32 inside, output in x's dtype."""
    xf = x.float()
    var = xf.pow(2).mean(dim=-1, keepdim=True)
    return (xf * torch.rsqrt(var + eps) * _one_plus(weight)).to(x.dtype)


def add_rmsnorm_ref(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float
                    ) -> tuple[torch.Tensor, torch.Tensor]:
    """Fused residual add + Gemma RMSNorm: ``r' = x + r`` (rounded to the stream dtype); returns (norm(r'), r')."""
    # BF16 + BF16 is computed in FP32 and rounded once by torch (its "opmath" type): one op.
    new_residual = x + residual if x.dtype == residual.dtype else (x.float() + residual.float()).to(residual.dtype)
    return rmsnorm_ref(new_residual, weight, eps), new_residual


def gated_rmsnorm_ref(x: torch.Tensor, z: torch.Tensor, weight: torch.Tensor, eps: float,
                      out_dtype: torch.dtype | None = None) -> torch.Tensor:
    """GDN output norm: ``x / rms(x) · w · silu(z)`` (plain weight, not 1+w), FP32 inside."""
    xf = x.float()
    var = xf.pow(2).mean(dim=-1, keepdim=True)
    y = xf * torch.rsqrt(var + eps) * weight.float() * torch.nn.functional.silu(z.float())
    return y.to(out_dtype or z.dtype)


def _dims(x: torch.Tensor) -> dict[str, int]:
    return {"rows": x.numel() // max(1, x.shape[-1]), "width": x.shape[-1]}


def rmsnorm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    hit = route("rmsnorm_gemma", {"x": x, "w": weight}, _dims(x))
    if hit is not None:
        return hit[0](hit[1], x=x, weight=weight, eps=eps)
    return rmsnorm_ref(x, weight, eps)


def add_rmsnorm(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float
                ) -> tuple[torch.Tensor, torch.Tensor]:
    hit = route("add_rmsnorm_gemma", {"x": x, "residual": residual, "w": weight}, _dims(x))
    if hit is not None:
        out: tuple[torch.Tensor, torch.Tensor] = hit[0](hit[1], x=x, residual=residual, weight=weight, eps=eps)
        return out
    return add_rmsnorm_ref(x, residual, weight, eps)


def gated_rmsnorm(x: torch.Tensor, z: torch.Tensor, weight: torch.Tensor, eps: float,
                  out_dtype: torch.dtype | None = None) -> torch.Tensor:
    hit = route("gated_rmsnorm", {"x": x, "z": z, "w": weight}, _dims(x))
    if hit is not None:
        return hit[0](hit[1], x=x, z=z, weight=weight, eps=eps, out_dtype=out_dtype)
    return gated_rmsnorm_ref(x, z, weight, eps, out_dtype)


def rmsnorm_quant(x: torch.Tensor, weight: torch.Tensor, eps: float, quant: str
                  ) -> torch.Tensor | fp8.GroupQuantized:
    """`rmsnorm` whose rows feed projections of activation quant ``quant`` (module docstring)."""
    if quant != "none":
        hit = route("rmsnorm_gemma", {"x": x, "w": weight}, _dims(x), quant=quant)
        if hit is not None:
            return fp8.GroupQuantized(*hit[0](hit[1], x=x, weight=weight, eps=eps))
    return rmsnorm(x, weight, eps)


def add_rmsnorm_quant(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float, quant: str
                      ) -> tuple[torch.Tensor | fp8.GroupQuantized, torch.Tensor]:
    """`add_rmsnorm` whose rows feed projections of activation quant ``quant`` (module docstring)."""
    if quant != "none":
        hit = route("add_rmsnorm_gemma", {"x": x, "residual": residual, "w": weight}, _dims(x), quant=quant)
        if hit is not None:
            rows, q, s, new_residual = hit[0](hit[1], x=x, residual=residual, weight=weight, eps=eps)
            return fp8.GroupQuantized(rows, q, s), new_residual
    return add_rmsnorm(x, residual, weight, eps)


def gated_rmsnorm_quant(x: torch.Tensor, z: torch.Tensor, weight: torch.Tensor, eps: float, quant: str
                        ) -> torch.Tensor | fp8.GroupQuantized:
    """`gated_rmsnorm` (output in z's dtype) whose rows feed projections of activation quant ``quant``."""
    if quant != "none":
        hit = route("gated_rmsnorm", {"x": x, "z": z, "w": weight}, _dims(x), quant=quant)
        if hit is not None:
            return fp8.GroupQuantized(*hit[0](hit[1], x=x, z=z, weight=weight, eps=eps))
    return gated_rmsnorm(x, z, weight, eps)


def _entry(decision: Any, **kw: Any) -> Any:
    return decision.tactic.entry(decision.contract.launch, **kw)


bind("rmsnorm_gemma", _entry)
bind("add_rmsnorm_gemma", _entry)
bind("gated_rmsnorm", _entry)
