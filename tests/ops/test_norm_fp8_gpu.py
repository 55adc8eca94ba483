"""GPU tests of the FP8-output norms (kernels/sm90/norm, the ``*_fp8_*`` contracts) on an sm90 device, through the
ops the engine calls: dispatch selects them by quant and rows; the rows are bitwise the plain norm's, the E4M3 form
bitwise the projection's own quantization kernel (`quantize_rows`); the projection behind the norm (launched as its
programmatic dependent) is bitwise the unfused norm -> quantization -> GEMM; eager == graph replay; outputs poisoned
first (an element left unwritten stays NaN)."""

from __future__ import annotations

from typing import Any

import pytest

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def experiment() -> Any:
    from netra import dispatch
    from netra.ops._common import reset_decisions

    dispatch.reset(dispatch.Dispatcher(min_maturity="experiment"))
    reset_decisions()
    yield
    dispatch.reset()
    reset_decisions()


def _weights(ns: tuple[int, ...], k: int, seed: int) -> list[Any]:
    import torch

    from netra.ops import fp8
    from netra.ops.linear import Weight

    g = torch.Generator(device="cuda").manual_seed(seed)
    return [Weight(*fp8.block_quantize_weight(torch.randn(n, k, generator=g, device="cuda") * k ** -0.5))
            for n in ns]


def _rows(m: int, width: int, seed: int) -> tuple[Any, Any, Any]:
    import torch

    g = torch.Generator(device="cuda").manual_seed(seed)
    x = torch.randn(m, width, generator=g, device="cuda") * 3
    x[0] *= 1e4
    if m > 2:
        x[1, :128] *= 300.0
        x[2] = 0.0
    r = torch.randn(m, width, generator=g, device="cuda") * 5
    w = torch.randn(width, generator=g, device="cuda") * 0.1
    return x.bfloat16(), r.bfloat16(), w.bfloat16()


def _quantize_rows(rows: Any) -> tuple[Any, Any]:
    """The projection's own quantization kernel (kernels/sm90/linear/linear.py `quantize_rows`) on the rows."""
    from netra.ops._triton import load_source

    k = rows.shape[-1]
    return load_source("kernels/sm90/linear/linear.py").quantize_rows(rows.reshape(-1, k))


@pytest.mark.usefixtures("experiment")
@pytest.mark.parametrize("m", [1, 8, 128, 300])
def test_add_norm_then_group_projection_is_bitwise_the_unfused_pair(m: int) -> None:
    import torch

    from netra.bench.timing import capture
    from netra.ops import _common, fp8, norm
    from netra.ops.linear import linear_group
    from netra.validate.oracle import poison_next

    x, r, w = _rows(m, 2048, seed=m)
    ws = _weights((8192, 4096), 2048, seed=1)  # the GDN in-projection's qkv | z

    def fused() -> tuple[Any, ...]:
        rows, res = norm.add_rmsnorm_quant(x, r, w, 1e-6, fp8.ACT_GROUP128)
        return (rows, res, *linear_group(rows, ws))

    poison_next((m, 2048), torch.float8_e4m3fn, x.device)
    got = fused()
    rows = got[0]
    assert isinstance(rows, fp8.GroupQuantized), "no FP8-output norm selected"
    label = "add_rmsnorm_gemma_fp8_rows" if m <= 128 else "add_rmsnorm_gemma_fp8_prefill"
    assert label in _common.decisions()["add_rmsnorm_gemma"]
    plain, res = norm.add_rmsnorm(x, r, w, 1e-6)
    assert torch.equal(rows.x, plain) and torch.equal(got[1], res)
    q, s = _quantize_rows(plain)
    assert torch.equal(rows.q.view(torch.uint8), q.view(torch.uint8)) and torch.equal(rows.scale, s)
    for a, b in zip(got[2:], linear_group(plain, ws), strict=True):
        assert torch.equal(a, b)
    if m <= 128:  # decode buckets are captured: the PDL chain norm -> GEMM replays bitwise
        g, rep = capture(fused)
        g.replay()
        torch.cuda.synchronize()
        for a, b in zip(got[2:], rep[2:], strict=True):
            assert torch.equal(a, b)


@pytest.mark.usefixtures("experiment")
@pytest.mark.parametrize("tokens", [1, 64, 128, 200])
def test_gated_norm_then_out_projection_is_bitwise_the_unfused_pair(tokens: int) -> None:
    import torch

    from netra.bench.timing import capture
    from netra.ops import fp8, norm
    from netra.ops.linear import linear

    g = torch.Generator(device="cuda").manual_seed(tokens)
    o = (torch.randn(tokens, 32, 128, generator=g, device="cuda") * 2).bfloat16()
    proj = (torch.randn(tokens, 2 * 32 * 128, generator=g, device="cuda") * 2).bfloat16()
    z = proj[:, 32 * 128:].reshape(tokens, 32, 128)  # the engine's strided view of the in-projection
    w = (torch.randn(128, generator=g, device="cuda") * 0.1).bfloat16()
    (wo,) = _weights((2048,), 4096, seed=2)

    def fused() -> tuple[Any, Any]:
        rows = norm.gated_rmsnorm_quant(o, z, w, 1e-6, fp8.ACT_GROUP128)
        return rows, linear(rows.reshape(tokens, 4096), wo)

    rows, out = fused()
    assert isinstance(rows, fp8.GroupQuantized)
    plain = norm.gated_rmsnorm(o, z, w, 1e-6)
    assert torch.equal(rows.x, plain)
    q, s = _quantize_rows(plain.reshape(tokens, 4096))
    assert torch.equal(rows.q.reshape(tokens, 4096).view(torch.uint8), q.view(torch.uint8))
    assert torch.equal(rows.scale.reshape(tokens, 32), s)
    assert torch.equal(out, linear(plain.reshape(tokens, 4096), wo))
    if tokens <= 128:
        gr, rep = capture(fused)
        gr.replay()
        torch.cuda.synchronize()
        assert torch.equal(rep[1], out)
