from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path

import pytest

from netra.deploy.audit import mem_policies, proc_cpus
from netra.deploy.liveness import RestartBudget
from netra.deploy.record import is_alive, proc_start_ticks
from netra.deploy.supervisor import Proc, RestartPolicy, Supervisor, WorkerState, resolve_argv


def test_proc_pins_cpus_binds_memory_and_dies_with_its_parent(tmp_path: Path) -> None:
    if not Path("/sys/devices/system/node/node0").exists():
        pytest.skip("no NUMA node 0 on this machine")
    cpu = min(os.sched_getaffinity(0))
    p = Proc("engine", 0, [sys.executable, "-c", "import time; time.sleep(60)"], {"NETRA_X": "1"},
             tmp_path / "w.log", cpus=(cpu,), mem_node=0)
    p.spawn()
    try:
        assert p.pid and proc_cpus(p.pid) == [cpu]
        policies = mem_policies(p.pid)
        if policies:  # numa_maps is readable: every mapping follows the bind policy
            assert "bind:0" in policies
        assert (tmp_path / "w.log").read_text().startswith("\n=== ")
        assert is_alive(p.pid, p.ticks) and p.ticks == proc_start_ticks(p.pid)
    finally:
        p.stop(5)
    assert not p.alive() and p.exit_code() == -signal.SIGTERM


def test_resolve_argv() -> None:
    assert resolve_argv(["netra", "engine", "--port", "1"]) == [sys.executable, "-m", "netra", "engine", "--port", "1"]
    assert resolve_argv(["python3", "-m", "x"]) == ["python3", "-m", "x"]


def test_backoff_doubles_up_to_its_cap() -> None:
    sup = Supervisor([], policy=RestartPolicy(5, 600, 0.5, 3.0, 10), probes=None,
                     engine_url=str, serve_url=str, audit=lambda w: [], set_down=lambda d: None,
                     on_change=lambda: None, log=lambda m: None)
    assert [sup.delay(a) for a in range(1, 6)] == [0.5, 1.0, 2.0, 3.0, 3.0]


def test_exit_of_a_dead_worker_is_recorded_once(tmp_path: Path) -> None:
    engine = Proc("engine", 0, [sys.executable, "-c", "raise SystemExit(7)"], {}, tmp_path / "e.log")
    serve = Proc("serve", 0, [sys.executable, "-c", "import time; time.sleep(60)"], {}, tmp_path / "s.log")
    w = WorkerState(0, engine, serve)
    events: list[str] = []
    sup = Supervisor([w], policy=RestartPolicy(1, 600, 60, 60, 10), probes=None,
                     engine_url=lambda i: "http://127.0.0.1:9", serve_url=lambda i: "http://127.0.0.1:9",
                     audit=lambda w: [], set_down=lambda d: events.append(f"down {sorted(d)}"),
                     on_change=lambda: None, log=events.append)
    engine.spawn()
    serve.spawn()
    try:
        assert engine.popen is not None
        engine.popen.wait(30)
        sup.step()
        sup.step()
        assert w.status == "backoff" and len(w.restarts) == 1 and w.restarts[0]["exit_code"] == 7
        # After max_restarts the worker is given up: processes stopped, taken out of the front.
        w.next_try = 0
        sup.step()  # respawns the engine, which exits with 7 again
        assert engine.popen is not None
        engine.popen.wait(30)
        deadline = time.monotonic() + 10
        while w.status != "failed" and time.monotonic() < deadline:
            sup.step()
        assert w.status == "failed" and [e["exit_code"] for e in w.restarts] == [7, 7]
        assert "down [0]" in events and not serve.alive() and sup.all_failed()
    finally:
        engine.stop(5)
        serve.stop(5)


def test_restart_budget_is_per_window() -> None:
    b = RestartBudget(max_restarts=2, window_s=10.0)
    assert b.allows(0.0)
    b.use(0.0)
    b.use(5.0)
    assert not b.allows(9.0) and b.in_window(9.0) == 2  # a third death within 10 s: given up
    assert b.allows(10.5) and b.in_window(10.5) == 1  # the first restart has left the window
    b.use(10.5)
    assert not b.allows(14.0)
    assert b.allows(15.5) and b.to_record()["window_s"] == 10.0
