"""The GDN and conv specs (netra/bench/specs/{gdn_decode,gdn_replay,prefill_ops}.py) on the CPU under Triton's
interpreter: each spec's smoke path passing is tests/bench/test_harness.py's; here its checks
failing when the tactic's output is corrupted (a check that cannot fail is not a check); and the GPU path's case
builders (inputs, providers over rotated input sets, sweeps, the checks the GPU cases run) at small heads on the CPU,
every provider called, so that the timed run's code is exercised before a GPU sees it (peers, graphs and timing
aside)."""

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
# Builds each spec's GPU cases at small shapes on the CPU, calls every provider on every input set and runs the case's
# check (the decode reference's dispatch check needs the GPU's tactics): prints key -> providers, ok.
GPU_CASES = """
import json, sys
from netra.ops import _interp
_interp.enable()
_interp.interpreter_fixes()
import torch
from netra.bench import harness
from netra.bench.specs import gdn_decode as gd, gdn_replay as gr, prefill_ops as po
from netra.catalog import contract_doc as cd

S, WIDE_V = gd.SMOKE, gd.Dims(1, 2, 64, 128)  # WIDE_V: every sweep tile (BV up to 128) fits a value head
builds = {
    "gdn_decode": [
        (lambda: gd.gdn_case(cd("gdn_decode_f32_small_hv32"), 8, False, S, "cpu"), True),
        (lambda: gd.gdn_case(cd("gdn_decode_bf16_hv32"), 17, True, WIDE_V, "cpu"), True),
        (lambda: gd.conv_case(cd(gd.CONV), 9, False, S, "cpu"), True),
        (lambda: gd.conv_case(cd(gd.CONV), 9, True, S, "cpu"), True)],
    "gdn_replay": [
        (lambda: gr.verify_case(cd("gdn_verify_f32_small_hv32"), 8, 3, S, "cpu"), True),
        (lambda: gr.commit_case(cd("gdn_commit_bf16_hv32"), 9, 3, 2, True, S, "cpu"), True),
        (lambda: gr.decode_case(9, torch.float32, S, "cpu"), False)],
    "prefill_ops": [
        (lambda: po.conv_case(cd(po.CONV), [40, 8], False, 256, "cpu"), True),
        *[(lambda n=n, op=op, w=w: po.norm_case(cd(n), op, 5 if w > 128 else 96, w, "cpu"), True)
          for n, op, _, w in po.NORMS],
        (lambda: po.linear_case(cd(po.LINEAR), 5, "cpu"), True)],
}
out = {}
for build, check in builds[sys.argv[1]]:
    case = build()
    for fn in case.providers.values():
        for i in range(case.n_inputs):
            fn(i)
    res = harness.run_check(case) if check else {"ok": True}
    out[case.key] = {"providers": sorted(case.providers), "ok": res["ok"], "contract": case.contract,
                     **({} if res["ok"] else {"check": str(res)[:1500]})}
print(json.dumps(out))
"""
GPU_PROVIDERS = {  # without the peers (not loaded on the CPU)
    "gdn state float32 b8": ["netra"], "conv b9": ["netra"], "verify state float32 b8 t3": ["netra"],
    "commit state bfloat16 b9 t3 L2": ["netra"], "decode_gdn state float32 b9 L30": ["netra"],
    "conv 40+8": ["netra", "reference"], "linear_group 5x2048->32+32": ["netra", "reference"],
    "rmsnorm_gemma 5x2048": ["netra", "reference"], "add_rmsnorm_gemma 5x2048": ["netra", "reference"],
    "gated_rmsnorm 96x128": ["netra", "reference"]}
CORRUPTED = {"gdn_decode": "gdn_decode_fused,conv1d_update", "gdn_replay": "gdn_verify,gdn_commit",
             "prefill_ops": "conv1d_prefill,rmsnorm,add_rmsnorm,gated_rmsnorm,linear_group_cublas"}


@pytest.fixture(autouse=True)
def _triton() -> None:
    pytest.importorskip("triton", reason="triton is not installed: the interpreter smoke paths need it")


@pytest.mark.parametrize("name", SPECS)
def test_smoke_check_fails_on_a_corrupted_output(name: str) -> None:
    proc = subprocess.run([sys.executable, "-c", CORRUPT, name, CORRUPTED[name]], cwd=ROOT, env=ENV,
                          capture_output=True, text=True, timeout=540)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    assert got["cases"] > 0 and len(got["failed"]) == got["cases"], got


@pytest.mark.parametrize("name", SPECS)
def test_gpu_cases_run_on_the_cpu(name: str) -> None:
    proc = subprocess.run([sys.executable, "-c", GPU_CASES, name], cwd=ROOT, env=ENV, capture_output=True, text=True,
                          timeout=540)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    for key, case in got.items():
        assert case["ok"], (key, case)
        if key.endswith(" sweep"):  # launch variants beside ours, no contract: they decide nothing
            assert case["contract"] is None and case["providers"][0] == "netra" and len(case["providers"]) > 3, key
            assert all(p.startswith("sweep:") for p in case["providers"][1:]), key
        else:
            assert case["providers"] == GPU_PROVIDERS[key], key
    if name == "gdn_replay":  # the decode reference is timed beside the commit, under no contract
        assert got["decode_gdn state float32 b9 L30"]["contract"] is None
