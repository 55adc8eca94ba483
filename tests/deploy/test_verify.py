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
from netra.deploy.verify import Verification, read_profile_lock, verify, write_profile_lock
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


# --- the speculative drafter is part of the lock ------------------------------------------------------------

DFLASH = "dp8-h200-throughput128"


def drafter(tmp: Path, config: bytes = b'{"architectures": ["DFlashDraftModel"], "block_size": 12}') -> Path:
    path = tmp / "drafter"
    path.mkdir()
    (path / "config.json").write_bytes(config)
    return path


def drafter_problems(v: Verification) -> list[str]:
    return [p for p in v.problems if p.startswith("drafter ")]


def test_refuses_a_missing_drafter_naming_it(tmp_path: Path) -> None:
    pinned = hashlib.sha256(b"the locked drafter").hexdigest()
    prof = (load_profile(DFLASH).replace("engine.speculative.draft_config_sha256", pinned)
            .replace("engine.speculative.draft_model_path", str(tmp_path / "dflash")))
    for strict in (True, False):
        v = verify(prof, profile_lock=locked(tmp_path, prof), kernel_lock=tmp_path / "none.json", strict=strict)
        assert drafter_problems(v) == [
            f"drafter {tmp_path}/dflash (engine.speculative.draft_model_path): no checkpoint there (no such folder); "
            f"the profile pins config.json sha256 {pinned} (put the drafter there, or name another with "
            "--set engine.speculative.draft_model_path=DIR)"]
    # A folder without config.json is no drafter either.
    (tmp_path / "dflash").mkdir()
    v = verify(prof, profile_lock=locked(tmp_path, prof), kernel_lock=tmp_path / "none.json")
    assert len(drafter_problems(v)) == 1 and "(no config.json)" in drafter_problems(v)[0]


def test_refuses_a_drafter_whose_config_differs_naming_both_hashes(tmp_path: Path) -> None:
    path = drafter(tmp_path)
    good = hashlib.sha256((path / "config.json").read_bytes()).hexdigest()
    base = load_profile(DFLASH).replace("engine.speculative.draft_model_path", str(path))
    ok = base.replace("engine.speculative.draft_config_sha256", good)
    v = verify(ok, profile_lock=locked(tmp_path, ok), kernel_lock=tmp_path / "none.json")
    assert drafter_problems(v) == [] and not [w for w in v.warnings if w.startswith("drafter ")]
    assert v.drafter == {"path": str(path), "local": True, "config_sha256": good, "pinned_sha256": good,
                         "revision": None}
    assert v.to_dict()["drafter"] == v.drafter  # recorded in the launch record
    (path / "config.json").write_bytes(b'{"architectures": ["DFlashDraftModel"], "block_size": 16}')
    now = hashlib.sha256((path / "config.json").read_bytes()).hexdigest()
    v = verify(ok, profile_lock=locked(tmp_path, ok), kernel_lock=tmp_path / "none.json")
    assert len(drafter_problems(v)) == 1
    msg = drafter_problems(v)[0]
    assert msg.startswith(f"drafter {path}/config.json: config.json sha256 {now}, the profile pins {good} ")
    assert f"netra plan --relock --profile {DFLASH}" in msg
    # An unpinned local drafter: its hash is shown, a warning when strict (as the target checkpoint's).
    v = verify(base, profile_lock=locked(tmp_path, base), kernel_lock=tmp_path / "none.json")
    assert drafter_problems(v) == [] and any(f"sha256 {now}, not pinned" in w for w in v.warnings)


