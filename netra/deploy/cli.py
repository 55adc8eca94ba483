"""`netra plan | launch | status | stop | compose`.

Registration imports nothing heavy (no torch, no httpx): each verb imports its module when it runs.
Exit codes: 0 success; 1 failure (a launch that failed or is not healthy); 2 refused (a profile,
lock, placement or audit problem, named in the message).
"""

from __future__ import annotations

import argparse
import importlib
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any


def _add_profile_args(p: argparse.ArgumentParser, *, default: str | None) -> None:
    p.add_argument("--profile", default=default, help="profile name (launcher/NAME.yaml) or path"
                   + (f" (default {default})" if default else ""))
    p.add_argument("--set", dest="sets", action="append", default=[], metavar="KEY=VALUE",
                   help="override one profile key (dotted, YAML value), e.g. engine.stream_interval=4")
    p.add_argument("--workers", type=int, help="number of workers (default: the profile's dp)")
    p.add_argument("--front-port", type=int, help="public port (default: the profile's front.port)")
    p.add_argument("--front-host", help="public address (default: the profile's front.host)")
    p.add_argument("--port-base", type=int,
                   help="worker i: engine on PORT_BASE+2i, response layer on PORT_BASE+2i+1")
    p.add_argument("--run-dir", type=Path, help="record, logs, nginx files (default: $NETRA_RUN_DIR/PROFILE)")


def _resolve(args: argparse.Namespace) -> tuple[Any, Any, Any]:
    """(base profile, profile with --set applied, overrides)."""
    from netra.deploy.plan import Overrides
    from netra.deploy.profile import load_profile

    base = load_profile(args.profile)
    prof = base.with_sets(args.sets)
    ov = Overrides(front_port=args.front_port, front_host=args.front_host, port_base=args.port_base,
                   run_dir=args.run_dir, workers=args.workers)
    return base, prof, ov


def print_plan(plan: Any) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console(width=max(160, Console().width))
    t = Table(title=f"plan {plan.profile_name}: {plan.dp} worker(s), {plan.engine_kind} on {plan.target}")
    for col in ("worker", "GPU", "NUMA", "CPU set", "cores", "mem", "engine port", "serve port", "environment"):
        t.add_column(col)
    for w in plan.workers:
        gpu = "-" if w.gpu is None else f"{w.gpu} ({w.gpu_pci})"
        env = " ".join(f"{k}={v}" for k, v in w.engine_env.items())
        t.add_row(str(w.index), gpu, str(w.numa_node if w.numa_node is not None else "-"), w.cpulist,
                  str(w.physical_cores), str(w.mem_node if w.mem_node is not None else "-"), str(w.engine_port),
                  str(w.serve_port), env)
    console.print(t)
    plugin_lines = _plugin_lines(plan)
    for w in plan.workers:
        console.print(f"worker {w.index} engine: {' '.join(w.engine_argv)}", soft_wrap=True, markup=False)
        console.print(f"worker {w.index} serve:  {' '.join(w.serve_argv)}", soft_wrap=True, markup=False)
        for line in plugin_lines.get(w.index, []):
            console.print(f"worker {w.index} {line}", soft_wrap=True, markup=False)
    f = plan.front
    console.print(f"front: nginx {f.balance} on {f.host}:{f.port}, worker_processes {f.worker_processes}, "
                  f"worker_connections {f.worker_connections}, keepalive {f.keepalive}, "
                  f"worker_rlimit_nofile {f.worker_rlimit_nofile}, max_fails {f.max_fails} / fail_timeout "
                  f"{f.fail_timeout_s}s, read timeout {f.read_timeout_s}s", markup=False)
    from netra.deploy.metrics import targets

    console.print(f"metrics: {f.url}/metrics has every worker's series (`netra launch`); per-worker scrape "
                  "targets (each series labelled worker, model_name):", markup=False)
    for target in targets(plan):
        console.print(f"  worker {target.worker} {target.process}: {target.url}", markup=False)
    console.print(f"topology: {plan.topology}", markup=False, soft_wrap=True)
    for note in plan.notes:
        console.print(f"note: {note}", markup=False)
    console.print(f"profile sha256 {plan.profile_sha256}", markup=False)


