"""Launch through Docker Compose: `netra launch --profile local-compose` (any profile naming a built image).

The compose file is the one `netra compose` renders (`netra.deploy.compose.build`, the renderer of
the 8-GPU files), written to `RUN_DIR/compose.yaml`, or an operator's file given with
`--compose-file`, which must equal a fresh render of the same profile (an edit after rendering, or a
profile changed since, is refused naming the file). Then, in the order of the process launcher:

1. the image: the lock must record a build of the profile's image (`netra images build NAME`), the
   engine must hold that image ID, its tag must point at it, and the file must run exactly it;
   otherwise the launch refuses naming the image (and, when it is missing, the command to build it);
2. workers up (`docker compose up -d --no-deps worker<i>...`): each container verifies its code
   objects at start (`netra.deploy.entry`); each must answer `/health`, and a container that exits
   or restarts meanwhile fails the launch with its log;
3. response layers up, each healthy;
4. the audit of every container, from the host: its main process (host PID, below docker-init)
   has the plan's command line, environment and CPU set (`/proc/PID/cmdline|environ|status`), the
   engine reports the plan's options at `/server_info`, and every code object the image carries is
   in the container's own filesystem with its locked sha256 (`/proc/PID/root`), besides any that
   its process tree maps;
5. only then the front (`up -d --no-deps front`), healthy through to a response layer;
6. the launch record `RUN_DIR/launch.json` (mode `compose`) from the containers started: IDs, names,
   image, host PIDs and start times, command lines, environments, CPU sets, audit.

Docker keeps the containers running (restart policy from the plan); `netra status` reads them back,
`netra stop` runs `docker compose down`. Any failure before serving takes everything down again.
"""

from __future__ import annotations

import hashlib
import json
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from netra.deploy import compose as cmp
from netra.deploy import images as il
from netra.deploy.audit import audit_options, audit_process, proc_cmdline, proc_tree
from netra.deploy.launch import StartError, port_free
from netra.deploy.plan import Plan
from netra.deploy.record import (
    RECORD_VERSION,
    now_utc,
    proc_start_ticks,
    read_record,
    record_path,
    write_json,
)
from netra.deploy.supervisor import healthy
from netra.deploy.verify import LaunchRefused, Verification
from netra.resources import sha256_file

POLL_S = 0.5
IMAGE_PYTHON = "/opt/venv/bin/python3"  # the images' interpreter (ENTRYPOINT)
IMAGE_ROOT = "/opt/netra"  # REPO_ROOT inside the images
IMAGE_BUILD_DIR = "/opt/netra/build"


def project_name(profile_name: str, run_dir: Path) -> str:
    """One Compose project per run dir, so that launches with other run dirs never collide."""
    return f"netra-{profile_name}-{hashlib.sha256(str(run_dir.resolve()).encode()).hexdigest()[:8]}"


def image_problems(profile: Any, c: Any) -> list[str]:
    """The locked build of the profile's image, against what the engine holds."""
    from netra.deploy.imagebuild import image_id

    name = profile.image
    entries = il.load_lock()
    entry = entries.get(name)
    if entry is None:
        return [f"image {name!r} of profile {profile.name!r} is not in the image lock {il.lock_path()}"]
    how = (f"`netra images base {entry.base} && netra images build {name}`" if entry.base else
           f"`netra images build {name}`")
    if entry.built is None:
        return [f"image {name!r} is not built: the image lock {il.lock_path()} records no build of it (run {how})"]
    want = entry.built["id"]
    if image_id(c, want) != want:
        return [f"image {name!r} ({want}) is missing from this Docker engine (run {how})"]
    problems = []
    tagged = image_id(c, entry.tag)
    if tagged != want:
        problems.append(f"image {name!r}: the engine's {entry.tag} is {tagged or 'absent'}, the image lock records "
                        f"{want} (an image ID that differs from the lock: rebuild and record it with {how})")
    labels = c.images.get(want).attrs.get("Config", {}).get("Labels") or {}
    if labels.get("org.netra.image") != name:
        problems.append(f"image {name!r}: {want} is labelled {labels.get('org.netra.image')!r}, not {name!r}")
    return problems


