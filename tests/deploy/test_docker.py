"""`local-compose` on this machine's Docker engine: base, build, up, chat, audit, down, and refusals.

Marked `docker` (skipped, with the reason, where no engine answers; `.ci/run` starts one). The
module works on a private copy of the image lock (`NETRA_IMAGE_LOCK`), so the committed lock is
never rewritten: the base is the locked one when the engine holds it (else debootstrap makes one),
the image is rebuilt only when its context changed since the locked build (the layers below the
package come from the engine's cache), and the code objects are this checkout's `build/` when it
matches the kernel lock, else a build cached by the kernel lock's sha256 under $NETRA_CACHE_DIR.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
import yaml

from netra import settings
from netra.deploy import compose, containers
from netra.deploy import images as il
from netra.deploy.record import read_record
from netra.settings import REPO_ROOT
from tests.deploy.conftest import free_block, free_port

pytestmark = [pytest.mark.docker, pytest.mark.timeout(900)]
PROFILE = "local-compose"
IMAGE = "netra-engine-cpu"


@dataclass
class Env:
    lock: Path
    build_dir: Path
    image_id: str
    env: dict[str, str]

    def netra(self, *args: str, timeout: float = 600, **extra: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "netra", *args], capture_output=True, text=True,
                              timeout=timeout, cwd=REPO_ROOT, env={**self.env, **extra})


def _code_objects() -> Path:
    """A build dir whose code objects match the kernel lock (needs nvcc when none exists yet)."""
    from netra.build import build_all, verify_lock

    here = Path(settings.get("NETRA_BUILD_DIR"))
    if not verify_lock(here):
        return here
    key = hashlib.sha256((REPO_ROOT / "kernels" / "lock.json").read_bytes()).hexdigest()[:16]
    cached = Path(settings.get("NETRA_CACHE_DIR")) / f"build-{key}"
    if verify_lock(cached):
        if shutil.which("nvcc") is None:
            pytest.skip("no code objects match kernels/lock.json and nvcc is not installed to build them")
        shutil.rmtree(cached, ignore_errors=True)
        build_all(cached)
    assert verify_lock(cached) == []
    return cached


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Env]:
    from netra.deploy import imagebuild

    lock = tmp_path_factory.mktemp("lock") / "lock.json"
    shutil.copy(il.LOCK_PATH, lock)
    build_dir = _code_objects()
    saved = {k: os.environ.get(k) for k in ("NETRA_IMAGE_LOCK", "NETRA_BUILD_DIR")}
    os.environ.update(NETRA_IMAGE_LOCK=str(lock), NETRA_BUILD_DIR=str(build_dir))
    try:
        imagebuild.make_base(path=lock)
        entry = imagebuild.build(IMAGE, path=lock, build_dir=build_dir)
        assert entry.built_id is not None
        yield Env(lock, build_dir, entry.built_id, dict(os.environ))
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def _lock_with(env: Env, tmp: Path, **built: Any) -> Path:
    """A copy of the test lock with the image's `built` record changed (None: not built)."""
    data = json.loads(env.lock.read_text())
    entry = data["images"][IMAGE]
    entry["built"] = None if built.get("none") else {**entry["built"], **built}
    out = tmp / "lock.json"
    out.write_text(json.dumps(data))
    return out


def _project_containers(project: str) -> list[str]:
    out = subprocess.run(["docker", "ps", "-a", "-q", "--filter", f"label=com.docker.compose.project={project}"],
                         capture_output=True, text=True, check=True)
    return out.stdout.split()


def _ports() -> list[str]:
    return ["--front-port", str(free_port()), "--port-base", str(free_block(4))]


# --- the image --------------------------------------------------------------------------------------


def test_image_is_recorded_on_the_locked_base(env: Env) -> None:
    import docker

    entry = il.load_lock(env.lock)[IMAGE]
    assert entry.built is not None and entry.built["id"] == env.image_id
    c = docker.from_env(version="auto")
    img, base = c.images.get(env.image_id), c.images.get(entry.digest)
    assert base.id == entry.digest == il.read_lock(env.lock).bases[entry.base or ""].id
    # Built FROM the locked base: its layers are the image's first layers.
    assert img.attrs["RootFS"]["Layers"][: len(base.attrs["RootFS"]["Layers"])] == base.attrs["RootFS"]["Layers"]
    assert entry.built["base_id"] == base.id and entry.built["dockerfile_sha256"] == entry.dockerfile_sha256
    assert img.attrs["Config"]["Labels"]["org.netra.image"] == IMAGE
    # The CPU torch wheel, never the CUDA build, and the code objects as locked.
    out = c.containers.run(env.image_id, ["python", "-c", "import torch; print(torch.__version__, torch.version.cuda)"],
                           remove=True, network_mode="none").decode()
    assert out.split()[-2:] == ["2.13.0+cpu", "None"]


