"""The dense-projection tactics (kernels/sm90/linear/linear.py) under Triton's CPU interpreter, against
`linear_ref` / `linear_group_ref` per each contract's declared relative-L2 tolerance: every FP8 m-bucket
(in-kernel activation quantization at m <= 16, the pre-quantization kernel above), with and without the
split-K ticket sum, adversarial magnitudes, the BF16 group (GDN b|a); split results are bitwise repeatable and
leave the ticket counters zero. The prefill contracts (m 129..8192) with their own launch data, adversarial rows
judged row by row, dispatch by rows, and one weight stack shared by every group contract."""

from __future__ import annotations

import copy
from typing import Any

import pytest
import torch

from netra.ops import fp8
from netra.ops.linear import Weight, linear_group_ref, linear_ref
from netra.validate.compare import rel_l2

pytestmark = pytest.mark.triton_interp

D = "kernels/sm90/linear/"
BUCKETS = {"linear_fp8_block_decode": (1, 5, 16), "linear_fp8_block_decode_m64": (17, 40),
           "linear_fp8_block_decode_m128": (65,)}


@pytest.fixture
def interp_entry(interp_source: Any) -> Any:
    """``(entry, contract JSON)`` of a linear contract, its source under the interpreter (with the
    interpreter fixes: the K loop's bound is a runtime scalar)."""
    from netra.catalog import contract_doc

    def load(path: str) -> tuple[Any, dict[str, Any]]:
        doc = contract_doc(path)
        return getattr(interp_source(doc["kernel"]["source"]), doc["kernel"]["symbol"]), doc

    return load


def fp8_weight(n: int, k: int, seed: int) -> Weight:
    g = torch.Generator().manual_seed(seed)
    return Weight(*fp8.block_quantize_weight(torch.randn(n, k, generator=g) * k ** -0.5))


