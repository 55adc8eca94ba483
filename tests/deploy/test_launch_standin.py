"""Process management, nginx routing, supervisor and records, with stdlib stand-in workers (fast).

The same launcher code runs the real `netra engine` / `netra serve` in test_launch_local.py.
"""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest

from netra.deploy.audit import proc_cpus, proc_environ
from netra.deploy.launch import Launch
from netra.deploy.plan import Overrides, Plan, make_plan
from netra.deploy.profile import load_profile
from netra.deploy.record import is_alive, read_record
from netra.deploy.verify import LaunchRefused, Verification
from netra.settings import REPO_ROOT
from tests.deploy.conftest import STANDIN, free_block, free_port, needs_nginx

pytestmark = [needs_nginx, pytest.mark.timeout(180)]


def standin_plan(run_dir: Path, **profile_sets: object) -> Plan:
    prof = load_profile("local")
    for key, value in profile_sets.items():
        prof = prof.replace(key, value)
    prof = prof.replace("supervisor.backoff_initial_s", 0.2).replace("supervisor.health_timeout_s", 20.0)
    prof = prof.replace("front.fail_timeout_s", 1)
    plan = make_plan(prof, None, Overrides(run_dir=run_dir, port_base=free_block(4), front_port=free_port()))
    workers = tuple(dataclasses.replace(
        w, engine_argv=(sys.executable, str(STANDIN), "engine", *w.engine_argv[2:]),
        serve_argv=(sys.executable, str(STANDIN), "serve", *w.serve_argv[2:])) for w in plan.workers)
    return dataclasses.replace(plan, workers=workers)


class Running:
    def __init__(self, launch: Launch) -> None:
        self.launch = launch
        self.thread = threading.Thread(target=launch.supervise, daemon=True)

    @property
    def url(self) -> str:
        return self.launch.plan.front.url

    def pids(self) -> list[int]:
        procs = [p for w in self.launch.workers for p in (w.engine, w.serve)]
        procs += [self.launch.nginx_proc] if self.launch.nginx_proc else []
        return [p.pid for p in procs if p.pid]


@pytest.fixture
def running(tmp_path: Path) -> Iterator[Running]:
    messages: list[str] = []
    launch = Launch(standin_plan(tmp_path), Verification(), log=messages.append)
    r = Running(launch)
    try:
        launch.start()
        r.thread.start()
        yield r
    finally:
        launch.stopping = True
        if r.thread.is_alive():
            r.thread.join(10)
        launch.stop()
        launch.state = "stopped"
        launch.save()


def complete(client: httpx.Client, url: str) -> httpx.Response:
    return client.post(url + "/v1/completions", json={"prompt": "hi", "max_tokens": 1}, timeout=30)


def test_start_record_and_round_robin(running: Running) -> None:
    plan = running.launch.plan
    rec = read_record(plan.run_dir)
    assert rec["state"] == "serving" and rec["plan_sha256"] == plan.sha256()
    assert rec["profile_sha256"] == load_profile("local").replace("supervisor.backoff_initial_s", 0.2).replace(
        "supervisor.health_timeout_s", 20.0).replace("front.fail_timeout_s", 1).sha256()
    assert (Path(plan.run_dir) / "plan.json").read_text() == plan.canonical_json()
    for w, ws in zip(rec["workers"], plan.workers, strict=True):
        assert w["engine_port"] == ws.engine_port and w["cpus"] == ws.cpulist and w["status"] == "up"
        assert is_alive(w["engine"]["pid"], w["engine"]["ticks"]) and w["engine"]["start_time"]
        # The process really runs on its CPU set with its environment.
        assert proc_cpus(w["engine"]["pid"]) == list(ws.cpus)
        assert proc_environ(w["engine"]["pid"])["OMP_NUM_THREADS"] == ws.engine_env["OMP_NUM_THREADS"]
    n = 10
    with httpx.Client() as client:
        served = Counter(complete(client, running.url).json()["worker"] for _ in range(2 * n))
    assert sorted(served.values()) == [n, n] and set(served) == {w.serve_port for w in plan.workers}
    status = subprocess.run([sys.executable, "-m", "netra", "status", "--run-dir", plan.run_dir, "--json"],
                            capture_output=True, text=True, timeout=60, cwd=REPO_ROOT)
    assert status.returncode == 0, status.stdout + status.stderr
    summary = json.loads(status.stdout)
    assert summary["front_healthy"] is True and summary["state"] == "serving"
    assert list(summary["health"].values()) == [{"engine": True, "serve": True}] * 2


