"""The pinned SGLang wheel's own plugin loader finds netra's entry point and registers its hooks.

Each case runs `plugin_child.py` in a fresh process (load_plugins() is once per process and its
registry is global), with the environment the launcher renders.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from netra.plugins import evidence
from netra.plugins import sglang as plugin

CHILD = Path(__file__).with_name("plugin_child.py")
MOE, ARGMAX = plugin.DOMAINS["moe"].target, plugin.DOMAINS["argmax"].target
EXPECTED = {MOE: [["around", "netra.plugins.sglang_moe.hook", "netra", "netra"]],
            ARGMAX: [["around", "netra.plugins.sglang_sampler.hook", "netra", "netra"]]}


def run_child(mode: str, tmp_path: Path, **env: str) -> dict[str, Any]:
    full = {k: v for k, v in os.environ.items() if k not in ("SGLANG_PLUGINS", plugin.TACTICS_ENV,
                                                              plugin.EVIDENCE_ENV)}
    full.update(env)
    proc = subprocess.run([sys.executable, str(CHILD), mode], capture_output=True, text=True, env=full,
                          timeout=120, check=False, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    out["stderr"] = proc.stderr
    return out


def test_load_plugins_registers_netra_hooks(tmp_path: Path) -> None:
    where = tmp_path / "worker0.plugin"
    out = run_child("load", tmp_path, SGLANG_PLUGINS="netra", NETRA_SGLANG_TACTICS="moe,argmax",
                    NETRA_PLUGIN_EVIDENCE=str(where))
    assert out["hooks"] == EXPECTED
    # On a CPU the real targets cannot be imported, so SGLang's apply_hooks logs and skips them.
    assert out["patched"] == []
    assert "Failed to apply hooks to" in out["stderr"]
    (rec,) = evidence.read(where)
    assert rec["domains"] == ["moe", "argmax"] and rec["error"] is None
    assert {d: (h["target"], h["registered"], h["applied"]) for d, h in rec["hooks"].items()} == {
        "moe": (MOE, True, False), "argmax": (ARGMAX, True, False)}


def test_sglang_plugins_whitelist_excludes_netra(tmp_path: Path) -> None:
    out = run_child("load", tmp_path, SGLANG_PLUGINS="other", NETRA_SGLANG_TACTICS="moe,argmax",
                    NETRA_PLUGIN_EVIDENCE=str(tmp_path / "ev"))
    assert out["hooks"] == {}
    assert "Skipping plugin netra (not in SGLANG_PLUGINS)" in out["stderr"]
    assert not (tmp_path / "ev").exists()
    # What the launcher renders for `tactics: none` leaves it out the same way.
    out = run_child("load", tmp_path, SGLANG_PLUGINS=plugin.PLUGINS_OFF, NETRA_SGLANG_TACTICS="moe")
    assert out["hooks"] == {}


def test_one_domain_registers_one_hook(tmp_path: Path) -> None:
    out = run_child("apply", tmp_path, SGLANG_PLUGINS="netra", NETRA_SGLANG_TACTICS="argmax")
    assert out["hooks"] == {ARGMAX: EXPECTED[ARGMAX]} and out["patched"] == [ARGMAX]
    assert out["evidence"]["counts"] == {"argmax": {"hits": 0, "misses": 1, "miss_reasons": {
        "not every request is greedy": 1}}}
    out = run_child("apply", tmp_path, SGLANG_PLUGINS="netra")  # no domain: the plugin registers nothing
    assert out["hooks"] == {} and out["patched"] == []


def test_unknown_domain_is_an_error_in_the_evidence(tmp_path: Path) -> None:
    where = tmp_path / "ev"
    out = run_child("load", tmp_path, SGLANG_PLUGINS="netra", NETRA_SGLANG_TACTICS="moe,gdn",
                    NETRA_PLUGIN_EVIDENCE=str(where))
    assert out["hooks"] == {}
    # SGLang logs a plugin that raises and goes on; the evidence says why nothing was hooked.
    assert "Failed to execute general plugin: netra" in out["stderr"]
    (rec,) = evidence.read(where)
    assert "unknown tactic domain(s) ['gdn']" in rec["error"]


def test_apply_hooks_patches_the_targets_and_misses_reach_the_original(tmp_path: Path) -> None:
    where = tmp_path / "ev"
    out = run_child("apply", tmp_path, SGLANG_PLUGINS="netra", NETRA_SGLANG_TACTICS="moe,argmax",
                    NETRA_PLUGIN_EVIDENCE=str(where))
    assert out["patched"] == sorted(EXPECTED)
    assert out["calls"] == ["sglang fused_experts", "sglang Sampler.forward"]
    ev = out["evidence"]
    assert {d: h["applied"] for d, h in ev["hooks"].items()} == {"moe": True, "argmax": True}
    assert ev["counts"]["moe"] == {"hits": 0, "misses": 1, "miss_reasons": {
        "use_fp8_w8a8 is False (weights are not FP8 W8A8)": 1}}
    assert ev["counts"]["argmax"]["miss_reasons"] == {"not every request is greedy": 1}
    (written,) = evidence.read(where)  # the file the launcher's audit reads says the same
    assert written["hooks"] == ev["hooks"] and written["counts"] == ev["counts"]
    assert written["tactics"] == []


@pytest.mark.parametrize("raw", ["moe", " argmax , moe ", "moe,argmax"])
def test_parse_domains_orders_and_validates(raw: str) -> None:
    assert plugin.parse_domains(raw) == tuple(d for d in plugin.DOMAINS if d in raw)
    with pytest.raises(plugin.PluginConfigError, match="unknown tactic domain"):
        plugin.parse_domains(raw + ",attention")


def test_install_check_the_image_build_runs(tmp_path: Path) -> None:
    out = run_child("check", tmp_path)
    assert out["check"].startswith("SGLang plugin netra (netra.plugins.sglang:register, dist netra): ")
    assert f"moe -> netra.plugins.sglang_moe.hook at {MOE}" in out["check"]
    dockerfile = (Path(__file__).parents[2] / "images" / "sglang-sm90.Dockerfile").read_text()
    assert "python3 -m netra.plugins.sglang --check-install" in dockerfile
