"""The GDN and conv specs' smoke paths (netra/bench/specs/{gdn_decode,gdn_replay,prefill_ops}.py): each spec's checks
run on the CPU under Triton's interpreter through the harness (``python -m netra.bench.harness NAME --smoke``), and
they fail when the tactic's output is corrupted (a check that cannot fail is not a check)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.triton_interp

ROOT = Path(__file__).resolve().parents[2]
SPECS = ("gdn_decode", "gdn_replay", "prefill_ops")
ENV = {**os.environ, "TRITON_INTERPRET": "1", "CUDA_VISIBLE_DEVICES": ""}

# Runs one spec's smoke path in-process with its tactic entries wrapped so that each result (or, for the commit,
# its pool) has one element moved by more than its magnitude: every case must then fail its check.
CORRUPT = """
import json, sys
from netra.ops import _interp
_interp.enable()
_interp.interpreter_fixes()
import argparse
from netra.bench import harness
from netra.bench.specs import gdn_decode, gdn_replay, prefill_ops

name, symbols = sys.argv[1], set(sys.argv[2].split(","))

def corrupted(real):
    def tactic(doc):
        fn = real(doc)
        if doc["kernel"]["symbol"] not in symbols:
            return fn
        def bad(*args, **kw):
            out = fn(*args, **kw)
            t = out[0] if isinstance(out, (tuple, list)) else out if out is not None else kw["ssm_pool"]
            flat = t.view(-1)
            flat[-1] += 1 + flat[-1].abs()
            return out
        return bad
    return tactic

for mod in (gdn_decode, gdn_replay, prefill_ops):
    mod.tactic = corrupted(mod.tactic)
record = harness.run(harness.specs()[name], argparse.Namespace(smoke=True))
print(json.dumps({"cases": record["checks"]["cases"], "failed": record["checks"]["failed"]}))
"""
CORRUPTED = {"gdn_decode": "gdn_decode_fused,conv1d_update", "gdn_replay": "gdn_verify,gdn_commit",
             "prefill_ops": "conv1d_prefill,rmsnorm,add_rmsnorm,gated_rmsnorm,linear_group_cublas"}


@pytest.fixture(autouse=True)
def _triton() -> None:
    pytest.importorskip("triton", reason="triton is not installed: the interpreter smoke paths need it")


def smoke(name: str, out: Path) -> dict[str, object]:
    """``python -m netra.bench.harness NAME --smoke --out OUT``: it exits 0, says "0 failed", and writes a smoke
    record with every case checked and passed (no timing, no promotion, no graphs)."""
    proc = subprocess.run([sys.executable, "-m", "netra.bench.harness", name, "--smoke", "--out", str(out)],
                          cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=540)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert f"{name}: " in proc.stdout and " 0 failed" in proc.stdout, proc.stdout[-3000:]
    record: dict[str, object] = json.loads((out / f"{name}.json").read_text())
    checks = record["checks"]
    assert isinstance(checks, dict)
    assert record["status"] == "smoke" and record["rows"] == [] and checks["cases"] > 0
    assert "promotion" not in record  # a smoke run times nothing, so it promotes nothing
    for key, case in checks["by_case"].items():
        assert case["ok"] and case.get("eager_equals_replay") is None, key  # no graphs on the CPU
    return record


@pytest.mark.parametrize("name", [s for s in SPECS if s != "gdn_replay"])  # gdn_replay's: tests/bench/test_spec_script.py
def test_smoke_path_passes(name: str, tmp_path: Path) -> None:
    smoke(name, tmp_path)


@pytest.mark.parametrize("name", SPECS)
def test_smoke_check_fails_on_a_corrupted_output(name: str) -> None:
    proc = subprocess.run([sys.executable, "-c", CORRUPT, name, CORRUPTED[name]], cwd=ROOT, env=ENV,
                          capture_output=True, text=True, timeout=540)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    assert got["cases"] > 0 and len(got["failed"]) == got["cases"], got
