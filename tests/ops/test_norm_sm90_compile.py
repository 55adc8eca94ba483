"""The FP8-output norms compile for sm_90a (Triton -> PTX -> cubin, no GPU) at each contract's launch (issue 19).

The interpreter checks the arithmetic but not the layouts Triton picks for the E4M3 epilogue's reshape into groups of
128: this compiles `_norm_kernel` with the epilogue on in a fresh process (tests/conftest.py turns the interpreter on
before triton is imported) and reads the PTX: the saturating E4M3 conversion and the programmatic-dependent release
are there, no local memory is used (no stack arrays in the PTX, no spills in ptxas' report), and with the epilogue
off neither the conversion nor the release is emitted.
"""

from __future__ import annotations

import textwrap
from typing import Any

import pytest

SCRIPT = textwrap.dedent("""
    import glob

    fn = load_module("kernels/sm90/norm/norm.py")._norm_kernel
    types = {"x_ptr": "*bf16", "r_ptr": "*bf16", "z_ptr": "*bf16", "w_ptr": "*bf16", "out_ptr": "*bf16",
             "res_out_ptr": "*bf16", "q_ptr": "*fp8e4nv", "s_ptr": "*fp32", "eps": "fp32"}
    mode = {"rmsnorm": 0, "add_rmsnorm": 1, "gated_rmsnorm": 2}
    out = {}
    for name, doc in contract_docs("sm90", "norm").items():
        if "_fp8_" not in name:
            continue
        width = doc["match"]["dims"]["width"]["eq"]
        m = mode[doc["kernel"]["symbol"].removesuffix("_fp8")]
        rows = doc["match"]["dims"]["rows"]
        # the engine's calls: the gated norm reads z in place from the in-projection (token stride 12288, head 128)
        z = {"z_heads": 32, "z_s0": 12288, "z_s1": 128} if m == 2 else {"z_heads": 1, "z_s0": 0, "z_s1": 0}
        for n_rows in sorted({rows["min"], min(rows["max"], 8192)}):
            for quant in (0, 1):
                consts = {"MODE": m, "BLOCK": width, "ROWS": doc["launch"]["meta"]["ROWS"], "OUT_F32": 0,
                          "QUANT": quant, "PDL": quant}
                k = compile_kernel(fn, types, consts, doc["launch"]["block"] // 32,
                                   values={"n_rows": n_rows, "width": width, **z})
                ptx = k.asm["ptx"]
                out[f"{doc['name']} rows={n_rows} quant={quant}"] = {
                    "e4m3": "cvt.rn.satfinite.e4m3x2.f32" in ptx, "pdl": "griddepcontrol.launch_dependents" in ptx,
                    "local": ".local" in ptx, "shared": k.metadata.shared, **ptxas_report(k)}
    print(json.dumps(out))
""")


@pytest.mark.slow
def test_fp8_norms_compile_for_sm90_with_the_e4m3_epilogue_and_no_spills(compile_sm90: Any) -> None:
    res = compile_sm90(SCRIPT)
    assert len(res) == 24, sorted(res)  # 6 FP8-output contracts at 2 row counts, epilogue on and off
    for name, r in res.items():
        on = name.endswith("quant=1")
        assert r["e4m3"] == on and r["pdl"] == on, (name, r)
        assert not r["local"] and r["spills"] == 0, (name, r)
