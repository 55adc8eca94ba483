from __future__ import annotations

import random
import shutil
import socket
import sys
from pathlib import Path

import pytest

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