def _plugin_lines(plan: Any) -> dict[int, list[str]]:
    """SGLang workers: Netra's plugin (on or off) and, per tactic domain, the hook and its contracts."""
    if plan.engine_kind != "sglang":
        return {}
    from netra.plugins import sglang as plugin

    out: dict[int, list[str]] = {}
    for w in plan.workers:
        if not w.tactics:
            out[w.index] = [f"plugin: none (SGLANG_PLUGINS={w.engine_env.get('SGLANG_PLUGINS')}): stock SGLang"]
            continue
        lines = [f"plugin: {plugin.ENTRY_POINT} (SGLANG_PLUGINS={w.engine_env.get('SGLANG_PLUGINS')}), tactics "
                 f"{', '.join(w.tactics)}, evidence {w.plugin_evidence}"]
        lines += [f"  tactic {line}" for line in plugin.describe(w.tactics, plan.target)]
        out[w.index] = lines
    return out


def _plan(args: argparse.Namespace) -> int:
    from netra.deploy.plan import PlanError, make_plan
    from netra.deploy.profile import ProfileError, render_schema
    from netra.deploy.topology import PlacementError
    from netra.deploy.verify import LaunchRefused, write_profile_lock
    from netra.resources import DataMissing

    try:
        if args.write_schema or args.relock:
            from netra.resources import require_checkout

            require_checkout("netra plan --write-schema / --relock")
        if args.write_schema:
            from netra.deploy.profile import SCHEMA_PATH

            SCHEMA_PATH.write_text(render_schema())
            print(f"wrote {SCHEMA_PATH}")
            return 0
        if args.relock:
            names = None
            if args.profile:
                from netra.deploy.profile import load_profile

                names = [load_profile(args.profile).name]
            for name, digest in write_profile_lock(names).items():
                if names is None or name in names:
                    print(f"locked {name} {digest}")
            return 0
        if not args.profile:
            print("netra plan: --profile is required", file=sys.stderr)
            return 2
        _, prof, ov = _resolve(args)
        plan = make_plan(prof, args.topology, ov)
    except (ProfileError, PlanError, PlacementError, LaunchRefused, DataMissing) as exc:
        print(f"netra plan: {exc}", file=sys.stderr)
        return 2
    if args.json:
        # Exactly the hashed bytes (no trailing newline): `netra plan --json | sha256sum` is the plan hash.
        sys.stdout.write(plan.canonical_json())
        sys.stdout.flush()
        return 0
    if args.table:
        print_plan(plan)
        print(f"plan sha256 {plan.sha256()}")
        return 0
    print_plan(plan)
    print("canonical JSON:")
    print(plan.canonical_json())
    print(f"plan sha256 {plan.sha256()}")
    return 0


def _detach(args: argparse.Namespace, run_dir: Path, timeout: float) -> int:
    from netra.deploy.record import RecordError, read_record

    # The same launch, in the foreground of a new session (rebuilt from the parsed arguments, so a
    # caller of `netra.cli.main([...])` is detached correctly whatever its own sys.argv).
    argv = ["launch", "--profile", str(args.profile), "--run-dir", str(run_dir)]
    for item in args.sets:
        argv += ["--set", item]
    for flag, value in (("--workers", args.workers), ("--front-port", args.front_port),
                        ("--front-host", args.front_host), ("--port-base", args.port_base)):
        if value is not None:
            argv += [flag, str(value)]
    if args.strict is not None:
        argv.append("--strict" if args.strict else "--no-strict")
    run_dir.mkdir(parents=True, exist_ok=True)
    log = run_dir / "launcher.log"
    with log.open("ab") as out:
        child = subprocess.Popen([sys.executable, "-m", "netra", *argv], stdin=subprocess.DEVNULL, stdout=out,
                                 stderr=subprocess.STDOUT, start_new_session=True)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        code = child.poll()
        try:
            rec = read_record(run_dir)
        except RecordError:
            rec = None
        if rec is not None and rec["launcher"]["pid"] == child.pid and rec["state"] == "serving":
            print(f"serving {rec['profile_name']} on {rec['front']['url']}/v1 (launcher pid {child.pid}; "
                  f"`netra status --run-dir {run_dir}`, `netra stop --run-dir {run_dir}`)")
            return 0
        if code is not None:
            tail = log.read_text(errors="replace").splitlines()[-25:]
            print("\n".join(tail), file=sys.stderr)
            return int(code) or 1
        time.sleep(0.2)
    print(f"netra launch --detach: not serving after {timeout:.0f} s; stopping it (log {log})", file=sys.stderr)
    child.terminate()
    try:
        child.wait(30)
    except subprocess.TimeoutExpired:
        child.kill()
    return 1


def _shown_and_verified(plan: Any, v: Any) -> bool:
    """Print the plan, its hash and the verification's warnings; False (refusal printed) on problems."""
    from netra.deploy.verify import LaunchRefused

    print_plan(plan)
    print(f"plan sha256 {plan.sha256()}")
    for w in v.warnings:
        print(f"warning: {w}", file=sys.stderr)
    if v.problems:
        print(str(LaunchRefused(v.problems)), file=sys.stderr)
        return False
    return True


