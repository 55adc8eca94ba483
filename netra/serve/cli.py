"""`netra serve`: the response layer for one worker (one process per worker, never one per node)."""

from __future__ import annotations

import argparse
import os
import resource
from typing import Any

from netra import logs
from netra.serve.config import ENGINES, SAMPLING_DEFAULTS, ServeConfig

_D = ServeConfig()


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--upstream", default=_D.upstream, help="the worker's base URL (docs/worker-contract.md)")
    p.add_argument("--host", default=_D.host, help="address to listen on")
    p.add_argument("--port", type=int, default=_D.port, help="port to listen on")
    p.add_argument("--stream-interval", type=int, default=_D.stream_interval,
                   help="tokens per client stream event (coalescing)")
    p.add_argument("--model-name", default=_D.model_name,
                   help="model name in /v1/models and responses (default: from the worker's /model_info)")
    p.add_argument("--engine", choices=ENGINES, default=_D.engine, help="what the upstream worker runs")
    p.add_argument("--upstream-timeout", type=float, default=_D.upstream_timeout,
                   help="seconds to connect, and the longest silence allowed between upstream events")
    p.add_argument("--max-connections", type=int, default=_D.max_connections,
                   help="upstream connection pool size (default: --max-inflight + 8)")
    p.add_argument("--max-body-bytes", type=int, default=_D.max_body_bytes, help="request body limit (413)")
    p.add_argument("--max-choices", type=int, default=_D.max_choices,
                   help="choices per request, prompts x n (400 past it)")
    p.add_argument("--max-inflight", type=int, default=_D.max_inflight,
                   help="upstream requests in flight at once (admission capacity)")
    p.add_argument("--max-waiting", type=int, default=_D.max_waiting,
                   help="requests waiting for admission before new ones get 503")
    p.add_argument("--queue-timeout", type=float, default=_D.queue_timeout,
                   help="seconds a request may wait for admission before a 503 with Retry-After")
    p.add_argument("--probe-interval", type=float, default=_D.probe_interval,
                   help="seconds between liveness probes of the worker")
    p.add_argument("--probe-timeout", type=float, default=_D.probe_timeout, help="deadline of one probe (s)")
    p.add_argument("--probe-misses", type=int, default=_D.probe_misses,
                   help="missed probes in a row that make the worker unresponsive")
    p.add_argument("--stall-timeout", type=float, default=_D.stall_timeout,
                   help="seconds a busy worker may go without completing a scheduler step")
    p.add_argument("--worker-id", default=_D.worker_id,
                   help="the worker label of this process's metrics and logs (the launcher passes the index)")
    p.add_argument("--api-key", default=None,
                   help="require this key (Authorization: Bearer KEY) on every request but /health and /metrics")
    p.add_argument("--api-key-env", default=None, metavar="NAME",
                   help="as --api-key, the key read from this environment variable (kept out of the command line)")
    p.add_argument("--sampling-defaults", choices=SAMPLING_DEFAULTS, default=_D.sampling_defaults,
                   help="sampling values a request leaves out: the checkpoint's generation_config.json (model, "
                        "as SGLang) or OpenAI's neutral ones (openai)")
    logs.add_arguments(p)


def config_from_args(args: argparse.Namespace) -> ServeConfig:
    key = args.api_key
    if args.api_key_env:
        key = os.environ.get(args.api_key_env)
        if not key:
            raise ValueError(f"--api-key-env {args.api_key_env}: the variable is not set (or empty)")
    return ServeConfig(upstream=args.upstream, host=args.host, port=args.port,
                       stream_interval=args.stream_interval, model_name=args.model_name, engine=args.engine,
                       upstream_timeout=args.upstream_timeout, max_connections=args.max_connections,
                       worker_id=args.worker_id, api_key=key,
                       max_body_bytes=args.max_body_bytes, max_choices=args.max_choices,
                       max_inflight=args.max_inflight, max_waiting=args.max_waiting,
                       queue_timeout=args.queue_timeout, probe_interval=args.probe_interval,
                       probe_timeout=args.probe_timeout, probe_misses=args.probe_misses,
                       stall_timeout=args.stall_timeout, sampling_defaults=args.sampling_defaults)


def raise_fd_limit() -> None:
    """Soft fd limit up to the hard one: a response layer holds a socket per client and per upstream
    request, and Debian's default soft limit (1,024) is below what one worker may take at once."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or soft < hard:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard if hard != resource.RLIM_INFINITY else 1 << 20, hard))
        except (ValueError, OSError):
            pass


def main(args: argparse.Namespace) -> int:
    try:
        config = config_from_args(args)
    except ValueError as exc:
        print(f"netra serve: {exc}")
        return 2
    import uvicorn

    from netra import settings
    from netra.serve.app import create_app

    level = (args.log_level or settings.get("NETRA_LOG_LEVEL")).upper()
    logs.configure(level, args.log_format)
    raise_fd_limit()
    app = create_app(config)
    # One event loop per process by design; access logs off: at thousands of events/s they cost CPU.
    # Keep-alive outlasts nginx's upstream keepalive_timeout (60 s) so nginx closes idle connections
    # first; a bounded graceful shutdown then cancels open streams, which aborts them at the worker.
    # The listen backlog holds a front's whole burst (nginx opens one connection per stream).
    uvicorn.run(app, host=config.host, port=config.port, log_level=level.lower(), access_log=False,
                timeout_keep_alive=75, timeout_graceful_shutdown=10, backlog=4096)
    return 0


def register(sub: Any) -> None:
    from netra.cli import add_verb

    p = add_verb(sub, "serve")
    add_arguments(p)
    p.set_defaults(func=main)