def test_build_refuses_code_objects_that_differ_from_the_kernel_lock(env: Env, tmp_path: Path) -> None:
    from netra.deploy.imagebuild import ImageBuildError, build

    bad = tmp_path / "build"
    shutil.copytree(env.build_dir, bad)
    victim = next(p for p in sorted(bad.rglob("*.cubin")))
    victim.write_bytes(victim.read_bytes() + b"\0")
    with pytest.raises(ImageBuildError, match=rf"(?s)refusing to build {IMAGE}.*{victim.name}.*differs"):
        build(IMAGE, path=env.lock, build_dir=bad)


# --- up, chat, audit, down -----------------------------------------------------------------------------


def test_launch_serves_a_streamed_chat_audits_and_stops(env: Env, tmp_path: Path) -> None:
    ports = _ports()
    front = int(ports[1])
    run_dir = tmp_path / "run"
    out = env.netra("launch", "--profile", PROFILE, *ports, "--run-dir", str(run_dir))
    assert out.returncode == 0, out.stdout + out.stderr
    rec = read_record(run_dir)
    project = rec["compose"]["project"]
    try:
        assert rec["mode"] == "compose" and rec["state"] == "serving"
        assert rec["image"]["id"] == env.image_id
        assert len(_project_containers(project)) == 5  # 2 engines, 2 response layers, nginx
        doc = yaml.safe_load(Path(rec["compose"]["file"]).read_text())
        assert {s["image"] for s in doc["services"].values()} == {env.image_id}  # by ID, never by tag
        for w in rec["workers"]:
            assert w["audit"] == []
            for role in ("engine", "serve"):
                proc = w[role]
                assert proc["image"] == env.image_id and proc["cpus"] == w["cpus"]
                # The record's host PID is the container's service process: its command line is the plan's.
                cmdline = Path(f"/proc/{proc['pid']}/cmdline").read_bytes().split(b"\0")[:-1]
                assert [a.decode() for a in cmdline] == proc["argv"]
                assert proc["argv"][:3] == [containers.IMAGE_PYTHON, "-m", "netra"]
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{front}/v1", api_key="unused", max_retries=0, timeout=120)
        pieces = [chunk.choices[0].delta.content or "" for chunk in client.chat.completions.create(
            model="netra-tiny", messages=[{"role": "user", "content": "Hello"}], max_tokens=12, temperature=0,
            stream=True) if chunk.choices]
        assert sum(1 for p in pieces if p) >= 2 and "".join(pieces)
        st = env.netra("status", "--run-dir", str(run_dir))
        assert st.returncode == 0, st.stdout + st.stderr
    finally:
        stopped = env.netra("stop", "--run-dir", str(run_dir))
    assert stopped.returncode == 0, stopped.stdout + stopped.stderr
    assert _project_containers(project) == []
    with pytest.raises(httpx.HTTPError):
        httpx.get(f"http://127.0.0.1:{front}/health", timeout=2)


def test_plain_docker_compose_up_serves_and_down_leaves_nothing(env: Env, tmp_path: Path) -> None:
    """The operator's path without the launcher: the rendered file's dependency chain brings up the
    engines, then the response layers, then nginx; `down` removes every container."""
    ports = _ports()
    front = int(ports[1])
    path = tmp_path / "compose.yaml"
    _render(env, path, ports)
    project = containers.project_name(PROFILE, tmp_path)
    binary = str(compose.compose_binary())
    try:
        up = subprocess.run([binary, "-p", project, "-f", str(path), "up", "-d", "--wait"], capture_output=True,
                            text=True, timeout=600)
        assert up.returncode == 0, up.stderr
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{front}/v1", api_key="unused", max_retries=0, timeout=120)
        reply = client.chat.completions.create(model="netra-tiny", messages=[{"role": "user", "content": "Hi"}],
                                               max_tokens=8, temperature=0)
        assert reply.usage is not None and reply.usage.completion_tokens == 8
        assert len(_project_containers(project)) == 5
        # No nginx process of the front runs as root: the master too was started as www-data.
        ids = subprocess.run(["docker", "ps", "-q", "--filter", f"label=com.docker.compose.project={project}",
                              "--filter", "label=com.docker.compose.service=front"],
                             capture_output=True, text=True, check=True).stdout.split()
        assert len(ids) == 1, ids
        top = subprocess.run(["docker", "top", ids[0]], capture_output=True, text=True, check=True).stdout
        lines = top.splitlines()  # UID PID PPID C STIME TTY TIME CMD (the host resolves the uid)
        nginx = [(line.split()[0], line) for line in lines[1:] if " nginx: " in line]  # the processes, not init
        assert any("master process" in line for _, line in nginx) and len(nginx) >= 2, top
        assert all(uid in ("www-data", "33") for uid, _ in nginx), top
    finally:
        down = subprocess.run([binary, "-p", project, "-f", str(path), "down", "--volumes"], capture_output=True,
                              text=True, timeout=300)
    assert down.returncode == 0, down.stderr
    assert _project_containers(project) == []


