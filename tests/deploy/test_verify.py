"""Every launch refusal, one test each, and the message names the cause."""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from netra.deploy.audit import audit_code_objects, audit_options, same_value
from netra.deploy.plan import make_plan
from netra.deploy.profile import PROFILE_DIR, load_profile
from netra.deploy.verify import read_profile_lock, verify, write_profile_lock
from netra.settings import REPO_ROOT

NUMA = REPO_ROOT / "numa"


def kernel_lock(tmp: Path, entries: list[dict]) -> Path:
    path = tmp / "lock.json"
    path.write_text(json.dumps({"version": 1, "code_objects": entries}))
    return path


def entry(name: str, data: bytes | None, target: str = "sm90") -> dict:
    return {"target": target, "family": "argmax", "name": name, "source": f"kernels/{target}/argmax/{name}.cu",
            "code_object": f"{target}/argmax/{name}.cubin", "sha256": hashlib.sha256(data or b"").hexdigest(),
            "flags": [], "resources": {}}


def locked(tmp: Path, *profiles) -> Path:
    path = tmp / "profiles.lock.json"
    path.write_text(json.dumps({"version": 1, "profiles": {p.name: p.sha256() for p in profiles}}))
    return path


def test_a_good_gpu_profile_passes(tmp_path: Path) -> None:
    prof = load_profile("dp1-h200")
    build = tmp_path / "build"
    (build / "sm90/argmax").mkdir(parents=True)
    (build / "sm90/argmax/k1.cubin").write_bytes(b"code object 1")
    lock = kernel_lock(tmp_path, [entry("k1", b"code object 1"), entry("g1", b"other", target="gfx950")])
    v = verify(prof, profile_lock=locked(tmp_path, prof), kernel_lock=lock, build_dir=build)
    assert v.problems == [] and [c["name"] for c in v.code_objects] == ["k1"]


def test_refuses_a_missing_code_object(tmp_path: Path) -> None:
    prof = load_profile("dp1-h200")
    lock = kernel_lock(tmp_path, [entry("k1", b"code object 1")])
    v = verify(prof, profile_lock=locked(tmp_path, prof), kernel_lock=lock, build_dir=tmp_path / "build")
    assert len(v.problems) == 1
    assert v.problems[0].startswith(f"missing code object {tmp_path}/build/sm90/argmax/k1.cubin (argmax/k1, sm90)")


def test_refuses_a_tampered_code_object(tmp_path: Path) -> None:
    prof = load_profile("dp1-h200")
    build = tmp_path / "build"
    (build / "sm90/argmax").mkdir(parents=True)
    (build / "sm90/argmax/k1.cubin").write_bytes(b"code object 1, patched")
    lock = kernel_lock(tmp_path, [entry("k1", b"code object 1")])
    v = verify(prof, profile_lock=locked(tmp_path, prof), kernel_lock=lock, build_dir=build)
    assert len(v.problems) == 1 and v.problems[0].startswith(f"tampered code object {build}/sm90/argmax/k1.cubin")


def test_missing_kernel_lock_refuses_strict_only(tmp_path: Path) -> None:
    prof = load_profile("dp1-h200")
    kw = {"profile_lock": locked(tmp_path, prof), "kernel_lock": tmp_path / "none.json", "build_dir": tmp_path}
    assert verify(prof, **kw).problems == []
    assert any("kernel lock" in w and "missing" in w for w in verify(prof, **kw).warnings)
    assert any("kernel lock" in p and "missing" in p for p in verify(prof, strict=True, **kw).problems)


def test_refuses_an_unpinned_image_when_strict(tmp_path: Path) -> None:
    pytest.importorskip("netra.deploy.images")
    from netra.deploy import images

    prof = load_profile("dp8-throughput128")
    assert prof.image in images.load_lock()
    if prof.image not in images.unresolved():
        pytest.skip(f"image {prof.image} is pinned in this checkout")
    kw = {"profile_lock": locked(tmp_path, prof), "kernel_lock": tmp_path / "none.json"}
    strict = verify(prof, strict=True, **kw)
    assert any(f"image {prof.image!r}" in p and "unresolved" in p for p in strict.problems), strict.problems
    relaxed = verify(prof, strict=False, **kw)
    assert not any("image" in p for p in relaxed.problems)


