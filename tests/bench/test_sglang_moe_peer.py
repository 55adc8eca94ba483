"""The SGLang MoE peer's Python path on CPU: SGLang's own code from the pinned wheel runs end to end
(configs, stubs, refs, the JIT requests), each launch recorded instead of executed; the kernel
sequence is the one the production path takes for Qwen3.6 at 1 and 64 tokens."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
FLAT = "jit per_token_group_quant_bf16_t_fp8_e4m3_t_128_false_true_true_false_true_flat.per_token_group_quant"
SORTED = "jit per_token_group_quant_bf16_t_fp8_e4m3_t_128_false_true_true_false_true_sorted.per_token_group_quant"
ALIGN_JIT = "jit moe_align_block_size_int32_t_false_false_false.moe_align_block_size"
TAIL = [FLAT, "fused_moe_kernel [pdl]", "jit activation_bf16_t_true.run_activation_sorted_filtered", SORTED,
        "fused_moe_kernel [pdl]", "_moe_sum_reduce_kernel [pdl]"]
SHARED = [FLAT, "_w8a8_block_fp8_matmul", "jit activation_bf16_t_true.run_activation", FLAT, "_w8a8_block_fp8_matmul"]


def test_peer_kernel_sequence_on_cpu(tmp_path: Path) -> None:
    pytest.importorskip("triton", reason="SGLang's kernel files import triton (pip install triton==3.6.0)")
    from netra.bench.peers import sglang_loader

    try:
        sglang_loader.wheel_root()
    except Exception as exc:
        pytest.skip(f"the pinned sglang wheel is not installed: {exc}")
    root = tmp_path / "peer"
    # compiled-Triton semantics: the dry run records launches instead of running Triton's interpreter
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    stage = subprocess.run([sys.executable, "-m", "netra.bench.peers.sglang_loader", str(root), "--no-wheels",
                            "--no-compile"], capture_output=True, text=True, timeout=300, cwd=REPO, env=env)
    assert stage.returncode == 0, stage.stderr[-3000:]
    # tvm-ffi is only needed on the GPU host; the dry run replaces its load_module either way
    code = textwrap.dedent(f"""
        import sys, types, runpy
        try:
            import tvm_ffi
        except ImportError:
            sys.modules["tvm_ffi"] = types.ModuleType("tvm_ffi")
        sys.argv = ["sglang_moe_dry", "--dry-run", "--root", {str(root)!r}, "--tokens", "1,64"]
        runpy.run_module("netra.bench.peers.sglang_moe_dry", run_name="__main__")
    """)
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, cwd=REPO, env=env)
    assert r.returncode == 0, r.stderr[-3000:]
    doc = json.loads(r.stdout.strip().splitlines()[-1])
    one, many = doc["dry_run"]["1"], doc["dry_run"]["64"]
    assert one["routed"] == ["_moe_align_small_numel_kernel [pdl]", *TAIL]
    assert many["routed"] == [ALIGN_JIT, *TAIL]
    for m in (one, many):
        assert m["block"] == [*SHARED, "_router_triton_kernel [pdl]", *m["routed"],
                              "_fused_gate_sigmoid_mul_add_kernel [pdl]"]
    notes = "\n".join(doc["notes"])
    assert "ran sglang.kernels.ops.moe.moe_align:moe_align_block_size for sgl_kernel.moe_align_block_size" in notes
    assert "ran sglang.kernels.ops.moe.fused_moe_triton_kernels:moe_sum_reduce_triton for sgl_kernel.moe_sum_reduce" \
        in notes
