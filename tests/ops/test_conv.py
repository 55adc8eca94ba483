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
