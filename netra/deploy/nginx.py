"""The front: render `nginx/netra.conf.template` from a plan, validate it with `nginx -t`, run it.

nginx runs as its own master with prefix, config, pid, error log and temp paths in the run dir
(`nginx -p RUN_DIR -e ERROR_LOG -c nginx.conf -g 'daemon off;'`), so several launches share a host.
The supervisor re-renders with a worker marked `down` and reloads (SIGHUP) while that worker is
unresponsive or given up, so new requests never wait on it; passive health (max_fails /
fail_timeout) and `proxy_next_upstream` cover a crashed worker and the moments before the
supervisor notices. nginx's own errors are OpenAI error objects (`error_pages`), and past the
profile's target concurrency a request gets a JSON 503 with `Retry-After`.
"""

from __future__ import annotations

import json
import os
import pwd
import re
import shutil
import subprocess
from collections.abc import Iterable
from pathlib import Path

from netra.deploy.metrics import SOCKET_NAME
from netra.deploy.plan import Plan
from netra.resources import DATA_ROOT

TEMPLATE = DATA_ROOT / "nginx" / "netra.conf.template"
_PLACEHOLDER = re.compile(r"\{\{\s*([a-z_]+)\s*\}\}")
LIVE_PATH = "/front/live"  # nginx's own liveness location (the supervisor's probe)
RETRY_AFTER_S = 1


def error_messages(plan: Plan) -> dict[int, str]:
    """nginx's own error statuses and their messages (the workers' errors pass through untouched)."""
    f = plan.front
    return {
        400: "the request is malformed",
        405: "method not allowed",
        408: "the request was not received in time",
        413: f"request body exceeds the limit of {f.max_body_bytes} bytes",
        414: "the request URI is too long",
        494: "the request headers are too large",
        500: "internal error at the front",
        502: "no worker could take the request",
        503: f"the server is at capacity ({f.target_concurrency} requests in flight); retry after {RETRY_AFTER_S} s",
        504: "no worker answered in time",
    }


def error_pages(plan: Plan) -> str:
    """`error_page` + one internal location per status, answering the OpenAI error object as JSON."""
    from netra.web.errors import error_body

    out = []
    for status, message in error_messages(plan).items():
        sent = 400 if status == 494 else status  # nginx answers an oversized header as 400
        code = "server_at_capacity" if status == 503 else sent
        body = json.dumps(error_body(sent, message, code=code), separators=(",", ":"))
        assert "'" not in body and "\\" not in body, body  # a single-quoted nginx string, no escapes
        retry = f"\n            add_header Retry-After {RETRY_AFTER_S} always;" if status == 503 else ""
        # A URI, not a named location: an error found before the request line is parsed (400,
        # 414) cannot be redirected to a named one.
        out.append(f"        error_page {status} /_netra_error/{status};\n"
                   f"        location = /_netra_error/{status} {{\n"
                   f"            internal;\n"
                   f"            default_type application/json;{retry}\n"
                   f"            return {sent} '{body}';\n"
                   f"        }}")
    return "\n".join(out)


class NginxError(RuntimeError):
    """nginx is missing, or rejected a rendered config (the message carries its output)."""


def nginx_binary() -> str:
    found = shutil.which("nginx") or next((p for p in ("/usr/sbin/nginx", "/usr/local/sbin/nginx")
                                           if os.access(p, os.X_OK)), None)
    if not found:
        raise NginxError("nginx is not installed (run `make nginx`, or apt-get install nginx)")
    return found


def fill(template: str, values: dict[str, str]) -> str:
    """Replace every {{name}}; a placeholder without a value or a value without a placeholder is a bug."""
    used = set(_PLACEHOLDER.findall(template))
    missing, unused = used - set(values), set(values) - used
    if missing or unused:
        raise NginxError(f"nginx template {TEMPLATE}: no value for {sorted(missing)}; "
                         f"no placeholder for {sorted(unused)}")
    return _PLACEHOLDER.sub(lambda m: values[m.group(1)], template)


