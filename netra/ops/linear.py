"""Dense projections: BF16 weights, or FP8 E4M3 weights with 128x128 block scales (W8A8 dynamic).

`Weight` is what the engine holds for one projection; `linear` dispatches and falls back to
`linear_ref`. The FP8 reference is the deployed arithmetic: activations quantized per token in
groups of 128 (FP32 scale), both operands dequantized exactly to the accumulator, one GEMM,
output rounded once to the activation dtype.

An input may be a `fp8.GroupQuantized` (rows plus their E4M3 form, made by the norm in front): an FP8
tactic of the same group size then reads that form instead of quantizing the rows itself (bitwise the same
operands); BF16 weights and the references read the rows.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from netra.ops import fp8
from netra.ops._common import acc_dtype, bind, route


@dataclass
class Weight:
    """One projection ``[N, K]``: BF16 ``data``, or E4M3 ``data`` plus FP32 ``scale_inv`` block scales."""

    data: torch.Tensor
    scale_inv: torch.Tensor | None = None
    block: tuple[int, int] = (fp8.BLOCK, fp8.BLOCK)
    # The fallback's dequantized copy in the accumulator dtype, made once (identical numerics to
    # dequantizing on every call; a tactic never reads it). Stacked expert weights are never cached
    # implicitly (256 experts in FP32 would not fit next to the model); the engine asks for it on a CPU.
    _dequant: torch.Tensor | None = field(default=None, repr=False)

    @property
    def is_fp8(self) -> bool:
        return self.data.dtype == fp8.E4M3

    @property
    def out_features(self) -> int:
        return int(self.data.shape[-2])

    @property
    def in_features(self) -> int:
        return int(self.data.shape[-1])

    def dequantized(self, dtype: torch.dtype, cache: bool = True) -> torch.Tensor:
        if self._dequant is not None and self._dequant.dtype == dtype:
            return self._dequant
        if not cache:
            if self.is_fp8:
                assert self.scale_inv is not None
                return fp8.block_dequantize_weight(self.data, self.scale_inv, self.block, dtype)
            return self.data.to(dtype)
        if self._dequant is None or self._dequant.dtype != dtype:
            if self.is_fp8:
                assert self.scale_inv is not None
                self._dequant = fp8.block_dequantize_weight(self.data, self.scale_inv, self.block, dtype)
            else:
                self._dequant = self.data.to(dtype)
        return self._dequant


def act_quant(weight: Weight) -> str:
    """The activation quant a producer may fold in for ``weight``'s input (`netra.ops.norm`'s ``*_quant``)."""
    return fp8.ACT_GROUP128 if weight.is_fp8 and weight.block[1] == fp8.BLOCK else "none"


def _prequantized(x: torch.Tensor | fp8.GroupQuantized, fp8_weights: bool, group: int
                  ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """(the rows, the tactic's extra arguments): ``xq`` / ``xs`` where the E4M3 form fits FP8 weights of ``group``."""
    if not isinstance(x, fp8.GroupQuantized):
        return x, {}
    if fp8_weights and x.group == group:
        return x.x, {"xq": x.q, "xs": x.scale}
    return x.x, {}


def linear_ref(x: torch.Tensor, weight: Weight, out_dtype: torch.dtype | None = None) -> torch.Tensor:
    """``x [..., K]`` (BF16) @ ``weight [N, K]``ᵀ -> ``[..., N]`` in ``out_dtype`` (default: x's dtype)."""
    acc = acc_dtype(x.device)
    out_dtype = out_dtype or x.dtype
    xa = fp8.fake_quantize_per_token_group(x, weight.block[1], acc) if weight.is_fp8 else x.to(acc)
    return torch.matmul(xa, weight.dequantized(acc).t()).to(out_dtype)


def linear(x: torch.Tensor | fp8.GroupQuantized, weight: Weight, out_dtype: torch.dtype | None = None
           ) -> torch.Tensor:
    """Projection through dispatch (op ``linear_fp8_block`` or ``linear_bf16``); fallback `linear_ref`."""
    x, pre = _prequantized(x, weight.is_fp8, weight.block[1])
    op = "linear_fp8_block" if weight.is_fp8 else "linear_bf16"
    tensors = {"x": x, "w": weight.data}
    if weight.scale_inv is not None:
        tensors["w_scale"] = weight.scale_inv
    hit = route(op, tensors, {"m": x.numel() // max(1, x.shape[-1]), "n": weight.out_features,
                              "k": weight.in_features}, quant="fp8_e4m3_block128" if weight.is_fp8 else "none")
    if hit is not None:
        launcher, decision = hit
        return launcher(decision, x=x, weight=weight, out_dtype=out_dtype or x.dtype, **pre)
    return linear_ref(x, weight, out_dtype)


_group_cache: dict[tuple[int, ...], tuple[list[torch.Tensor], torch.Tensor]] = {}


def linear_group_ref(x: torch.Tensor, weights: list[Weight], out_dtype: torch.dtype | None = None
                     ) -> list[torch.Tensor]:
    """Several projections of the same input: the same numbers as ``[linear_ref(x, w) for w in weights]``.

    The activation is quantized once (per-token-group quantization does not depend on the weight)
    and, when every weight holds its dequantized copy, the copies are concatenated once and the
    projections run as one GEMM: each output column is the same dot product either way.
    """
    acc = acc_dtype(x.device)
    out_dtype = out_dtype or x.dtype
    kinds = {(w.is_fp8, w.block[1]) for w in weights}
    if len(kinds) != 1 or any(w._dequant is None or w._dequant.dtype != acc for w in weights):
        return [linear_ref(x, w, out_dtype) for w in weights]
    is_fp8, group = kinds.pop()
    xa = fp8.fake_quantize_per_token_group(x, group, acc) if is_fp8 else x.to(acc)
    parts = [w._dequant for w in weights if w._dequant is not None]
    key = tuple(id(d) for d in parts)
    hit = _group_cache.get(key)
    # the entry holds its tensors: an id is reused once its tensor is freed, so a hit must be those very tensors
    if hit is None or any(a is not b for a, b in zip(hit[0], parts, strict=True)):
        hit = (parts, torch.cat(parts).t())
        _group_cache[key] = hit
    out = torch.matmul(xa, hit[1]).to(out_dtype)
    return list(out.split([w.out_features for w in weights], dim=-1))


def linear_group(x: torch.Tensor | fp8.GroupQuantized, weights: list[Weight], out_dtype: torch.dtype | None = None
                 ) -> list[torch.Tensor]:
    """Projections sharing an input through dispatch (op ``linear_group``); fallback `linear_group_ref`."""
    all_fp8 = all(w.is_fp8 for w in weights)
    x, pre = _prequantized(x, all_fp8, weights[0].block[1])
    tensors = {"x": x, "w": weights[0].data}
    # one signature per (rows, K, total N, parts): the tactic stacks the weights once; a mixed-dtype group (or
    # weights of different K) is outside every contract by its dtype / quant
    same = all(w.in_features == x.shape[-1] and w.data.dtype == weights[0].data.dtype for w in weights)
    hit = route("linear_group", tensors, {"m": x.numel() // max(1, x.shape[-1]), "k": x.shape[-1],
                                          "n": sum(w.out_features for w in weights), "parts": len(weights)},
                quant="fp8_e4m3_block128" if all_fp8 and same else ("none" if same else "mixed"))
    if hit is not None:
        out: list[torch.Tensor] = hit[0](hit[1], x=x, weights=weights, out_dtype=out_dtype or x.dtype,
                                         **(pre if same else {}))
        return out
    return linear_group_ref(x, weights, out_dtype)


def _launch_linear(decision: Any, *, x: torch.Tensor, weight: Weight, out_dtype: torch.dtype,
                   **pre: torch.Tensor) -> torch.Tensor:
    out: torch.Tensor = decision.tactic.entry(decision.contract.launch, x=x, weight=weight, out_dtype=out_dtype,
                                              **pre)
    return out


def _launch_group(decision: Any, *, x: torch.Tensor, weights: list[Weight], out_dtype: torch.dtype,
                  **pre: torch.Tensor) -> list[torch.Tensor]:
    out: list[torch.Tensor] = decision.tactic.entry(decision.contract.launch, x=x, weights=weights,
                                                    out_dtype=out_dtype, **pre)
    return out


bind("linear_fp8_block", _launch_linear)
bind("linear_bf16", _launch_linear)
bind("linear_group", _launch_group)
