from __future__ import annotations

import pytest
import torch

from netra.ops import fp8


@pytest.mark.parametrize("shape", [(256, 384), (200, 300), (3, 130, 64)])
def test_block_quantize_matches_blockwise_definition(shape: tuple[int, ...]) -> None:
    torch.manual_seed(0)
    w = torch.randn(shape) * 3
    q, s = fp8.block_quantize_weight(w)
    *lead, n, k = shape
    assert q.dtype == fp8.E4M3 and q.shape == w.shape
    assert s.shape == (*lead, -(-n // 128), -(-k // 128)) and s.dtype == torch.float32
    flat_w, flat_q, flat_s = w.reshape(-1, n, k), q.reshape(-1, n, k), s.reshape(-1, s.shape[-2], s.shape[-1])
    for b in range(flat_w.shape[0]):
        for i in range(flat_s.shape[1]):
            for j in range(flat_s.shape[2]):
                blk = flat_w[b, i * 128:(i + 1) * 128, j * 128:(j + 1) * 128]
                scale = blk.abs().max() / 448.0
                assert flat_s[b, i, j] == scale
                expect = (blk / scale).to(fp8.E4M3).float()
                got = flat_q[b, i * 128:(i + 1) * 128, j * 128:(j + 1) * 128].float()
                assert torch.equal(got, expect)
    deq = fp8.block_dequantize_weight(q, s)
    # E4M3 has 3 mantissa bits: relative error at most 2^-4 of the block max per element.
    err = (deq - w).abs()
    assert bool((err <= fp8.expand_block_scale(s, n, k) * 448.0 / 16 + 1e-6).all())


def test_exact_values_roundtrip() -> None:
    # Values already on the E4M3 grid of a power-of-two scale come back exactly.
    grid = torch.tensor([0.0, 1.0, -2.0, 448.0, 0.5, -0.25, 3.5, 6.0]).repeat(16, 16)
    q, s = fp8.block_quantize_weight(grid)
    assert torch.equal(fp8.block_dequantize_weight(q, s), grid)


@pytest.mark.parametrize("k", [128, 256, 200, 64])
def test_per_token_group_quantization(k: int) -> None:
    torch.manual_seed(1)
    x = (torch.randn(7, k) * torch.logspace(-3, 2, 7)[:, None]).bfloat16()
    x[3] = 0  # an all-zero row gets the floor scale, not a division by zero
    q, s = fp8.quantize_per_token_group(x)
    groups = -(-k // 128)
    assert s.shape == (7, groups)
    for g in range(groups):
        part = x[:, g * 128:(g + 1) * 128].float()
        expect_s = part.abs().amax(-1).clamp(min=1e-10) / 448.0
        assert torch.equal(s[:, g], expect_s)
        assert torch.equal(q[:, g * 128:(g + 1) * 128].float(), (part / expect_s[:, None]).to(fp8.E4M3).float())
    assert not torch.isnan(q.float()).any()
    deq = fp8.dequantize_per_token_group(q, s, dtype=torch.float64)
    fake = fp8.fake_quantize_per_token_group(x, dtype=torch.float64)
    assert torch.allclose(deq, fake, rtol=2**-22, atol=0)
    assert torch.equal(fake[3], torch.zeros(k, dtype=torch.float64))