def _launch(args: argparse.Namespace) -> int:
    from netra.deploy.plan import PlanError, make_plan
    from netra.deploy.profile import ProfileError
    from netra.deploy.topology import PlacementError
    from netra.deploy.verify import LaunchRefused, verify

    try:
        base, prof, ov = _resolve(args)
        v = verify(prof, base=base, strict=args.strict)
    except (ProfileError, LaunchRefused) as exc:
        print(f"launch refused: {exc}", file=sys.stderr)
        return 2
    key_env = prof.serve.api_key_env
    if key_env and not os.environ.get(key_env):
        v.problems.append(f"serve.api_key_env: the profile requires an API key, but ${key_env} is not set")
    try:
        plan = make_plan(prof, None, ov)
    except (PlanError, PlacementError) as exc:
        # Report every cause at once: the placement problem and whatever verification found.
        print(str(LaunchRefused([str(exc), *v.problems])), file=sys.stderr)
        return 2
    if args.compose or (args.compose is None and prof.target == "cpu" and prof.image is not None):
        return _launch_compose(args, base, prof, v)
    if args.detach:
        if v.problems:
            print(str(LaunchRefused(v.problems)), file=sys.stderr)
            return 2
        return _detach(args, Path(plan.run_dir), float(plan.supervisor["health_timeout_s"]) * 2 + 60)
    if not _shown_and_verified(plan, v):
        return 2
    from netra.deploy.launch import Launch

    strict = prof.strict if args.strict is None else args.strict
    meta = {"profile_base_sha256": base.sha256(), "set_overrides": list(args.sets),
            "overrides": plan.overrides, "strict": strict}
    return Launch(plan, v, strict=strict, meta=meta, log=lambda m: print(m, flush=True)).run()


def _launch_compose(args: argparse.Namespace, base: Any, prof: Any, v: Any) -> int:
    """The profile's plan in containers, through Docker Compose (netra/deploy/containers.py)."""
    from netra.deploy import compose
    from netra.deploy.containers import ComposeLaunch
    from netra.deploy.imagebuild import ImageBuildError
    from netra.deploy.plan import Overrides, default_run_dir

    ov = Overrides(front_port=args.front_port, front_host=args.front_host, port_base=args.port_base,
                   workers=args.workers)
    try:
        _, plan = compose.build(prof, None, ov)
    except compose.ComposeError as exc:
        print(f"launch refused: {exc}", file=sys.stderr)
        return 2
    if not _shown_and_verified(plan, v):
        return 2
    run_dir = Path(args.run_dir if args.run_dir is not None else default_run_dir(prof)).absolute()
    meta = {"profile_base_sha256": base.sha256(), "set_overrides": list(args.sets), "overrides": ov.to_dict()}
    try:
        launch = ComposeLaunch(prof, plan, v, run_dir, compose_file=args.compose_file, meta=meta,
                               log=lambda m: print(m, flush=True))
    except ImageBuildError as exc:
        print(f"launch refused: {exc}", file=sys.stderr)
        return 2
    return launch.run()


def _run_dir(args: argparse.Namespace) -> Path:
    if args.run_dir is not None:
        return Path(args.run_dir)
    from netra.deploy.plan import default_run_dir
    from netra.deploy.profile import load_profile

    return default_run_dir(load_profile(args.profile))


def _status(args: argparse.Namespace) -> int:
    from netra.deploy.launch import dump, status
    from netra.deploy.record import RecordError, read_record

    try:
        run_dir = _run_dir(args)
        rec = read_record(run_dir)
        if rec.get("mode") == "compose":
            from netra.deploy import containers
            from netra.deploy.imagebuild import ImageBuildError

            try:
                code, summary = containers.status(rec)
            except ImageBuildError as exc:
                print(f"netra status: {exc}", file=sys.stderr)
                return 1
            print(dump(summary) if args.json else "\n".join(
                [f"{summary['profile']}: {summary['state']} on {summary['front']} (compose project "
                 f"{summary['project']}, front {'healthy' if summary['front_healthy'] else 'NOT healthy'})"]
                + [f"  {name}: {st}" for name, st in summary["containers"].items()]))
            return code
        code, summary = status(run_dir)
    except RecordError as exc:
        print(f"netra status: {exc}", file=sys.stderr)
        return 1
    if args.json:
        print(dump(summary))
        return code
    print(status_text(summary))
    return code


