"""The conv update's in-place state shift is ordered across warps in the sm90 build (issue 19).

`_conv1d_update_kernel` loads the taps of channel c (the channel layout) and the flat state run (the run's
layout), then overwrites that run: one element is loaded and stored by threads of different warps, and Triton
orders global memory only per thread. Without a CTA barrier between the last load and the first store, a warp
running ahead stores the shifted state under a slower warp's tap loads, a race the interpreter (whole-tensor
loads, then stores) cannot show. This compiles the kernel for sm_90a at the contract's launch (Triton -> PTX, no
GPU) in a fresh process (tests/conftest.py turns the interpreter on before triton is imported) and checks the
PTX: every global store comes after a ``bar.sync`` that follows every global load.
"""

from __future__ import annotations

import textwrap
from typing import Any

import pytest

SCRIPT = textwrap.dedent("""
    mod = load_module("kernels/sm90/conv/conv1d_update.py")
    launch = contract_doc("conv1d_update_c8192_w4")["launch"]
    fn = mod._conv1d_update_kernel
    types = {"x_ptr": "*bf16", "w_ptr": "*bf16", "state_ptr": "*bf16", "slots_ptr": "*i64", "out_ptr": "*bf16"}
    out = {}
    for pdl in (0, 1):
        # what the JIT specializes at the engine's call: unit channel / tap strides, 16-byte aligned pointers and
        # the other integers divisible by 16 (8192 channels, the qkv row stride, the pool's slot stride)
        consts = {"sx_c": 1, "sw_k": 1, "BC": launch["meta"]["BC"], "PAD": 0, "USE_PDL": pdl}
        k = compile_kernel(fn, types, consts, launch["block"] // 32, launch["meta"]["num_stages"],
                           divisible=[n for n in fn.arg_names if n not in consts and n != "sw_c"])
        out[f"pdl={pdl}"] = [ln.strip() for ln in k.asm["ptx"].splitlines()
                             if "ld.global" in ln or "st.global" in ln or "bar.sync" in ln]
    print(json.dumps(out))
""")


def _ordered(lines: list[str]) -> tuple[bool, str]:
    """Every global store after a ``bar.sync`` that follows the last global load (the code's text order)."""
    loads = [i for i, ln in enumerate(lines) if "ld.global" in ln]
    stores = [i for i, ln in enumerate(lines) if "st.global" in ln]
    if not loads or not stores:
        return False, "no global loads or stores found"
    barriers = [i for i, ln in enumerate(lines) if ln.startswith("bar.sync") and i > loads[-1]]
    if not barriers:
        return False, "no bar.sync after the last global load"
    early = [lines[i] for i in stores if i < barriers[0]]
    return not early, f"stores before the barrier: {early[:3]}"


def test_ordered_helper_rejects_the_racy_order() -> None:
    racy = ["ld.global.b16 {%rs1}, [%rd1];", "@%p1 st.global.b32 [%rd2], {%r1};", "bar.sync 0;"]
    fenced = ["ld.global.b16 {%rs1}, [%rd1];", "bar.sync 0;", "@%p1 st.global.b32 [%rd2], {%r1};"]
    assert not _ordered(racy)[0]
    assert not _ordered(racy[:2])[0]
    assert _ordered(fenced)[0]


@pytest.mark.slow
def test_conv_update_orders_its_state_loads_before_the_in_place_stores(compile_sm90: Any) -> None:
    res = compile_sm90(SCRIPT)
    for name, lines in res.items():
        ok, why = _ordered(lines)
        assert ok, (name, why)
