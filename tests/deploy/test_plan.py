from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from pathlib import Path

import pytest

from netra.deploy.plan import Overrides, PlanError, make_plan
from netra.deploy.profile import load_profile
from netra.deploy.topology import PlacementError
from netra.settings import REPO_ROOT

NUMA = REPO_ROOT / "numa"


def test_local_plan_commands_ports_and_paths(tmp_path: Path) -> None:
    plan = make_plan(load_profile("local"), None, Overrides(run_dir=tmp_path, port_base=41000, front_port=41999))
    assert plan.dp == 2 and plan.front.port == 41999 and plan.front.host == "127.0.0.1"
    for i, w in enumerate(plan.workers):
        assert (w.engine_port, w.serve_port) == (41000 + 2 * i, 41001 + 2 * i)
        assert w.engine_log == str(tmp_path / f"worker{i}.engine.log") and w.gpu is None
        argv = list(w.engine_argv)
        assert argv[:4] == ["netra", "engine", "--preset", "tiny"]
        assert argv[argv.index("--port") + 1] == str(w.engine_port)
        assert argv[argv.index("--max-running-requests") + 1] == "16"
        assert "--incremental-streaming-output" in argv and argv[argv.index("--device") + 1] == "cpu"
        assert list(w.serve_argv) == ["netra", "serve", "--upstream", f"http://127.0.0.1:{w.engine_port}",
                                      "--host", "127.0.0.1", "--port", str(w.serve_port), "--stream-interval",
                                      "1", "--model-name", "netra-tiny", "--engine", "embedded", "--worker-id",
                                      str(i),
                                      # bounds from the profile: 2 x 16 running, the front's 256, local's
                                      # 30 s queue and its fast liveness probe
                                      "--max-inflight", "64", "--max-waiting", "256", "--queue-timeout", "30",
                                      "--max-choices", "64", "--max-body-bytes", str(8 << 20),
                                      "--probe-interval", "0.5", "--probe-timeout", "1", "--probe-misses", "2",
                                      "--stall-timeout", "30"]
        assert argv[argv.index("--worker-id") + 1] == str(i) and "--enable-metrics" in argv
        assert argv[argv.index("--served-model-name") + 1] == "netra-tiny"
        assert w.engine_env["OMP_NUM_THREADS"] == str(w.physical_cores)
        assert w.engine_expect["port"] == w.engine_port and w.engine_expect["preset"] == "tiny"
    assert plan.front.upstreams == ("127.0.0.1:41001", "127.0.0.1:41003")
    # Default ports come from the profile.
    default = make_plan(load_profile("local"), None, Overrides(run_dir=tmp_path))
    assert [(w.engine_port, w.serve_port) for w in default.workers] == [(30000, 31000), (30001, 31001)]
    assert default.front.port == 8000


def test_plan_hash_is_canonical_and_deterministic(tmp_path: Path) -> None:
    prof = load_profile("dp2-h200")
    a = make_plan(prof, NUMA / "dual-socket-8x-h200", Overrides(run_dir=tmp_path))
    b = make_plan(prof, NUMA / "dual-socket-8x-h200", Overrides(run_dir=tmp_path))
    text = a.canonical_json()
    assert text == json.dumps(json.loads(text), sort_keys=True, separators=(",", ":"))
    assert a.sha256() == b.sha256() == hashlib.sha256(text.encode()).hexdigest()
    c = make_plan(prof, NUMA / "dual-socket-8x-h200", Overrides(run_dir=tmp_path, port_base=50000))
    assert c.sha256() != a.sha256()
    w = a.workers[1]
    assert w.engine_env == {"CUDA_DEVICE_ORDER": "PCI_BUS_ID", "CUDA_VISIBLE_DEVICES": "1", "OMP_NUM_THREADS": "28",
                            "NETRA_TACTIC_MIN_MATURITY": "experiment"}
    # GPUs 0 and 1 are both on node 0: its 56 cores are split between the two workers.
    assert w.cpulist == "28-55,140-167"
    assert w.engine_argv[w.engine_argv.index("--cuda-graph-bs") + 1:][:11] == tuple(
        str(b) for b in (1, 2, 4, 8, 16, 32, 64, 80, 96, 112, 128))


def test_plan_refusals(tmp_path: Path) -> None:
    with pytest.raises(PlacementError, match="fewer GPUs than DP"):
        make_plan(load_profile("dp8-h200-throughput128"), NUMA / "single-socket-4x-h200")
    with pytest.raises(PlanError, match="at least one worker"):
        make_plan(load_profile("local"), None, Overrides(workers=0, run_dir=tmp_path))
    with pytest.raises(PlanError, match="port collision"):
        make_plan(load_profile("local"), None, Overrides(port_base=41000, front_port=41002, run_dir=tmp_path))
    with pytest.raises(PlanError, match="do not fit"):
        make_plan(load_profile("local"), None, Overrides(port_base=65534, run_dir=tmp_path))


def test_sglang_plan_uses_the_rendered_command() -> None:
    sglang = pytest.importorskip("netra.deploy.sglang")
    prof = load_profile("dp8-throughput128")
    plan = make_plan(prof, NUMA / "dual-socket-8x-mi350x")
    for w in plan.workers:
        assert list(w.engine_argv) == sglang.render_argv(prof, host="127.0.0.1", port=w.engine_port)
        assert w.engine_env["HIP_VISIBLE_DEVICES"] == str(w.gpu)
        assert w.serve_argv[w.serve_argv.index("--engine") + 1] == "sglang"
        assert w.serve_argv[w.serve_argv.index("--worker-id") + 1] == str(w.index)
        assert w.serve_argv[w.serve_argv.index("--max-inflight") + 1] == "256"  # 2 x 128 running
        assert w.engine_expect["max_running_requests"] == 128 and w.engine_expect["stream_interval"] == 2


