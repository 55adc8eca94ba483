"""The in-pod audit: readiness is the audit.

Started by the serve role of `netra.k8s.pod` (the pod shares one PID namespace), it checks, every
`INTERVAL_S` for the pod's life, and writes the verdict to ``NETRA_AUDIT_FILE``; the response layer's
``/health`` answers 503 until the verdict passes (`netra.serve.app`). Invariants rather than fixed CPU ids
(the kubelet, not the plan, picks the cores):

* the engine answers ``/health`` on loopback;
* exactly the planned engine command line runs (`netra.k8s.pod.pod_commands`), with the planned
  environment;
* its CPU set is whole cores (every SMT sibling of each CPU), all on one NUMA node, and that node is
  the GPU's (where the container sees its GPU); as many CPUs as the pod requested (``NETRA_ENGINE_CPUS``);
* its memory is allowed only on that node (on a machine of several nodes);
* the code objects under the build dir equal the kernel lock, in this container and in the engine's
  (through ``/proc/PID/root``) (the entrypoints checked them at start; a later change is caught here);
* where SGLang runs with tactics, the plugin's evidence (`netra.deploy.audit.audit_plugin`).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

from netra.deploy.audit import proc_cmdline, proc_cpus, proc_environ
from netra.deploy.topology import format_cpulist, parse_cpulist

INTERVAL_S = 2.0


def _read(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except OSError:
        return None


def _status_list(pid: int, key: str) -> list[int]:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return parse_cpulist(line.split(":", 1)[1])
    return []


def find_process(argv: list[str]) -> int | None:
    """The PID whose command line is `argv` (the interpreter path aside), if any."""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            cmd = proc_cmdline(int(entry.name))
        except OSError:
            continue
        if len(cmd) == len(argv) and cmd[1:] == argv[1:]:
            return int(entry.name)
    return None


def cpu_problems(cpus: list[int], want_count: int | None, sys_root: Path = Path("/sys"),
                 gpu_node: int | None = None) -> list[str]:
    """Whole cores on one NUMA node (the GPU's when known), `want_count` of them when given."""
    problems = []
    got = set(cpus)
    if want_count is not None and len(got) != want_count:
        problems.append(f"engine CPU set {format_cpulist(sorted(got))} has {len(got)} CPUs, the pod requested "
                        f"{want_count}")
    for c in sorted(got):
        sib = _read(sys_root / f"devices/system/cpu/cpu{c}/topology/thread_siblings_list")
        if sib is not None and not set(parse_cpulist(sib)) <= got:
            problems.append(f"engine CPU {c} without its SMT siblings {sib}: not a whole core")
            break
    nodes = {}
    for node_dir in sorted((sys_root / "devices/system/node").glob("node[0-9]*")):
        text = _read(node_dir / "cpulist")
        if text:
            nodes[int(node_dir.name[4:])] = set(parse_cpulist(text))
    touched = sorted(n for n, cs in nodes.items() if cs & got)
    if len(touched) > 1:
        problems.append(f"engine CPUs {format_cpulist(sorted(got))} span NUMA nodes {touched}")
    if gpu_node is not None and gpu_node >= 0 and touched and touched != [gpu_node]:
        problems.append(f"engine CPUs are on NUMA node {touched}, its GPU on node {gpu_node}")
    return problems


def _same_root(pid: int) -> bool:
    """Whether process `pid` sees this process's root filesystem (false: another container's)."""
    try:
        theirs, ours = os.stat(f"/proc/{pid}/root"), os.stat("/")
    except OSError:
        return True
    return (theirs.st_dev, theirs.st_ino) == (ours.st_dev, ours.st_ino)


def gpu_numa_node(sys_root: Path = Path("/sys")) -> int | None:
    """The NUMA node of the one GPU this container sees (the NVIDIA runtime shows only the assigned ones)."""
    gpus = sorted(Path("/proc/driver/nvidia/gpus").glob("*")) if Path("/proc/driver/nvidia/gpus").is_dir() else []
    if len(gpus) != 1:
        return None
    node = _read(sys_root / "bus/pci/devices" / gpus[0].name.lower() / "numa_node")
    return int(node) if node is not None and node.lstrip("-").isdigit() else None


def audit_pod(plan: dict[str, Any], ordinal: int, *, engine_cpus: int | None = None, check_health: bool = True,
              build_dir: Path | None = None) -> list[str]:
    from netra.deploy.supervisor import resolve_argv
    from netra.k8s.pod import pod_commands

    cmds = pod_commands(plan, ordinal, plan["target"] != "cpu")
    problems: list[str] = []
    if check_health:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{cmds['engine_port']}/health", timeout=3) as r:
                if r.status != 200:
                    problems.append(f"engine /health answers {r.status}")
        except OSError as exc:
            problems.append(f"engine /health does not answer: {exc}")
    from netra.build import verify_lock

    if build_dir is not None:
        problems += [f"code objects: {p}" for p in verify_lock(build_dir)]
    argv = resolve_argv(cmds["engine_argv"])
    pid = find_process(argv)
    if pid is None:
        return [*problems, f"no process runs the planned engine command line: {' '.join(argv)[:300]}"]
    try:
        env = proc_environ(pid)
        cpus = proc_cpus(pid)
        mems = _status_list(pid, "Mems_allowed_list")
    except OSError as exc:
        return [*problems, f"engine pid {pid} cannot be audited: {exc}"]
    if build_dir is not None and not _same_root(pid):
        # The engine runs in its own container: its code objects are the ones in its filesystem, read
        # through /proc/PID/root (the pod shares one PID namespace), not this container's copy.
        engine_build = Path(f"/proc/{pid}/root") / build_dir.relative_to(build_dir.anchor)
        problems += [f"engine's code objects: {p}" for p in verify_lock(engine_build)]
    for key, want in sorted(cmds["engine_env"].items()):
        if env.get(key) != want:
            problems.append(f"engine environment {key}: the plan sets {want!r}, the engine has {env.get(key)!r}")
    problems += cpu_problems(cpus, engine_cpus, gpu_node=gpu_numa_node())
    nodes = sorted(Path("/sys/devices/system/node").glob("node[0-9]*"))
    if len(nodes) > 1:
        cpu_nodes = {int(n.name[4:]) for n in nodes if set(parse_cpulist(_read(n / "cpulist") or "")) & set(cpus)}
        if not set(mems) <= cpu_nodes:
            problems.append(f"engine memory allowed on nodes {mems}, its CPUs are on {sorted(cpu_nodes)}")
    w = plan["workers"][ordinal % len(plan["workers"])]
    if plan["engine_kind"] == "sglang" and w.get("tactics"):
        problems += _plugin_problems(w, pid, build_dir)
    return problems


def _plugin_problems(w: dict[str, Any], pid: int, build_dir: Path | None) -> list[str]:
    from netra.deploy.audit import audit_plugin
    from netra.deploy.plan import WorkerPlan
    from netra.kernel_lock import object_path, read_lock

    fields: dict[str, Any] = {k: (tuple(v) if isinstance(v, list) else v) for k, v in w.items()
              if k in WorkerPlan.__dataclass_fields__}
    wp = WorkerPlan(**fields)
    objects = [{"name": e["name"], "sha256": e["sha256"], "family": str(e.get("family")),
                "path": str(object_path(e, build_dir or Path(".")))} for e in read_lock()["code_objects"]]
    problems, _ = audit_plugin(wp, pid, objects)
    return problems


def write_verdict(out: Path, problems: list[str], plan_sha256: str) -> None:
    tmp = out.with_name(out.name + ".tmp")
    tmp.write_text(json.dumps({"ok": not problems, "problems": problems, "plan_sha256": plan_sha256,
                               "checked": time.time()}))
    tmp.replace(out)


def main(argv: list[str] | None = None) -> int:
    from netra import settings
    from netra.k8s.pod import load_plan

    p = argparse.ArgumentParser(prog="python -m netra.k8s.audit", description="the in-pod audit (readiness)")
    p.add_argument("--plan", type=Path, required=True, help="the plan ConfigMap's plan.json")
    p.add_argument("--ordinal", type=int, required=True, help="this pod's StatefulSet ordinal")
    p.add_argument("--out", type=Path, required=True, help="where the verdict goes (NETRA_AUDIT_FILE)")
    p.add_argument("--once", action="store_true", help="audit once and exit 0 (pass) or 1")
    args = p.parse_args(argv)
    sha = os.environ.get("NETRA_PLAN_SHA256", "")
    cpus = os.environ.get("NETRA_ENGINE_CPUS")
    build_dir = Path(settings.get("NETRA_BUILD_DIR"))
    while True:
        try:
            plan = load_plan(args.plan, sha or None)
            problems = audit_pod(plan, args.ordinal, engine_cpus=int(cpus) if cpus else None, build_dir=build_dir)
        except Exception as exc:  # a verdict is always written: the pod stays out of Ready, saying why
            problems = [f"the audit failed: {exc!r}"]
        write_verdict(args.out, problems, sha)
        if args.once:
            return 0 if not problems else 1
        time.sleep(INTERVAL_S)


if __name__ == "__main__":
    sys.exit(main())
