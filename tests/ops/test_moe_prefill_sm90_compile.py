"""The prefill MoE's router (with x's quantization) and its routing and sort/align kernels compile for sm_90a (Triton -> PTX -> cubin, no GPU) at the shapes
the engine launches (256 experts, top 8; issue 20).

The interpreter runs `tl.histogram`, `tl.gather` and the cross-lane scans on whole arrays; this compiles each kernel
in a fresh process (tests/conftest.py turns the interpreter on before triton is imported) and checks that no local
memory is used (no stack arrays in the PTX, no spills in ptxas' report)."""

from __future__ import annotations

import textwrap
from typing import Any

import pytest

SCRIPT = textwrap.dedent("""
    mod = load_module("kernels/sm90/moe/moe_prefill.py")
    bt, ep, sp = mod.ROUTE_TOKENS, 512, 16
    kernels = {
        "_router_kernel": ({"x_ptr": "*bf16", "wr_ptr": "*bf16", "wg_ptr": "*bf16", "out_ptr": "*bf16",
                            "xq_ptr": "*fp8e4nv", "xs_ptr": "*fp32"}, {"BLOCK_M": 64, "BLOCK_N": 64, "BLOCK_K": 64}),
        "_topk_kernel": ({"logits_ptr": "*bf16", "ids_ptr": "*i32", "rw_ptr": "*fp32", "hist_ptr": "*i32"},
                         {"E": 256, "K": 8, "EP": ep, "SP": sp, "BT": bt, "RENORM": 1}),
        "_block_offsets_kernel": ({"hist_ptr": "*i32", "base_ptr": "*i32", "counts_ptr": "*i32"},
                                  {"BB": 64, "BE": 64}),
        "_tile_table_kernel": ({"counts_ptr": "*i32", "seg_ptr": "*i32", "t_exp_ptr": "*i32", "t_row_ptr": "*i32",
                                "t_cnt_ptr": "*i32"}, {"EP": ep, "BM": 64, "BJ": 32}),
        "_scatter_kernel": ({"ids_ptr": "*i32", "base_ptr": "*i32", "seg_ptr": "*i32", "order_ptr": "*i32",
                             "tok_ptr": "*i32"}, {"S": 9, "SP": sp, "BT": bt}),
    }
    out = {}
    # an 8,192-token chunk: the integers as the JIT specializes them there
    values = {"T": 8192, "E": 256, "H": 2048, "NB": 8192 // bt, "E1": 257, "max_tiles": 8192 * 9 // 64 + 257}
    for name, (types, consts) in kernels.items():
        fn = getattr(mod, name)
        k = compile_kernel(fn, types, consts, 4, values={n: v for n, v in values.items() if n in fn.arg_names})
        out[name] = {"local": ".local" in k.asm["ptx"], "shared": k.metadata.shared, **ptxas_report(k)}
    print(json.dumps(out))
""")


@pytest.mark.slow
def test_route_align_kernels_compile_for_sm90_without_spills(compile_sm90: Any) -> None:
    res = compile_sm90(SCRIPT)
    assert sorted(res) == ["_block_offsets_kernel", "_router_kernel", "_scatter_kernel", "_tile_table_kernel",
                           "_topk_kernel"]
    for name, r in res.items():
        assert not r["local"] and r["spills"] == 0, (name, r)
