from __future__ import annotations

import torch

from netra.ops import attention, fp8


def _dense(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, start: int, scale: float) -> torch.Tensor:
    """Plain causal GQA: q [Lq, Hq, D] at positions start.., k/v [Lk, Hkv, D] (float64)."""
    hq, hkv = q.shape[1], k.shape[1]
    kk = k.double().repeat_interleave(hq // hkv, dim=1)
    vv = v.double().repeat_interleave(hq // hkv, dim=1)
    s = torch.einsum("qhd,khd->hqk", q.double(), kk) * scale
    qpos = torch.arange(start, start + q.shape[0])[:, None]
    s = s.masked_fill(torch.arange(k.shape[0])[None, :] > qpos, float("-inf"))
    return torch.einsum("hqk,khd->qhd", torch.softmax(s, -1), vv)


def test_prefill_then_decode_over_fp8_cache() -> None:
    torch.manual_seed(0)
    hq, hkv, d, total = 8, 2, 32, 40
    q = torch.randn(total, hq, d).bfloat16()
    k = torch.randn(total, hkv, d).bfloat16()
    v = torch.randn(total, hkv, d).bfloat16()
    scale = d ** -0.5
    kc = torch.zeros(4, 64, hkv, d, dtype=fp8.E4M3)
    vc = torch.zeros_like(kc)
    slot = 2
    # chunk 0..24 then 25..34 via prefill, then 35..39 one by one via decode
    outs = []
    for lo, hi in ((0, 25), (25, 35)):
        pos = torch.arange(lo, hi)
        attention.kv_store(k[lo:hi], v[lo:hi], kc, vc, torch.full((hi - lo,), slot), pos)
        outs.append(attention.attention_prefill(q[lo:hi], kc, vc, [slot], [lo], [hi - lo], scale))
    for t in range(35, total):
        attention.kv_store(k[t:t + 1], v[t:t + 1], kc, vc, torch.tensor([slot]), torch.tensor([t]))
        outs.append(attention.attention_decode(q[t:t + 1], kc, vc, torch.tensor([slot]), torch.tensor([t + 1]),
                                               t + 1, scale))
    got = torch.cat(outs).double()
    # exact oracle: the same attention over the E4M3-rounded cache
    k8, v8 = k.float().to(fp8.E4M3).double(), v.float().to(fp8.E4M3).double()
    assert torch.allclose(got, _dense(q, k8, v8, 0, scale), atol=1e-2, rtol=1e-2)
    # against full precision, the FP8 cache costs at most a few percent of the output scale
    full = _dense(q, k, v, 0, scale)
    assert (got - full).abs().max() < 0.1 * full.abs().max()


def test_decode_batch_rows_are_independent_and_bf16_cache() -> None:
    torch.manual_seed(1)
    hq, hkv, d = 4, 2, 16
    kc = torch.randn(5, 32, hkv, d).bfloat16()
    vc = torch.randn(5, 32, hkv, d).bfloat16()
    q = torch.randn(3, hq, d).bfloat16()
    slots, lens = torch.tensor([4, 1, 3]), torch.tensor([7, 30, 1])
    batch = attention.attention_decode(q, kc, vc, slots, lens, 30, 0.25)
    for i in range(3):
        n = int(lens[i])
        alone = attention.attention_decode(q[i:i + 1], kc, vc, slots[i:i + 1], lens[i:i + 1], n, 0.25)
        assert torch.equal(alone[0], batch[i])
        ref = _dense(q[i:i + 1], kc[int(slots[i]), :n], vc[int(slots[i]), :n], n - 1, 0.25)
        assert torch.allclose(batch[i].double(), ref[0], atol=1e-2, rtol=1e-2)


def test_output_gate() -> None:
    o, g = torch.randn(3, 2, 4).bfloat16(), torch.randn(3, 2, 4).bfloat16()
    assert torch.equal(attention.output_gate(o, g), (o.float() * torch.sigmoid(g.float())).bfloat16())