@pytest.mark.parametrize("role", ["engine", "serve"])
def test_sigkill_routes_around_and_restarts(running: Running, role: str) -> None:
    launch = running.launch
    victim = getattr(launch.workers[0], role)
    old_pid = victim.pid
    assert old_pid is not None
    os.kill(old_pid, signal.SIGKILL)
    killed_at = time.monotonic()
    with httpx.Client() as client:
        codes = Counter(complete(client, running.url).status_code for _ in range(100))
    assert codes == Counter({200: 100})
    while launch.workers[0].status != "up" or getattr(launch.workers[0], role).pid == old_pid:
        assert time.monotonic() - killed_at < 30, f"worker 0 not back: {launch.workers[0].status}"
        time.sleep(0.1)
    rec = read_record(launch.plan.run_dir)
    restarts = rec["workers"][0]["restarts"]
    assert len(restarts) == 1 and restarts[0]["process"] == role and restarts[0]["exit_code"] == -9
    assert restarts[0]["pid"] == old_pid and rec["workers"][0][role]["pid"] != old_pid
    # Back in rotation once nginx's passive-health window (fail_timeout) has passed.
    time.sleep(launch.plan.front.fail_timeout_s + 0.5)
    with httpx.Client() as client:
        served = Counter(complete(client, running.url).json()["worker"] for _ in range(8))
    assert len(served) == 2


def test_stop_leaves_nothing(tmp_path: Path) -> None:
    launch = Launch(standin_plan(tmp_path), Verification(), log=lambda m: None)
    launch.start()
    pids = [p.pid for w in launch.workers for p in (w.engine, w.serve)] + [launch.nginx_proc.pid]
    launch.stop()
    assert all(not is_alive(pid, None) for pid in pids if pid)


