"""scripts/gpu/plugin_h200.py's loading on the CPU, from the pinned wheel's files: SGLang is imported
through the bench peers' loader (the MoE peer's manifest plus ``sglang_plugin``'s) and Netra's hooks
are applied by SGLang's own ``HookRegistry``. Catches a manifest change that would break the H200 run
before a device call (the GPU half, with SGLang's JIT modules, is tests/plugins/test_plugin_gpu.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from netra.bench.peers import sglang_loader

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "scripts" / "gpu" / "plugin_h200.py"


def test_the_h200_script_loads_sglang_through_the_peers_loader(tmp_path: Path) -> None:
    try:
        root = sglang_loader.wheel_root()
    except Exception as exc:  # installed with --no-deps by `make setup`
        pytest.skip(f"the pinned sglang wheel is not installed: {exc}")
    code = textwrap.dedent(f"""
        import importlib.util, json, sys
        sys.argv = ["plugin_h200"]
        spec = importlib.util.spec_from_file_location("plugin_h200", {str(SCRIPT)!r})
        m = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(m)
        sg = m.load({str(root)!r})
        rec = m.apply_plugin(sg)
        import torch
        softmax = sys.modules["sglang.kernels.ops.sampling"].softmax  # the sampler's own facade
        x = torch.randn(3, 4096)
        print(json.dumps({{
            "applied": rec["applied"], "patched": rec["patched"],
            "files": [sg[k].__file__ for k in ("fused", "sampler", "hooks", "base")],
            "sampler_softmax_is_sglangs": sg["sampler"].sampler_softmax is softmax,
            "softmax_equal": torch.equal(softmax(x), torch.softmax(x, -1)),
            "config_is_real": sys.modules["sglang.srt.layers.moe.moe_runner"].MoeRunnerConfig is sg["base"].MoeRunnerConfig,
            "substitutes": m.substitutes()}}))
    """)
    env = {**os.environ, "NETRA_PLUGIN_EVIDENCE": str(tmp_path / "evidence")}
    env.pop("OUT", None)
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, cwd=REPO, env=env)
    assert r.returncode == 0, r.stderr[-4000:]
    got = json.loads(r.stdout.strip().splitlines()[-1])
    assert got["applied"] == {"moe": True, "argmax": True}
    assert got["patched"] == ["sglang.srt.layers.moe.moe_runner.triton_utils.fused_moe.fused_experts",
                              "sglang.srt.layers.sampler.Sampler.forward"]
    assert all(f.startswith(str(root)) for f in got["files"]), got["files"]
    assert got["sampler_softmax_is_sglangs"] and got["softmax_equal"] and got["config_is_real"]
    assert got["substitutes"] == []  # nothing stood in until a call reaches an AOT sgl_kernel op
