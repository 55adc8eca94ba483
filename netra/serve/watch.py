"""Liveness of a worker as this project defines it (the response layer and the supervisor share it).

A worker is **alive** when its `GET /health` answers 200 within the probe deadline and, if it
reports its scheduler's progress (the embedded engine does: `busy`, `step_age_s`), it is either
idle or has completed a step within `stall_s` seconds. A busy worker making step progress is
alive however slow its steps are; a worker whose event loop answers while its scheduler is stuck
inside one step for longer than `stall_s` is not. A probe that fails either test is a miss;
`misses` consecutive misses make the worker **unresponsive**.

`EngineWatch` runs that probe in the response layer every `interval_s` seconds. While the worker
is unresponsive, new requests get 503 at once and requests that have sent nothing to their client
yet are failed with 503 (nginx passes both to another worker); streams already under way keep
waiting (the supervisor restarts a worker that does not recover, which ends them with an error).
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import TYPE_CHECKING, Any

import orjson

if TYPE_CHECKING:
    from netra.serve.upstream import Upstream

log = logging.getLogger("netra.serve.watch")


def judge_health(status: int, body: bytes, stall_s: float) -> tuple[bool, str]:
    """(alive, why) for one answered `/health` probe."""
    if status != 200:
        return False, f"/health returned HTTP {status}"
    try:
        info = orjson.loads(body) if body else None
    except orjson.JSONDecodeError:
        info = None
    age = info.get("step_age_s") if isinstance(info, dict) and info.get("busy") else None
    if isinstance(age, int | float) and age > stall_s:
        return False, f"busy with no scheduler step completed for {age:.1f} s (> {stall_s:g} s)"
    return True, "ok"


class EngineWatch:
    def __init__(self, upstream: Upstream, interval_s: float, timeout_s: float, misses: int,
                 stall_s: float) -> None:
        self.upstream = upstream
        self.interval_s = interval_s
        self.timeout_s = timeout_s
        self.misses_allowed = misses
        self.stall_s = stall_s
        self.misses = 0
        self.why = "not probed yet"
        self.last_ok: float | None = None
        self.checked_at: float | None = None  # when the latest probe ended
        self.alive = False  # its verdict
        self._lost = asyncio.Event()  # set while unresponsive; requests wait on it beside their work
        self._task: asyncio.Task[None] | None = None

    @property
    def unresponsive(self) -> bool:
        return self._lost.is_set()

    def lost(self) -> asyncio.Event:
        return self._lost

    async def probe(self) -> tuple[bool, str]:
        return await self.probe_within(self.timeout_s)

    async def probe_within(self, timeout_s: float) -> tuple[bool, str]:
        answered, why, status, body = await self.upstream.probe_health(timeout_s)
        if not answered:
            return False, why
        return judge_health(status, body, self.stall_s)

    def fresh(self) -> bool:
        """Whether the latest probe is recent enough to answer for the worker (two intervals)."""
        return self.checked_at is not None and time.monotonic() - self.checked_at <= 2 * self.interval_s

    def record(self, ok: bool, why: str) -> None:
        self.checked_at, self.alive = time.monotonic(), ok
        if ok:
            self.last_ok = time.monotonic()
            if self._lost.is_set():
                log.warning("worker answers again; taking requests")
            self.misses, self.why = 0, "ok"
            self._lost.clear()
            return
        self.misses += 1
        self.why = why
        if self.misses >= self.misses_allowed and not self._lost.is_set():
            log.warning("worker unresponsive after %d missed probes (%s): refusing new requests with 503",
                        self.misses, why)
            self._lost.set()

    async def run(self) -> None:
        while True:
            started = time.monotonic()
            try:
                ok, why = await self.probe()
            except Exception as exc:  # a probe must never end the watch
                ok, why = False, f"probe failed: {type(exc).__name__}"
            self.record(ok, why)
            await asyncio.sleep(max(0.0, self.interval_s - (time.monotonic() - started)))

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self.run())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass
            self._task = None

    def status(self) -> dict[str, Any]:
        return {"unresponsive": self.unresponsive, "misses": self.misses, "why": self.why}
