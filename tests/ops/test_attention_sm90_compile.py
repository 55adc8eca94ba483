"""The attention kernels compile for sm90 (Triton -> PTX -> ptxas) without a GPU, at the contracts' launch
constants, with no spills and shared memory that fits: the interpreter tests check the numbers, this
checks that the compiler accepts what the interpreter ran (Triton's language is not checked by the
interpreter). It runs in a fresh process: on GPU-less machines tests/conftest.py turns the
interpreter on before triton is imported, and an interpreted process cannot compile."""

from __future__ import annotations

import textwrap
from typing import Any

import pytest

SCRIPT = textwrap.dedent("""
    def contract(name):
        return contract_doc(name)

    def compile_(fn, types, consts, free, num_warps, num_stages=None, **opts):
        # what the JIT specializes at real calls: 16-byte aligned pointers, strides divisible by 16
        k = compile_kernel(fn, types, consts, num_warps, num_stages,
                           divisible=[n for n in fn.arg_names if n not in consts and n not in free], **opts)
        return {"shared": k.metadata.shared, **ptxas_report(k), "cp_async": k.asm["ptx"].count("cp.async.cg"),
                "fma": len(re.findall(r"\\bfma\\.rn\\.f32", k.asm["ptx"]))}

    out = {}
    dk = load_module("kernels/sm90/attention/decode_fp8.py")
    launch = contract("attention_decode_gated_fp8_gqa16x2_d256")["launch"]
    m = launch["meta"]
    types = {"Q": "*bf16", "K": "*fp8e4nv", "V": "*fp8e4nv", "Slots": "*i64", "SeqLens": "*i64", "Gate": "*bf16",
             "Out": "*bf16", "PartO": "*fp32", "PartLse": "*fp32", "qk_scale": "fp32", "v_scale": "fp32"}
    free = ("ctx_len", "splits", "qk_scale", "v_scale", "eps", "k_inv_scale", "v_inv_scale")
    for direct in (True, False):
        consts = {"DIRECT": direct, "GROUP": 8, "KV_HEADS": 2, "HEAD_DIM": 256, "BLOCK_H": m["BLOCK_H"],
                  "BLOCK_N": m["BLOCK_N"], "HAS_GATE": True, "stride_qd": 1, "stride_gd": 1}
        out[f"decode direct={direct}"] = compile_(dk._decode_fp8_kernel, types, consts, free,
                                                  num_warps=launch["block"] // 32, num_stages=m["num_stages"])
    for pdl in (False, True):  # the contracts' PDL 0, and the GPU script's PDL exploration
        consts = {"Q_HEADS": 16, "HEAD_DIM": 256, "BLOCK_N": m["BLOCK_N"], "CHUNK": m["MERGE_CHUNK"], "HAS_GATE": True,
                  "USE_PDL": pdl, "stride_gd": 1}
        out[f"merge pdl={pdl}"] = compile_(dk._decode_merge_kernel, types, consts, free, num_warps=m["merge_warps"],
                                           launch_pdl=pdl)
    pk = load_module("kernels/sm90/attention/qk_norm_rope_store.py")
    plaunch = contract("qk_norm_rope_store_fp8_h16x2_d256_r64")["launch"]
    ptypes = {"Q": "*bf16", "K": "*bf16", "V": "*bf16", "QW": "*bf16", "KW": "*bf16", "Pos": "*i64",
              "Table": "*fp32", "Slots": "*i64", "KC": "*fp8e4nv", "VC": "*fp8e4nv", "QOut": "*bf16",
              "eps": "fp32", "k_inv_scale": "fp32", "v_inv_scale": "fp32"}
    consts = {"Q_HEADS": 16, "HEAD_DIM": 256, "ROT": 64, "FP8_MAX": 448.0, "stride_qd": 1, "stride_kd": 1,
              "stride_vd": 1}
    out["prologue"] = compile_(pk._qk_norm_rope_store_kernel, ptypes, consts, free,
                               num_warps=plaunch["block"] // 32, enable_fp_fusion=False)
    print(json.dumps(out))
""")


@pytest.mark.slow
def test_attention_kernels_compile_for_sm90_without_spills(compile_sm90: Any) -> None:
    res = compile_sm90(SCRIPT)
    for name, r in res.items():
        assert r["spills"] == 0, (name, r)
        assert r["shared"] <= 232448 // 2, (name, r)  # two CTAs per SM must fit (228 KB per SM)
    for name in ("decode direct=True", "decode direct=False"):
        assert res[name]["cp_async"] > 0, (name, "K/V loads are not pipelined through cp.async")
        assert res[name]["registers"] <= 255
    assert res["prologue"]["fma"] == 0, "the rotation must not contract into FMAs (rope_ref rounds each product)"
