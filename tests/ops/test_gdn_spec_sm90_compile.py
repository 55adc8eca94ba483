"""The GDN verify and commit kernels (kernels/sm90/gdn/gdn_replay.py) compile for sm_90a (Triton -> PTX -> cubin, no
GPU) at every contract's launch and the full shape (Hv 32, Hk 16, dk = dv = 128, 8192 conv channels), without spills,
and in the decode kernels' arithmetic:

* every reduction of the GDN steps kernel (the L2 norms, Sᵀk̂, Sᵀq̂, k̂·q̂) runs in the same layout as the one-pass
  decode kernel's at the same tile (a reduction's FP32 order follows its layout: another layout is another sum);
* verify's FP32 instruction mix equals the decode kernel's (same FMA contraction, the same approximate exp / rsqrt /
  division), and the conv steps kernel's equals the conv update kernel's.

The interpreter tests (tests/ops/test_gdn_spec_triton.py) check the values; these check what the interpreter cannot:
that the compiled kernels would round as the compiled decode kernels do. T is a runtime loop bound (any T compiles
to the same code)."""

from __future__ import annotations

import textwrap
from typing import Any

import pytest

SCRIPT = textwrap.dedent("""
    import collections, glob

    def reduces(ttgir):
        # each tt.reduce's operand type (aliases resolved), keyed by the Python name Triton gives its result
        alias = dict(re.findall(r"^(#\\w+) = (.*)$", ttgir, re.M))
        out = {}
        for m in re.finditer(r'%(\\w+?)(?:_\\d+)? = "tt.reduce".*?\\}\\) : \\((tensor<[^)]*>)\\)', ttgir, re.S):
            ty = re.sub(r"#\\w+", lambda a: alias.get(a.group(0), a.group(0)), m.group(2))
            out.setdefault(m.group(1), []).append(ty)
        return out

    def fp_mix(ptx):
        ops = re.findall(r"^\\s*(?:@!?%p\\d+\\s+)?((?:fma|mul|add|sub|div|ex2|lg2|rsqrt|rcp|max|min|neg|abs)\\.[\\w.]+)",
                         ptx, re.M)
        return dict(collections.Counter(o for o in ops if o.endswith("f32")))

    gdn_src, conv_src = load_module("kernels/sm90/gdn/gdn_replay.py"), load_module("kernels/sm90/conv/conv1d_update.py")
    decode = load_module("kernels/sm90/gdn/gdn_decode.py")._gdn_decode_fused_kernel
    io = {n: "*bf16" for n in ("q_ptr", "k_ptr", "v_ptr", "a_ptr", "b_ptr", "dt_bias_ptr", "o_ptr")}
    io.update({"a_log_ptr": "*fp32", "slots_ptr": "*i64", "count_ptr": "*i32"})
    # the engine's calls: post-conv rows of 8192 channels, heads of 128, a | b views of one [rows, 64] projection
    strides = {"sq_b": 8192, "sq_h": 128, "sq_d": 1, "sk_b": 8192, "sk_h": 128, "sk_d": 1, "sv_b": 8192,
               "sv_h": 128, "sv_d": 1, "sa_b": 64, "sa_h": 1, "sb_b": 64, "sb_h": 1}
    layer = {"sq_l": 2048 * 8192, "sa_l": 2048 * 64, "sg_l": 32, "ss_l": 129 * 32 * 128 * 128}
    out = {}
    for doc in contract_docs("sm90", "gdn", "gdn_").values():
        if doc["kernel"]["source"] != "kernels/sm90/gdn/gdn_replay.py":
            continue
        launch, meta = doc["launch"], doc["launch"]["meta"]
        sd = {"float32": "*fp32", "bfloat16": "*bf16"}[doc["match"]["dtypes"]["state"][0]]
        commit = int(doc["op"] == "gdn_commit")
        c = {"HV": 32, "HK": 16, "DK": 128, "DV": 128, "BV": meta["BV"], "PAD": 0, "EPS": 1e-6, "SCALE": 128 ** -0.5}
        warps = launch["block"] // 32
        mine = compile_kernel(gdn_src._gdn_steps_kernel, {**io, "state_ptr": sd}, {**c, "COMMIT": commit}, warps,
                              meta["num_stages"], values={**strides, **layer})
        dec = compile_kernel(decode, {**io, "state_ptr": sd}, {**c, "RELOAD": 0}, warps, 1, values=strides)
        ctypes = {"x_ptr": "*bf16", "w_ptr": "*bf16", "state_ptr": "*bf16", "slots_ptr": "*i64", "count_ptr": "*i32",
                  "y_ptr": "*bf16", "out_ptr": "*bf16"}
        conv = compile_kernel(gdn_src._conv_steps_kernel, ctypes, {"BC": meta["BC"], "PAD": 0, "COMMIT": commit},
                              meta["CONV_WARPS"], 1, values={"channels": 8192, "sx_l": 2048 * 8192, "sx_r": 8192,
                                                             "sx_c": 1, "sw_l": 8192 * 4, "sw_c": 4, "sw_k": 1,
                                                             "ss_l": 129 * 8192 * 3, "ss_n": 8192 * 3, "sy_r": 8192})
        upd = conv_src._conv1d_update_kernel
        conv_dec = compile_kernel(upd, ctypes, {"sx_c": 1, "sw_k": 1, "BC": meta["BC"], "PAD": 0, "USE_PDL": 0},
                                  meta["CONV_WARPS"], 1,
                                  divisible=[n for n in upd.arg_names if n not in ("sx_c", "sw_k", "sw_c", "BC",
                                                                                  "PAD", "USE_PDL")])
        out[doc["name"]] = {
            "commit": commit, "steps": ptxas_report(mine), "conv": ptxas_report(conv),
            "local": ".local" in mine.asm["ptx"] or ".local" in conv.asm["ptx"],
            "reduces": reduces(mine.asm["ttgir"]), "decode_reduces": reduces(dec.asm["ttgir"]),
            "mix": fp_mix(mine.asm["ptx"]), "decode_mix": fp_mix(dec.asm["ptx"]),
            "conv_mix": fp_mix(conv.asm["ptx"]), "conv_decode_mix": fp_mix(conv_dec.asm["ptx"])}
    print(json.dumps(out))
""")


@pytest.mark.slow
def test_gdn_replay_kernels_compile_without_spills_in_the_decode_kernels_arithmetic(compile_sm90: Any) -> None:
    res = compile_sm90(SCRIPT)
    assert sorted(res) == sorted(f"gdn_{op}_{t}_hv32" for op in ("verify", "commit") for t in ("f32_small", "f32",
                                                                                                "bf16")), sorted(res)
    for name, r in res.items():
        assert r["steps"]["spills"] == 0 and r["conv"]["spills"] == 0 and not r["local"], (name, r)
        # commit stores no output: its q reductions are dead code; the ones it has are the decode kernel's
        want = {"k", "sk"} if r["commit"] else {"q", "k", "sk", "sq", "kq"}
        assert set(r["reduces"]) == want, (name, r["reduces"])
        for key in want:
            assert r["reduces"][key] == r["decode_reduces"][key], (name, key, r["reduces"], r["decode_reduces"])
        if not r["commit"]:
            assert r["mix"] == r["decode_mix"], (name, r["mix"], r["decode_mix"])
        assert r["conv_mix"] == r["conv_decode_mix"], (name, r["conv_mix"], r["conv_decode_mix"])
