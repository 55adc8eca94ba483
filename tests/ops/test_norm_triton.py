"""The RMSNorm family's Triton tactics (kernels/sm90/norm/norm.py) under Triton's CPU interpreter, at the decode and
the prefill contracts' launch geometry, against the FP32 references per each contract's declared relative-L2 tolerance."""

from __future__ import annotations

import pytest
import torch

from netra.ops import norm
from netra.validate.compare import rel_l2

pytestmark = pytest.mark.triton_interp


def inputs(rows: int, width: int, seed: int) -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(seed)

    def t(scale: float) -> torch.Tensor:
        return (torch.randn(rows, width, generator=g) * scale).bfloat16()
    x = t(3.0)
    x[0] *= 1e4  # one huge row, one zero row: each row is normalised on its own
    x[-1] = 0.0
    return x, t(5.0), t(2.0), (torch.randn(width, generator=g) * 0.1).bfloat16()


@pytest.mark.parametrize("name", ["rmsnorm_gemma_rows", "rmsnorm_gemma_prefill", "add_rmsnorm_gemma_prefill",
                                  "gated_rmsnorm_rows", "gated_rmsnorm_prefill"])
def test_norm_contract_geometry(interp_source, name: str) -> None:
    from netra.catalog import contract_doc as read_contract

    doc = read_contract(name)
    entry = getattr(interp_source(doc["kernel"]["source"]), doc["kernel"]["symbol"])  # BF16 rounding mended
    gated = name.startswith("gated")
    rows, width = (203, 128) if gated else (131, 2048)  # not a multiple of the contract's ROWS
    x, r, z, w = inputs(rows, width, seed=len(name))
    tol = doc["numerics"]["rtol"]
    if gated:
        zs = torch.cat([z, z], dim=1)[:, :width]  # strided, as the engine's view of the in-projection
        got = entry(doc["launch"], x=x, z=zs, weight=w, eps=1e-6)
        ref = norm.gated_rmsnorm_ref(x, zs, w, 1e-6)
    elif name.startswith("add"):
        got, res = entry(doc["launch"], x=x, residual=r, weight=w, eps=1e-6)
        ref, res_ref = norm.add_rmsnorm_ref(x, r, w, 1e-6)
        assert torch.equal(res, res_ref)  # the new residual is the BF16 sum, exactly
    else:
        got = entry(doc["launch"], x=x, weight=w, eps=1e-6)
        ref = norm.rmsnorm_ref(x, w, 1e-6)
    assert got.dtype == ref.dtype and got.shape == ref.shape
    if not name.startswith("add"):  # a zero row normalises to zeros (its sum with the residual is not zero)
        assert torch.equal(got[-1], torch.zeros_like(got[-1]))
    for i in range(rows - 1):  # per row: a row's error never hides behind another's magnitude
        assert rel_l2(got[i], ref[i]) <= tol, (name, i)


@pytest.mark.parametrize("name, rows, want", [
    ("rmsnorm_gemma_rows", 128, "rmsnorm_gemma_rows"), ("rmsnorm_gemma_rows", 129, "rmsnorm_gemma_prefill"),
    ("add_rmsnorm_gemma_rows", 8320, "add_rmsnorm_gemma_prefill"), ("gated_rmsnorm_rows", 4096, "gated_rmsnorm_rows"),
    ("gated_rmsnorm_rows", 4097, "gated_rmsnorm_prefill"), ("gated_rmsnorm_rows", 262144, "gated_rmsnorm_prefill")])
def test_dispatch_picks_the_prefill_norms_by_rows(name: str, rows: int, want: str) -> None:
    """Decode rows stay on the verified decode contracts; a prefill chunk (8192 tokens + 128 decode rows in a mixed
    step; x 32 heads for the gated norm) picks the prefill contract at experiment maturity."""
    from dataclasses import replace

    from netra.catalog import Catalog
    from netra.dispatch import plan
    from netra.dispatch_cli import domain_signature

    cat = Catalog.load()
    base = domain_signature(cat.by_name(name))
    sig = replace(base, dims=tuple(sorted({**dict(base.dims), "rows": rows}.items())))
    got = plan(sig, cat, "experiment")
    assert (got.contract.name if got.contract is not None else None) == want, got.reason