def test_refuses_graph_buckets_that_do_not_cover_max_running_requests(tmp_path: Path) -> None:
    prof = load_profile("dp1-h200").replace("engine.cuda_graph_bs", [1, 2, 4, 8, 16, 32, 64])
    v = verify(prof, profile_lock=locked(tmp_path, prof), kernel_lock=tmp_path / "none.json")
    assert v.problems == ["graph buckets do not cover max running requests: engine.cuda_graph_bs tops out at 64 "
                          "but engine.max_running_requests is 128 (batches above 64 would leave the captured "
                          "graphs)"]
    ok = prof.replace("engine.max_running_requests", 64)
    assert verify(ok, profile_lock=locked(tmp_path, ok), kernel_lock=tmp_path / "none.json").problems == []


def test_refuses_a_profile_edited_after_its_lock(tmp_path: Path) -> None:
    prof = load_profile("local")
    lock = locked(tmp_path, prof)
    edited = prof.replace("engine.max_running_requests", 32)
    v = verify(edited, profile_lock=lock)
    assert len(v.problems) == 1 and v.problems[0].startswith("profile 'local' was edited after its lock")
    assert "netra plan --relock --profile local" in v.problems[0]
    # A --set override on the command line is not an edit: the lock is checked on the file's profile.
    assert verify(edited, base=prof, profile_lock=lock).problems == []
    # An unlocked profile is a warning, or a refusal when strict.
    empty = tmp_path / "empty.json"
    empty.write_text('{"version": 1, "profiles": {}}')
    assert verify(prof, profile_lock=empty).problems == []
    assert "not in the profile lock" in verify(prof, profile_lock=empty, strict=True).problems[0]


def test_relock_round_trip(tmp_path: Path) -> None:
    path = tmp_path / "lock.json"
    write_profile_lock(["local"], path)
    assert read_profile_lock(path) == {"local": load_profile("local").sha256()}
    write_profile_lock(None, path)
    assert set(read_profile_lock(path)) == {p.stem for p in PROFILE_DIR.glob("*.yaml")}


def test_refuses_a_checkpoint_that_is_not_the_pinned_one(tmp_path: Path) -> None:
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    (ckpt / "config.json").write_text('{"hidden_size": 2048}')
    good = hashlib.sha256(b'{"hidden_size": 2048}').hexdigest()
    prof = load_profile("local").replace("engine.model_path", str(ckpt))
    ok = prof.replace("checkpoint.config_sha256", good)
    assert verify(ok, profile_lock=locked(tmp_path, ok)).problems == []
    bad = prof.replace("checkpoint.config_sha256", "0" * 64)
    problems = verify(bad, profile_lock=locked(tmp_path, bad)).problems
    assert len(problems) == 1 and problems[0].startswith(f"checkpoint {ckpt}/config.json: sha256 ")


def test_option_audit_names_dropped_and_changed_options() -> None:
    w = make_plan(load_profile("local")).workers[0]
    info = {"version": "x", "nested": {k: v for k, v in w.engine_expect.items()}}
    assert audit_options(w, info) == []
    del info["nested"]["max_running_requests"]
    info["nested"]["stream_interval"] = 4
    problems = audit_options(w, info)
    assert problems == [
        "engine option max_running_requests did not reach worker 0: /server_info does not report it "
        "(the plan sets 16)",
        "engine option stream_interval did not reach worker 0: the plan sets 1, the worker runs with 4"]
    assert same_value([1, 2], (1, 2)) and same_value(0.8, 0.8000000000001) and not same_value(True, 1)


