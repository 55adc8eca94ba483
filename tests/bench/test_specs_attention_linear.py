"""The attention, linear and norm specs (netra/bench/specs): each one's smoke path (CPU, Triton's interpreter) passes
through the harness, and its checks fail when the tactic's output is corrupted (a check that cannot fail is no
check), each run in a fresh process (the interpreter must be on before triton is imported); and their GPU grids
cover the contracts each one pins, and their issue targets read a record's rows."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SPECS = ("attention", "linear", "norm")

# spec -> (the kernel sources whose entries get corrupted, their symbols; the smoke cases run corrupted: one per
# kind of check the spec has)
CORRUPT: dict[str, tuple[dict[str, tuple[str, ...]], tuple[str, ...]]] = {
    "attention": ({"kernels/sm90/attention/decode_fp8.py": ("launch_decode",),
                   "kernels/sm90/attention/qk_norm_rope_store.py": ("qk_norm_rope_store_fp8",)},
                  ("decode B=3 L=200", "decode gated B=3 L=200", "prologue T=5")),
    "linear": ({"kernels/sm90/linear/linear.py": ("linear", "linear_group"),
                "kernels/sm90/linear/cublas_group.py": ("linear_group_cublas",)},
               ("o_proj m=5", "qgkv m=65", "ba m=130", "lm_head m=20")),
    "norm": ({"kernels/sm90/norm/norm.py": ("rmsnorm", "add_rmsnorm", "gated_rmsnorm")},
             ("rmsnorm_gemma_rows rows=3", "add_rmsnorm_gemma_rows rows=5", "gated_rmsnorm_rows rows=37")),
}

SCRIPT = textwrap.dedent("""
    import argparse, dataclasses, importlib, json, sys
    from netra.ops import _interp
    _interp.enable()
    _interp.interpreter_fixes()
    import torch
    from netra.bench import harness
    from netra.ops._triton import load_source

    name, sources, keys = sys.argv[1], json.loads(sys.argv[2]), json.loads(sys.argv[3])

    def corrupt(v):
        if isinstance(v, (list, tuple)):
            return type(v)([corrupt(v[0]), *v[1:]])
        v = v.clone()
        v[0] = v[0] * 1.5  # the first row (token, request) off by half its value
        return v

    def corrupted(fn):
        return lambda *a, **kw: corrupt(fn(*a, **kw))

    for src, symbols in sources.items():
        mod = load_source(src)
        for sym in symbols:
            setattr(mod, sym, corrupted(getattr(mod, sym)))
    spec = harness.specs()[name]
    chosen = dataclasses.replace(spec, smoke=lambda: (b for b in spec.smoke() if b().key in keys))
    rec = harness.run(chosen, argparse.Namespace(smoke=True))

    def refused(v):  # a comparison's result (netra.validate.compare) that failed, anywhere in the check's result
        if isinstance(v, dict):
            return (v.get("policy") is not None and v.get("ok") is False) or any(refused(x) for x in v.values())
        return isinstance(v, list) and any(refused(x) for x in v)

    by_case = rec["checks"]["by_case"]
    print(json.dumps({"cases": sorted(by_case), "failed": sorted(rec["checks"]["failed"]),
                      "refused_by_compare": sorted(k for k, v in by_case.items() if refused(v))}))
""")


def _env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}


@pytest.mark.triton_interp
@pytest.mark.parametrize("name", SPECS)
def test_smoke_checks_fail_on_a_corrupted_output(name: str, tmp_path: Path) -> None:
    """Every entry of the spec's kernels returns its first row scaled by 1.5: each chosen smoke case must fail, and
    the contract's comparison must be what refused it."""
    sources, keys = CORRUPT[name]
    script = tmp_path / "corrupt.py"
    script.write_text(SCRIPT)
    proc = subprocess.run([sys.executable, str(script), name, json.dumps({k: list(v) for k, v in sources.items()}),
                           json.dumps(list(keys))], cwd=REPO, env={**_env(), "PYTHONPATH": str(REPO)},
                          capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["cases"] == sorted(keys), out  # every chosen case ran
    assert out["failed"] == sorted(keys), proc.stdout[-3000:]
    assert out["refused_by_compare"] == sorted(keys), proc.stdout[-3000:]  # the comparison itself caught it


def test_gpu_grids_cover_the_contracts_they_pin() -> None:
    """The default GPU grid reaches every contract the spec pins (the linear one: every linear contract of the
    catalog, each by its row range), so no contract goes unmeasured by omission."""
    import argparse

    from netra.bench.specs import attention, linear, norm
    from netra.catalog import contract_docs

    assert set(linear.CONTRACTS) == set(contract_docs("sm90", "linear"))
    opts = argparse.Namespace(linear_rows="")
    reached = {linear.pick(*linear.op_of(s[3], s[4]), m)
               for m in linear.rows_of(opts) for s in linear.SHAPES if linear.in_range(s, m)}
    assert reached == set(linear.CONTRACTS)
    assert set(attention.CONTRACTS) <= set(contract_docs("sm90", "attention"))
    assert set(norm.CONTRACTS) <= set(contract_docs("sm90", "norm"))
    builders = {name: list(spec.cases(argparse.Namespace(linear_rows="", linear_explore=True, attention_explore=True)))
                for name, spec in (("attention", attention.SPEC), ("linear", linear.SPEC), ("norm", norm.SPEC))}
    assert all(builders.values())


def test_targets_read_the_issue_shapes_from_the_rows() -> None:
    from netra.bench.specs import attention, linear

    def row(op: str, shape: dict[str, int], provider: str, us: float) -> dict[str, object]:
        return {"op": op, "shape": shape, "provider": provider, "median_us": us, "floor_fraction": 0.5}

    rec = {"rows": [row("attention_decode", {"batch": 128, "context": 4096}, "netra", 10.0),
                    row("attention_decode", {"batch": 128, "context": 4096}, "sglang_triton", 20.0),
                    row("attention_decode", {"batch": 1, "context": 49152}, "netra", 30.0),
                    row("attention_decode", {"batch": 1, "context": 49152}, "sglang_triton", 20.0)]}
    t = attention.targets(rec)
    assert t["B=128 L=4096: netra <= sglang_triton"]["pass"] and not t["B=1 L=49152: netra <= sglang_triton"]["pass"]
    rec = {"rows": [row("o_proj", {"n": [2048], "k": 4096, "m": 1}, "netra", 5.0),  # type: ignore[dict-item]
                    row("o_proj", {"n": [2048], "k": 4096, "m": 1}, "sglang", 9.0)]}  # type: ignore[dict-item]
    t = linear.targets(rec)
    assert t["o_proj m=1: netra <= sglang"]["pass"]
    assert not t["o_proj m=128: netra <= sglang"]["pass"]  # not measured is not a pass
