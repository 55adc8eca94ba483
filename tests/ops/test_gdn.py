from __future__ import annotations

import pytest
import torch

from netra.ops import gdn


def _inputs(length: int, hk: int = 2, hv: int = 4, dk: int = 16, dv: int = 8, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(length, hk, dk, generator=g).bfloat16()
    k = torch.randn(length, hk, dk, generator=g).bfloat16()
    v = torch.randn(length, hv, dv, generator=g).bfloat16()
    a, b = torch.randn(length, hv, generator=g), torch.randn(length, hv, generator=g)
    a_log = torch.log(torch.rand(hv, generator=g) * 15 + 1)
    dt_bias = torch.randn(hv, generator=g) * 0.5
    decay, beta = gdn.gdn_gating(a, b, a_log, dt_bias)
    state = torch.randn(hv, dk, dv, generator=g) * 0.2
    return q, k, v, decay, beta, state


def test_gating_formula() -> None:
    a, b = torch.tensor([[0.3, -2.0]]), torch.tensor([[1.0, -1.0]])
    a_log, dt = torch.tensor([0.5, 1.5]), torch.tensor([0.1, -0.2])
    g, beta = gdn.gdn_gating(a, b, a_log, dt)
    import math
    for h in range(2):
        sp = math.log1p(math.exp(float(a[0, h] + dt[h])))
        assert abs(float(g[0, h]) + math.exp(float(a_log[h])) * sp) < 1e-6
        assert abs(float(beta[0, h]) - 1 / (1 + math.exp(-float(b[0, h])))) < 1e-6


def test_recurrence_is_the_delta_rule() -> None:
    # One step by hand, in float64, for one head.
    q, k, v, g, beta, s0 = _inputs(1, hk=1, hv=1)
    o, s1 = gdn.gdn_recurrent_ref(q, k, v, g, beta, s0)
    qd, kd = q[0, 0].double(), k[0, 0].double()
    qd = qd / qd.norm() / qd.numel() ** 0.5
    kd = kd / kd.norm()
    s = s0[0].double() * torch.exp(g[0, 0].double())
    u = beta[0, 0].double() * (v[0, 0].double() - s.t() @ kd)
    s = s + torch.outer(kd, u)
    assert torch.allclose(s1[0].double(), s, atol=1e-5)
    assert torch.allclose(o[0, 0].double(), s.t() @ qd, atol=1e-2)


@pytest.mark.parametrize("length,chunk", [(1, 64), (63, 64), (64, 64), (150, 64), (37, 8)])
def test_chunked_equals_step_by_step(length: int, chunk: int) -> None:
    q, k, v, g, beta, s0 = _inputs(length, seed=length)
    o1, s1 = gdn.gdn_recurrent_ref(q, k, v, g, beta, s0)
    o2, s2 = gdn.gdn_chunked_ref(q, k, v, g, beta, s0, chunk=chunk)
    assert torch.allclose(s1, s2, atol=1e-5, rtol=1e-4)
    assert (o1.float() - o2.float()).abs().max() <= 2 ** -7 * (1 + o1.float().abs().max())


@pytest.mark.parametrize("ssm_dtype", [torch.float32, torch.bfloat16])
def test_decode_and_prefill_pools(ssm_dtype: torch.dtype) -> None:
    length = 20
    q, k, v, g, beta, _ = _inputs(length)
    pool = torch.zeros(4, 4, 16, 8, dtype=ssm_dtype)
    poison = torch.full((4, 16, 8), 7.0, dtype=ssm_dtype)
    pool[3] = poison
    # prefill 12 tokens into slot 2, then decode the rest one by one (slot 1 runs alongside, padded)
    out = [gdn.gdn_prefill(q[:12], k[:12], v[:12], g[:12], beta[:12], pool, [2], [12])]
    for t in range(12, length):
        rows = torch.tensor([2, 1])
        o = gdn.gdn_decode(q[t:t + 1].repeat(2, 1, 1), k[t:t + 1].repeat(2, 1, 1), v[t:t + 1].repeat(2, 1, 1),
                           g[t:t + 1].repeat(2, 1), beta[t:t + 1].repeat(2, 1), pool, rows)
        out.append(o[:1])
    o_ref, s_ref = gdn.gdn_recurrent_ref(q, k, v, g, beta, torch.zeros(4, 16, 8))
    tol = 2 ** -7 if ssm_dtype == torch.float32 else 2 ** -4
    assert (torch.cat(out).float() - o_ref.float()).abs().max() <= tol * (1 + o_ref.float().abs().max())
    assert torch.allclose(pool[2].float(), s_ref, atol=tol, rtol=tol)
    assert torch.equal(pool[3], poison)  # untouched slot


def test_decode_rows_do_not_depend_on_the_batch() -> None:
    q, k, v, g, beta, _ = _inputs(6)
    pool = torch.randn(8, 4, 16, 8)
    alone = []
    for i in range(6):
        p = pool.clone()
        alone.append(gdn.gdn_decode(q[i:i + 1], k[i:i + 1], v[i:i + 1], g[i:i + 1], beta[i:i + 1], p,
                                    torch.tensor([i + 1]))[0])
    together = gdn.gdn_decode(q, k, v, g, beta, pool.clone(), torch.arange(1, 7))
    assert torch.equal(torch.stack(alone), together)
