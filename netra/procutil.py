"""Child-process helpers shared by everything that starts a Netra process for a test or a benchmark:
wait until its ``/health`` answers, and stop it bounded in time (terminate, then kill)."""

from __future__ import annotations

import subprocess
import time


def wait_healthy(url: str, proc: subprocess.Popen[str] | subprocess.Popen[bytes], deadline: float, error: str,
                 interval: float = 0.05) -> None:
    """Poll ``url/health`` until it answers 200; raise ``RuntimeError(error)`` if ``proc`` exits first or
    ``deadline`` (a ``time.monotonic()`` value) passes."""
    import httpx

    while True:
        try:
            if httpx.get(url + "/health", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        if proc.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(error)
        time.sleep(interval)


def terminate(proc: subprocess.Popen[str] | subprocess.Popen[bytes], timeout: float = 10.0) -> None:
    """SIGTERM, wait up to ``timeout`` s, then SIGKILL and wait again."""
    proc.terminate()
    try:
        proc.wait(timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout)