def x_of(m: int, k: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(m, k, generator=g)
    x[:, 128:256] *= 50.0  # an outlier group
    return x.bfloat16()


def with_meta(doc: dict[str, Any], **meta: int) -> dict[str, Any]:
    launch = copy.deepcopy(doc["launch"])
    launch["meta"].update(meta)
    return launch


@pytest.mark.parametrize("name", list(BUCKETS))
@pytest.mark.parametrize("split", [False, True])
@pytest.mark.parametrize("quant_in,swap", [(0, 1), (1, 1), (0, 0)])
def test_fp8_buckets_against_the_reference(interp_entry, name: str, split: bool, quant_in: int, swap: int) -> None:
    entry, doc = interp_entry(name)
    w = fp8_weight(256, 512, seed=1)
    # TARGET_CTAS 1: no split; 64: the column tiles split K 4 ways (the ticket sum); QUANT_IN: x quantized in the
    # GEMM (1) or by the pre-kernel (0); SWAP: the weight as the MMA's M side (1) or N side (0)
    launch = with_meta(doc, TARGET_CTAS=64 if split else 1, QUANT_IN=quant_in, SWAP=swap)
    for m in BUCKETS[name]:
        x = x_of(m, 512, seed=m)
        got = entry(launch, x=x, weight=w, out_dtype=torch.bfloat16)
        ref = linear_ref(x, w, torch.bfloat16)
        assert got.shape == ref.shape and got.dtype == torch.bfloat16
        assert rel_l2(got, ref) <= doc["numerics"]["rtol"], (m, rel_l2(got, ref))


def test_fp8_split_is_repeatable_and_leaves_the_counters_zero(interp_entry) -> None:
    from netra.runtime import grid_size

    entry, doc = interp_entry("linear_fp8_block_decode_m64")
    mod = __import__("sys").modules[entry.__module__]  # the interpreted source module
    w = fp8_weight(384, 1024, seed=2)
    x = x_of(33, 1024, seed=3)
    launch = with_meta(doc, TARGET_CTAS=48, MAX_SPLIT=8, BLOCK_N=64)
    pl = mod.fp8_plan(launch["meta"], 33, 384, 1024)
    assert pl["split"] == 8 and pl["BLOCK_M"] == 64
    assert grid_size(launch["grid"], {"n": 384, "m": 33, **launch["meta"], **pl}) == [6, 8, 1]
    a = entry(launch, x=x, weight=w, out_dtype=torch.float32)
    b = entry(launch, x=x, weight=w, out_dtype=torch.float32)
    assert torch.equal(a, b)
    assert int(mod._tickets(x.device).abs().sum()) == 0
    assert rel_l2(a, linear_ref(x, w, torch.float32)) <= doc["numerics"]["rtol"]


@pytest.mark.parametrize("swap", [1, 0])
@pytest.mark.parametrize("target", [1, 64])
def test_fp8_row_tile_first_order_is_bitwise_the_plain_order(interp_entry, swap: int, target: int) -> None:
    """``MFAST`` (the CTAs of one column tile launched side by side: the row tiles walked first) only renames the
    CTAs: the same tiles, the same split order, so the output is bitwise the plain order's, with and without the K
    split's ticket sum (TARGET_CTAS 64: 4 column tiles x 2 row tiles x split 8), and the tickets end zero."""
    entry, doc = interp_entry("linear_fp8_block_decode_m128")
    mod = __import__("sys").modules[entry.__module__]
    w = fp8_weight(256, 1024, seed=11)
    x = x_of(100, 1024, seed=12)
    plain = with_meta(doc, BLOCK_M=64, BLOCK_N=64, SWAP=swap, TARGET_CTAS=target, MFAST=0)
    fast = with_meta(doc, BLOCK_M=64, BLOCK_N=64, SWAP=swap, TARGET_CTAS=target, MFAST=1)
    assert mod.fp8_plan(fast["meta"], 100, 256, 1024)["split"] == (8 if target == 64 else 1)
    a = entry(plain, x=x, weight=w, out_dtype=torch.float32)
    b = entry(fast, x=x, weight=w, out_dtype=torch.float32)
    assert torch.equal(a, b)
    assert int(mod._tickets(x.device).abs().sum()) == 0
    assert rel_l2(b, linear_ref(x, w, torch.float32)) <= doc["numerics"]["rtol"]


@pytest.mark.parametrize("case", ["huge", "tiny", "zero_rows", "one_hot"])
def test_fp8_adversarial_magnitudes(interp_entry, case: str) -> None:
    entry, doc = interp_entry("linear_fp8_block_decode")
    w = fp8_weight(128, 256, seed=4)
    x = x_of(6, 256, seed=5).float()
    if case == "huge":
        x[0] *= 1e30
        x[1, :128] *= 1e35
    elif case == "tiny":
        x *= 1e-30
    elif case == "zero_rows":
        x[2] = 0.0
        x[3, 128:] = 0.0
    elif case == "one_hot":
        x.zero_()
        x[:, 7] = 3.0
        x[4, 200] = -1e4
    x = x.bfloat16()
    got = entry(with_meta(doc, TARGET_CTAS=8), x=x, weight=w, out_dtype=torch.float32)
    ref = linear_ref(x, w, torch.float32)
    assert torch.isfinite(got).all()
    for r in range(x.shape[0]):  # per row: every row's magnitude is judged on its own
        if float(ref[r].norm()) == 0.0:
            assert float(got[r].abs().max()) == 0.0
        else:
            assert rel_l2(got[r], ref[r]) <= doc["numerics"]["rtol"], (case, r)


@pytest.mark.parametrize("name,m", [("linear_group_fp8_decode", 3), ("linear_group_fp8_decode_m128", 70)])
def test_fp8_group_outputs_are_the_per_weight_projections(interp_entry, name: str, m: int) -> None:
    entry, doc = interp_entry(name)
    ws = [fp8_weight(256, 256, seed=6), fp8_weight(128, 256, seed=7)]
    x = x_of(m, 256, seed=8)
    outs = entry(with_meta(doc, TARGET_CTAS=32), x=x, weights=ws, out_dtype=torch.bfloat16)
    refs = [linear_ref(x, w_, torch.bfloat16) for w_ in ws]
    assert [o.shape for o in outs] == [r.shape for r in refs]
    for o, r in zip(outs, refs, strict=True):
        assert rel_l2(o, r) <= doc["numerics"]["rtol"]


def test_bf16_group_b_a(interp_entry) -> None:
    entry, doc = interp_entry("linear_group_bf16_decode")
    g = torch.Generator().manual_seed(9)
    ws = [Weight((torch.randn(32, 512, generator=g) / 16).bfloat16()) for _ in range(2)]
    x = torch.randn(3, 512, generator=g).bfloat16()
    for target in (1, 16):  # one CTA; K split 4 ways (the second-pass sum)
        outs = entry(with_meta(doc, TARGET_CTAS=target), x=x, weights=ws, out_dtype=torch.float32)
        refs = linear_group_ref(x, ws, torch.float32)
        for o, r in zip(outs, refs, strict=True):
            assert o.shape == (3, 32)
            assert rel_l2(o, r) <= doc["numerics"]["rtol"]


def test_bf16_group_ticket_sum_is_bitwise_the_second_pass(interp_entry) -> None:
    """The contract's TICKET launch (each tile's last CTA sums the K split's partials) gives bitwise the two-launch
    sum (`_split_sum_kernel`, the same additions in the same order), repeatably, and leaves the counters zero."""
    from netra.ops._triton import load_source

    entry, doc = interp_entry("linear_group_bf16_decode")
    assert doc["launch"]["meta"]["TICKET"] == 1
    g = torch.Generator().manual_seed(12)
    ws = [Weight((torch.randn(32, 1024, generator=g) / 16).bfloat16()) for _ in range(2)]
    for m in (1, 3, 16):
        x = torch.randn(m, 1024, generator=g).bfloat16()
        for od in (torch.bfloat16, torch.float32):
            ticket = entry(with_meta(doc, TARGET_CTAS=16), x=x, weights=ws, out_dtype=od)  # split 8
            again = entry(with_meta(doc, TARGET_CTAS=16), x=x, weights=ws, out_dtype=od)
            two = entry(with_meta(doc, TARGET_CTAS=16, TICKET=0), x=x, weights=ws, out_dtype=od)
            for a, b, c in zip(ticket, again, two, strict=True):
                assert torch.equal(a, b) and torch.equal(a, c), (m, od)
    mod = load_source(doc["kernel"]["source"])
    assert torch.device("cpu") in mod._counters  # the ticket launches used them
    assert not bool(mod._counters[torch.device("cpu")].any())


def test_bf16_lm_head_entry(interp_entry) -> None:
    """The BF16 path as the lm_head contract launches it (FP32 logits), with and without the K split."""
    entry, doc = interp_entry("linear_bf16_decode")
    g = torch.Generator().manual_seed(10)
    w = Weight((torch.randn(200, 512, generator=g) / 16).bfloat16())
    for m, target in ((1, 1), (5, 64), (20, 1)):
        x = torch.randn(m, 512, generator=g).bfloat16()
        got = entry(with_meta(doc, TARGET_CTAS=target), x=x, weight=w, out_dtype=torch.float32)
        assert got.dtype == torch.float32 and got.shape == (m, 200)
        assert rel_l2(got, linear_ref(x, w, torch.float32)) <= doc["numerics"]["rtol"]


# prefill chunks (m 129..8192): the contracts' own launch data (SWAP 0, 128 x 128 tiles, no K split), rows past
# one row tile and a ragged last tile, adversarial rows among ordinary ones, judged row by row
PREFILL = {"linear_fp8_block_prefill": (129, 300), "linear_group_fp8_prefill": (257,)}


def prefill_x(m: int, k: int, seed: int) -> torch.Tensor:
    """Ordinary rows (an outlier group) with adversarial rows spread over the row tiles: huge, tiny, zero,
    one-hot, one huge group next to small ones, and the last row (the ragged tile's only row at m = 129)."""
    x = x_of(m, k, seed).float()
    x[0] *= 1e30
    x[1] *= 1e-30
    x[2] = 0.0
    x[127].zero_()
    x[127, 7] = 3.0
    x[127, 200] = -1e4
    x[128, :128] *= 1e35
    x[m - 1] *= 1e-3
    x[m // 2, 128:] = 0.0
    return x.bfloat16()


def judge_rows(got: torch.Tensor, ref: torch.Tensor, rtol: float, what: Any) -> None:
    assert torch.isfinite(got).all(), what
    for r in range(ref.shape[0]):  # every row's magnitude judged on its own, and the whole
        if float(ref[r].float().norm()) == 0.0:
            assert float(got[r].float().abs().max()) == 0.0, (what, r)
        else:
            assert rel_l2(got[r], ref[r]) <= rtol, (what, r, rel_l2(got[r], ref[r]))
    assert rel_l2(got, ref) <= rtol, what


def test_fp8_prefill_plan_is_the_compute_bound_launch(interp_entry) -> None:
    """The prefill launch data: 128 x 128 tiles, activation rows as the MMA's M side, never a K split (no
    partials, no tickets), the grid rule over the row tiles."""
    from netra.runtime import grid_size

    for name in PREFILL:
        entry, doc = interp_entry(name)
        mod = __import__("sys").modules[entry.__module__]
        launch = doc["launch"]
        assert launch["meta"]["SWAP"] == 0 and launch["block"] == 256
        for m, n, k in ((129, 2048, 4096), (1024, 12288, 2048), (8192, 9216, 2048), (8192, 512, 4096)):
            pl = mod.fp8_plan(launch["meta"], m, n, k)
            assert (pl["BLOCK_M"], pl["BLOCK_N"], pl["split"], pl["kb_per_split"]) == (128, 128, 1, k // 128)
            assert grid_size(launch["grid"], {"n": n, "m": m, **launch["meta"], **pl}) == [n // 128, 1, -(-m // 128)]


@pytest.mark.parametrize("out_dtype", [torch.bfloat16, torch.float32])
def test_fp8_prefill_against_the_reference(interp_entry, out_dtype: torch.dtype) -> None:
    entry, doc = interp_entry("linear_fp8_block_prefill")
    w = fp8_weight(384, 512, seed=11)
    for m in PREFILL["linear_fp8_block_prefill"]:
        x = prefill_x(m, 512, seed=m)
        got = entry(doc["launch"], x=x, weight=w, out_dtype=out_dtype)
        ref = linear_ref(x, w, out_dtype)
        assert got.shape == ref.shape == (m, 384) and got.dtype == out_dtype
        judge_rows(got, ref, doc["numerics"]["rtol"], m)


def test_fp8_prefill_leading_dims_and_repeatable(interp_entry) -> None:
    """``x [..., K]`` as the engine passes it; two calls bitwise equal (no split: one K order per output)."""
    entry, doc = interp_entry("linear_fp8_block_prefill")
    w = fp8_weight(256, 256, seed=12)
    x = x_of(2 * 70, 256, seed=13).reshape(2, 70, 256)
    a = entry(doc["launch"], x=x, weight=w, out_dtype=torch.bfloat16)
    b = entry(doc["launch"], x=x, weight=w, out_dtype=torch.bfloat16)
    assert a.shape == (2, 70, 256) and torch.equal(a, b)
    assert rel_l2(a, linear_ref(x, w, torch.bfloat16)) <= doc["numerics"]["rtol"]


def test_fp8_group_prefill_outputs_are_the_per_weight_projections(interp_entry) -> None:
    entry, doc = interp_entry("linear_group_fp8_prefill")
    ws = [fp8_weight(256, 384, seed=14), fp8_weight(128, 384, seed=15), fp8_weight(128, 384, seed=16)]
    for m in PREFILL["linear_group_fp8_prefill"]:
        x = prefill_x(m, 384, seed=17)
        outs = entry(doc["launch"], x=x, weights=ws, out_dtype=torch.bfloat16)
        refs = [linear_ref(x, w_, torch.bfloat16) for w_ in ws]
        assert [o.shape for o in outs] == [r.shape for r in refs]
        for o, r in zip(outs, refs, strict=True):
            judge_rows(o, r, doc["numerics"]["rtol"], m)
        for w_ in ws:  # linear_group_ref's one-GEMM path (every weight's dequantized copy cached)
            w_.dequantized(torch.float32)
        for o, r in zip(outs, linear_group_ref(x, ws, torch.bfloat16), strict=True):
            assert rel_l2(o, r) <= doc["numerics"]["rtol"]


@pytest.mark.parametrize("op,m,want", [
    ("linear_fp8_block", 128, "linear_fp8_block_decode_m128"), ("linear_fp8_block", 129, "linear_fp8_block_prefill"),
    ("linear_fp8_block", 2048, "linear_fp8_block_prefill"), ("linear_fp8_block", 8192, "linear_fp8_block_prefill"),
    ("linear_fp8_block", 8193, None), ("linear_group", 128, "linear_group_fp8_decode_m128"),
    ("linear_group", 129, "linear_group_fp8_prefill"), ("linear_group", 8192, "linear_group_fp8_prefill"),
    ("linear_group", 8193, None)])
def test_dispatch_picks_the_prefill_contracts_by_rows(op: str, m: int, want: str | None) -> None:
    """On sm90 (experiment maturity) the rows pick the bucket: decode up to 128, prefill 129..8192, the reference
    beyond; every (n, k) the decode contracts serve is served at prefill sizes too."""
    from dataclasses import replace

    from netra.catalog import Catalog
    from netra.dispatch import plan
    from netra.dispatch_cli import domain_signature

    cat = Catalog.load()
    pre = cat.by_name("linear_fp8_block_prefill" if op == "linear_fp8_block" else "linear_group_fp8_prefill")
    dec = cat.by_name("linear_fp8_block_decode_m128" if op == "linear_fp8_block" else "linear_group_fp8_decode_m128")
    assert {a: b for a, b in pre.dims.items() if a != "m"} == {a: b for a, b in dec.dims.items() if a != "m"}
    base = domain_signature(pre)
    sig = replace(base, dims=tuple(sorted({**dict(base.dims), "m": m}.items())))
    got = plan(sig, cat, "experiment")
    assert (got.contract.name if got.contract is not None else None) == want, got.reason


def test_group_contracts_share_one_weight_stack(interp_source) -> None:
    """The contracts of one source share its module (netra.runtime imports a source once), so a decode bucket and
    the prefill contract stack a group's weights once, not once each."""
    from types import SimpleNamespace

    from netra.catalog import Catalog
    from netra.ops import linear as op
    from netra.runtime import _import_source
    from netra.settings import REPO_ROOT

    interp_source(D + "linear.py")  # the interpreter fixes, for this test module
    cat = Catalog.load()
    ws = [fp8_weight(256, 256, seed=18), fp8_weight(128, 256, seed=19)]
    key = tuple(id(w_.data) for w_ in ws)
    mods = []
    for name, m in (("linear_group_fp8_decode", 5), ("linear_group_fp8_prefill", 140)):
        c = cat.by_name(name)
        obj = c.objects[0]
        mod = _import_source(obj, (REPO_ROOT / obj.kernel["source"]).read_bytes())
        dec = SimpleNamespace(tactic=SimpleNamespace(module=mod, entry=getattr(mod, obj.kernel["symbol"])),
                              contract=SimpleNamespace(launch=c.launch))
        x = x_of(m, 256, seed=m)
        outs = op._launch_group(dec, x=x, weights=ws, out_dtype=torch.float32)
        for o, w_ in zip(outs, ws, strict=True):
            assert rel_l2(o, linear_ref(x, w_, torch.float32)) <= c.raw["numerics"]["rtol"]
        mods.append(mod)
    assert mods[0] is mods[1]
    assert key in mods[0]._stacks
    mods[0]._stacks.pop(key)


def test_bf16_group_at_prefill_rows_through_cublas() -> None:
    """`linear_group_bf16_prefill` (kernels/sm90/linear/cublas_group.py, no Triton kernel: runs anywhere torch does)
    against linear_group_ref per the contract's relative L2, and dispatch: rows 129..8320 pick it, 128 the decode
    contract, beyond 8320 the reference."""
    from dataclasses import replace

    from netra.catalog import Catalog
    from netra.catalog import contract_doc as read_contract
    from netra.dispatch import plan
    from netra.dispatch_cli import domain_signature
    from netra.ops._triton import entry
    from netra.ops.linear import Weight, linear_group_ref

    doc = read_contract("linear_group_bf16_prefill")
    g = torch.Generator().manual_seed(4)
    x = (torch.randn(200, 2048, generator=g) * 2).bfloat16()
    x[0] *= 1e3
    x[1] = 0.0
    ws = [Weight((torch.randn(32, 2048, generator=g) * 2048 ** -0.5).bfloat16()) for _ in range(2)]
    got = entry(doc)(doc["launch"], x=x, weights=ws, out_dtype=torch.bfloat16)
    for o, r in zip(got, linear_group_ref(x, ws, torch.bfloat16), strict=True):
        assert o.shape == r.shape and o.dtype == r.dtype
        judge_rows(o, r, doc["numerics"]["rtol"], "bf16 group")
    cat = Catalog.load()
    base = domain_signature(cat.by_name("linear_group_bf16_decode"))
    for m, want in ((128, "linear_group_bf16_decode"), (129, "linear_group_bf16_prefill"),
                    (8320, "linear_group_bf16_prefill"), (8321, None)):
        sig = replace(base, dims=tuple(sorted({**dict(base.dims), "m": m}.items())), graph_phase="eager")  # prefill
        d = plan(sig, cat, "experiment")
        assert (d.contract.name if d.contract is not None else None) == want, (m, d.reason)
