from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager

import httpx
import pytest
import torch

torch.set_num_threads(1)


@contextmanager
def engine_process(*extra: str, startup_timeout: float = 90.0) -> Iterator[str]:
    """Run `netra engine --preset tiny --port 0` as a real process; yields its base URL; always stops it."""
    cmd = [sys.executable, "-m", "netra", "engine", "--preset", "tiny", "--host", "127.0.0.1", "--port", "0", *extra]
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    try:
        base = None
        deadline = time.monotonic() + startup_timeout
        lines = []
        assert proc.stdout is not None
        while time.monotonic() < deadline:
            line = proc.stdout.readline()
            if not line:
                break
            lines.append(line)
            if "listening on " in line:
                base = line.split("listening on ")[1].split()[0]
                break
        if base is None:
            raise RuntimeError("engine did not start:\n" + "".join(lines))
        # drain the rest of the output in the background so the pipe never fills
        import threading
        threading.Thread(target=lambda: [None for _ in proc.stdout], daemon=True).start()  # type: ignore[union-attr]
        for _ in range(100):
            try:
                if httpx.get(base + "/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.1)
        yield base
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)


@pytest.fixture(scope="session")
def engine_url() -> Iterator[str]:
    with engine_process("--max-running-requests", "64", "--context-length", "1024") as base:
        yield base


@pytest.fixture(scope="session")
def incremental_url() -> Iterator[str]:
    with engine_process("--incremental-streaming-output", "--stream-interval", "3", "--context-length", "1024") as base:
        yield base
