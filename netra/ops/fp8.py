"""FP8 E4M3 helpers shared by the engine's references and the MoE kernels (issue 7).

Formats, as in the FP8 checkpoints (DeepSeek-V3 / Qwen3 ``fp8`` quant method, ``weight_block_size``
[128, 128]) and SGLang's W8A8 block path:

* weights: ``float8_e4m3fn`` ``[N, K]`` with one FP32 dequantization scale per 128x128 block,
  ``scale_inv[ceil(N/128), ceil(K/128)]`` (the checkpoint's ``weight_scale_inv``: w ≈ q * scale_inv);
  a partial edge block has its own scale computed over the elements it holds.
* activations: quantized per token in groups of 128 along K, one FP32 scale per group
  ``[T, ceil(K/128)]``; scale = max(|x| over the group, 1e-10) / 448.

Every function works on any leading shape and on CPU or GPU; nothing here allocates persistent state.
`GroupQuantized` carries activation rows together with their E4M3 form from the op that produced them to the FP8
projection that reads them (issue 19: the activation quantization folded into its producer).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

E4M3 = torch.float8_e4m3fn
E4M3_MAX = 448.0  # largest finite float8_e4m3fn
AMAX_EPS = 1e-10  # SGLang's per_token_group_quant_fp8 floor: an all-zero group gets a tiny scale, not 0/0
BLOCK = 128


def _div448(amax: torch.Tensor) -> torch.Tensor:
    """``amax / 448`` as an IEEE division on every device (CUDA turns a division by a Python scalar
    into a multiplication by its rounded reciprocal, which moves some scales by one ulp)."""
    if amax.device.type == "cpu":  # the CPU divides by a Python scalar exactly (one op fewer)
        return amax / E4M3_MAX
    return amax / torch.full_like(amax, E4M3_MAX)


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def block_quantize_weight(w: torch.Tensor, block: tuple[int, int] = (BLOCK, BLOCK)
                          ) -> tuple[torch.Tensor, torch.Tensor]:
    """``w [..., N, K]`` (any float) -> (``q [..., N, K]`` E4M3, ``scale_inv [..., ceil(N/bn), ceil(K/bk)]`` FP32)."""
    bn, bk = block
    *lead, n, k = w.shape
    nb, kb = _ceil_div(n, bn), _ceil_div(k, bk)
    wf = w.float()
    padded = torch.zeros(*lead, nb * bn, kb * bk, dtype=torch.float32, device=w.device)
    padded[..., :n, :k] = wf
    blocks = padded.reshape(*lead, nb, bn, kb, bk)
    amax = blocks.abs().amax(dim=(-3, -1)).clamp(min=AMAX_EPS)  # [..., nb, kb]
    scale = _div448(amax)
    q = (blocks / scale[..., :, None, :, None]).clamp(-E4M3_MAX, E4M3_MAX)
    q = q.reshape(*lead, nb * bn, kb * bk)[..., :n, :k].to(E4M3)
    return q.contiguous(), scale.contiguous()


def expand_block_scale(scale: torch.Tensor, n: int, k: int, block: tuple[int, int] = (BLOCK, BLOCK)
                       ) -> torch.Tensor:
    """``scale [..., nb, kb]`` -> per-element ``[..., n, k]`` (FP32)."""
    s = scale.float().repeat_interleave(block[0], dim=-2).repeat_interleave(block[1], dim=-1)
    return s[..., :n, :k]


def block_dequantize_weight(q: torch.Tensor, scale_inv: torch.Tensor,
                            block: tuple[int, int] = (BLOCK, BLOCK), dtype: torch.dtype = torch.float32
                            ) -> torch.Tensor:
    """E4M3 ``q [..., N, K]`` with block scales -> ``dtype`` (the product is formed in FP32, exact for E4M3)."""
    n, k = q.shape[-2], q.shape[-1]
    return (q.float() * expand_block_scale(scale_inv, n, k, block)).to(dtype)


def quantize_per_token_group(x: torch.Tensor, group: int = BLOCK) -> tuple[torch.Tensor, torch.Tensor]:
    """``x [..., K]`` -> (``q [..., K]`` E4M3, ``scale [..., ceil(K/group)]`` FP32), one scale per group of 128.

    The division happens in FP32 on the value as stored (BF16 activations are exact in FP32).
    """
    k = x.shape[-1]
    kb = _ceil_div(k, group)
    xf = x.float()
    if kb * group != k:
        xf = torch.nn.functional.pad(xf, (0, kb * group - k))
    g = xf.reshape(*x.shape[:-1], kb, group)
    scale = _div448(g.abs().amax(dim=-1).clamp(min=AMAX_EPS))
    q = (g / scale[..., None]).clamp(-E4M3_MAX, E4M3_MAX).reshape(*x.shape[:-1], kb * group)[..., :k]
    return q.to(E4M3).contiguous(), scale.contiguous()


def dequantize_per_token_group(q: torch.Tensor, scale: torch.Tensor, group: int = BLOCK,
                               dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Inverse of `quantize_per_token_group` (up to E4M3 rounding)."""
    k = q.shape[-1]
    s = scale.float().repeat_interleave(group, dim=-1)[..., :k]
    return (q.float() * s).to(dtype)


