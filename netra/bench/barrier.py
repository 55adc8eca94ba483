"""Filesystem barrier: every client process announces readiness, then all start at one instant.

Layout of the barrier directory: ``ready-<k>`` written by client k once its requests are prepared
and its connections are open; ``release`` written (atomically, by rename) by the parent once all K
ready files exist. The release file holds a start instant on ``CLOCK_MONOTONIC`` slightly in the
future, so that clients, which poll for the file, all begin at the same instant rather than at
their (staggered) poll wake-ups. ``CLOCK_MONOTONIC`` is system-wide on Linux, so instants taken in
different processes are comparable; all benchmark timestamps use it.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path

RELEASE = "release"
# How far ahead of the release write the common start is placed: long enough for every polling
# client to see the file (they poll every POLL_S) on a loaded 2-core machine.
RELEASE_LEAD_S = 0.25
POLL_S = 0.002


class BarrierError(RuntimeError):
    pass


def now() -> float:
    """Seconds on the system-wide monotonic clock (comparable across processes on one host)."""
    return time.clock_gettime(time.CLOCK_MONOTONIC)


def _atomic_write(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def announce_ready(directory: Path, client: int) -> None:
    _atomic_write(directory / f"ready-{client}", f"{os.getpid()}\n")


def wait_release(directory: Path, timeout_s: float) -> float:
    """Block until the parent releases the barrier; return the common start instant (after waiting for it)."""
    deadline = now() + timeout_s
    path = directory / RELEASE
    while not path.exists():
        if now() > deadline:
            raise BarrierError(f"barrier {directory}: no release within {timeout_s:.0f} s")
        time.sleep(POLL_S)
    start = float(path.read_text().strip())
    # Sleep most of the way, then spin the last millisecond for a tight common start.
    remaining = start - now()
    if remaining > 0.002:
        time.sleep(remaining - 0.002)
    while now() < start:
        pass
    return start


def ready_clients(directory: Path, clients: int) -> list[int]:
    return [k for k in range(clients) if (directory / f"ready-{k}").exists()]


def release_when_ready(directory: Path, clients: int, timeout_s: float,
                       alive: Callable[[], str | None] | None = None,
                       on_ready: Callable[[], None] | None = None) -> float:
    """Wait for all ``clients`` ready files, then write the release; returns the start instant.

    ``alive`` is polled while waiting: it returns an error message when a client died, which
    aborts the wait with that message instead of waiting out the timeout. ``on_ready`` runs once
    every client is ready, just before the release (nothing is in flight then).
    """
    deadline = now() + timeout_s
    while len(ready_clients(directory, clients)) < clients:
        if alive is not None:
            problem = alive()
            if problem:
                raise BarrierError(problem)
        if now() > deadline:
            missing = sorted(set(range(clients)) - set(ready_clients(directory, clients)))
            raise BarrierError(f"barrier {directory}: clients {missing} not ready within {timeout_s:.0f} s")
        time.sleep(0.01)
    if on_ready is not None:
        on_ready()
    start = now() + RELEASE_LEAD_S
    _atomic_write(directory / RELEASE, f"{start!r}\n")
    return start
