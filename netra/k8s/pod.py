"""What runs inside a worker pod: `netra k8s pod engine|serve`.

A StatefulSet has one pod template, so the pod picks its worker from the plan at start: pod ordinal
k (the suffix of its name) runs worker ``k % dp`` of the node plan (mounted from the plan ConfigMap,
its sha256 checked against the pod's annotation, passed as ``NETRA_PLAN_SHA256``), with three
deliberate changes that `pod_commands` makes and the audit expects:

* every pod has its own network namespace, so every pod uses worker 0's ports (the Service, the
  router and the probes then name one port);
* the response layer binds ``0.0.0.0`` (the router and the kubelet's probe reach it on the pod IP);
  the engine stays on loopback, reachable only from its own response layer;
* ``--worker-id`` is the ordinal (unique across the fleet); a GPU given by the device plugin is
  index 0 inside the container.

The serve role starts the in-pod audit (`netra.k8s.audit`) in a child process before it becomes
the response layer; the response layer's ``/health`` answers 503 until the audit has written a
passing result to ``NETRA_AUDIT_FILE`` (see `netra.serve.app`).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

PLAN_FILE = Path("/etc/netra/plan/plan.json")
AUDIT_FILE = Path("/run/netra-pod/audit.json")
SERVE_HOST = "0.0.0.0"


class PodError(RuntimeError):
    """The pod cannot run its worker (no ordinal, a plan whose hash differs)."""


def ordinal_of(pod_name: str) -> int:
    m = re.fullmatch(r".+-(\d+)", pod_name)
    if m is None:
        raise PodError(f"pod name {pod_name!r} has no StatefulSet ordinal")
    return int(m.group(1))


def _set_flag(argv: list[str], flag: str, value: str) -> list[str]:
    out = list(argv)
    if flag in out:
        out[out.index(flag) + 1] = value
    return out


def pod_commands(plan: dict[str, Any], ordinal: int, gpu_target: bool) -> dict[str, Any]:
    """The engine and response-layer commands and environments of pod `ordinal` (see the module doc)."""
    workers = plan["workers"]
    w = workers[ordinal % len(workers)]
    engine_port, serve_port = workers[0]["engine_port"], workers[0]["serve_port"]
    engine = _set_flag([str(a) for a in w["engine_argv"]], "--port", str(engine_port))
    engine = _set_flag(engine, "--worker-id", str(ordinal))
    env = {str(k): str(v) for k, v in w["engine_env"].items()}
    if gpu_target:
        for key in ("CUDA_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES"):
            if key in env:
                env[key] = "0"
    serve = _set_flag([str(a) for a in w["serve_argv"]], "--upstream", f"http://127.0.0.1:{engine_port}")
    serve = _set_flag(serve, "--port", str(serve_port))
    serve = _set_flag(serve, "--host", SERVE_HOST)
    serve = _set_flag(serve, "--worker-id", str(ordinal))
    return {"worker": w["index"], "engine_argv": engine, "engine_env": dict(sorted(env.items())),
            "serve_argv": serve, "serve_env": {str(k): str(v) for k, v in w["serve_env"].items()},
            "engine_port": engine_port, "serve_port": serve_port}


def load_plan(path: Path = PLAN_FILE, expect_sha256: str | None = None) -> dict[str, Any]:
    import hashlib

    text = path.read_text()
    digest = hashlib.sha256(text.strip().encode()).hexdigest()
    if expect_sha256 is not None and digest != expect_sha256:
        raise PodError(f"{path}: plan sha256 {digest} differs from the pod's {expect_sha256}")
    plan: dict[str, Any] = json.loads(text)
    return plan


def main(role: str, plan_path: Path = PLAN_FILE) -> int:
    from netra.deploy.supervisor import resolve_argv

    try:
        plan = load_plan(plan_path, os.environ.get("NETRA_PLAN_SHA256"))
        ordinal = ordinal_of(os.environ.get("POD_NAME") or os.uname().nodename)
    except (OSError, PodError, ValueError) as exc:
        print(f"netra k8s pod: {exc}", file=sys.stderr, flush=True)
        return 2
    cmds = pod_commands(plan, ordinal, plan["target"] != "cpu")
    if role == "engine":
        argv, env = cmds["engine_argv"], cmds["engine_env"]
    else:
        argv, env = cmds["serve_argv"], cmds["serve_env"]
        audit_file = Path(os.environ.get("NETRA_AUDIT_FILE", str(AUDIT_FILE)))
        os.environ["NETRA_AUDIT_FILE"] = str(audit_file)
        audit_file.parent.mkdir(parents=True, exist_ok=True)
        # The audit watches until it passes and then exits; it outlives this exec as its own process.
        subprocess.Popen([sys.executable, "-m", "netra.k8s.audit", "--plan", str(plan_path),
                          "--ordinal", str(ordinal), "--out", str(audit_file)], start_new_session=True)
    os.environ.update(env)
    exe = resolve_argv(argv)
    sys.stdout.flush()
    os.execvp(exe[0], exe)
    return 0  # not reached
