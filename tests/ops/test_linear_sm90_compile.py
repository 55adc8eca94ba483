"""The BF16 projection kernel's in-kernel split sum (``TICKET``, contract ``linear_group_bf16_decode``) compiles for
sm_90a (Triton -> PTX -> cubin, no GPU) at the contract's launch: the ticket is an acquire-release GPU-scope atomic
behind a CTA barrier, the counter reset a relaxed exchange, no local memory and no spills (at one row and at 128); without ``TICKET`` neither atomic is
emitted (the two-launch path)."""

from __future__ import annotations

import textwrap
from typing import Any

import pytest

SCRIPT = textwrap.dedent("""
    launch = contract_doc("linear_group_bf16_decode")["launch"]
    fn = load_module("kernels/sm90/linear/linear.py")._linear_kernel
    types = {"x_ptr": "*bf16", "w_ptr": "*bf16", "out_ptr": "*bf16", "part_ptr": "*fp32", "cnt_ptr": "*i32"}
    out = {}
    for m in (1, 128):  # GDN b|a at one row (M specialized to 1) and at 128
        for ticket in (0, 1):
            consts = {"KB_PER_SPLIT": 2, "BLOCK_M": 16 if m == 1 else 128, "BLOCK_N": launch["meta"]["BLOCK_N"],
                      "BLOCK_K": 128, "SPLIT": 8, "OUT_F32": 0, "TICKET": ticket}
            k = compile_kernel(fn, types, consts, launch["block"] // 32, launch["meta"]["num_stages"],
                               values={"M": m, "N": 64, "K": 2048})
            ptx = k.asm["ptx"]
            acq_rel = "atom.global.gpu.acq_rel.add" in ptx or "atom.acq_rel.gpu.global.add" in ptx
            out[f"m={m} ticket={ticket}"] = {"acq_rel": acq_rel, "xchg": ".exch" in ptx, "bar": "bar.sync" in ptx,
                                             "local": ".local" in ptx, **ptxas_report(k)}
    print(json.dumps(out))
""")


@pytest.mark.slow
def test_bf16_ticket_sum_compiles_with_the_ordered_atomics(compile_sm90: Any) -> None:
    res = compile_sm90(SCRIPT)
    for m in (1, 128):
        on, off = res[f"m={m} ticket=1"], res[f"m={m} ticket=0"]
        assert on["acq_rel"] and on["xchg"] and on["bar"] and not on["local"] and on["spills"] == 0, on
        assert not off["acq_rel"] and not off["xchg"] and not off["local"] and off["spills"] == 0, off
