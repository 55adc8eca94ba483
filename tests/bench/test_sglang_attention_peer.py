"""The attention peer (netra/bench/peers/sglang_attention.py) loads SGLang 0.5.23's decode attention from
the pinned wheel with its manifest alone and runs it: here through Triton's interpreter on the CPU, in a
fresh process (the loader's finder is process-global), against the FP32 oracle."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

SCRIPT = textwrap.dedent("""
    import importlib.util, json, os, sys
    os.environ["TRITON_INTERPRET"] = "1"
    from netra.ops import _interp
    _interp.interpreter_fixes()
    import torch
    from netra.bench.peers import sglang_loader
    from netra.bench.peers.sglang_attention import SglangDecodeAttention
    from netra.ops import attention, fp8
    import dataclasses
    from netra.bench.peers import sglang_attention, sglang_common
    # the common manifest without its carried wheels (tvm-ffi: SGLang's JIT modules, unused by this peer)
    common = dataclasses.replace(sglang_common.COMMON, wheels={})
    sglang_loader.install(sglang_loader.wheel_root(), manifest_list=[common, sglang_attention.MANIFEST])
    g = torch.Generator().manual_seed(0)
    kc = torch.randn(3, 96, 2, 256, generator=g).to(fp8.E4M3)
    vc = torch.randn(3, 96, 2, 256, generator=g).to(fp8.E4M3)
    slots, lens = torch.tensor([2, 1]), torch.tensor([90, 33])
    q = torch.randn(2, 16, 256, generator=g).bfloat16()
    peer = SglangDecodeAttention(kc, vc, slots, lens, 16, 256 ** -0.5, root=sglang_loader.wheel_root(), use_pdl=False)
    o = peer(q)
    ref = attention.attention_decode_ref(q, kc, vc, slots, lens, 96, 256 ** -0.5)
    q8 = q.float().to(fp8.E4M3).bfloat16()
    ref8 = attention.attention_decode_ref(q8, kc, vc, slots, lens, 96, 256 ** -0.5)
    rel = lambda a, b: float((a.double() - b.double()).norm() / b.double().norm())
    print(json.dumps({"vs_ref": rel(o, ref), "vs_fp8q_ref": rel(o, ref8), "splits": peer.num_kv_splits.tolist(),
                      "notes": sorted(set(sglang_loader.NOTES))}))
""")


def test_sglang_decode_attention_peer_runs_with_e4m3_queries(tmp_path: Path) -> None:
    pytest.importorskip("triton")
    try:
        from netra.bench.peers import sglang_loader

        sglang_loader.wheel_root()
    except Exception as exc:  # installed with --no-deps by `make setup`
        pytest.skip(f"the pinned sglang wheel is not installed: {exc}")
    script = tmp_path / "peer.py"
    script.write_text(SCRIPT)
    proc = subprocess.run([sys.executable, str(script), str(REPO / "tests/ops/conftest.py")], cwd=REPO,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    # SGLang's stage 1 casts q (and the probabilities, for P·V) to the cache dtype: E4M3-level error, a
    # few percent, where a BF16-q kernel is at the output's BF16 rounding (~1e-3); closer to the E4M3-q oracle
    assert 0.01 < out["vs_ref"] < 0.1 and out["vs_fp8q_ref"] < out["vs_ref"], out
    assert all(1 <= s <= 8 for s in out["splits"]), out