def test_in_flight_request_on_a_killed_engine_moves_to_another_worker(tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """A non-streamed request whose engine dies has sent the client nothing: nginx passes it on."""
    monkeypatch.setenv("STANDIN_SLOW", "2")
    launch = Launch(standin_plan(tmp_path), Verification(), log=lambda m: None)
    try:
        launch.start()
        with httpx.Client() as client, ThreadPoolExecutor(2) as pool:
            futures = [pool.submit(complete, client, launch.plan.front.url) for _ in range(2)]
            time.sleep(1.0)
            assert launch.workers[0].engine.pid
            os.kill(launch.workers[0].engine.pid, signal.SIGKILL)
            t0 = time.monotonic()
            results = [f.result() for f in futures]
            assert time.monotonic() - t0 < 10
        assert [r.status_code for r in results] == [200, 200]
        assert {r.json()["worker"] for r in results} == {launch.plan.workers[1].serve_port}
        launch.nginx_proc.send(signal.SIGQUIT)  # flush the access log
        launch.nginx_proc.popen.wait(10)
        log = Path(launch.plan.front.access_log).read_text()
        w0, w1 = (f"127.0.0.1:{w.serve_port}" for w in launch.plan.workers)
        assert f"up={w0}, {w1} us=502, 200" in log
    finally:
        launch.stop()


def test_refuses_an_engine_option_that_did_not_reach_the_worker(tmp_path: Path,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("STANDIN_DROP", "max_running_requests")
    launch = Launch(standin_plan(tmp_path), Verification(), log=lambda m: None)
    assert launch.run() == 2
    rec = read_record(tmp_path)
    assert rec["state"] == "refused"
    assert "engine option max_running_requests did not reach worker 0" in rec["message"]
    assert rec["front"]["process"] is None  # the front never opened
    assert all(not is_alive(w["engine"]["pid"], w["engine"]["ticks"]) for w in rec["workers"])


def test_refuses_a_wrapper_that_drops_the_environment(tmp_path: Path) -> None:
    plan = standin_plan(tmp_path)
    w0 = plan.workers[0]
    wrapped = dataclasses.replace(w0, engine_argv=("env", "-u", "OMP_NUM_THREADS", *w0.engine_argv))
    plan = dataclasses.replace(plan, workers=(wrapped, *plan.workers[1:]))
    launch = Launch(plan, Verification(), log=lambda m: None)
    assert launch.run() == 2
    message = read_record(tmp_path)["message"]
    assert "environment OMP_NUM_THREADS did not reach worker 0" in message
    assert "worker 0 (pid" in message and "runs a different command line" in message


def test_refuses_busy_ports(tmp_path: Path) -> None:
    import socket

    plan = standin_plan(tmp_path)
    with socket.socket() as s:
        s.bind(("127.0.0.1", plan.workers[1].engine_port))
        s.listen()
        launch = Launch(plan, Verification(), log=lambda m: None)
        with pytest.raises(LaunchRefused, match=f"port {plan.workers[1].engine_port} is already in use"):
            launch.start()
    assert all(w.engine.popen is None for w in launch.workers)


def test_detached_launcher_status_and_stop_from_another_shell(tmp_path: Path) -> None:
    base, front = free_block(4), free_port()
    log = (tmp_path / "driver.log").open("wb")
    driver = subprocess.Popen([sys.executable, str(STANDIN), "launch", "--run-dir", str(tmp_path),
                               "--front-port", str(front), "--port-base", str(base)],
                              stdout=log, stderr=subprocess.STDOUT, start_new_session=True, cwd=REPO_ROOT)
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                if read_record(tmp_path)["state"] == "serving":
                    break
            except Exception:
                pass
            assert driver.poll() is None, (tmp_path / "driver.log").read_text()
            assert time.monotonic() < deadline
            time.sleep(0.2)
        rec = read_record(tmp_path)
        pids = [rec["front"]["process"]["pid"]] + [w[k]["pid"] for w in rec["workers"] for k in ("engine", "serve")]
        cli = [sys.executable, "-m", "netra"]
        st = subprocess.run([*cli, "status", "--run-dir", str(tmp_path)], capture_output=True, text=True,
                            timeout=60, cwd=REPO_ROOT)
        assert st.returncode == 0 and "serving" in st.stdout, st.stdout + st.stderr
        stop = subprocess.run([*cli, "stop", "--run-dir", str(tmp_path)], capture_output=True, text=True,
                              timeout=90, cwd=REPO_ROOT)
        assert stop.returncode == 0 and f"launcher pid {driver.pid} stopped" in stop.stdout, stop.stdout
        assert driver.wait(10) == 0
        assert all(not is_alive(pid, None) for pid in pids)
        assert read_record(tmp_path)["state"] == "stopped"
        st = subprocess.run([*cli, "status", "--run-dir", str(tmp_path)], capture_output=True, text=True,
                            timeout=60, cwd=REPO_ROOT)
        assert st.returncode == 1
    finally:
        if driver.poll() is None:
            driver.kill()
            driver.wait(10)


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_foreground_launcher_stops_cleanly_on_ctrl_c_and_sigterm(tmp_path: Path, sig: int) -> None:
    out = (tmp_path / "driver.log").open("wb")
    driver = subprocess.Popen([sys.executable, str(STANDIN), "launch", "--run-dir", str(tmp_path),
                               "--front-port", str(free_port()), "--port-base", str(free_block(4))],
                              stdout=out, stderr=subprocess.STDOUT, start_new_session=True, cwd=REPO_ROOT)
    try:
        deadline = time.monotonic() + 60
        while not ((tmp_path / "launch.json").exists() and read_record(tmp_path)["state"] == "serving"):
            assert driver.poll() is None and time.monotonic() < deadline, (tmp_path / "driver.log").read_text()
            time.sleep(0.2)
        rec = read_record(tmp_path)
        procs = [(w[k]["pid"], w[k]["ticks"]) for w in rec["workers"] for k in ("engine", "serve")]
        procs.append((rec["front"]["process"]["pid"], rec["front"]["process"]["ticks"]))
        os.killpg(driver.pid, sig)  # Ctrl-C reaches the launcher's process group; children have their own
        assert driver.wait(30) == 0
        assert not [pid for pid, ticks in procs if is_alive(pid, ticks)]
        assert read_record(tmp_path)["state"] == "stopped"
        assert "every process of this launch has exited" in (tmp_path / "driver.log").read_text()
    finally:
        if driver.poll() is None:
            driver.kill()
            driver.wait(10)


def test_worker_that_cannot_restart_is_given_up_and_the_rest_keeps_serving(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    marker = tmp_path / "no-restart"
    monkeypatch.setenv("STANDIN_FAIL_MARKER", str(marker))
    launch = Launch(standin_plan(tmp_path / "run", **{"supervisor.max_restarts": 2}), Verification(),
                    log=lambda m: None)
    r = Running(launch)
    try:
        launch.start()
        r.thread.start()
        marker.touch()
        assert launch.workers[0].engine.pid
        os.kill(launch.workers[0].engine.pid, signal.SIGKILL)
        # Wait on the launch record (what another shell sees), not the in-memory status: the status
        # flips before the supervisor has stopped the processes and written the record.
        deadline = time.monotonic() + 30
        while (rec := read_record(launch.plan.run_dir))["workers"][0]["status"] != "failed":
            assert time.monotonic() < deadline, launch.workers[0].status
            time.sleep(0.1)
        events = rec["workers"][0]["restarts"]
        assert [e["exit_code"] for e in events] == [-9, 3, 3] and [e["attempt"] for e in events] == [1, 2, 3]
        assert [e["delay_s"] for e in events[:2]] == [0.2, 0.4]  # doubling backoff
        conf = Path(launch.plan.front.conf_path).read_text()
        assert f"127.0.0.1:{launch.plan.workers[0].serve_port} max_fails=1 fail_timeout=1s down;" in conf
        time.sleep(1.0)  # the reload takes effect
        with httpx.Client() as client:
            served = Counter(complete(client, r.url).json()["worker"] for _ in range(10))
        assert served == Counter({launch.plan.workers[1].serve_port: 10})
        assert r.thread.is_alive() and rec["state"] == "serving"
    finally:
        launch.stopping = True
        r.thread.join(10)
        launch.stop()


def test_sigkilled_launcher_takes_its_children_with_it(tmp_path: Path) -> None:
    out = (tmp_path / "driver.log").open("wb")
    driver = subprocess.Popen([sys.executable, str(STANDIN), "launch", "--run-dir", str(tmp_path),
                               "--front-port", str(free_port()), "--port-base", str(free_block(4))],
                              stdout=out, stderr=subprocess.STDOUT, start_new_session=True, cwd=REPO_ROOT)
    try:
        deadline = time.monotonic() + 60
        while not ((tmp_path / "launch.json").exists() and read_record(tmp_path)["state"] == "serving"):
            assert driver.poll() is None and time.monotonic() < deadline, (tmp_path / "driver.log").read_text()
            time.sleep(0.2)
        rec = read_record(tmp_path)
        procs = [(w[k]["pid"], w[k]["ticks"]) for w in rec["workers"] for k in ("engine", "serve")]
        procs.append((rec["front"]["process"]["pid"], rec["front"]["process"]["ticks"]))
        driver.kill()
        driver.wait(10)
        deadline = time.monotonic() + 20  # the parent-death signal (SIGTERM) reaches every child
        while [p for p, t in procs if is_alive(p, t)] and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not [p for p, t in procs if is_alive(p, t)]
        st = subprocess.run([sys.executable, "-m", "netra", "status", "--run-dir", str(tmp_path), "--json"],
                            capture_output=True, text=True, timeout=60, cwd=REPO_ROOT)
        assert st.returncode == 1 and json.loads(st.stdout)["state"] == "dead"
        stop = subprocess.run([sys.executable, "-m", "netra", "stop", "--run-dir", str(tmp_path)],
                              capture_output=True, text=True, timeout=60, cwd=REPO_ROOT)
        assert stop.returncode == 0 and "launcher was not running" in stop.stdout
    finally:
        if driver.poll() is None:
            driver.kill()
            driver.wait(10)


def test_round_robin_is_exact_across_nginx_worker_processes(tmp_path: Path) -> None:
    """With 4 nginx worker processes and a new connection per request, 2N requests still land N/N."""
    launch = Launch(standin_plan(tmp_path, **{"front.target_concurrency": 4096}), Verification(), log=lambda m: None)
    assert launch.plan.front.worker_processes == 4
    try:
        launch.start()
        n = 12
        served: Counter[int] = Counter()
        for _ in range(2 * n):
            with httpx.Client() as client:  # a fresh connection each time: any nginx worker may take it
                served[complete(client, launch.plan.front.url).json()["worker"]] += 1
        assert sorted(served.values()) == [n, n], served
    finally:
        launch.stop()


def test_nginx_that_dies_is_restarted(running: Running) -> None:
    launch = running.launch
    assert launch.nginx_proc is not None and launch.nginx_proc.pid
    old = launch.nginx_proc.pid
    os.kill(old, signal.SIGKILL)
    deadline = time.monotonic() + 20
    while launch.nginx_proc.pid == old or not launch.nginx_proc.alive():
        assert time.monotonic() < deadline
        time.sleep(0.1)
    with httpx.Client() as client:
        codes = Counter(complete(client, running.url).status_code for _ in range(10))
    assert codes == Counter({200: 10})
    rec = read_record(launch.plan.run_dir)
    assert [r["exit_code"] for r in rec["front"]["restarts"]] == [-9]
    assert rec["front"]["process"]["pid"] == launch.nginx_proc.pid
    # The killed master's worker processes (its process group) are gone too.
    assert not [p for p in Path("/proc").glob("[0-9]*/stat") if _pgid(p) == old]


def _pgid(stat: Path) -> int | None:
    try:
        text = stat.read_text()
    except OSError:
        return None
    fields = text[text.rindex(")") + 2:].split()
    return None if fields[0] == "Z" else int(fields[2])


# --- Netra's SGLang plugin: the audit reads what each worker reports from inside ---------------------

LOCKED = {"path": "/opt/netra/build/sm90/moe/moe_layer_t1.cubin", "sha256": "a" * 64, "family": "moe",
          "name": "moe_layer_t1"}
LOADED = {"name": "moe_layer_t1", "family": "moe", "op": "moe_fp8_routed", "sha256": "a" * 64, "device": 0}


def plugin_plan(run_dir: Path, *extra: dict[str, str]) -> Plan:
    """Stand-in SGLang workers whose profile enables the moe domain; ``extra[i]``: worker i's env additions."""
    from netra.plugins import sglang as plugin

    plan = standin_plan(run_dir)
    workers = []
    for w, more in zip(plan.workers, extra, strict=True):
        where = str(run_dir / f"worker{w.index}.plugin")
        env = {**w.engine_env, **plugin.worker_env(("moe",), where), "STANDIN_PLUGIN_TACTICS": json.dumps([LOADED]),
               **more}
        workers.append(dataclasses.replace(w, engine_env=env, tactics=("moe",), plugin_evidence=where))
    return dataclasses.replace(plan, engine_kind="sglang", workers=tuple(workers))


def test_plugin_evidence_admits_workers_that_loaded_the_locked_code_objects(tmp_path: Path) -> None:
    launch = Launch(plugin_plan(tmp_path, {}, {}), Verification(code_objects=[LOCKED]), log=lambda m: None)
    try:
        launch.start()
        assert launch.state == "serving"
        assert [ws.audit for ws in launch.workers] == [[], []]
        assert [ws.warnings for ws in launch.workers] == [[], []]
        assert httpx.get(launch.plan.front.url + "/health", timeout=5).status_code == 200
    finally:
        launch.stop()


def test_refuses_a_worker_that_did_not_load_the_plugin(tmp_path: Path) -> None:
    # An earlier run's evidence (a process that is gone) does not count for the new worker 1.
    stale = tmp_path / "worker1.plugin"
    stale.mkdir()
    (stale / "999999.json").write_text(json.dumps({"version": 1, "plugin": "netra", "pid": 999999, "ticks": 1,
                                                   "hooks": {"moe": {"registered": True, "applied": True}},
                                                   "tactics": [LOADED]}))
    plan = plugin_plan(tmp_path, {}, {"STANDIN_PLUGIN": "absent"})
    launch = Launch(plan, Verification(code_objects=[LOCKED]), log=lambda m: None)
    assert launch.run() == 2
    rec = read_record(tmp_path)
    assert rec["state"] == "refused" and rec["front"]["process"] is None  # the front never opened
    assert "worker 1 (pid" in rec["message"]
    assert "enables tactics moe but did not load the SGLang plugin netra" in rec["message"]
    assert str(stale) in rec["message"]
    assert "worker 0" not in rec["message"]


def test_refuses_a_worker_that_loaded_a_tampered_code_object(tmp_path: Path) -> None:
    tampered = json.dumps([{**LOADED, "sha256": "b" * 64}])
    plan = plugin_plan(tmp_path, {"STANDIN_PLUGIN_TACTICS": tampered}, {})
    launch = Launch(plan, Verification(code_objects=[LOCKED]), log=lambda m: None)
    assert launch.run() == 2
    rec = read_record(tmp_path)
    assert rec["state"] == "refused" and rec["front"]["process"] is None
    assert (f"worker 0 (pid {rec['workers'][0]['engine']['pid']}) loaded code object {LOCKED['path']} "
            f"(moe/moe_layer_t1) with sha256 {'b' * 16}..., the kernel lock says {'a' * 16}...") in rec["message"]
    assert "worker 1" not in rec["message"]
