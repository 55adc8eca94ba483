"""Processes of a launch and the supervisor loop that keeps workers alive.

`Proc` starts one process (engine, response layer or nginx) with its CPU set, memory node, log file
and a parent-death signal, so nothing outlives a launcher killed with SIGKILL.

`Supervisor.step()` is called a few times a second by the launcher. A worker whose engine or
response layer died is restarted after a doubling backoff, health-checked, audited again, and is
back in rotation. Meanwhile nginx routes around it by itself: a refused connection, or the 502/503
its response layer answers while the engine is gone, passes the request to the next worker
(`proxy_next_upstream`) and marks the server failed for `fail_timeout` (passive health). The config
is not reloaded for a crash, because a reload closes every client's idle keepalive connection, and
a client that was just reusing one sees a disconnect. A process that is alive but does not answer
(stopped, wedged) sends no error for nginx to notice: liveness probes find it, and the worker is
taken out of rotation (one reload), then restarted if it does not recover (netra/deploy/liveness.py).
Every restart is recorded; more than `max_restarts` within `restart_window_s` gives the worker up:
it is marked `down` for good and the launch keeps serving on the others; it stops only when no
worker is left.
"""

from __future__ import annotations

import ctypes
import os
import platform
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from netra.deploy.liveness import ProbePolicy, Probes, RestartBudget
from netra.deploy.record import now_utc, proc_start_ticks

PR_SET_PDEATHSIG = 1
MPOL_BIND = 2
_SYS_SET_MEMPOLICY = {"x86_64": 238, "aarch64": 237}
_MAX_NODES = 1024


def resolve_argv(argv: list[str] | tuple[str, ...]) -> list[str]:
    """Plans spell Netra's own commands as `netra VERB ...`; run them with this interpreter."""
    out = list(argv)
    if out and out[0] == "netra":
        return [sys.executable, "-m", "netra", *out[1:]]
    return out