def test_code_object_audit_reads_the_memory_map(tmp_path: Path) -> None:
    w = make_plan(load_profile("local")).workers[0]
    blob = tmp_path / "k1.cubin"
    blob.write_bytes(b"\0" * 8192)
    other = {"path": str(tmp_path / "k2.cubin"), "sha256": "f" * 64, "family": "argmax", "name": "k2"}
    mine = {"path": str(blob), "sha256": "e" * 64, "family": "argmax", "name": "k1"}
    code = ("import mmap, sys, time\nf = open(sys.argv[1], 'rb')\nm = mmap.mmap(f.fileno(), 0, prot=mmap.PROT_READ)\n"
            "print('mapped', flush=True)\ntime.sleep(60)\n")
    proc = subprocess.Popen([sys.executable, "-c", code, str(blob)], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "mapped"
        assert audit_code_objects(w, proc.pid, {}, [mine]) == []
        problems = audit_code_objects(w, proc.pid, {}, [mine, other])
        assert len(problems) == 1 and problems[0].startswith(f"code object {other['path']} (argmax/k2) is neither")
        # A runtime that loads from memory reports the sha256 it loaded instead.
        assert audit_code_objects(w, proc.pid, {"code_objects": [{"sha256": "f" * 64}]}, [mine, other]) == []
    finally:
        proc.kill()
        proc.wait(10)


def test_proc_tree_finds_children(monkeypatch: pytest.MonkeyPatch) -> None:
    from netra.deploy import audit

    code = ("import subprocess, sys, time\n"
            "c = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'])\n"
            "print(c.pid, flush=True)\ntime.sleep(60)\n")
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    child = None
    try:
        assert proc.stdout is not None
        child = int(proc.stdout.readline())
        assert audit.proc_tree(proc.pid) == [proc.pid, child]
        # The same through /proc/*/stat, as on kernels without the children files.
        monkeypatch.setattr(audit, "Path", _NoChildren)
        assert sorted(audit.proc_tree(proc.pid)) == sorted([proc.pid, child])
    finally:
        proc.kill()
        proc.wait(10)
        if child is not None:
            os.kill(child, signal.SIGKILL)


class _NoChildren(type(Path())):  # type: ignore[misc]
    def exists(self, *args: object, **kwargs: object) -> bool:
        return False if self.name == "children" else super().exists()


def run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "netra", *args], capture_output=True, text=True, timeout=120,
                          cwd=REPO_ROOT)


def test_cli_refuses_fewer_gpus_than_dp() -> None:
    t0 = time.monotonic()
    out = run_cli("launch", "--profile", "dp2-h200", "--run-dir", "/nonexistent/never-created")
    assert out.returncode == 2, out.stdout + out.stderr
    assert "fewer GPUs than DP: the profile needs 2 nvidia GPUs, this machine has 0" in out.stderr
    assert not Path("/nonexistent/never-created").exists() and time.monotonic() - t0 < 60


def test_cli_refuses_an_edited_profile_and_names_every_cause(tmp_path: Path) -> None:
    data = yaml.safe_load((PROFILE_DIR / "local.yaml").read_text())
    data["engine"]["max_running_requests"] = 8
    edited = tmp_path / "local.yaml"
    edited.write_text(yaml.safe_dump(data))
    out = run_cli("launch", "--profile", str(edited), "--run-dir", str(tmp_path / "run"))
    assert out.returncode == 2
    assert "launch refused" in out.stderr and "profile 'local' was edited after its lock" in out.stderr
    assert not (tmp_path / "run" / "launch.json").exists()


def test_tactics_without_a_selectable_contract_refuse(tmp_path: Path) -> None:
    prof = load_profile("dp8-throughput128").replace("engine.tactics", ["argmax"])
    v = verify(prof, profile_lock=locked(tmp_path, prof), kernel_lock=kernel_lock(tmp_path, []),
               build_dir=tmp_path)
    assert ("engine.tactics enables argmax, but no gfx950 contract for op argmax can be selected "
            "(kernels/gfx950: none built and accepted)") in "\n".join(v.problems)
    sm90 = load_profile("dp8-h200-throughput128").replace("engine.tactics", ["argmax"])
    v = verify(sm90, profile_lock=locked(tmp_path, sm90), kernel_lock=kernel_lock(tmp_path, []), build_dir=tmp_path)
    assert not [p for p in v.problems if "engine.tactics" in p]
