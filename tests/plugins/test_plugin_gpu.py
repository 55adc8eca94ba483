"""Netra's SGLang plugin on an sm90 GPU, against SGLang 0.5.23's own fused_experts and Sampler.forward.

Runs scripts/gpu/plugin_h200.py in a child process (it installs the SGLang peer loader's import
finder, which must not leak into this process) and asserts on its record. Needs the staged folder
the peers use: ``make sglang-peer`` (nvcc, no GPU) on a machine with the pinned wheel, then carry
.sglang_peer (git-ignored) and build/.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "scripts" / "gpu" / "plugin_h200.py"
STAGED = REPO / ".sglang_peer"

pytestmark = [pytest.mark.gpu, pytest.mark.timeout(600)]


@pytest.fixture(scope="module")
def record(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    if not (STAGED / "sglang/srt/layers/sampler.py").is_file():
        pytest.skip(f"SGLang's files are not staged in {STAGED} (make sglang-peer)")
    out = tmp_path_factory.mktemp("plugin") / "plugin_h200.json"
    env = {k: v for k, v in os.environ.items() if k != "OUT"}
    proc = subprocess.run([sys.executable, str(SCRIPT), "--sglang-root", str(STAGED), str(out)], cwd=REPO,
                          capture_output=True, text=True, timeout=560, env=env, check=False)
    print(proc.stdout[-4000:], proc.stderr[-4000:])
    rec: dict[str, Any] = json.loads(out.read_text())
    return rec


def _checks(rec: dict[str, Any], section: str) -> dict[str, dict[str, Any]]:
    return {c["check"]: c for c in rec["checks"] if c["section"] == section}


def test_hooks_applied_through_sglang_hook_registry(record: dict[str, Any]) -> None:
    assert record["hooks"]["applied"] == {"moe": True, "argmax": True}
    assert not record["errors"], record["errors"]


@pytest.mark.parametrize("tokens", [1, 8, 128])
def test_hooked_fused_experts_equals_netra_and_misses_equal_sglang(record: dict[str, Any], tokens: int) -> None:
    checks = _checks(record, "moe")
    for name in (f"hooked == netra moe_routed bitwise, {tokens} tokens",
                 f"hooked with tactics off == SGLang's original bitwise, {tokens} tokens"):
        assert checks[name]["pass"], checks[name]


@pytest.mark.parametrize("tokens", [1, 8, 128])
def test_hooked_fused_experts_in_a_graph_and_faster(record: dict[str, Any], tokens: int) -> None:
    checks = _checks(record, "moe")
    assert checks[f"hooked in a CUDA graph == netra bitwise, {tokens} tokens"]["pass"]
    row = next(r for r in record["timing"] if r["section"] == "moe" and r["tokens"] == tokens)
    assert row["ratio_sglang_over_hooked"] > 1.0, row


def test_non_matching_calls_reach_the_original_and_are_counted(record: dict[str, Any]) -> None:
    checks = _checks(record, "moe")
    for name, c in checks.items():
        if name.startswith("non-matching call"):
            assert c["pass"], c
    reasons = record["evidence"]["counts"]["moe"]["miss_reasons"]
    assert any("routed_scaling_factor" in r for r in reasons)
    assert any("tokens=129" in r for r in reasons)


def test_sampler_hook_greedy_and_non_greedy(record: dict[str, Any]) -> None:
    checks = _checks(record, "argmax")
    assert len(checks) == 5 and all(c["pass"] for c in checks.values()), checks
    assert record["evidence"]["counts"]["argmax"]["miss_reasons"]["not every request is greedy"] >= 2


def test_the_original_runs_sglangs_jit_pipeline(record: dict[str, Any]) -> None:
    """The unhooked call is SGLang's production pipeline: its JIT quant, activation and align modules
    loaded through the peers' loader; only the AOT sgl_kernel ops (torch 2.14.1 ABI) are stood in."""
    jit = [n for n in record["loader_notes"] if n.startswith("jit ")]
    for name in ("per_token_group_quant", "activation", "moe_align_block_size"):
        assert any(n.startswith(f"jit sgl_kernel_jit_{name}") for n in jit), jit
    assert len(record["substitutes"]) == 2, record["substitutes"]
    assert all(s.startswith("ran sglang.kernels.ops.") and " for sgl_kernel." in s for s in record["substitutes"])