def test_drafter_identity_is_locked_and_set_cannot_re_pin_it(tmp_path: Path) -> None:
    path = drafter(tmp_path)
    good = hashlib.sha256((path / "config.json").read_bytes()).hexdigest()
    base = (load_profile(DFLASH).replace("engine.speculative.draft_model_path", str(path))
            .replace("engine.speculative.draft_config_sha256", good))
    lock = locked(tmp_path, base)
    # Pinning is an edit of the profile: its sha256 (the profile lock) changes with the drafter identity.
    assert base.sha256() != base.replace("engine.speculative.draft_config_sha256", "0" * 64).sha256()
    assert base.sha256() != base.replace("engine.speculative.draft_revision", "abc123").sha256()
    (tmp_path / "x").mkdir()
    other = drafter(tmp_path / "x", b'{"block_size": 8}')
    other_sha = hashlib.sha256(b'{"block_size": 8}').hexdigest()
    repinned = (base.replace("engine.speculative.draft_model_path", str(other))
                .replace("engine.speculative.draft_config_sha256", other_sha))
    v = verify(repinned, base=base, profile_lock=lock, kernel_lock=tmp_path / "none.json")
    assert [p for p in v.problems if "engine.speculative" in p] == [
        f"engine.speculative.draft_config_sha256: --set changes the locked drafter identity ({good} -> "
        f"{other_sha}); pin it in the profile and `netra plan --relock --profile {DFLASH}`"]
    # Another folder holding the locked drafter is fine; speculation off is fine.
    copy = tmp_path / "copy"
    copy.mkdir()
    (copy / "config.json").write_bytes((path / "config.json").read_bytes())
    moved = base.replace("engine.speculative.draft_model_path", str(copy))
    assert drafter_problems(verify(moved, base=base, profile_lock=lock, kernel_lock=tmp_path / "none.json")) == []
    off = base.replace("engine.speculative", None)
    assert not [p for p in verify(off, base=base, profile_lock=lock).problems
                if p.startswith(("drafter ", "engine.speculative"))]


def test_hub_drafter_is_treated_as_the_target_checkpoint(tmp_path: Path) -> None:
    from netra.deploy.verify import drafter_dir

    assert drafter_dir("z-lab/Qwen3.6-35B-A3B-DFlash") is None and drafter_dir("gpt2") is None
    assert drafter_dir("/models/dflash") == Path("/models/dflash") and drafter_dir("./d") == Path("d")
    assert drafter_dir("a/b/c") == Path("a/b/c") and drafter_dir(str(tmp_path)) == tmp_path
    prof = load_profile(DFLASH)  # the committed profile: a repo id, unreadable without network
    assert prof.engine.speculative is not None and prof.engine.speculative.draft_model_path == "z-lab/Qwen3.6-35B-A3B-DFlash"
    kw = {"profile_lock": locked(tmp_path, prof), "kernel_lock": tmp_path / "none.json"}
    strict = verify(prof, strict=True, **kw)
    assert drafter_problems(strict) == []
    assert "drafter z-lab/Qwen3.6-35B-A3B-DFlash: no engine.speculative.draft_config_sha256 in the profile, " \
           "identity unpinned" in strict.warnings
    assert "checkpoint Qwen/Qwen3.6-35B-A3B-FP8: no checkpoint.config_sha256 in the profile, identity unpinned" \
           in strict.warnings  # the target, the same way
    assert not [w for w in verify(prof, strict=False, **kw).warnings if w.startswith("drafter ")]
    pinned = prof.replace("engine.speculative.draft_config_sha256", "ab" * 32)
    v = verify(pinned, strict=True, profile_lock=locked(tmp_path, pinned), kernel_lock=tmp_path / "none.json")
    assert drafter_problems(v) == [] and any(w.startswith("drafter z-lab/Qwen3.6-35B-A3B-DFlash: a Hugging Face "
                                                          "repo id, not a local folder") for w in v.warnings)
    assert v.drafter is not None and v.drafter["local"] is False and v.drafter["config_sha256"] is None


def test_cli_launch_refuses_a_missing_drafter_naming_it(tmp_path: Path) -> None:
    missing = tmp_path / "no-drafter"
    out = run_cli("launch", "--profile", DFLASH, "--set", f"engine.speculative.draft_model_path={missing}",
                  "--run-dir", str(tmp_path / "run"))
    assert out.returncode == 2, out.stdout + out.stderr
    assert "launch refused" in out.stderr
    assert f"drafter {missing} (engine.speculative.draft_model_path): no checkpoint there (no such folder)" in out.stderr
    assert not (tmp_path / "run" / "launch.json").exists()