def run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "netra", *args], capture_output=True, text=True, timeout=120,
                          cwd=REPO_ROOT)


def test_netra_plan_cli_dual_socket() -> None:
    """The issue's check: 8 disjoint CPU sets of 14 cores + siblings, GPUs 0-3 on node 0, 4-7 on node 1."""
    topo = str(NUMA / "dual-socket-8x-mi350x")
    out = run_cli("plan", "--profile", "dp8-throughput128", "--topology", topo, "--json")
    assert out.returncode == 0, out.stderr
    plan = json.loads(out.stdout)
    sets = [set(w["cpus"]) for w in plan["workers"]]
    assert len(sets) == 8 and all(len(s) == 28 for s in sets)
    assert len(set().union(*sets)) == 224
    assert [w["numa_node"] for w in plan["workers"]] == [0] * 4 + [1] * 4
    assert [w["gpu"] for w in plan["workers"]] == list(range(8))
    table = run_cli("plan", "--profile", "dp8-throughput128", "--topology", topo)
    assert table.returncode == 0, table.stderr
    digest = hashlib.sha256(out.stdout.rstrip("\n").encode()).hexdigest()
    assert f"plan sha256 {digest}" in table.stdout
    assert "0-13,112-125" in table.stdout and "98-111,210-223" in table.stdout
    bad = run_cli("plan", "--profile", "dp8-throughput128", "--topology", str(NUMA / "single-socket-4x-h200"))
    assert bad.returncode == 2 and "fewer GPUs than DP" in bad.stderr
    override = run_cli("plan", "--profile", "dp8-throughput128", "--topology", topo, "--json",
                       "--set", "engine.stream_interval=4", "--set", "engine.speculative=null")
    assert override.returncode == 0, override.stderr
    assert json.loads(override.stdout)["profile"]["engine"]["stream_interval"] == 4


def test_embedded_engine_scheduling_and_memory_options_reach_the_engine(tmp_path: Path) -> None:
    """dp1-h200's mem_fraction_static and an overridden mixed_chunk become `netra engine` flags, and the
    launch checks them in /server_info (engine_expect); the engine's own parser accepts the argv."""
    from netra.deploy.profile import ProfileError
    from netra.engine.cli import add_arguments, options_from_args

    prof = load_profile("dp1-h200").replace("engine.mixed_chunk", "fused").replace("engine.decode_overlap", True)
    w = make_plan(prof, NUMA / "dual-socket-8x-h200", Overrides(run_dir=tmp_path)).workers[0]
    argv = list(w.engine_argv)
    assert argv[argv.index("--mem-fraction-static") + 1] == "0.9"
    assert argv[argv.index("--mixed-chunk") + 1] == "fused"
    assert w.engine_expect["mem_fraction_static"] == 0.9 and w.engine_expect["mixed_chunk"] == "fused"
    import argparse

    parser = argparse.ArgumentParser()
    add_arguments(parser)
    opts = options_from_args(parser.parse_args(argv[2:]))
    assert (opts.mem_fraction_static, opts.mixed_chunk, opts.decode_overlap) == (0.9, "fused", True)
    assert w.engine_expect["decode_overlap"] is True
    # the profile's tactic maturity reaches the worker's environment (dp1-h200: what its H200 records measured)
    assert w.engine_env["NETRA_TACTIC_MIN_MATURITY"] == "experiment"
    local = make_plan(load_profile("local"), None, Overrides(run_dir=tmp_path)).workers[0]
    assert "NETRA_TACTIC_MIN_MATURITY" not in local.engine_env
    assert "--mixed-chunk" not in make_plan(load_profile("local"), None, Overrides(run_dir=tmp_path)).workers[0].engine_argv
    with pytest.raises(ProfileError, match=r"engine\.mixed_chunk: an embedded-engine option"):
        load_profile("dp8-h200-throughput128").replace("engine.mixed_chunk", "split")
    with pytest.raises(ProfileError, match=r"engine\.decode_overlap: an embedded-engine option"):
        load_profile("dp8-h200-throughput128").replace("engine.decode_overlap", True)


def test_embedded_engine_reasoning_parser_reaches_the_engine(tmp_path: Path) -> None:
    """A profile's reasoning_parser becomes `netra engine --reasoning-parser`, which the engine's own parser
    accepts, and the launch expects it back at /server_info (EngineOptions.to_json)."""
    import argparse

    from netra.engine.cli import add_arguments, options_from_args

    prof = load_profile("dp1-h200").replace("engine.reasoning_parser", "qwen3")
    w = make_plan(prof, NUMA / "dual-socket-8x-h200", Overrides(run_dir=tmp_path)).workers[0]
    argv = list(w.engine_argv)
    assert argv[argv.index("--reasoning-parser") + 1] == "qwen3"
    assert w.engine_expect["reasoning_parser"] == "qwen3"
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    opts = options_from_args(parser.parse_args(argv[2:]))
    assert opts.reasoning_parser == "qwen3" and opts.to_json()["reasoning_parser"] == "qwen3"
    # Without the key: no flag and nothing expected (the seeded presets leave it off).
    plain = make_plan(load_profile("dp1-h200"), NUMA / "dual-socket-8x-h200", Overrides(run_dir=tmp_path)).workers[0]
    assert "--reasoning-parser" not in plain.engine_argv and "reasoning_parser" not in plain.engine_expect
