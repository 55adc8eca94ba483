"""Liveness probes and the restart budget of a launch's supervisor.

A probe is a `GET` with a deadline, run on a small thread pool so that the supervisor's loop never
waits on it: `Probes.poll()` starts a probe when one is due and reads back the ones that finished.
What counts as alive is `netra.serve.watch.judge_health` (the response layer uses the same rule):
`/health` answered 200 within the deadline, and a busy engine has completed a scheduler step
within `stall_s`. A response layer is probed at its own `/health`, and any answer within the
deadline counts (its 503 says its engine is down, which the engine's own probe judges).

`RestartBudget` is systemd's StartLimitBurst / StartLimitIntervalSec: at most `max_restarts`
restarts within any `window_s` seconds; one more death inside the window gives the process up.
"""

from __future__ import annotations

import time
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from netra.serve.watch import judge_health


@dataclass(frozen=True)
class ProbePolicy:
    interval_s: float
    timeout_s: float
    misses: int  # consecutive misses that make a process unresponsive
    stall_s: float  # a busy engine with no step completed for this long is not alive
    recover_s: float  # out of rotation this long without recovering: restarted

    @classmethod
    def from_plan(cls, sup: dict[str, Any]) -> ProbePolicy:
        return cls(float(sup["probe_interval_s"]), float(sup["probe_timeout_s"]), int(sup["probe_misses"]),
                   float(sup["stall_s"]), float(sup["recover_s"]))


def probe(url: str, timeout_s: float, stall_s: float, any_answer: bool) -> tuple[bool, str]:
    """(alive, why) of one GET `url` with a deadline of `timeout_s` seconds."""
    import httpx

    try:
        r = httpx.get(url, timeout=timeout_s)
    except httpx.TimeoutException:
        return False, f"no answer within {timeout_s:g} s"
    except httpx.HTTPError as exc:
        return False, f"{type(exc).__name__}"
    if any_answer:
        return True, f"answered {r.status_code}"
    return judge_health(r.status_code, r.content, stall_s)


@dataclass
class ProbeState:
    misses: int = 0
    why: str = "not probed yet"
    next_at: float = 0.0
    pending: Future[tuple[bool, str]] | None = None
    answered: int = 0  # probes answered since the last reset (a restarted process starts over)


@dataclass
class Probes:
    policy: ProbePolicy
    pool: ThreadPoolExecutor = field(default_factory=lambda: ThreadPoolExecutor(8, thread_name_prefix="probe"))
    states: dict[str, ProbeState] = field(default_factory=dict)

    def poll(self, key: str, url: str, now: float, any_answer: bool = False) -> ProbeState:
        """Collect a finished probe of `key`, start one when due; returns the probe state."""
        st = self.states.setdefault(key, ProbeState())
        if st.pending is not None and st.pending.done():
            ok, why = st.pending.result()
            st.pending = None
            st.misses = 0 if ok else st.misses + 1
            st.why = why
            st.answered += 1
        if st.pending is None and now >= st.next_at:
            st.next_at = now + self.policy.interval_s
            st.pending = self.pool.submit(probe, url, self.policy.timeout_s, self.policy.stall_s, any_answer)
        return st

    def reset(self, key: str) -> None:
        """Forget `key`'s history (its process was restarted); a probe in flight is discarded."""
        self.states.pop(key, None)

    def close(self) -> None:
        self.pool.shutdown(wait=False, cancel_futures=True)


@dataclass
class RestartBudget:
    max_restarts: int
    window_s: float
    times: deque[float] = field(default_factory=deque)

    def _prune(self, now: float) -> None:
        while self.times and now - self.times[0] > self.window_s:
            self.times.popleft()

    def allows(self, now: float) -> bool:
        self._prune(now)
        return len(self.times) < self.max_restarts

    def use(self, now: float) -> None:
        self._prune(now)
        self.times.append(now)

    def in_window(self, now: float | None = None) -> int:
        self._prune(time.monotonic() if now is None else now)
        return len(self.times)

    def to_record(self) -> dict[str, Any]:
        return {"max_restarts": self.max_restarts, "window_s": self.window_s, "in_window": self.in_window()}
