from __future__ import annotations

import random
import shutil
import socket
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import openai
import pytest

from netra.deploy.record import is_alive, read_record
from netra.settings import REPO_ROOT

HERE = Path(__file__).resolve().parent
STANDIN = HERE / "standin.py"


def port_is_free(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def free_block(n: int) -> int:
    """A base port with n consecutive free ports after it (bound briefly to check; never fixed)."""
    rng = random.Random()
    for _ in range(200):
        base = rng.randrange(20000, 60000)
        if all(port_is_free(base + i) for i in range(n)):
            return base
    raise RuntimeError(f"no block of {n} free ports found")


@pytest.fixture
def python() -> str:
    return sys.executable


needs_nginx = pytest.mark.skipif(shutil.which("nginx") is None and not Path("/usr/sbin/nginx").exists(),
                                 reason="nginx is not installed (make nginx)")


# `netra launch --profile local` for real, once per test module that asks for `local` (detached,
# ports and run dir of its own), stopped and checked for leftovers at the end of the module.
MODEL = "netra-tiny"


@dataclass
class Local:
    run_dir: Path
    url: str

    def record(self) -> dict:
        return read_record(self.run_dir)

    def client(self) -> openai.OpenAI:
        # No SDK retries: a request that fails must show up as a failure here.
        return openai.OpenAI(base_url=self.url + "/v1", api_key="unused", max_retries=0, timeout=120)


def netra(*args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "netra", *args], capture_output=True, text=True,
                          timeout=timeout, cwd=REPO_ROOT)


@contextmanager
def launched(profile: str, tmp_path_factory: pytest.TempPathFactory, *extra: str) -> Iterator[Local]:
    """`netra launch --profile PROFILE --detach` on ports and a run dir of its own; stopped at the end, and
    checked for leftover processes."""
    # Ports are checked free, then bound by the launch a moment later; on a busy machine another
    # process can take one in between ("address already in use"): only that is retried, on new ports.
    for attempt in range(3):
        run_dir = tmp_path_factory.mktemp(profile)
        front = free_port()
        out = netra("launch", "--profile", profile, *extra, "--front-port", str(front), "--port-base",
                    str(free_block(4)), "--run-dir", str(run_dir), "--detach")
        if out.returncode == 0 or "address already in use" not in out.stdout + out.stderr or attempt == 2:
            break
    try:
        assert out.returncode == 0, out.stdout + out.stderr
        assert f"serving {profile} on http://127.0.0.1:{front}/v1" in out.stdout
        yield Local(run_dir, f"http://127.0.0.1:{front}")
    finally:
        rec = read_record(run_dir) if (run_dir / "launch.json").exists() else None
        stop = netra("stop", "--run-dir", str(run_dir), timeout=120)
        assert stop.returncode == 0, stop.stdout + stop.stderr
        if rec is not None:
            final = read_record(run_dir)
            pids = [(p["pid"], p["ticks"]) for w in final["workers"] for p in (w["engine"], w["serve"])]
            if final.get("front"):  # absent when the launch failed before nginx started
                pids.append((final["front"]["process"]["pid"], final["front"]["process"]["ticks"]))
            assert not [pid for pid, ticks in pids if is_alive(pid, ticks)]
            assert final["state"] == "stopped"


@pytest.fixture(scope="module")
def local(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Local]:
    with launched("local", tmp_path_factory) as served:
        yield served
