from __future__ import annotations

import torch

from netra.ops import conv


def test_causal_conv_matches_torch_conv1d_and_carries_state() -> None:
    torch.manual_seed(0)
    length, c, k = 11, 24, 4
    x = torch.randn(length, c).bfloat16()
    w = torch.randn(c, k).bfloat16()
    ref = torch.nn.functional.conv1d(x.double().t()[None], w.double()[:, None, :], padding=k - 1, groups=c)
    ref = torch.nn.functional.silu(ref[0, :, :length].t())
    pool = torch.zeros(3, c, k - 1, dtype=torch.bfloat16)
    # first 7 tokens as a prefill chunk, then 2 more as a chunk, then 2 decode steps
    y1 = conv.causal_conv1d_prefill(x[:7], w, pool, [1], [7])
    y2 = conv.causal_conv1d_prefill(x[7:9], w, pool, [1], [2])
    y3 = [conv.causal_conv1d_update(x[t:t + 1], w, pool, torch.tensor([1])) for t in (9, 10)]
    got = torch.cat([y1, y2, *y3])
    assert got.dtype == torch.bfloat16
    assert torch.allclose(got.double(), ref, atol=2e-2, rtol=2e-2)
    assert torch.equal(pool[1], x[-(k - 1):].t())  # the state is the last K-1 inputs, oldest first
    assert torch.equal(pool[0], torch.zeros(c, k - 1, dtype=torch.bfloat16))


def test_short_chunk_keeps_older_state() -> None:
    c, k = 5, 4
    w = torch.ones(c, k).bfloat16()
    state = torch.arange(c * (k - 1), dtype=torch.float32).reshape(c, k - 1).bfloat16()
    x = torch.full((1, c), 100.0).bfloat16()
    _, st = conv.causal_conv1d_ref(x, w, state)
    assert torch.equal(st[:, :2], state[:, 1:]) and torch.equal(st[:, 2], x[0])


def _nan_payloads() -> torch.Tensor:
    """Four BF16 NaNs with non-canonical payloads / signs (a float round trip would rewrite them)."""
    return torch.tensor([0x7FA1, -0x003F, 0x7F81, -0x0001], dtype=torch.int16).view(torch.bfloat16)


def test_update_reference_moves_state_bits_unchanged() -> None:
    """The shift computes nothing: NaN payloads in x and in the state reach the pool bit for bit
    (the H200 record of 2026-12-02 failed state_bitwise from B = 8 because the reference rounded the
    state through FP32, which canonicalises NaNs on the GPU)."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(3, 16, generator=g).bfloat16()
    w = torch.randn(16, 4, generator=g).bfloat16()
    pool = torch.randn(4, 16, 3, generator=g).bfloat16()
    x[1, :4] = _nan_payloads()
    pool[2, 4:8, 2] = _nan_payloads()
    before = pool.clone()
    conv.causal_conv1d_update_ref(x, w, pool, torch.tensor([3, 2, 0]))
    bits = pool.view(torch.int16)
    assert torch.equal(bits[2, :4, 2], x[1, :4].view(torch.int16))
    assert torch.equal(bits[2, 4:8, 1], _nan_payloads().view(torch.int16))
    assert torch.equal(bits[2, :, :2], before.view(torch.int16)[2, :, 1:])
    assert torch.equal(bits[0], before.view(torch.int16)[0])  # the pad slot


def test_prefill_reference_moves_state_bits_unchanged() -> None:
    g = torch.Generator().manual_seed(1)
    x = torch.randn(2, 8, generator=g).bfloat16()
    x[1, :4] = _nan_payloads()
    state = torch.randn(8, 3, generator=g).bfloat16()
    _, new = conv.causal_conv1d_ref(x, torch.randn(8, 4, generator=g).bfloat16(), state)
    assert torch.equal(new.view(torch.int16)[:4, 2], _nan_payloads().view(torch.int16))
    assert torch.equal(new.view(torch.int16)[:, 0], state.view(torch.int16)[:, 2])