# --- refusals ---------------------------------------------------------------------------------------------


def test_an_image_id_that_differs_from_the_lock_is_refused(env: Env, tmp_path: Path) -> None:
    base_id = il.load_lock(env.lock)[IMAGE].digest  # a real image the engine holds, not the one the tag names
    lock = _lock_with(env, tmp_path, id=base_id)
    out = env.netra("launch", "--profile", PROFILE, *_ports(), "--run-dir", str(tmp_path / "run"),
                    NETRA_IMAGE_LOCK=str(lock))
    assert out.returncode == 2, out.stdout + out.stderr
    assert f"image '{IMAGE}': the engine's netra/engine-cpu:0.1.0 is {env.image_id}, the image lock records " \
           f"{base_id}" in out.stdout + out.stderr


@pytest.mark.parametrize("how", ["not built", "missing"])
def test_a_missing_image_names_the_build_command(env: Env, tmp_path: Path, how: str) -> None:
    lock = (_lock_with(env, tmp_path, none=True) if how == "not built"
            else _lock_with(env, tmp_path, id="sha256:" + "0" * 64))
    out = env.netra("launch", "--profile", PROFILE, *_ports(), "--run-dir", str(tmp_path / "run"),
                    NETRA_IMAGE_LOCK=str(lock))
    text = out.stdout + out.stderr
    assert out.returncode == 2, text
    assert "netra images base debian-bookworm-minbase && netra images build netra-engine-cpu" in text
    assert ("is not built" if how == "not built" else "is missing from this Docker engine") in text


def _render(env: Env, path: Path, ports: list[str]) -> None:
    out = env.netra("compose", "--profile", PROFILE, *ports, "-o", str(path))
    assert out.returncode == 0, out.stderr


@pytest.mark.parametrize("edit", ["service", "profile hash"])
def test_a_compose_file_edited_after_rendering_is_refused(env: Env, tmp_path: Path, edit: str) -> None:
    ports = _ports()
    path = tmp_path / "compose.yaml"
    _render(env, path, ports)
    doc = yaml.safe_load(path.read_text())
    if edit == "service":
        doc["services"]["worker0"]["environment"]["OMP_NUM_THREADS"] = "2"
        named = "services.worker0"
    else:
        doc["x-netra"]["profile_sha256"] = "0" * 64
        named = "profile hash mismatch"
    path.write_text(yaml.safe_dump(compose._escape(doc), sort_keys=False))
    compose.validate(path)  # still a valid compose file: only the launcher's check can tell
    out = env.netra("launch", "--profile", PROFILE, *ports, "--run-dir", str(tmp_path / "run"),
                    "--compose-file", str(path))
    assert out.returncode == 2, out.stdout + out.stderr
    assert f"compose file {path}" in out.stdout and named in out.stdout


def test_a_tampered_code_object_stops_its_worker_and_the_front_never_opens(env: Env, tmp_path: Path) -> None:
    ports = _ports()
    front = int(ports[1])
    run_dir = tmp_path / "run"
    path = tmp_path / "compose.yaml"
    _render(env, path, ports)
    project = containers.project_name(PROFILE, run_dir)
    binary = str(compose.compose_binary())
    subprocess.run([binary, "-p", project, "-f", str(path), "create"], check=True, capture_output=True)
    try:
        # After the build, in worker 0's own container: one byte of one code object changes.
        kernel_lock = json.loads((REPO_ROOT / "kernels" / "lock.json").read_text())
        victim = kernel_lock["code_objects"][0]
        tampered = tmp_path / "tampered.cubin"
        tampered.write_bytes((env.build_dir / victim["code_object"]).read_bytes() + b"\0")
        worker0 = f"{project}-worker0-1"
        subprocess.run(["docker", "cp", str(tampered), f"{worker0}:{containers.IMAGE_BUILD_DIR}/"
                        f"{victim['code_object']}"], check=True, capture_output=True)
        out = env.netra("launch", "--profile", PROFILE, *ports, "--run-dir", str(run_dir), "--compose-file",
                        str(path))
        text = out.stdout + out.stderr
        assert out.returncode == 1, text
        assert f"container {worker0} (worker0) exited" in text
        assert "refusing to start" in text and victim["name"] in text and "sha256" in text
        rec = read_record(run_dir)
        # `compose create` made every container; the front's was never started.
        assert rec["state"] == "failed" and rec["front"]["container"]["status"] == "created"
        assert rec["workers"][1]["serve"]["status"] == "created"
        with pytest.raises(httpx.HTTPError):
            httpx.get(f"http://127.0.0.1:{front}/health", timeout=2)
    finally:
        subprocess.run([binary, "-p", project, "-f", str(path), "down", "--volumes"], capture_output=True)
    assert _project_containers(project) == []