def fake_quantize_per_token_group(x: torch.Tensor, group: int = BLOCK, dtype: torch.dtype = torch.float32
                                  ) -> torch.Tensor:
    """``dequantize(quantize_per_token_group(x))`` in ``dtype`` with fewer ops (the references' hot path).

    The dequantized product ``q·scale`` is formed in ``dtype`` (exact in float64; one FP32 rounding
    otherwise, as a GEMM epilogue that applies the scale after accumulation would differ anyway).
    """
    k = x.shape[-1]
    if k % group:
        q, s = quantize_per_token_group(x, group)
        return (q.to(dtype).reshape(*x.shape[:-1], -1)[..., :k] *
                s.to(dtype).repeat_interleave(group, dim=-1)[..., :k])
    g = x.float().reshape(*x.shape[:-1], k // group, group)
    scale = _div448(g.abs().amax(dim=-1, keepdim=True).clamp_(min=AMAX_EPS))
    # No saturating clamp needed: |g| ≤ amax, so |g / scale| ≤ 448·(1 + 2⁻²³), which E4M3 rounds to
    # 448 (torch's conversion only overflows from 480 up). `q · scale` promotes to `dtype` in the mul.
    q = (g / scale).to(E4M3)
    return (q.to(dtype) * scale).reshape(x.shape)


ACT_GROUP128 = "fp8_e4m3_group128"  # the dispatch quant of an op whose output rows also come per-token-group E4M3


@dataclass(frozen=True)
class GroupQuantized:
    """Activation rows and their per-token-group E4M3 form, made together by the op that produced the rows (the
    norms in front of the FP8 projections), so that the projection skips its own quantization kernel.

    ``x [..., K]`` holds the rows as the producer rounds them (BF16), ``q [..., K]`` (E4M3) and
    ``scale [..., K / group]`` (FP32) are bitwise `quantize_per_token_group(x, group)`: a consumer may read
    either form and compute the same numbers (a reference reads ``x`` and quantizes it again).
    """

    x: torch.Tensor
    q: torch.Tensor
    scale: torch.Tensor
    group: int = BLOCK

    def __post_init__(self) -> None:
        k = self.x.shape[-1]
        if (self.q.shape != self.x.shape or k % self.group
                or tuple(self.scale.shape) != (*self.x.shape[:-1], k // self.group)):
            raise ValueError(f"GroupQuantized: x {tuple(self.x.shape)}, q {tuple(self.q.shape)}, scale "
                             f"{tuple(self.scale.shape)} are not rows with one scale per group of {self.group}")

    @property
    def shape(self) -> torch.Size:
        return self.x.shape

    def reshape(self, *shape: int) -> GroupQuantized:
        """The same rows under another leading shape; the last dim stays a multiple of the group (a group is a
        contiguous run of ``group`` values, so regrouping the flat rows keeps every group's scale)."""
        x = self.x.reshape(*shape)
        if x.shape[-1] % self.group:
            raise ValueError(f"GroupQuantized.reshape: last dim {x.shape[-1]} is not a multiple of {self.group}")
        return GroupQuantized(x, self.q.reshape(x.shape),
                              self.scale.reshape(*x.shape[:-1], x.shape[-1] // self.group), self.group)


def rows_of(x: torch.Tensor | GroupQuantized) -> torch.Tensor:
    """The activation rows of ``x`` as a tensor (its ``x`` where it carries an E4M3 form)."""
    return x.x if isinstance(x, GroupQuantized) else x