@pytest.mark.parametrize("name", ["gated_rmsnorm_rows", "gated_rmsnorm_prefill"])
def test_gated_norm_reads_the_engine_strided_z_in_place(interp_source, name: str) -> None:
    """z as the GDN layer holds it: a column slice of the fused in-projection viewed as [tokens, heads, width] (token
    stride 2 x heads x width); the kernel reads it in place, and a z it cannot read so (last dim strided) is copied."""
    from netra.catalog import contract_doc as read_contract

    doc = read_contract(name)
    mod = interp_source(doc["kernel"]["source"])
    entry = getattr(mod, doc["kernel"]["symbol"])
    tokens, heads, width = 5, 3, 128
    x, _, _, w = inputs(tokens * heads, width, seed=11)
    x3 = x.view(tokens, heads, width)
    proj = (torch.randn(tokens, 2 * heads * width, generator=torch.Generator().manual_seed(2)) * 2).bfloat16()
    z = proj[:, heads * width:].reshape(tokens, heads, width)
    assert not z.is_contiguous() and z.untyped_storage().data_ptr() == proj.untyped_storage().data_ptr()  # a view
    assert mod._z_layout(z, width)[1:] == (heads, 2 * heads * width, width)
    got = entry(doc["launch"], x=x3, z=z, weight=w, eps=1e-6)
    ref = norm.gated_rmsnorm_ref(x3, z, w, 1e-6)
    assert got.shape == ref.shape
    for i in range(tokens):
        for h in range(heads):
            if float(ref[i, h].float().norm()) > 0:
                assert rel_l2(got[i, h], ref[i, h]) <= doc["numerics"]["rtol"], (i, h)
    zt = z.transpose(1, 2).contiguous().transpose(1, 2)  # last dim strided: copied contiguous first
    assert mod._z_layout(zt, width)[1] == 1
    assert torch.equal(entry(doc["launch"], x=x3, z=zt, weight=w, eps=1e-6), got)


FP8 = ["rmsnorm_gemma_fp8_rows", "rmsnorm_gemma_fp8_prefill", "add_rmsnorm_gemma_fp8_rows",
       "add_rmsnorm_gemma_fp8_prefill", "gated_rmsnorm_fp8_rows", "gated_rmsnorm_fp8_prefill"]


