"""scripts/gpu/spec.py --cpu-smoke: the device script's checks run on the CPU under Triton's interpreter, on tiny
shapes (two value heads on one key head, head dims 64, C = 256, T = 3), one case per verify and commit contract:
outputs poisoned, bitwise against the decode kernels looped, within a bf16 ulp of the PyTorch reference, pools
read only (verify) / untouched outside the batch (commit), pad rows and count-0 rows. No graphs, timing or peers
(those need the H200). The record it writes validates as a ``not_run`` kernel record carrying the prediction."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from netra.records import validate

pytestmark = pytest.mark.triton_interp

ROOT = Path(__file__).resolve().parents[2]


def test_cpu_smoke_runs_the_checks(tmp_path: Path) -> None:
    pytest.importorskip("triton", reason="triton is not installed: the interpreter smoke run needs it")
    env = {**os.environ, "TRITON_INTERPRET": "1", "CUDA_VISIBLE_DEVICES": ""}
    proc = subprocess.run([sys.executable, str(ROOT / "scripts/gpu/spec.py"), "--cpu-smoke", "--out", str(tmp_path)],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=540)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    record = json.loads((tmp_path / "spec_h200.json").read_text())
    validate(record)
    assert record["status"] == "not_run" and record["reason"] and record["rows"] == []
    assert record["failures"] == {}
    cases = record["checks"]["by_case"]
    ops = {k.split("/")[0] for k in cases}
    assert ops == {f"gdn_{op}_{v}_hv32" for op in ("verify", "commit") for v in ("f32_small", "f32", "bf16")}
    for name, case in cases.items():
        assert case["ok"] and case["bitwise_decode_kernels_looped"] and case["torch_ref_ok"], name
        assert case["eager_equals_replay"] is None, name  # no graphs on the CPU
    assert all(cases[k]["pools_unchanged"] and cases[k]["pad_rows_zero"] for k in cases if "verify" in k)
    assert all(cases[k]["untouched_bitwise"] for k in cases if "commit" in k)
    assert record["prediction"]["commit_ms"] == 5.0 and record["prediction"]["fraction_of_decode_step"] == 0.31
