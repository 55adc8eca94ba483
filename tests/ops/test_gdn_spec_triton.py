"""The GDN verify and commit tactics (kernels/sm90/gdn/gdn_replay.py) under Triton's CPU interpreter, bitwise against
their references run with the decode tactics they repeat as steps (conv1d_update.py's kernel, then gdn_decode.py's
one-pass kernel at the contract's tile): the decode kernels looped T times is what the speculative step must equal.

Small head counts keep the interpreter quick (2 key / 4 value heads, 1024 conv channels); head dims are the model's
(the tile shape)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch

from netra.catalog import contract_doc
from netra.ops import gdn
from netra.validate.compare import compare

pytestmark = pytest.mark.triton_interp

VERIFY = ["gdn_verify_f32_small_hv32",
          "gdn_verify_f32_hv32",
          "gdn_verify_bf16_hv32"]
COMMIT = [p.replace("verify", "commit") for p in VERIFY]
CONV = "conv1d_update_c8192_w4"
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}
HK, HV, DK, DV, K = 2, 4, 128, 128, 4
C = 2 * HK * DK + HV * DV


def steps(interp_source: Callable[[str], Any], doc: dict[str, Any]) -> tuple[Any, Any, Any]:
    """(the tactic's entry, the decode conv step, the decode GDN step at the contract's tile) under the interpreter."""
    mine = getattr(interp_source(doc["kernel"]["source"]), doc["kernel"]["symbol"])
    conv_doc = contract_doc(CONV)
    conv_entry = interp_source(conv_doc["kernel"]["source"]).conv1d_update
    dec_entry = interp_source("kernels/sm90/gdn/gdn_decode.py").gdn_decode_fused
    dec_launch = {"block": doc["launch"]["block"], "grid": ["cdiv(v_dim, BV)", "batch * v_heads"],
                  "meta": {"BV": doc["launch"]["meta"]["BV"], "RELOAD": 0, "num_stages": 1}}

    def conv_step(x: torch.Tensor, w: torch.Tensor, pool: torch.Tensor, slots: torch.Tensor) -> torch.Tensor:
        return conv_entry(conv_doc["launch"], x=x, weight=w, state_pool=pool, slots=slots)

    def gdn_step(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, a: torch.Tensor, b: torch.Tensor,
                 a_log: torch.Tensor, dt_bias: torch.Tensor, pool: torch.Tensor, slots: torch.Tensor) -> torch.Tensor:
        return dec_entry(dec_launch, q=q, k=k, v=v, a=a, b=b, a_log=a_log, dt_bias=dt_bias, state_pool=pool,
                         slots=slots)

    return mine, conv_step, gdn_step


def make_layer(g: torch.Generator, n_slots: int, state_dtype: torch.dtype) -> dict[str, torch.Tensor]:
    return {
        "conv_weight": (torch.randn(C, K, generator=g) * 0.5).bfloat16(),
        "a_log": torch.log(torch.rand(HV, generator=g) * 15 + 1),
        "dt_bias": (torch.randn(HV, generator=g) * 0.5).bfloat16(),
        "conv_pool": torch.randn(n_slots, C, K - 1, generator=g).bfloat16(),
        "ssm_pool": (torch.randn(n_slots, HV, DK, DV, generator=g) * 0.3).to(state_dtype),
    }


def make_block(g: torch.Generator, rows: int) -> dict[str, torch.Tensor]:
    """Pre-conv rows as strided views of a wider in_proj output, a | b strided views of one projection."""
    wide = torch.randn(rows, C + 64, generator=g).bfloat16()
    ba = torch.randn(rows, 2 * HV, generator=g).bfloat16()
    return {"qkv": wide[:, :C], "b": ba[:, :HV], "a": ba[:, HV:]}


@pytest.mark.parametrize("path", VERIFY)
def test_verify_is_bitwise_the_decode_kernels_looped(interp_source: Any, path: str) -> None:
    doc = contract_doc(path)
    sd = DTYPES[doc["match"]["dtypes"]["state"][0]]
    mine, conv_step, gdn_step = steps(interp_source, doc)
    g = torch.Generator().manual_seed(1)
    layer = make_layer(g, 7, sd)
    slots, tokens = torch.tensor([5, 0, 2]), 3
    block = make_block(g, 3 * tokens)
    conv_before, ssm_before = layer["conv_pool"].clone(), layer["ssm_pool"].clone()
    out = torch.full((3 * tokens, HV, DV), float("nan")).bfloat16()  # poisoned: every row must be written
    o = mine(doc["launch"], **block, **layer, slots=slots, tokens=tokens, out=out)
    assert o is out
    assert torch.equal(layer["conv_pool"], conv_before) and torch.equal(layer["ssm_pool"], ssm_before)
    want = gdn.gdn_verify_ref(**block, **layer, slots=slots, tokens=tokens, conv_step=conv_step, gdn_step=gdn_step)
    assert torch.equal(o, want)
    assert torch.equal(o.unflatten(0, (3, tokens))[1], torch.zeros(tokens, HV, DV, dtype=o.dtype))
    # and within the decode contracts' tolerance of the PyTorch decode steps (one bf16 ulp per element)
    rep = compare(contract_doc("gdn_decode_f32_hv32")["numerics"], o,
                  gdn.gdn_verify_ref(**block, **layer, slots=slots, tokens=tokens))
    assert rep["rel_l2"] < 0.01, rep


@pytest.mark.parametrize("path", COMMIT)
def test_commit_is_bitwise_the_decode_kernels_looped(interp_source: Any, path: str) -> None:
    """Two layers, mixed counts (1..T, a 0) and a pad row in one batch: the pools bitwise the decode kernels'
    count[r] steps, slots outside the batch (slot 0 included) untouched."""
    doc = contract_doc(path)
    sd = DTYPES[doc["match"]["dtypes"]["state"][0]]
    mine, conv_step, gdn_step = steps(interp_source, doc)
    g = torch.Generator().manual_seed(2)
    tokens, n_layers, n_slots = 3, 2, 8
    slots, count = torch.tensor([6, 0, 3, 1, 4]), torch.tensor([3, 2, 1, 2, 0], dtype=torch.int32)
    layers = [make_layer(g, n_slots, sd) for _ in range(n_layers)]
    blocks = [make_block(g, slots.shape[0] * tokens) for _ in range(n_layers)]
    args = {"qkv_stash": torch.stack([b["qkv"] for b in blocks]), "a_stash": torch.stack([b["a"] for b in blocks]),
            "b_stash": torch.stack([b["b"] for b in blocks]),
            "conv_weights": torch.stack([x["conv_weight"] for x in layers]),
            "a_log": torch.stack([x["a_log"] for x in layers]), "dt_bias": torch.stack([x["dt_bias"] for x in layers]),
            "conv_pool": torch.stack([x["conv_pool"] for x in layers]),
            "ssm_pool": torch.stack([x["ssm_pool"] for x in layers])}
    ref = {k: v.clone() for k, v in args.items()}
    before = {k: v.clone() for k, v in args.items()}
    mine(doc["launch"], **args, slots=slots, count=count, tokens=tokens)
    gdn.gdn_commit_ref(**ref, slots=slots, count=count, tokens=tokens, conv_step=conv_step, gdn_step=gdn_step)
    assert torch.equal(args["conv_pool"], ref["conv_pool"])
    assert torch.equal(args["ssm_pool"], ref["ssm_pool"])
    for untouched in (0, 2, 5, 7, 4):  # not in the batch, the pad slot, and slot 4 (count 0)
        assert torch.equal(args["conv_pool"][:, untouched], before["conv_pool"][:, untouched])
        assert torch.equal(args["ssm_pool"][:, untouched], before["ssm_pool"][:, untouched])
    for s in (6, 3, 1):
        assert not torch.equal(args["ssm_pool"][:, s], before["ssm_pool"][:, s])


@pytest.mark.parametrize("path", VERIFY[:1])
def test_verify_then_commit_matches_decode_kernels(interp_source: Any, path: str) -> None:
    """The cycle at one layer: the verify tactic's first count outputs are the ones the committed replay produced (the
    commit tactic's state = the decode kernels' state after count steps, whose outputs verify gave)."""
    doc = contract_doc(path)
    cdoc = contract_doc(path.replace("verify", "commit"))
    mine, conv_step, gdn_step = steps(interp_source, doc)
    commit = getattr(interp_source(cdoc["kernel"]["source"]), cdoc["kernel"]["symbol"])
    g = torch.Generator().manual_seed(3)
    layer = make_layer(g, 4, torch.float32)
    slots, tokens = torch.tensor([3, 1]), 4
    blocks = [make_block(g, 2 * tokens) for _ in range(2)]
    count = torch.tensor([2, 4])
    st = {"qkv_stash": blocks[0]["qkv"][None].clone(), "a_stash": blocks[0]["a"][None],
          "b_stash": blocks[0]["b"][None], "conv_weights": layer["conv_weight"][None], "a_log": layer["a_log"][None],
          "dt_bias": layer["dt_bias"][None], "conv_pool": layer["conv_pool"][None].clone(),
          "ssm_pool": layer["ssm_pool"][None].clone()}
    commit(cdoc["launch"], **st, slots=slots, count=count, tokens=tokens)
    o = mine(doc["launch"], **blocks[1], conv_weight=layer["conv_weight"], a_log=layer["a_log"],
             dt_bias=layer["dt_bias"], conv_pool=st["conv_pool"][0], ssm_pool=st["ssm_pool"][0], slots=slots,
             tokens=tokens)
    # oracle: decode kernels, request by request, accepted tokens then the next block
    for r in range(2):
        n = int(count[r])
        seq = {key: torch.cat([blocks[0][key].unflatten(0, (2, tokens))[r, :n],
                               blocks[1][key].unflatten(0, (2, tokens))[r]]) for key in ("qkv", "a", "b")}
        one = torch.tensor([slots[r]])
        want = gdn.gdn_verify_ref(**seq, **layer, slots=one, tokens=n + tokens, conv_step=conv_step,
                                  gdn_step=gdn_step)
        assert torch.equal(o.unflatten(0, (2, tokens))[r], want[n:])
