"""Readiness is the audit: the response layer's /health gate on the in-pod verdict, and the audit's checks
(planned command line and environment, whole cores on one NUMA node, the GPU's node, tampered code objects).
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from serve.conftest import make_stack

from netra.deploy.plan import Overrides, make_plan
from netra.deploy.profile import load_profile
from netra.k8s import audit
from netra.k8s.pod import pod_commands
from netra.serve.fakeworker import write_tokenizer

ROOT = Path(__file__).resolve().parents[2]
H200 = ROOT / "numa" / "dual-socket-8x-h200" / "sys"


@pytest.fixture(scope="module")
def tokenizer_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tokenizer(tmp_path_factory.mktemp("tok"))


def _health(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url + "/health", timeout=10) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def test_health_is_503_until_the_audit_passes(tokenizer_dir: Path, tmp_path: Path,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    verdict = tmp_path / "audit.json"
    with make_stack(tokenizer_dir) as stack:
        assert _health(stack.url)[0] == 200  # no verdict asked for: as today
        monkeypatch.setenv("NETRA_AUDIT_FILE", str(verdict))
        code, body = _health(stack.url)
        assert code == 503 and "has not written a verdict" in body
        verdict.write_text(json.dumps({"ok": False, "problems": ["engine CPU 3 without its SMT siblings 3,115"]}))
        code, body = _health(stack.url)
        assert code == 503 and "engine CPU 3 without its SMT siblings 3,115" in body
        verdict.write_text(json.dumps({"ok": True, "problems": []}))
        assert _health(stack.url) == (200, "")


def test_cpu_invariants_on_the_dual_socket_fixture() -> None:
    # node0: 0-55,112-167; SMT siblings c and c+112.
    assert audit.cpu_problems([0, 1, 112, 113], 4, sys_root=H200, gpu_node=0) == []
    assert audit.cpu_problems([0, 1, 112], None, sys_root=H200) == ["engine CPU 1 without its SMT siblings 1,113: "
                                                                     "not a whole core"]
    assert audit.cpu_problems([55, 56, 167, 168], None, sys_root=H200) == [
        "engine CPUs 55-56,167-168 span NUMA nodes [0, 1]"]
    assert audit.cpu_problems([0, 112], 4, sys_root=H200, gpu_node=1) == [
        "engine CPU set 0,112 has 2 CPUs, the pod requested 4", "engine CPUs are on NUMA node [0], its GPU on node 1"]


def _plan_with(argv: list[str]) -> dict[str, Any]:
    prof = load_profile("local")
    plan = make_plan(prof, ROOT / "numa" / "no-numa-2x-h200", Overrides(run_dir=Path("/run/netra/local"))).to_dict()
    for w in plan["workers"]:
        w["engine_argv"] = [*argv, "--port", str(w["engine_port"]), "--worker-id", str(w["index"])]
    return plan


def test_audit_finds_the_planned_engine_and_its_environment() -> None:
    tag = f"netra-k8s-audit-{time.monotonic_ns()}"
    plan = _plan_with([sys.executable, "-c", "import time; time.sleep(60)", tag])
    cmds = pod_commands(plan, 3, gpu_target=False)  # ordinal 3 runs worker 1 on worker 0's ports
    assert cmds["worker"] == 1
    assert audit.audit_pod(plan, 3, check_health=False) == [
        f"no process runs the planned engine command line: {' '.join(cmds['engine_argv'])}"]
    env = dict(cmds["engine_env"])
    env["OMP_NUM_THREADS"] = "99"
    proc = subprocess.Popen(cmds["engine_argv"], env=env)
    try:
        deadline = time.monotonic() + 10
        while audit.find_process(cmds["engine_argv"]) is None and time.monotonic() < deadline:
            time.sleep(0.05)
        problems = audit.audit_pod(plan, 3, check_health=False)
        want = cmds["engine_env"]["OMP_NUM_THREADS"]
        assert problems[0] == f"engine environment OMP_NUM_THREADS: the plan sets {want!r}, the engine has '99'"
        assert [p for p in problems[1:] if "environment" in p] == []
    finally:
        proc.kill()
        proc.wait()
    proc = subprocess.Popen(cmds["engine_argv"], env=cmds["engine_env"])
    try:
        deadline = time.monotonic() + 10
        while audit.find_process(cmds["engine_argv"]) is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert [p for p in audit.audit_pod(plan, 3, check_health=False) if "environment" in p] == []
    finally:
        proc.kill()
        proc.wait()


def test_a_tampered_code_object_fails_the_audit(tmp_path: Path) -> None:
    from netra.build import verify_lock

    plan = _plan_with([sys.executable, "-c", "pass", f"never-{time.monotonic_ns()}"])
    problems = audit.audit_pod(plan, 0, check_health=False, build_dir=tmp_path)
    # An empty build dir: every locked code object is missing, named by the lock check.
    missing = verify_lock(tmp_path)
    assert missing
    assert problems[:-1] == [f"code objects: {p}" for p in missing]
    assert problems[-1].startswith("no process runs the planned engine command line")


def test_verdict_file(tmp_path: Path) -> None:
    out = tmp_path / "audit.json"
    audit.write_verdict(out, ["x"], "abc")
    v = json.loads(out.read_text())
    assert (v["ok"], v["problems"], v["plan_sha256"]) == (False, ["x"], "abc")
