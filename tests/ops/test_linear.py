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
