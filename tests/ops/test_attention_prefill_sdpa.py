"""The CUDA attention prefill where no contract serves it (`attention_prefill_sdpa`, PyTorch's fused SDPA) against
the FP32 reference, on the CPU (SDPA's math backend; the same lower-right causal mask, head repetition and cache
dequantisation as on CUDA, where the FlashAttention backend runs them): chunks appended to cached prefixes, GQA
16/2 and 8/1, FP8 and BF16 caches, scales. Declared tolerance: rel-L2 <= 1e-2 (BF16 operands), no NaN."""

from __future__ import annotations

import pytest
import torch

from netra.ops import attention, fp8


def _case(hq: int, hkv: int, d: int, cache_dtype: torch.dtype, chunks: list[tuple[int, int]], seed: int,
          k_scale: float = 1.0, v_scale: float = 1.0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    slots = len(chunks) + 1
    ctx = max(s + n for s, n in chunks) + 3
    k = torch.randn(slots, ctx, hkv, d, generator=g) * 2.0
    v = torch.randn(slots, ctx, hkv, d, generator=g)
    if cache_dtype == fp8.E4M3:
        k = (k / k_scale).clamp(-fp8.E4M3_MAX, fp8.E4M3_MAX)
        v = (v / v_scale).clamp(-fp8.E4M3_MAX, fp8.E4M3_MAX)
    q = torch.randn(sum(n for _, n in chunks), hq, d, generator=g).to(torch.bfloat16)
    return q, k.to(cache_dtype), v.to(cache_dtype)


@pytest.mark.parametrize("hq,hkv,d", [(16, 2, 256), (8, 1, 64)])
@pytest.mark.parametrize("cache", ["fp8", "bf16"])
def test_sdpa_prefill_matches_the_reference(hq: int, hkv: int, d: int, cache: str) -> None:
    dtype = fp8.E4M3 if cache == "fp8" else torch.bfloat16
    chunks = [(0, 37), (50, 9), (3, 1), (0, 1), (120, 64)]  # (cached prefix, chunk length) per sequence
    scales = (0.5, 2.0) if cache == "fp8" else (1.0, 1.0)
    q, kc, vc = _case(hq, hkv, d, dtype, chunks, seed=hq * d, k_scale=scales[0], v_scale=scales[1])
    args = (q, kc, vc, [i + 1 for i in range(len(chunks))], [s for s, _ in chunks], [n for _, n in chunks],
            d ** -0.5, *scales)
    got = attention.attention_prefill_sdpa(*args)
    ref = attention.attention_prefill_ref(*args)
    assert got.dtype == ref.dtype == torch.bfloat16 and got.shape == ref.shape
    assert torch.isfinite(got).all()
    err = ((got.double() - ref.double()).norm() / ref.double().norm()).item()
    assert err <= 1e-2, err
    # every query row sees exactly its causal prefix: change a key past the last sequence's first query's
    # position and only later rows of that sequence may move
    start, n = chunks[-1]
    kc2 = kc.clone()
    kc2[len(chunks), start + 1] = kc2[len(chunks), start + 1].float().neg().to(kc2.dtype)
    moved = attention.attention_prefill_sdpa(q, kc2, vc, *args[3:])
    last = slice(q.shape[0] - n, q.shape[0])
    assert torch.equal(moved[:q.shape[0] - n], got[:q.shape[0] - n])  # other sequences untouched
    assert torch.equal(moved[last][0], got[last][0])  # the first query of the chunk does not see position start+1
    assert not torch.equal(moved[last][1:], got[last][1:])


@pytest.mark.parametrize("cache", ["fp8", "bf16"])
def test_sdpa_prefill_runs_of_one_shape_are_one_call_with_the_same_rows(cache: str) -> None:
    """Consecutive sequences of one shape (a chunk of fresh prompts of one length, continuing chunks of one prefix)
    go through one batched SDPA call: the result matches the reference and every sequence's rows are bitwise that
    sequence prefilled alone (on the CPU's math backend; on CUDA the backend may tile a batch otherwise, and the GPU
    test judges it against the reference)."""
    dtype = fp8.E4M3 if cache == "fp8" else torch.bfloat16
    chunks = [(0, 37), (0, 37), (0, 37), (50, 9), (50, 9), (3, 1), (0, 37)]
    q, kc, vc = _case(16, 2, 64, dtype, chunks, seed=11)
    slots, starts, lens = [7, 2, 5, 1, 3, 6, 4], [s for s, _ in chunks], [n for _, n in chunks]
    got = attention.attention_prefill_sdpa(q, kc, vc, slots, starts, lens, 64 ** -0.5)
    ref = attention.attention_prefill_ref(q, kc, vc, slots, starts, lens, 64 ** -0.5)
    err = ((got.double() - ref.double()).norm() / ref.double().norm()).item()
    assert torch.isfinite(got).all() and err <= 1e-2, err
    offset = 0
    for slot, start, n in zip(slots, starts, lens, strict=True):
        alone = attention.attention_prefill_sdpa(q[offset:offset + n], kc, vc, [slot], [start], [n], 64 ** -0.5)
        assert torch.equal(got[offset:offset + n], alone), (slot, start, n)
        offset += n


def test_the_backend_setting_is_checked(monkeypatch: pytest.MonkeyPatch) -> None:
    from netra import settings

    monkeypatch.setenv("NETRA_ATTN_PREFILL", "flash")
    with pytest.raises(settings.SettingError, match="sdpa or reference"):
        attention.prefill_backend()
    monkeypatch.setenv("NETRA_ATTN_PREFILL", "reference")
    assert attention.prefill_backend() == "reference"


@pytest.mark.gpu
def test_sdpa_prefill_on_cuda_at_the_model_shape() -> None:
    """On the H200 (FlashAttention backend): Qwen3.6's 16/2 heads of 256 over an FP8 cache, a 1024-token chunk after
    a 3000-token prefix and a fresh 1024-token prompt, against the FP32 reference; and a chunk after a 60,000-token
    prefix runs (the reference would need 16 x 2048 x 62,048 FP32 scores) with finite output."""
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    chunks = [(3000, 1024), (0, 1024)]
    q, kc, vc = _case(16, 2, 256, fp8.E4M3, chunks, seed=7)
    q, kc, vc = q.cuda(), kc.cuda(), vc.cuda()
    args = (q, kc, vc, [1, 2], [3000, 0], [1024, 1024], 256 ** -0.5)
    got = attention.attention_prefill_sdpa(*args)
    ref = attention.attention_prefill_ref(*args)
    err = ((got.double() - ref.double()).norm() / ref.double().norm()).item()
    assert torch.isfinite(got).all() and err <= 1e-2, err
    chunks = [(0, 1024)] * 8  # the 1K/1K benchmark's chunk: one batched SDPA call
    q, kc, vc = _case(16, 2, 256, fp8.E4M3, chunks, seed=9)
    args = (q.cuda(), kc.cuda(), vc.cuda(), [8, 3, 1, 2, 4, 7, 5, 6], [0] * 8, [1024] * 8, 256 ** -0.5)
    got = attention.attention_prefill_sdpa(*args)
    ref = attention.attention_prefill_ref(*args)
    err = ((got.double() - ref.double()).norm() / ref.double().norm()).item()
    assert torch.isfinite(got).all() and err <= 1e-2, err
    q, kc, vc = _case(16, 2, 256, fp8.E4M3, [(60000, 2048)], seed=8)
    out = attention.attention_prefill_sdpa(q.cuda(), kc.cuda(), vc.cuda(), [1], [60000], [2048], 256 ** -0.5)
    assert torch.isfinite(out).all()