def file_problems(path: Path, doc: dict[str, Any]) -> list[str]:
    """An operator's compose file against a fresh render of the same profile (`doc`)."""
    import yaml

    try:
        got = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as exc:
        return [f"compose file {path}: cannot be read ({exc})"]
    if not isinstance(got, dict) or not isinstance(got.get("x-netra"), dict):
        return [f"compose file {path} was not rendered by `netra compose` (no x-netra section)"]
    meta, want = got["x-netra"], doc["x-netra"]
    problems = []
    for key, what in (("profile_sha256", "profile"), ("plan_sha256", "plan"), ("image_id", "image")):
        if meta.get(key) != want.get(key):
            problems.append(f"compose file {path}: {what} hash mismatch: the file says {meta.get(key)}, profile "
                            f"{want['profile']!r} renders {want.get(key)} (edited after rendering, or the profile "
                            f"changed since: re-render with `netra compose --profile {want['profile']} -o {path}`)")
    if not problems and got != doc:
        keys = [f"{top}.{k}" for top in sorted(set(got) | set(doc)) if isinstance(doc.get(top), dict)
                for k in sorted(set(got.get(top) or {}) | set(doc[top]))
                if (got.get(top) or {}).get(k) != doc[top].get(k)] or ["(top level)"]
        problems.append(f"compose file {path} was edited after rendering: {', '.join(keys[:6])} differ from a fresh "
                        f"render of profile {want['profile']!r}")
    return problems


def main_pid(state_pid: int) -> int:
    """The service's own process: the child of docker-init when the container runs with `init`."""
    cmd = proc_cmdline(state_pid)
    if cmd and Path(cmd[0]).name in ("docker-init", "tini"):
        kids = [p for p in proc_tree(state_pid) if p != state_pid]
        if kids:
            return kids[0]
    return state_pid


def exec_argv(argv: tuple[str, ...] | list[str]) -> list[str]:
    """The command as the image's entry point executes it (`netra VERB` -> `python -m netra VERB`)."""
    out = list(argv)
    return [IMAGE_PYTHON, "-m", "netra", *out[1:]] if out[:1] == ["netra"] else out


def container_code_objects(index: int, pid: int, kernel_lock: Path) -> list[str]:
    """Every code object of the kernel lock, in the container's filesystem, with its locked sha256."""
    data = json.loads(kernel_lock.read_text())
    root = Path(f"/proc/{pid}/root")
    problems = []
    for e in data["code_objects"]:
        # Where the image keeps it: cubins under its build dir, Triton modules in its source tree.
        where = f"{IMAGE_ROOT if e.get('kind') == 'triton' else IMAGE_BUILD_DIR}/{e['code_object']}"
        path = root / where.lstrip("/")
        label = f"{e['family']}/{e['name']}"
        if not path.is_file():
            problems.append(f"worker {index}: code object {where} ({label}) is missing in its container")
        elif sha256_file(path) != e["sha256"]:
            problems.append(f"worker {index}: tampered code object {where} ({label}) in its container: sha256 "
                            f"differs from the kernel lock")
    return problems