def _bind_memory(node: int) -> None:
    number = _SYS_SET_MEMPOLICY.get(platform.machine())
    if number is None:
        raise OSError(f"memory binding is not implemented on {platform.machine()}")
    mask = (ctypes.c_ulong * (_MAX_NODES // (8 * ctypes.sizeof(ctypes.c_ulong))))()
    bits = 8 * ctypes.sizeof(ctypes.c_ulong)
    mask[node // bits] |= 1 << (node % bits)
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.syscall(number, MPOL_BIND, ctypes.byref(mask), _MAX_NODES + 1) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"set_mempolicy(MPOL_BIND, node {node}): {os.strerror(err)}")


def _preexec(cpus: tuple[int, ...], mem_node: int | None, parent: int) -> Callable[[], None]:
    def setup() -> None:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
        if os.getppid() != parent:  # the launcher died between fork and prctl
            os._exit(1)
        if cpus:
            os.sched_setaffinity(0, cpus)
        if mem_node is not None:
            _bind_memory(mem_node)

    return setup


@dataclass
class Proc:
    """One supervised process. `argv` is as planned; `exec_argv` as executed."""

    role: str  # engine | serve | nginx
    index: int | None
    argv: list[str]
    env: dict[str, str]
    log: Path
    cpus: tuple[int, ...] = ()
    mem_node: int | None = None
    popen: subprocess.Popen[bytes] | None = None
    ticks: int | None = None
    started_at: str | None = None
    exec_argv: list[str] = field(default_factory=list)
    exit_reported: bool = False

    def spawn(self) -> None:
        self.exec_argv = resolve_argv(self.argv)
        self.exit_reported = False
        self.log.parent.mkdir(parents=True, exist_ok=True)
        with self.log.open("ab") as out:
            out.write(f"\n=== {now_utc()} start {' '.join(self.exec_argv)}\n".encode())
            out.flush()
            try:
                self.popen = subprocess.Popen(
                    self.exec_argv, env={**os.environ, **self.env}, stdin=subprocess.DEVNULL, stdout=out,
                    stderr=subprocess.STDOUT, start_new_session=True,  # Ctrl-C reaches the launcher only
                    preexec_fn=_preexec(self.cpus, self.mem_node, os.getpid()))
            except subprocess.SubprocessError as exc:
                # Python reports only "Exception occurred in preexec_fn": name what it was doing.
                raise OSError(f"cannot start {self.role} {self.index}: setting CPU affinity "
                              f"{list(self.cpus)} or binding memory to NUMA node {self.mem_node} failed in the "
                              f"child ({exc}); set_mempolicy may be forbidden here (container seccomp)") from exc
        self.ticks = proc_start_ticks(self.popen.pid)
        self.started_at = now_utc()

    @property
    def pid(self) -> int | None:
        return self.popen.pid if self.popen else None

    def alive(self) -> bool:
        return self.popen is not None and self.popen.poll() is None

    def exit_code(self) -> int | None:
        return self.popen.poll() if self.popen else None

    def send(self, sig: int) -> None:
        if self.alive():
            assert self.popen is not None
            try:
                self.popen.send_signal(sig)
            except ProcessLookupError:
                pass

    def stop(self, timeout: float = 10.0, sig: int = signal.SIGTERM) -> None:
        """SIGTERM (or `sig`), then SIGKILL after `timeout`; always reaps the process and its group."""
        if self.popen is None:
            return
        if self.popen.poll() is None:
            self.send(sig)
            try:
                self.popen.wait(timeout)
            except subprocess.TimeoutExpired:
                self.popen.kill()
                self.popen.wait(10)
        self.kill_group()

    def kill_group(self) -> None:
        """SIGKILL what is left of the process's group once the leader is gone: nginx workers of a
        killed master, SGLang's scheduler of a killed server (it would hold the GPU's memory)."""
        if self.popen is None or self.popen.poll() is None:
            return
        try:
            os.killpg(self.popen.pid, signal.SIGKILL)  # start_new_session: the group id is its pid
        except (ProcessLookupError, PermissionError):
            pass

    def to_record(self) -> dict[str, Any]:
        return {"pid": self.pid, "ticks": self.ticks, "start_time": self.started_at, "argv": self.exec_argv,
                "env": self.env, "log": str(self.log), "cpus": list(self.cpus), "mem_node": self.mem_node,
                "exit_code": self.exit_code()}


def healthy(url: str, timeout: float = 1.0) -> bool:
    import httpx

    try:
        return httpx.get(url, timeout=timeout).status_code == 200
    except httpx.HTTPError:
        return False


def log_tail(path: Path, lines: int = 15) -> str:
    try:
        text = path.read_text(errors="replace").splitlines()
    except OSError:
        return "(no log)"
    return "\n".join(text[-lines:])


@dataclass(frozen=True)
class RestartPolicy:
    max_restarts: int  # restarts allowed within any window_s seconds; one more gives the worker up
    window_s: float
    backoff_initial_s: float
    backoff_max_s: float
    health_timeout_s: float

    @classmethod
    def from_plan(cls, sup: dict[str, Any]) -> RestartPolicy:
        return cls(int(sup["max_restarts"]), float(sup["restart_window_s"]), float(sup["backoff_initial_s"]),
                   float(sup["backoff_max_s"]), float(sup["health_timeout_s"]))


@dataclass
class WorkerState:
    index: int
    engine: Proc
    serve: Proc
    status: str = "up"  # up | out (unresponsive, out of rotation) | backoff | starting | failed
    budget: RestartBudget = field(default_factory=lambda: RestartBudget(5, 600.0))
    next_try: float = 0.0
    deadline: float = 0.0
    out_since: float = 0.0
    kill_reason: str | None = None  # why the supervisor killed a process (it was unresponsive)
    restarts: list[dict[str, Any]] = field(default_factory=list)
    rotation: list[dict[str, Any]] = field(default_factory=list)  # out of / back into nginx rotation
    audit: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)

    def liveness(self, probes: Probes | None) -> dict[str, Any]:
        if probes is None:
            return {}
        out = {}
        for role in ("engine", "serve"):
            st = probes.states.get(f"{self.index}.{role}")
            if st is not None:
                out[role] = {"misses": st.misses, "why": st.why}
        return out


class Supervisor:
    """Restart and rotation policy for the workers of one launch (driven by `step()`, one thread,
    no waits: probes run on their own threads, see netra/deploy/liveness.py).

    - A process that exits is restarted after a doubling backoff, within the restart budget
      (`max_restarts` in any `window_s`); one more death inside the window gives the worker up for
      good (out of the front; the launch keeps serving on the others).
    - A worker whose engine or response layer misses `probe_misses` liveness probes in a row is
      taken out of nginx rotation at once (status `out`). If every probe passes again it returns
      to rotation; if it is still unresponsive `recover_s` later, the unresponsive process is killed
      (SIGKILL works on a stopped process too) and restarted like any death, and the worker returns
      to rotation once it is healthy and audited again.
    """

    def __init__(self, workers: list[WorkerState], *, policy: RestartPolicy, probes: ProbePolicy | None,
                 engine_url: Callable[[int], str], serve_url: Callable[[int], str],
                 audit: Callable[[WorkerState], list[str]], set_down: Callable[[set[int]], None],
                 on_change: Callable[[], None], log: Callable[[str], None]) -> None:
        self.workers = workers
        self.policy = policy
        for w in workers:
            w.budget = RestartBudget(policy.max_restarts, policy.window_s)
        self.probes = Probes(probes) if probes is not None else None
        self.engine_url = engine_url
        self.serve_url = serve_url
        self.audit = audit
        self.set_down = set_down
        self.on_change = on_change
        self.log = log
        self.down: set[int] = set()  # given up for good
        self.out: set[int] = set()  # unresponsive, or restarting after being unresponsive

    def delay(self, attempt: int) -> float:
        p = self.policy
        return min(p.backoff_max_s, p.backoff_initial_s * (2 ** max(0, attempt - 1)))

    def _rotation_changed(self) -> None:
        self.set_down(self.down | self.out)

    def _fail(self, w: WorkerState) -> None:
        """Give a worker up: stop its processes and take it out of the front for good."""
        w.status = "failed"
        w.engine.stop(5)
        w.serve.stop(5)
        self.down.add(w.index)
        self.out.discard(w.index)
        self._rotation_changed()

    def _died(self, w: WorkerState, now: float) -> None:
        dead = [p for p in (w.engine, w.serve) if p.popen is not None and not p.alive() and not p.exit_reported]
        for p in dead:
            p.exit_reported = True
            p.kill_group()
            event = {"time": now_utc(), "process": p.role, "pid": p.pid, "exit_code": p.exit_code(),
                     "attempt": w.budget.in_window(now) + 1}
            if w.kill_reason is not None:
                event["reason"] = w.kill_reason
            w.restarts.append(event)
            self.log(f"worker {w.index}: {p.role} (pid {p.pid}) exited with {p.exit_code()}")
            if self.probes is not None:
                self.probes.reset(f"{w.index}.{p.role}")
        w.kill_reason = None
        if not w.budget.allows(now):
            self._fail(w)
            self.log(f"worker {w.index}: gave up after {w.budget.in_window(now)} restarts within "
                     f"{self.policy.window_s:.0f} s; it stays out of the front")
        else:
            w.budget.use(now)
            n = w.budget.in_window(now)
            d = self.delay(n)
            if w.restarts:
                w.restarts[-1]["delay_s"] = d
            w.status, w.next_try = "backoff", now + d
            self.log(f"worker {w.index}: restart {n}/{self.policy.max_restarts} within "
                     f"{self.policy.window_s:.0f} s, in {d:.1f} s")
        self.on_change()

    def step(self) -> None:
        now = time.monotonic()
        for w in self.workers:
            if w.status in ("up", "out"):
                if not (w.engine.alive() and w.serve.alive()):
                    self._died(w, now)
                elif self.probes is not None:
                    self._probe(w, now)
            elif w.status == "backoff" and now >= w.next_try:
                if not w.engine.alive():
                    w.engine.spawn()
                w.status, w.deadline = "starting", now + self.policy.health_timeout_s
                self.on_change()
            elif w.status == "starting":
                self._starting(w, now)

    def _probe(self, w: WorkerState, now: float) -> None:
        assert self.probes is not None
        policy = self.probes.policy
        states = {"engine": self.probes.poll(f"{w.index}.engine", self.engine_url(w.index) + "/health", now),
                  "serve": self.probes.poll(f"{w.index}.serve", self.serve_url(w.index) + "/health", now,
                                            any_answer=True)}
        hung = {role: st.why for role, st in states.items() if st.misses >= policy.misses}
        if w.status == "up" and hung:
            w.status, w.out_since = "out", now
            why = "; ".join(f"{role}: {why}" for role, why in hung.items())
            w.rotation.append({"time": now_utc(), "event": "out", "why": why})
            self.out.add(w.index)
            self._rotation_changed()
            self.log(f"worker {w.index}: unresponsive ({why}); out of rotation")
            self.on_change()
        elif w.status == "out":
            if all(st.misses == 0 and st.answered for st in states.values()):
                w.status = "up"
                w.rotation.append({"time": now_utc(), "event": "back", "why": "every probe answers again"})
                self.out.discard(w.index)
                self._rotation_changed()
                self.log(f"worker {w.index}: answers again; back in rotation")
                self.on_change()
            elif hung and now - w.out_since >= policy.recover_s:
                role, why = next(iter(hung.items()))
                proc = w.engine if role == "engine" else w.serve
                w.kill_reason = f"unresponsive for {now - w.out_since:.1f} s out of rotation ({why})"
                self.log(f"worker {w.index}: {role} (pid {proc.pid}) still unresponsive; killing it to restart")
                proc.send(signal.SIGKILL)

    def _starting(self, w: WorkerState, now: float) -> None:
        if not w.engine.alive():
            self._died(w, now)
            return
        if now > w.deadline:
            self.log(f"worker {w.index}: not healthy within {self.policy.health_timeout_s:.0f} s")
            w.engine.stop(5)
            self._died(w, now)
            return
        if not healthy(self.engine_url(w.index) + "/health"):
            return
        if not w.serve.alive():
            w.serve.spawn()
            return
        if not healthy(self.serve_url(w.index) + "/health"):
            return
        problems = self.audit(w)
        w.audit = problems
        if problems:
            self.log(f"worker {w.index}: audit failed after restart: {problems}")
            self._fail(w)
            self.on_change()
            return
        w.status = "up"
        if self.probes is not None:  # judged afresh: misses from before the restart say nothing now
            self.probes.reset(f"{w.index}.engine")
            self.probes.reset(f"{w.index}.serve")
        if w.index in self.out:
            self.out.discard(w.index)
            w.rotation.append({"time": now_utc(), "event": "back", "why": "restarted, healthy and audited"})
            self._rotation_changed()
        self.log(f"worker {w.index}: back (engine pid {w.engine.pid}, serve pid {w.serve.pid})")
        self.on_change()

    def all_failed(self) -> bool:
        return all(w.status == "failed" for w in self.workers)

    def close(self) -> None:
        if self.probes is not None:
            self.probes.close()