def metrics_location(socket: Path | None) -> str:
    """The body of `location = /metrics`: the aggregator's unix socket, or a 404 that says where to scrape."""
    if socket is not None:
        return f"            proxy_pass http://unix:{socket}:/metrics;"
    message = ("this front has no metrics aggregator: scrape the /metrics of every response layer and "
               "engine (netra plan lists them)")
    return ("            default_type application/json;\n"
            f"            return 404 '{{\"error\": {{\"message\": \"{message}\", \"type\": \"not_found_error\", "
            "\"param\": null, \"code\": 404}}';")


def render(plan: Plan, down: Iterable[int] = (), template: str | None = None,
           metrics_socket: Path | None = None) -> str:
    """The nginx config for a plan; workers whose index is in `down` are marked down; `/metrics` goes
    to the aggregator at `metrics_socket` (a process launch) or answers 404 (compose)."""
    f = plan.front
    down_set = set(down)
    servers = []
    for w, addr in zip(plan.workers, f.upstreams, strict=True):
        flag = " down" if w.index in down_set else ""
        servers.append(f"        server {addr} max_fails={f.max_fails} fail_timeout={f.fail_timeout_s}s{flag};"
                       f"  # worker {w.index}")
    if len(down_set) >= len(plan.workers):
        # nginx refuses an upstream block where every server is down; keep one so that requests fail
        # fast with 502/503 instead of the config failing to load.
        servers = [s.replace(" down;", ";") for s in servers[:1]] + servers[1:]
    user = ""
    if os.geteuid() == 0:
        # A root master would run workers as `nobody`, who cannot write the run dir's temp paths.
        user = f"user {pwd.getpwuid(os.geteuid()).pw_name};"
    host = f.host if ":" not in f.host else f"[{f.host}]"
    values = {
        "user_directive": user, "worker_processes": str(f.worker_processes),
        "worker_rlimit_nofile": str(f.worker_rlimit_nofile), "pid_path": f.pid_path, "error_log": f.error_log,
        "worker_connections": str(f.worker_connections), "access_log": f.access_log,
        "temp_dir": str(Path(plan.run_dir) / "nginx-temp"),
        "balance_directive": "least_conn;" if f.balance == "least_conn" else "# round robin (nginx default)",
        "servers": "\n".join(servers), "keepalive": str(f.keepalive), "listen": f"{host}:{f.port}",
        "connect_timeout_s": str(f.connect_timeout_s), "read_timeout_s": str(f.read_timeout_s),
        "next_upstream_tries": str(min(len(plan.workers), 3)), "target_concurrency": str(f.target_concurrency),
        "max_body_bytes": str(f.max_body_bytes), "error_pages": error_pages(plan), "live_path": LIVE_PATH,
        "metrics_location": metrics_location(metrics_socket),
    }
    return fill(template if template is not None else TEMPLATE.read_text(), values)


def write(plan: Plan, down: Iterable[int] = ()) -> Path:
    run_dir = Path(plan.run_dir)
    for sub in ("client_body", "proxy", "fastcgi", "uwsgi", "scgi"):
        (run_dir / "nginx-temp" / sub).mkdir(parents=True, exist_ok=True)
    conf = Path(plan.front.conf_path)
    tmp = conf.with_suffix(".tmp")
    tmp.write_text(render(plan, down, metrics_socket=run_dir / SOCKET_NAME))
    tmp.replace(conf)  # atomic: a reload never reads a half-written file
    return conf


def base_argv(plan: Plan) -> list[str]:
    return [nginx_binary(), "-p", plan.run_dir, "-e", plan.front.error_log, "-c", plan.front.conf_path]


def validate(plan: Plan) -> str:
    """`nginx -t` on the written config; returns its output, raises NginxError when it fails."""
    proc = subprocess.run([*base_argv(plan), "-t"], capture_output=True, text=True, timeout=30)
    out = (proc.stdout + proc.stderr).strip()
    if proc.returncode != 0:
        raise NginxError(f"nginx -t rejected {plan.front.conf_path}:\n{out}")
    return out


def start_argv(plan: Plan) -> list[str]:
    return [*base_argv(plan), "-g", "daemon off;"]


def reload(plan: Plan) -> None:
    proc = subprocess.run([*base_argv(plan), "-s", "reload"], capture_output=True, text=True, timeout=30)
    if proc.returncode != 0:
        raise NginxError(f"nginx -s reload failed: {(proc.stdout + proc.stderr).strip()}")
