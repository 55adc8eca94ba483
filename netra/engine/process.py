"""Run `netra engine` as a child process (tests, the benchmark, anyone who needs a real worker).

``--port 0`` lets the engine bind a free port itself; it prints ``listening on http://HOST:PORT``,
which is read back here, so there is no race between picking a port and binding it. The process is
always stopped on exit (terminate, then kill), bounded in time.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

from netra.procutil import terminate, wait_healthy


@contextmanager
def engine_process(*args: str, startup_timeout: float = 120.0, log_path: str | None = None) -> Iterator[str]:
    """Start ``python -m netra engine --host 127.0.0.1 --port 0 ARGS``; yield its base URL once /health is 200."""
    cmd = [sys.executable, "-m", "netra", "engine", "--host", "127.0.0.1", "--port", "0", *args]
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    log = open(log_path, "a") if log_path else None  # noqa: SIM115 (closed in finally)
    try:
        assert proc.stdout is not None
        out = proc.stdout
        lines: list[str] = []
        base: str | None = None
        found = threading.Event()

        def pump() -> None:  # read every line so the pipe never fills; spot the address line
            nonlocal base
            for line in out:
                if log is not None:
                    log.write(line)
                if base is None:
                    lines.append(line)
                    if "listening on " in line:
                        base = line.split("listening on ")[1].split()[0]
                        found.set()
            found.set()

        threading.Thread(target=pump, daemon=True).start()
        found.wait(startup_timeout)
        if base is None:
            raise RuntimeError(f"netra engine did not start ({' '.join(cmd)}):\n" + "".join(lines[-30:]))
        wait_healthy(base, proc, time.monotonic() + 30, "netra engine printed its address but /health never answered")
        yield base
    finally:
        terminate(proc, 10)
        if log is not None:
            log.close()
