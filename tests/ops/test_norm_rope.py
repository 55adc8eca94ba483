from __future__ import annotations

import math

import torch

from netra.ops import norm, rope


def test_gemma_rmsnorm_and_residual() -> None:
    torch.manual_seed(0)
    x = torch.randn(5, 64).bfloat16()
    r = torch.randn(5, 64).bfloat16()
    w = (torch.randn(64) * 0.1).bfloat16()
    out = norm.rmsnorm(x, w, 1e-6)
    for i in range(5):
        row = x[i].double()
        expect = row / math.sqrt(float((row * row).mean()) + 1e-6) * (1 + w.double())
        assert torch.allclose(out[i].double(), expect, rtol=1e-2, atol=1e-2)
    normed, res = norm.add_rmsnorm(x, r, w, 1e-6)
    assert torch.equal(res, (x.float() + r.float()).bfloat16())
    assert torch.equal(normed, norm.rmsnorm(res, w, 1e-6))


def test_gated_rmsnorm_uses_plain_weight_and_silu_gate() -> None:
    torch.manual_seed(0)
    x, z = torch.randn(3, 4, 32), torch.randn(3, 4, 32).bfloat16()
    w = torch.rand(32).bfloat16() + 0.5
    out = norm.gated_rmsnorm(x, z, w, 1e-6)
    xf = x.double()
    expect = xf / torch.sqrt((xf * xf).mean(-1, keepdim=True) + 1e-6) * w.double() * torch.nn.functional.silu(z.double())
    assert out.dtype == torch.bfloat16
    assert torch.allclose(out.double(), expect, rtol=1e-2, atol=1e-2)


def test_partial_rope_matches_complex_rotation() -> None:
    torch.manual_seed(0)
    t, h, d, rd = 6, 3, 32, 8
    q, k = torch.randn(t, h, d).bfloat16(), torch.randn(t, 1, d).bfloat16()
    pos = torch.tensor([0, 1, 5, 17, 300, 4095])
    cache = rope.rope_cache(4096, rd, 1e7)
    qo, ko = rope.rope(q, k, pos, cache, rd)
    half = rd // 2
    for ti, p in enumerate(pos.tolist()):
        for j in range(half):
            ang = p / (1e7 ** (2 * j / rd))
            c = complex(math.cos(ang), math.sin(ang))
            a = complex(float(q[ti, 0, j]), float(q[ti, 0, j + half])) * c
            assert abs(float(qo[ti, 0, j]) - a.real) < 2e-2 * (1 + abs(a.real))
            assert abs(float(qo[ti, 0, j + half]) - a.imag) < 2e-2 * (1 + abs(a.imag))
    assert torch.equal(qo[..., rd:], q[..., rd:]) and torch.equal(ko[..., rd:], k[..., rd:])
    assert torch.equal(qo[0], q[0])  # position 0 is the identity