def status_text(summary: dict[str, Any]) -> str:
    """`netra status` for a person: the launch, then one line per process and per worker."""
    up = summary["launcher_alive"]
    lines = [f"{summary['profile']}: {summary['state']} on {summary['front']} (launcher pid "
             f"{summary['launcher_pid']} {'running' if up else 'not running'}; front "
             f"{'healthy' if summary['front_healthy'] else 'NOT healthy'}; plan {summary['plan_sha256'][:16]}; "
             f"run dir {summary['run_dir']})"]
    lines.append(f"  {'process':<16} {'pid':>8} {'port':>6}  {'CPU set':<12} state")
    for p in summary["processes"]:
        lines.append(f"  {p['name']:<16} {p['pid'] or '-':>8} {p['port'] or '-':>6}  {p['cpus'] or 'all':<12} "
                     f"{'up' if p['alive'] else 'stopped'}")
    for index, st in summary["workers"].items():
        h = summary["health"][index]
        health = (f"engine {'healthy' if h['engine'] else 'NOT healthy'}, response layer "
                  f"{'healthy' if h['serve'] else 'NOT healthy'}") if up else "not running"
        budget = (summary.get("restart_budget") or {}).get(index)
        in_window = f" ({budget['in_window']}/{budget['max_restarts']} in the window)" if budget else ""
        lines.append(f"  worker {index}: {st}, {health}, restarts {summary['restarts'][index]}{in_window}")
        last = (summary.get("rotation") or {}).get(index)
        if last:
            lines.append(f"    rotation: {last['event']} at {last['time']} ({last['why']})")
    policy = summary.get("restart_policy")
    if policy:
        front = summary.get("front_restart_budget") or {}
        lines.append(f"  restart budget: {policy['max_restarts']} restarts within {policy['window_s']:.0f} s per "
                     f"worker and for nginx (one more gives it up); nginx {front.get('in_window', 0)}/"
                     f"{policy['max_restarts']} in the window")
    return "\n".join(lines)


def _stop(args: argparse.Namespace) -> int:
    from netra.deploy.launch import stop
    from netra.deploy.record import RecordError, read_record

    try:
        run_dir = _run_dir(args)
        if read_record(run_dir).get("mode") == "compose":
            from netra.deploy import containers

            notes = containers.stop(run_dir)
        else:
            notes = stop(run_dir, timeout=args.timeout)
    except RecordError as exc:
        print(f"netra stop: {exc}", file=sys.stderr)
        return 1
    for n in notes:
        print(n)
    return 0


def register(sub: Any) -> None:
    from netra.cli import add_verb

    p = add_verb(sub, "plan")
    _add_profile_args(p, default=None)
    p.add_argument("--topology", type=Path, help="a sysfs mirror (numa/<fixture>) instead of this machine")
    p.add_argument("--json", action="store_true", help="print only the canonical JSON (sha256 it to get the hash)")
    p.add_argument("--table", action="store_true", help="print only the table and the hash")
    p.add_argument("--relock", action="store_true",
                   help="write the profile's sha256 (every profile's without --profile) into launcher/lock.json")
    p.add_argument("--write-schema", action="store_true", help="regenerate launcher/schema.json")
    p.set_defaults(func=_plan)

    p = add_verb(sub, "launch")
    _add_profile_args(p, default="local")
    p.add_argument("--detach", action="store_true", help="return once serving; the launcher keeps running")
    p.add_argument("--strict", action=argparse.BooleanOptionalAction, default=None,
                   help="override the profile's strict lock policy")
    p.add_argument("--compose", action=argparse.BooleanOptionalAction, default=None,
                   help="start the plan in containers with Docker Compose (default: for a cpu profile that "
                        "names an image, such as local-compose)")
    p.add_argument("--compose-file", type=Path,
                   help="start this file rendered by `netra compose` (refused if it differs from a fresh render)")
    p.set_defaults(func=_launch)

    for verb, func in (("status", _status), ("stop", _stop)):
        p = add_verb(sub, verb)
        p.add_argument("--run-dir", type=Path, help="the launch's run dir (default: $NETRA_RUN_DIR/PROFILE)")
        p.add_argument("--profile", default="local", help="the profile whose default run dir to use")
        if verb == "status":
            p.add_argument("--json", action="store_true", help="print the summary as JSON")
        else:
            p.add_argument("--timeout", type=float, default=30.0, help="seconds to wait for a clean stop")
        p.set_defaults(func=func)

    compose = importlib.import_module("netra.deploy.compose")
    p = add_verb(sub, "compose")
    compose.add_arguments(p)
    p.set_defaults(func=lambda a: int(compose.main(a) or 0))
