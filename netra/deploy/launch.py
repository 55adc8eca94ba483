"""Process-mode launch of a verified plan: engines, audit, response layers, nginx, then supervision.

Order (ARCHITECTURE.md, "The launcher"): every port is checked free; the engines start with their CPU
sets and memory nodes; each must answer /health; each is audited (command line, environment, CPU
set, memory policy, /server_info options, mapped code objects or, for SGLang workers with tactics,
the evidence of Netra's plugin); the response layers start and must answer /health (200 only when
their engine is healthy); only then is nginx started, so it never marks an upstream down because it
was hit before listening. The launch record is rewritten at every
change. SIGINT / SIGTERM stop everything: nginx first (no new requests), then the response layers,
then the engines; each gets SIGTERM, then SIGKILL after a bounded wait.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from netra.deploy import nginx
from netra.deploy.audit import audit_code_objects, audit_options, audit_plugin, audit_process
from netra.deploy.liveness import ProbePolicy, Probes, RestartBudget
from netra.deploy.metrics import SOCKET_NAME, MetricsProxy
from netra.deploy.metrics import targets as metrics_targets
from netra.deploy.plan import Plan
from netra.deploy.record import RECORD_VERSION, is_alive, now_utc, proc_start_ticks, read_record, record_path
from netra.deploy.record import RecordError as RecordError
from netra.deploy.record import write_json as write_json
from netra.deploy.supervisor import Proc, RestartPolicy, Supervisor, WorkerState, healthy, log_tail
from netra.deploy.topology import format_cpulist
from netra.deploy.verify import LaunchRefused, Verification

POLL_S = 0.2


class StartError(RuntimeError):
    """A process of the launch failed to come up; the message names it and quotes its log."""


class Stopped(Exception):
    """A stop signal arrived while the launch was starting."""


def port_free(host: str, port: int) -> bool:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


class Launch:
    def __init__(self, plan: Plan, verification: Verification, *, strict: bool = False,
                 meta: dict[str, Any] | None = None, log: Callable[[str], None] = print) -> None:
        self.plan = plan
        # Strict: a locked code object the worker does not show is a refusal, not a warning.
        self.strict = strict
        self.verification = verification
        self.meta = meta or {}
        self.log = log
        self.run_dir = Path(plan.run_dir)
        self.stopping = False
        self.started = now_utc()
        self.state = "starting"
        self.message = ""
        self.nginx_proc: Proc | None = None
        self.metrics_proxy: MetricsProxy | None = None
        self.nginx_restarts: list[dict[str, Any]] = []
        policy = RestartPolicy.from_plan(plan.supervisor)
        self.nginx_budget = RestartBudget(policy.max_restarts, policy.window_s)
        probe_policy = ProbePolicy.from_plan(plan.supervisor)
        # nginx answers from its own event loops whatever the workers do, so a slow answer means
        # overload before it means a hang: give it a longer deadline and more misses.
        self.nginx_probes = Probes(ProbePolicy(probe_policy.interval_s, max(5.0, 2 * probe_policy.timeout_s),
                                               probe_policy.misses + 2, probe_policy.stall_s, probe_policy.recover_s))
        self.workers = [
            WorkerState(
                w.index,
                Proc("engine", w.index, list(w.engine_argv), dict(w.engine_env), Path(w.engine_log), w.cpus,
                     w.mem_node),
                Proc("serve", w.index, list(w.serve_argv), dict(w.serve_env), Path(w.serve_log), w.cpus,
                     w.mem_node))
            for w in plan.workers]
        self.supervisor = Supervisor(
            self.workers, policy=policy, probes=probe_policy,
            engine_url=lambda i: plan.workers[i].engine_url, serve_url=lambda i: plan.workers[i].serve_url,
            audit=self.audit_worker, set_down=self.set_down, on_change=self.save, log=self.log)

    # --- record ---------------------------------------------------------------------------------

    def record(self) -> dict[str, Any]:
        p = self.plan
        workers = []
        for ws, wp in zip(self.workers, p.workers, strict=True):
            workers.append({
                "index": wp.index, "status": ws.status, "gpu": wp.gpu, "gpu_pci": wp.gpu_pci,
                "numa_node": wp.numa_node, "cpus": wp.cpulist, "mem_node": wp.mem_node,
                "engine_port": wp.engine_port, "serve_port": wp.serve_port, "engine_url": wp.engine_url,
                "serve_url": wp.serve_url, "engine": ws.engine.to_record(), "serve": ws.serve.to_record(),
                "restarts": ws.restarts, "restart_budget": ws.budget.to_record(), "rotation": ws.rotation,
                "liveness": ws.liveness(self.supervisor.probes), "audit": ws.audit, "audit_warnings": ws.warnings})
        return {
            "version": RECORD_VERSION, "state": self.state, "message": self.message, "updated": now_utc(),
            "launcher": {"pid": os.getpid(), "ticks": proc_start_ticks(os.getpid()), "start_time": self.started},
            "profile_name": p.profile_name, "profile_sha256": p.profile_sha256, "profile": p.profile,
            "plan_sha256": p.sha256(), "plan_path": str(self.run_dir / "plan.json"), "run_dir": p.run_dir,
            "front": {"url": p.front.url, "host": p.front.host, "port": p.front.port, "conf": p.front.conf_path,
                      "process": self.nginx_proc.to_record() if self.nginx_proc else None,
                      "restarts": self.nginx_restarts, "restart_budget": self.nginx_budget.to_record()},
            "restart_policy": {"max_restarts": self.supervisor.policy.max_restarts,
                               "window_s": self.supervisor.policy.window_s},
            "verification": self.verification.to_dict(), "workers": workers, **self.meta}

    def save(self) -> None:
        write_json(record_path(self.run_dir), self.record())

    # --- startup --------------------------------------------------------------------------------

    def _check_wait(self, deadline: float, what: str) -> None:
        if self.stopping:
            raise Stopped()
        if time.monotonic() > deadline:
            raise StartError(f"{what}: not healthy within {self.plan.supervisor['health_timeout_s']} s")
        time.sleep(POLL_S)

    def _wait_healthy(self, procs: list[tuple[Proc, str]], deadline: float) -> None:
        pending = list(procs)
        while pending:
            for proc, url in list(pending):
                if not proc.alive():
                    raise StartError(f"worker {proc.index} {proc.role} (pid {proc.pid}) exited with "
                                     f"{proc.exit_code()} during startup; {proc.log}:\n{log_tail(proc.log)}")
                if healthy(url):
                    pending.remove((proc, url))
            if pending:
                self._check_wait(deadline, ", ".join(f"worker {p.index} {p.role}" for p, _ in pending))

    def audit_worker(self, ws: WorkerState) -> list[str]:
        import httpx

        wp = self.plan.workers[ws.index]
        assert ws.engine.pid is not None and ws.serve.pid is not None
        problems = audit_process(wp, ws.engine.pid, ws.engine.exec_argv, wp.engine_env)
        if ws.serve.alive():
            problems += audit_process(wp, ws.serve.pid, ws.serve.exec_argv, wp.serve_env)
        try:
            resp = httpx.get(wp.engine_url + "/server_info", timeout=10)
            resp.raise_for_status()
            info = resp.json()
        except (httpx.HTTPError, ValueError) as exc:
            return [*problems, f"worker {wp.index}: GET /server_info failed ({exc}); its options cannot be "
                               f"audited"]
        problems += audit_options(wp, info)
        ws.warnings = []
        if wp.tactics:
            # Netra's SGLang plugin reports what it hooked and loaded (SGLang's /server_info does not).
            plugin_problems, plugin_warnings = audit_plugin(wp, ws.engine.pid, self.verification.code_objects)
            problems += plugin_problems
            ws.warnings += plugin_warnings
        if self.plan.engine_kind != "sglang":
            # The embedded engine loads every locked code object of its target; an SGLang worker loads
            # only what its plugin's domains select (audited above) and none without the plugin.
            objects = audit_code_objects(wp, ws.engine.pid, info, self.verification.code_objects)
            if self.strict:
                problems += objects
            else:
                ws.warnings += objects
        for msg in ws.warnings:
            self.log(f"warning: {msg}")
        return problems

    def start(self) -> None:
        """Start everything or nothing: any failure stops what was started and raises."""
        p = self.plan
        self.run_dir.mkdir(parents=True, exist_ok=True)
        try:
            old = read_record(self.run_dir)
        except RecordError:
            old = None
        if old is not None and is_alive(old["launcher"].get("pid"), old["launcher"].get("ticks")):
            raise LaunchRefused([f"a launch is already running from {self.run_dir} (launcher pid "
                                 f"{old['launcher']['pid']}); stop it with `netra stop --run-dir {self.run_dir}`"])
        busy = [port for host, port in [(p.front.host, p.front.port)]
                + [("127.0.0.1", q) for w in p.workers for q in (w.engine_port, w.serve_port)]
                if not port_free(host, port)]
        if busy:
            raise LaunchRefused([f"port {port} is already in use (pick others with --front-port / --port-base)"
                                 for port in busy])
        (self.run_dir / "plan.json").write_text(p.canonical_json())
        self.save()
        timeout = float(p.supervisor["health_timeout_s"])
        for ws in self.workers:
            ws.engine.spawn()
        self.save()
        self.log(f"started {len(self.workers)} engine(s); waiting for /health")
        self._wait_healthy([(ws.engine, p.workers[ws.index].engine_url + "/health") for ws in self.workers],
                           time.monotonic() + timeout)
        for ws in self.workers:
            ws.serve.spawn()
        self.save()
        self._wait_healthy([(ws.serve, p.workers[ws.index].serve_url + "/health") for ws in self.workers],
                           time.monotonic() + timeout)
        problems: list[str] = []
        for ws in self.workers:
            ws.audit = self.audit_worker(ws)
            problems += ws.audit
        if problems:
            raise LaunchRefused(problems)
        self.log("every worker is healthy and audited; starting the metrics aggregator and nginx")
        self.metrics_proxy = MetricsProxy(self.run_dir / SOCKET_NAME, metrics_targets(p))
        self.metrics_proxy.start()
        nginx.write(p)
        nginx.validate(p)
        self.nginx_proc = Proc("nginx", None, nginx.start_argv(p), {}, Path(p.run_dir) / "nginx.stdout.log")
        self.nginx_proc.spawn()
        deadline = time.monotonic() + 30
        while not healthy(p.front.url + "/health"):
            if not self.nginx_proc.alive():
                raise StartError(f"nginx exited with {self.nginx_proc.exit_code()}: "
                                 f"{log_tail(Path(p.front.error_log))}")
            self._check_wait(deadline, "the front (nginx)")
        self.state = "serving"
        self.save()

    # --- running --------------------------------------------------------------------------------

    def set_down(self, down: set[int]) -> None:
        """Re-render with these workers `down` and reload (only for workers given up for good)."""
        nginx.write(self.plan, down)
        if self.nginx_proc is not None and self.nginx_proc.alive():
            self.nginx_proc.send(signal.SIGHUP)  # graceful reload: in-flight requests finish
        self.log(f"nginx: workers down {sorted(down) or 'none'}")

    def _nginx_check(self) -> bool:
        """nginx exited, or stopped answering its liveness location: restart it within the budget."""
        proc = self.nginx_proc
        if proc is None:
            return True
        now = time.monotonic()
        reason = None
        if proc.alive():
            st = self.nginx_probes.poll("nginx", self.plan.front.url + nginx.LIVE_PATH, now, any_answer=True)
            if st.misses < self.nginx_probes.policy.misses:
                return True
            reason = f"unresponsive ({st.why}, {st.misses} probes missed)"
            self.log(f"nginx (pid {proc.pid}) {reason}; killing it to restart")
            proc.send(signal.SIGKILL)
            try:
                assert proc.popen is not None
                proc.popen.wait(10)
            except Exception:  # reaped below by kill_group either way
                pass
        if not self.nginx_budget.allows(now):
            self.message = (f"nginx exited {self.nginx_budget.in_window(now) + 1} times within "
                            f"{self.nginx_budget.window_s:.0f} s; giving up")
            return False
        self.nginx_budget.use(now)
        event: dict[str, Any] = {"time": now_utc(), "pid": proc.pid, "exit_code": proc.exit_code()}
        if reason:
            event["reason"] = reason
        self.nginx_restarts.append(event)
        self.log(f"nginx (pid {proc.pid}) exited with {proc.exit_code()}; restarting")
        proc.kill_group()  # its worker processes outlive a killed master and keep the port
        self.nginx_probes.reset("nginx")
        proc.spawn()
        self.save()
        return True

    def supervise(self) -> int:
        try:
            while not self.stopping:
                self.supervisor.step()
                if not self._nginx_check():
                    return 1
                if self.supervisor.all_failed():
                    self.message = "every worker failed and exhausted its restarts"
                    return 1
                time.sleep(POLL_S)
            return 0
        finally:
            self.supervisor.close()
            self.nginx_probes.close()

    def stop(self) -> None:
        self.state = "stopping"
        self.save()
        groups: list[list[Proc]] = [[self.nginx_proc] if self.nginx_proc else [],
                                    [w.serve for w in self.workers], [w.engine for w in self.workers]]
        for group in groups:
            for proc in group:
                proc.send(signal.SIGTERM)
            for proc in group:
                proc.stop(10)
        if self.metrics_proxy is not None:
            self.metrics_proxy.stop()
            self.metrics_proxy = None

    def run(self) -> int:
        """Start, serve until SIGINT/SIGTERM, stop. 0 = clean stop, 1 = failed, 2 = refused."""
        previous = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}

        def on_signal(signum: int, frame: Any) -> None:
            self.stopping = True

        for s in previous:
            signal.signal(s, on_signal)
        code = 0
        try:
            try:
                self.start()
                self.log(f"serving {self.plan.profile_name} on {self.plan.front.url}/v1 "
                         f"(record {record_path(self.run_dir)}; stop with Ctrl-C or "
                         f"`netra stop --run-dir {self.run_dir}`)")
                code = self.supervise()
                self.state = "stopped" if code == 0 else "failed"
            except Stopped:
                self.state, self.message = "stopped", "stopped during startup"
            except LaunchRefused as exc:
                self.state, self.message, code = "refused", str(exc), 2
                self.log(str(exc))
            except (StartError, nginx.NginxError, OSError) as exc:
                self.state, self.message, code = "failed", str(exc), 1
                self.log(f"launch failed: {exc}")
        finally:
            final = self.state
            self.log("stopping: nginx, response layers, engines")
            self.stop()
            self.state = final
            self.save()
            self.log(f"{final}: every process of this launch has exited")
            for s, handler in previous.items():
                signal.signal(s, handler)
        return code


# --- from another shell ----------------------------------------------------------------------------

def processes(record: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    return [(name, proc) for name, proc, _ in _processes_with_ports(record)]


def _processes_with_ports(record: dict[str, Any]) -> list[tuple[str, dict[str, Any], int | None]]:
    out = []
    front = record.get("front", {})
    if front.get("process"):
        out.append(("nginx", front["process"], front.get("port")))
    for w in record.get("workers", []):
        out.append((f"worker{w['index']}.serve", w["serve"], w.get("serve_port")))
        out.append((f"worker{w['index']}.engine", w["engine"], w.get("engine_port")))
    return out


def status(run_dir: Path) -> tuple[int, dict[str, Any]]:
    """(exit code, summary): 0 when the launcher is alive, serving, and every worker is up."""
    rec = read_record(run_dir)
    launcher = rec["launcher"]
    alive = is_alive(launcher.get("pid"), launcher.get("ticks"))
    procs = {name: is_alive(p.get("pid"), p.get("ticks")) for name, p in processes(rec)}
    table = [{"name": name, "pid": p.get("pid"), "port": port, "cpus": format_cpulist(tuple(p.get("cpus") or ())),
              "alive": procs[name]} for name, p, port in _processes_with_ports(rec)]
    front_ok = alive and rec["state"] == "serving" and healthy(rec["front"]["url"] + "/health")
    # The record keeps each worker's last supervised status; once the launcher is gone nothing is up.
    workers = {w["index"]: w["status"] if alive else "stopped" for w in rec["workers"]}
    health = {w["index"]: {"engine": alive and healthy(w["engine_url"] + "/health"),
                           "serve": alive and healthy(w["serve_url"] + "/health")} for w in rec["workers"]}
    ok = alive and front_ok and all(s == "up" for s in workers.values())
    state = rec["state"] if alive or rec["state"] in ("stopped", "failed", "refused") else "dead"
    summary = {"state": state, "launcher_alive": alive, "launcher_pid": launcher.get("pid"),
               "front": rec["front"]["url"], "front_healthy": front_ok, "processes_alive": procs,
               "processes": table, "run_dir": str(run_dir), "workers": workers, "health": health, "profile": rec["profile_name"],
               "plan_sha256": rec["plan_sha256"], "restarts": {w["index"]: len(w["restarts"]) for w in rec["workers"]},
               "restart_policy": rec.get("restart_policy"),
               "restart_budget": {w["index"]: w.get("restart_budget") for w in rec["workers"]},
               "front_restart_budget": rec["front"].get("restart_budget"),
               "rotation": {w["index"]: (w.get("rotation") or [None])[-1] for w in rec["workers"]}}
    return (0 if ok else 1), summary


def stop(run_dir: Path, timeout: float = 30.0) -> list[str]:
    """Stop a launch from its record: SIGTERM the launcher, wait, then reap any recorded leftovers."""
    rec = read_record(run_dir)
    notes = []
    launcher = rec["launcher"]
    if is_alive(launcher.get("pid"), launcher.get("ticks")):
        os.kill(launcher["pid"], signal.SIGTERM)
        deadline = time.monotonic() + timeout
        while is_alive(launcher["pid"], launcher.get("ticks")) and time.monotonic() < deadline:
            time.sleep(0.1)
        if is_alive(launcher["pid"], launcher.get("ticks")):
            notes.append(f"launcher pid {launcher['pid']} did not stop in {timeout:.0f} s; killing it")
            os.kill(launcher["pid"], signal.SIGKILL)
        else:
            notes.append(f"launcher pid {launcher['pid']} stopped")
    else:
        notes.append("launcher was not running")
    # Whatever the launcher could not stop (it was killed): only PIDs whose start time matches.
    for name, p in processes(read_record(run_dir)):
        for sig in (signal.SIGTERM, signal.SIGKILL):
            if not is_alive(p.get("pid"), p.get("ticks")):
                break
            os.kill(p["pid"], sig)
            notes.append(f"{name} pid {p['pid']}: sent {signal.Signals(sig).name}")
            deadline = time.monotonic() + 5
            while is_alive(p.get("pid"), p.get("ticks")) and time.monotonic() < deadline:
                time.sleep(0.05)
        # Each process led its own group (new session): members left after the leader are ours.
        left = group_members(p.get("pid"))
        if left:
            os.killpg(p["pid"], signal.SIGKILL)
            notes.append(f"{name}: killed {len(left)} leftover process(es) of its group")
    return notes


def group_members(pgid: int | None) -> list[int]:
    """Live processes whose process group is `pgid`."""
    if not pgid:
        return []
    out = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            text = stat.read_text()
        except OSError:
            continue
        fields = text[text.rindex(")") + 2:].split()
        if fields[0] not in ("Z", "X") and int(fields[2]) == pgid:
            out.append(int(stat.parent.name))
    return out


def dump(obj: Any) -> str:
    return json.dumps(obj, indent=2, sort_keys=True)