def adversarial_rows(rows: int, width: int, seed: int) -> tuple[torch.Tensor, ...]:
    """`inputs` plus rows that stress the quantization: one outlier group, a row of tiny values, a row with one
    nonzero value, and a row whose groups are all zero but one."""
    x, r, z, w = inputs(rows, width, seed)
    x[1, : min(width, 128)] *= 300.0
    x[2] *= 1e-30
    x[3] = 0.0
    x[3, width // 2] = -7.0
    if width > 128:
        x[4, 128:] = 0.0
    return x, r, z, w


@pytest.mark.parametrize("name", FP8)
def test_fp8_norms_write_the_plain_rows_and_their_quantization(interp_source, name: str) -> None:
    """The FP8-output contracts: the BF16 rows are bitwise the plain contract's (same launch), and the E4M3 rows and
    scales are bitwise `fp8.quantize_per_token_group` of those rows (what the projection's own quantization makes)."""
    from netra.catalog import contract_doc as read_contract
    from netra.ops import fp8

    doc = read_contract(name)
    plain = read_contract(name.replace("_fp8", ""))
    assert doc["launch"]["block"] == plain["launch"]["block"]
    assert doc["launch"]["meta"]["ROWS"] == plain["launch"]["meta"]["ROWS"]
    mod = interp_source(doc["kernel"]["source"])
    entry, plain_entry = getattr(mod, doc["kernel"]["symbol"]), getattr(mod, plain["kernel"]["symbol"])
    gated = name.startswith("gated")
    rows, width = (203, 128) if gated else (131, 2048)  # not a multiple of the contract's ROWS
    x, r, z, w = adversarial_rows(rows, width, seed=len(name))
    if gated:
        zs = torch.cat([z, z], dim=1)[:, :width]
        got, q, s = entry(doc["launch"], x=x, z=zs, weight=w, eps=1e-6)
        want = plain_entry(plain["launch"], x=x, z=zs, weight=w, eps=1e-6)
    elif name.startswith("add"):
        got, q, s, res = entry(doc["launch"], x=x, residual=r, weight=w, eps=1e-6)
        want, res_want = plain_entry(plain["launch"], x=x, residual=r, weight=w, eps=1e-6)
        assert torch.equal(res, res_want)
    else:
        got, q, s = entry(doc["launch"], x=x, weight=w, eps=1e-6)
        want = plain_entry(plain["launch"], x=x, weight=w, eps=1e-6)
    assert got.dtype == torch.bfloat16 and torch.equal(got, want)
    q_ref, s_ref = fp8.quantize_per_token_group(got)
    assert q.dtype == torch.float8_e4m3fn and q.shape == got.shape
    assert s.dtype == torch.float32 and s.shape == (*got.shape[:-1], width // 128)
    assert torch.equal(q.view(torch.uint8), q_ref.view(torch.uint8))
    assert torch.equal(s, s_ref)
    fp8.GroupQuantized(got, q, s)  # the op's carrier accepts the shapes


def test_projection_behind_an_fp8_norm_reads_its_rows_bitwise(interp_source) -> None:
    """An FP8 projection given the norm's E4M3 form (``xq`` / ``xs``) computes bitwise what it computes from the BF16
    rows with its own quantization kernel, alone and as a group, at a decode and a prefill bucket."""
    from netra.catalog import contract_doc as read_contract
    from netra.ops import fp8
    from netra.ops.linear import Weight

    ndoc = read_contract("add_rmsnorm_gemma_fp8_rows")
    nmod = interp_source(ndoc["kernel"]["source"])
    g = torch.Generator().manual_seed(5)
    ws = [Weight(*fp8.block_quantize_weight(torch.randn(n, 2048, generator=g) * 2048 ** -0.5)) for n in (128, 64)]
    for lname, gname, m in (("linear_fp8_block_decode", "linear_group_fp8_decode", 5),
                            ("linear_fp8_block_prefill", "linear_group_fp8_prefill", 130)):
        x, r, _, w = adversarial_rows(m, 2048, seed=m)
        rows, q, s, _ = getattr(nmod, ndoc["kernel"]["symbol"])(ndoc["launch"], x=x, residual=r, weight=w, eps=1e-6)
        for cname, kw in ((lname, {"weight": ws[0]}), (gname, {"weights": ws})):
            doc = read_contract(cname)
            entry = getattr(interp_source(doc["kernel"]["source"]), doc["kernel"]["symbol"])
            plain = entry(doc["launch"], x=rows, out_dtype=torch.bfloat16, **kw)
            pre = entry(doc["launch"], x=rows, out_dtype=torch.bfloat16, xq=q, xs=s, **kw)
            for a, b in zip(plain if isinstance(plain, list) else [plain], pre if isinstance(pre, list) else [pre],
                            strict=True):
                assert torch.equal(a, b), (cname, m)
            # the E4M3 form is what it reads (no second quantization): zero codes give zero outputs
            zero = entry(doc["launch"], x=rows, out_dtype=torch.bfloat16, xq=torch.zeros_like(q), xs=s, **kw)
            assert all(not bool(t.any()) for t in (zero if isinstance(zero, list) else [zero])), cname


@pytest.mark.parametrize("plain, rows, want", [
    ("rmsnorm_gemma_rows", 1, "rmsnorm_gemma_fp8_rows"), ("rmsnorm_gemma_rows", 8320, "rmsnorm_gemma_fp8_prefill"),
    ("add_rmsnorm_gemma_rows", 128, "add_rmsnorm_gemma_fp8_rows"),
    ("add_rmsnorm_gemma_rows", 129, "add_rmsnorm_gemma_fp8_prefill"),
    ("gated_rmsnorm_rows", 4096, "gated_rmsnorm_fp8_rows"), ("gated_rmsnorm_rows", 4097, "gated_rmsnorm_fp8_prefill")])
def test_dispatch_picks_the_fp8_norms_by_quant_and_rows(plain: str, rows: int, want: str) -> None:
    """Quant ``fp8_e4m3_group128`` picks the FP8-output contracts at experiment maturity, by rows as the plain ones;
    quant ``none`` keeps the plain contracts; no FP8-output contract is selected at the default maturity."""
    from dataclasses import replace

    from netra.catalog import Catalog
    from netra.dispatch import plan
    from netra.dispatch_cli import domain_signature

    cat = Catalog.load()
    base = domain_signature(cat.by_name(plain))
    sig = replace(base, dims=tuple(sorted({**dict(base.dims), "rows": rows}.items())))
    got = plan(replace(sig, quant="fp8_e4m3_group128"), cat, "experiment")
    assert (got.contract.name if got.contract is not None else None) == want, got.reason
    kept = plan(sig, cat, "experiment")
    assert kept.contract is not None and "_fp8" not in kept.contract.name
    assert plan(replace(sig, quant="fp8_e4m3_group128"), cat, "accepted").contract is None
