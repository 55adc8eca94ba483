"""The BF16 projection kernel's in-kernel split sum (``TICKET``, contract ``linear_group_bf16_decode``) compiles for
sm_90a (Triton -> PTX -> cubin, no GPU) at the contract's launch: the ticket is an acquire-release GPU-scope atomic
behind a CTA barrier, the counter reset a relaxed exchange, no local memory and no more spills than the two-launch path; without ``TICKET`` neither atomic is
emitted (the two-launch path)."""

from __future__ import annotations

import textwrap
from typing import Any

import pytest

SCRIPT = textwrap.dedent("""
    launch = json.load(open("kernels/sm90/linear/linear_group_bf16_decode.contract.json"))["launch"]
    fn = load_module("kernels/sm90/linear/linear.py")._linear_kernel
    types = {"x_ptr": "*bf16", "w_ptr": "*bf16", "out_ptr": "*fp32", "part_ptr": "*fp32", "cnt_ptr": "*i32"}
    out = {}
    for ticket in (0, 1):
        consts = {"KB_PER_SPLIT": 2, "BLOCK_M": 16, "BLOCK_N": launch["meta"]["BLOCK_N"], "BLOCK_K": 128,
                  "SPLIT": 8, "OUT_F32": 1, "TICKET": ticket}
        k = compile_kernel(fn, types, consts, launch["block"] // 32, launch["meta"]["num_stages"])
        ptx = k.asm["ptx"]
        out[f"ticket={ticket}"] = {"acq_rel": "atom.global.gpu.acq_rel.add" in ptx
                                   or "atom.acq_rel.gpu.global.add" in ptx,
                                   "xchg": ".exch" in ptx, "bar": "bar.sync" in ptx, "local": ".local" in ptx,
                                   **ptxas_report(k)}
    print(json.dumps(out))
""")


@pytest.mark.slow
def test_bf16_ticket_sum_compiles_with_the_ordered_atomics(compile_sm90: Any) -> None:
    res = compile_sm90(SCRIPT)
    on, off = res["ticket=1"], res["ticket=0"]
    assert on["acq_rel"] and on["xchg"] and on["bar"] and not on["local"], on
    assert not off["acq_rel"] and not off["xchg"] and not off["local"], off
    # the kernel at this launch already spills a little without the ticket (255 registers: 96 bytes at this
    # specialisation); the ticket epilogue must not add to it
    assert on["spills"] <= off["spills"], (on, off)