class ComposeLaunch:
    def __init__(self, profile: Any, plan: Plan, verification: Verification, run_dir: Path, *,
                 compose_file: Path | None = None, meta: dict[str, Any] | None = None,
                 log: Callable[[str], None] = print) -> None:
        from netra.deploy.imagebuild import client

        self.profile = profile
        self.plan = plan  # the container plan (run dir /run/netra/<profile>)
        self.verification = verification
        self.run_dir = run_dir
        self.given_file = compose_file
        self.file = compose_file or run_dir / "compose.yaml"
        self.project = project_name(profile.name, run_dir)
        self.meta = meta or {}
        self.log = log
        self.state = "starting"
        self.message = ""
        self.audit: dict[int, list[str]] = {}
        self.docker = client()

    # --- compose ----------------------------------------------------------------------------------

    def compose(self, *args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
        argv = [str(cmp.compose_binary()), "-p", self.project, "-f", str(self.file), *args]
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False)
        if proc.returncode != 0:
            raise StartError(f"docker compose {' '.join(args)} failed: {(proc.stderr or proc.stdout).strip()[-1500:]}")
        return proc

    def container(self, service: str) -> Any:
        found = self.docker.containers.list(all=True, filters={
            "label": [f"com.docker.compose.project={self.project}", f"com.docker.compose.service={service}"]})
        if not found:
            raise StartError(f"service {service}: no container in project {self.project}")
        c = found[0]
        c.reload()
        return c

    def _logs(self, c: Any) -> str:
        return "\n".join(c.logs(tail=25).decode(errors="replace").splitlines()[-25:])

    def _wait(self, services: dict[str, str], timeout: float) -> None:
        """Each service's URL answers 200; a container that exits or restarts fails the launch."""
        pending = dict(services)
        deadline = time.monotonic() + timeout
        while pending:
            for service, url in list(pending.items()):
                c = self.container(service)
                st = c.attrs["State"]
                restarts = int(c.attrs.get("RestartCount") or 0)
                if st.get("Restarting") or st.get("Status") in ("exited", "dead") or restarts:
                    how = (f"exited and was restarted {restarts} time(s)" if restarts or st.get("Restarting")
                           else f"exited with {st.get('ExitCode')}")
                    raise StartError(f"container {c.name} ({service}) {how} during startup; its log:\n"
                                     f"{self._logs(c)}")
                if healthy(url):
                    del pending[service]
            if pending and time.monotonic() > deadline:
                raise StartError(f"{', '.join(pending)}: not healthy within {timeout:.0f} s")
            time.sleep(POLL_S)

    # --- audit ------------------------------------------------------------------------------------

    def audit_worker(self, i: int) -> list[str]:
        import httpx

        from netra.deploy.verify import KERNEL_LOCK

        wp = self.plan.workers[i]
        engine = self.container(f"worker{i}")
        serve = self.container(f"serve{i}")
        epid, spid = main_pid(engine.attrs["State"]["Pid"]), main_pid(serve.attrs["State"]["Pid"])
        doc_env = dict(wp.engine_env)
        problems = audit_process(wp, epid, exec_argv(wp.engine_argv), doc_env)
        problems += audit_process(wp, spid, exec_argv(wp.serve_argv), dict(wp.serve_env))
        for c in (engine, serve):
            if c.image.id != self.image_id:
                problems.append(f"worker {i}: container {c.name} runs image {c.image.id}, the lock records "
                                f"{self.image_id}")
        try:
            resp = httpx.get(wp.engine_url + "/server_info", timeout=10)
            resp.raise_for_status()
            problems += audit_options(wp, resp.json())
        except (httpx.HTTPError, ValueError) as exc:
            problems.append(f"worker {i}: GET /server_info failed ({exc}); its options cannot be audited")
        problems += container_code_objects(i, epid, KERNEL_LOCK)
        return problems

    def _proc(self, c: Any, argv: list[str], env: dict[str, str], cpus: str) -> dict[str, Any]:
        pid = main_pid(c.attrs["State"]["Pid"]) if c.attrs["State"].get("Pid") else None
        return {"container": c.name, "container_id": c.id, "image": c.image.id, "pid": pid,
                "ticks": proc_start_ticks(pid) if pid else None, "start_time": c.attrs["State"].get("StartedAt"),
                "argv": argv, "env": env, "cpus": c.attrs["HostConfig"].get("CpusetCpus") or cpus,
                "restart_count": c.attrs.get("RestartCount", 0), "status": c.attrs["State"].get("Status")}

    # --- record -----------------------------------------------------------------------------------

    def record(self) -> dict[str, Any]:
        p = self.plan
        workers = []
        for w in p.workers:
            item: dict[str, Any] = {
                "index": w.index, "cpus": w.cpulist, "engine_port": w.engine_port, "serve_port": w.serve_port,
                "engine_url": w.engine_url, "serve_url": w.serve_url, "audit": self.audit.get(w.index, [])}
            for role, argv, env in (("engine", w.engine_argv, w.engine_env), ("serve", w.serve_argv, w.serve_env)):
                try:
                    c = self.container(f"{'worker' if role == 'engine' else 'serve'}{w.index}")
                    item[role] = self._proc(c, exec_argv(argv), dict(env), w.cpulist)
                except StartError:
                    item[role] = None
            workers.append(item)
        try:
            front = self._proc(self.container("front"), [], {}, "")
        except StartError:
            front = None
        return {
            "version": RECORD_VERSION, "mode": "compose", "state": self.state, "message": self.message,
            "updated": now_utc(), "profile_name": p.profile_name, "profile_sha256": p.profile_sha256,
            "profile": p.profile, "plan_sha256": p.sha256(), "run_dir": str(self.run_dir),
            "container_run_dir": p.run_dir,
            "compose": {"file": str(self.file), "file_sha256": sha256_file(self.file) if self.file.is_file() else None,
                        "project": self.project, "binary": str(cmp.compose_binary())},
            "image": {"name": self.profile.image, "id": getattr(self, "image_id", None), "lock": str(il.lock_path())},
            "front": {"url": p.front.url, "host": p.front.host, "port": p.front.port, "container": front},
            "verification": self.verification.to_dict(), "workers": workers, **self.meta}

    def save(self) -> None:
        write_json(record_path(self.run_dir), self.record())

    # --- start / stop -----------------------------------------------------------------------------

    def prepare(self) -> None:
        """Refusals before anything runs: the image against the lock, the compose file, free ports."""
        doc, _ = cmp.build(self.profile, None, self._overrides())
        problems = image_problems(self.profile, self.docker)
        if self.given_file is not None:
            problems += file_problems(self.given_file, doc)
        busy = [port for host, port in [(self.plan.front.host, self.plan.front.port)]
                + [("127.0.0.1", q) for w in self.plan.workers for q in (w.engine_port, w.serve_port)]
                if not port_free(host, port)]
        problems += [f"port {port} is already in use (pick others with --front-port / --port-base)" for port in busy]
        if problems:
            raise LaunchRefused(problems)
        self.image_id = str(il.load_lock()[self.profile.image].built_id)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        if self.given_file is None:
            self.file.write_text(cmp.render(self.profile, None, overrides=self._overrides(),
                                            command=f"netra launch --profile {self.profile.name}"))
        try:
            cmp.validate(self.file)
        except cmp.ComposeError as exc:
            raise LaunchRefused([str(exc)]) from None

    def _overrides(self) -> Any:
        from netra.deploy.plan import Overrides

        o = self.plan.overrides
        return Overrides(front_port=o.get("front_port"), front_host=o.get("front_host"),
                         port_base=o.get("port_base"), workers=o.get("workers"))

    def start(self) -> None:
        self.prepare()
        (self.run_dir / "plan.json").write_text(self.plan.canonical_json())
        self.save()
        timeout = float(self.plan.supervisor["health_timeout_s"])
        n = range(len(self.plan.workers))
        self.compose("up", "-d", "--no-deps", *(f"worker{i}" for i in n))
        self.log(f"started {len(n)} engine container(s); waiting for /health")
        self._wait({f"worker{i}": self.plan.workers[i].engine_url + "/health" for i in n}, timeout)
        self.compose("up", "-d", "--no-deps", *(f"serve{i}" for i in n))
        self._wait({f"serve{i}": self.plan.workers[i].serve_url + "/health" for i in n}, timeout)
        problems: list[str] = []
        for i in n:
            self.audit[i] = self.audit_worker(i)
            problems += self.audit[i]
        if problems:
            raise LaunchRefused(problems)
        self.log("every container is healthy and audited; starting the front")
        self.compose("up", "-d", "--no-deps", "front")
        self._wait({"front": self.plan.front.url + "/health"}, 60)
        self.state = "serving"
        self.save()

    def down(self) -> None:
        if self.file.is_file():
            try:
                self.compose("down", "--volumes", "--timeout", "10")
            except StartError as exc:
                self.log(f"warning: {exc}")

    def run(self) -> int:
        """Start; 0 serving (the containers keep running), 1 failed, 2 refused (everything taken down)."""
        code = 0
        try:
            self.start()
            self.log(f"serving {self.plan.profile_name} on {self.plan.front.url}/v1 from containers (compose project "
                     f"{self.project}; `netra status --run-dir {self.run_dir}`, `netra stop --run-dir {self.run_dir}`)")
            return 0
        except LaunchRefused as exc:
            self.state, self.message, code = "refused", str(exc), 2
            self.log(str(exc))
        except (StartError, OSError, subprocess.TimeoutExpired) as exc:
            self.state, self.message, code = "failed", str(exc), 1
            self.log(f"launch failed: {exc}")
        if self.run_dir.is_dir():
            self.save()
        self.down()
        return code


