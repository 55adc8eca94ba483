"""Hang detection in the supervisor, with stdlib stand-in workers (fast): a stopped process misses
its probes, is taken out of nginx rotation, and is either back after SIGCONT or restarted."""

from __future__ import annotations

import os
import signal
import time
from collections import Counter
from pathlib import Path

import httpx
import pytest

from netra.deploy import nginx
from netra.deploy.launch import Launch
from netra.deploy.liveness import ProbePolicy, Probes
from netra.deploy.record import read_record
from netra.deploy.verify import Verification
from tests.deploy.conftest import needs_nginx
from tests.deploy.test_launch_standin import Running, complete, standin_plan

pytestmark = [needs_nginx, pytest.mark.timeout(120)]
FAST = {"supervisor.probe_interval_s": 0.2, "supervisor.probe_timeout_s": 0.5, "supervisor.probe_misses": 2}


def wait_until(cond: object, timeout: float, what: str) -> float:
    t0 = time.monotonic()
    while not cond():  # type: ignore[operator]
        assert time.monotonic() - t0 < timeout, what
        time.sleep(0.05)
    return time.monotonic() - t0


def start(tmp_path: Path, **sets: object) -> Running:
    launch = Launch(standin_plan(tmp_path, **{**FAST, **sets}), Verification(), log=lambda m: None)
    r = Running(launch)
    launch.start()
    r.thread.start()
    return r


def stop(r: Running) -> None:
    r.launch.stopping = True
    r.thread.join(10)
    for w in r.launch.workers:
        for p in (w.engine, w.serve):
            if p.pid and p.alive():
                os.kill(p.pid, signal.SIGCONT)
    r.launch.stop()


def down_in_conf(launch: Launch, index: int) -> bool:
    port = launch.plan.workers[index].serve_port
    return f"127.0.0.1:{port} max_fails=1 fail_timeout=1s down;" in Path(launch.plan.front.conf_path).read_text()


def test_stopped_engine_leaves_rotation_and_returns_after_sigcont(tmp_path: Path) -> None:
    r = start(tmp_path, **{"supervisor.recover_s": 60.0})
    launch = r.launch
    try:
        assert httpx.get(r.url + nginx.LIVE_PATH, timeout=5).status_code == 204  # nginx's own liveness
        pid = launch.workers[1].engine.pid
        assert pid
        os.kill(pid, signal.SIGSTOP)
        t = wait_until(lambda: launch.workers[1].status == "out" and down_in_conf(launch, 1), 10, "not taken out")
        assert t < 5, t
        time.sleep(0.5)  # the reload takes effect
        with httpx.Client() as client:
            served = Counter(complete(client, r.url).json()["worker"] for _ in range(6))
        assert served == Counter({launch.plan.workers[0].serve_port: 6})
        os.kill(pid, signal.SIGCONT)
        wait_until(lambda: read_record(launch.plan.run_dir)["workers"][1]["status"] == "up"
                   and not down_in_conf(launch, 1), 10, "not back")
        rec = read_record(launch.plan.run_dir)
        assert [e["event"] for e in rec["workers"][1]["rotation"]] == ["out", "back"]
        assert "engine" in rec["workers"][1]["rotation"][0]["why"]
        assert rec["workers"][1]["restarts"] == [] and launch.workers[1].engine.pid == pid  # not restarted
        assert rec["front"]["restarts"] == [] and rec["workers"][0]["rotation"] == []  # no false alarm
    finally:
        stop(r)


def test_stopped_response_layer_is_restarted_when_it_does_not_recover(tmp_path: Path) -> None:
    r = start(tmp_path, **{"supervisor.recover_s": 1.0})
    launch = r.launch
    try:
        old = launch.workers[0].serve.pid
        assert old
        os.kill(old, signal.SIGSTOP)
        wait_until(lambda: launch.workers[0].status == "out", 10, "not taken out")
        # The record (what another shell sees) is written after the in-memory status flips.
        wait_until(lambda: (w := read_record(launch.plan.run_dir)["workers"][0])["status"] == "up"
                   and w["serve"]["pid"] != old, 30, "not restarted")
        rec = read_record(launch.plan.run_dir)
        event = rec["workers"][0]["restarts"][-1]
        assert event["process"] == "serve" and event["pid"] == old and event["exit_code"] == -signal.SIGKILL
        assert "unresponsive" in event["reason"]
        assert rec["workers"][0]["restart_budget"]["in_window"] == 1
        assert rec["restart_policy"] == {"max_restarts": 5, "window_s": 600.0}
        assert [e["event"] for e in rec["workers"][0]["rotation"]] == ["out", "back"]
        wait_until(lambda: not down_in_conf(launch, 0), 5, "still down in nginx")
        time.sleep(0.5)
        with httpx.Client() as client:
            assert Counter(complete(client, r.url).status_code for _ in range(6)) == Counter({200: 6})
    finally:
        stop(r)


def test_probe_judges_a_busy_engine_by_its_step_progress() -> None:
    from netra.serve.watch import judge_health

    assert judge_health(200, b'{"ok": true, "busy": true, "steps": 9, "step_age_s": 3.0}', 10.0)[0]
    alive, why = judge_health(200, b'{"ok": true, "busy": true, "steps": 9, "step_age_s": 12.5}', 10.0)
    assert not alive and "12.5" in why
    assert judge_health(200, b'{"ok": true, "busy": false, "step_age_s": 99}', 10.0)[0]  # idle: no steps due
    assert judge_health(200, b"", 10.0)[0]  # SGLang: no progress fields, the deadline alone
    assert not judge_health(503, b"", 10.0)[0]


def test_probes_never_block_and_count_misses() -> None:
    probes = Probes(ProbePolicy(interval_s=0.0, timeout_s=0.2, misses=2, stall_s=10, recover_s=1))
    try:
        t0 = time.monotonic()
        url = "http://192.0.2.1:9/health"  # TEST-NET-1: never answers
        st = probes.poll("x", url, time.monotonic())
        assert time.monotonic() - t0 < 0.1 and st.pending is not None
        while st.misses < 2:
            assert time.monotonic() - t0 < 10
            st = probes.poll("x", url, time.monotonic())
            time.sleep(0.02)
        assert st.answered >= 2
    finally:
        probes.close()
