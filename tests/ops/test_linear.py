from __future__ import annotations

import torch

from netra.ops import fp8
from netra.ops.linear import Weight, linear, linear_ref


def test_fp8_linear_is_dequantized_gemm() -> None:
    torch.manual_seed(0)
    w = torch.randn(300, 256) / 16
    q, s = fp8.block_quantize_weight(w)
    x = torch.randn(9, 256).bfloat16()
    out = linear(x, Weight(q, s))
    xq, xs = fp8.quantize_per_token_group(x)
    expect = (fp8.dequantize_per_token_group(xq, xs, dtype=torch.float64)
              @ fp8.block_dequantize_weight(q, s, dtype=torch.float64).t()).bfloat16()
    assert out.dtype == torch.bfloat16
    assert torch.equal(out, expect)
    # and close to the unquantized product (FP8 on both sides: a few percent)
    ref = x.double() @ w.double().t()
    assert (out.double() - ref).abs().max() < 0.1 * ref.abs().max()


def test_bf16_linear_and_rows_independent_of_batch() -> None:
    torch.manual_seed(0)
    w = Weight((torch.randn(64, 96) / 8).bfloat16())
    x = torch.randn(33, 96).bfloat16()
    full = linear_ref(x, w, torch.float32)
    assert torch.equal(full, (x.double() @ w.data.double().t()).float())
    for m in (1, 2, 5, 16):
        assert torch.equal(linear_ref(x[:m], w, torch.float32), full[:m])


def test_group_reference_ignores_a_stale_stack_under_reused_ids() -> None:
    """The group fallback caches its stacked weights by the weights' ids; an id comes back once its tensor is freed,
    so a cached stack of other tensors under the same ids must not be used (seen as a split-size error in CI)."""
    from netra.ops import linear as op

    torch.manual_seed(1)
    ws = []
    for n in (48, 16):
        q, s = fp8.block_quantize_weight(torch.randn(n, 256) / 16)
        w = Weight(q, s)
        w.dequantized(torch.float64)  # the engine keeps a dequantized copy on CPU (float64 accumulation)
        ws.append(w)
    x = torch.randn(5, 256).bfloat16()
    key = tuple(id(w._dequant) for w in ws)
    op._group_cache[key] = ([torch.zeros(1)], torch.zeros(256, 8, dtype=torch.float64))  # another tensors' stack
    try:
        got = op.linear_group_ref(x, ws)
    finally:
        op._group_cache.pop(key, None)
    for g, w in zip(got, ws, strict=True):
        assert torch.equal(g, linear_ref(x, w))