# --- from another shell ------------------------------------------------------------------------------


def status(rec: dict[str, Any]) -> tuple[int, dict[str, Any]]:
    """(exit code, summary) of a compose launch, from its record and the containers."""
    names = {"front": (rec["front"].get("container") or {}).get("container")}
    for w in rec["workers"]:
        for role in ("engine", "serve"):
            names[f"worker{w['index']}.{role}"] = (w.get(role) or {}).get("container")
    from netra.deploy.imagebuild import client

    docker = client()
    states = {k: _container_status(docker, v) for k, v in names.items()}
    health = {w["index"]: {"engine": healthy(w["engine_url"] + "/health"), "serve": healthy(w["serve_url"] + "/health")}
              for w in rec["workers"]}
    front_ok = healthy(rec["front"]["url"] + "/health")
    running = all(s == "running" for s in states.values())
    state = rec["state"] if rec["state"] != "serving" or running else "degraded"
    summary = {"state": state, "mode": "compose", "front": rec["front"]["url"], "front_healthy": front_ok,
               "containers": states, "health": health, "profile": rec["profile_name"], "plan_sha256": rec["plan_sha256"],
               "project": rec["compose"]["project"], "workers": {w["index"]: "up" if all(health[w["index"]].values())
                                                                 else "down" for w in rec["workers"]}}
    return (0 if front_ok and running and rec["state"] == "serving" else 1), summary


def _container_status(docker: Any, name: str | None) -> str:
    import docker as sdk

    if not name:
        return "absent"
    try:
        return str(docker.containers.get(name).status)
    except sdk.errors.NotFound:
        return "absent"


def stop(run_dir: Path) -> list[str]:
    rec = read_record(run_dir)
    c = rec["compose"]
    proc = subprocess.run([c["binary"], "-p", c["project"], "-f", c["file"], "down", "--volumes", "--timeout", "10"],
                          capture_output=True, text=True, check=False, timeout=300)
    rec["state"] = "stopped" if proc.returncode == 0 else rec["state"]
    rec["updated"] = now_utc()
    write_json(record_path(run_dir), rec)
    tail = (proc.stderr or proc.stdout).strip().splitlines()[-3:]
    return [f"docker compose down ({c['project']}): exit {proc.returncode}", *tail]
