"""`netra serve`: the response layer for one worker (one process per worker, never one per node)."""

from __future__ import annotations

import argparse
import os
from typing import Any

from netra import logs
from netra.serve.config import ENGINES, ServeConfig

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
                   help="upstream connection pool size")
    p.add_argument("--worker-id", default=_D.worker_id,
                   help="the worker label of this process's metrics and logs (the launcher passes the index)")
    p.add_argument("--api-key", default=None,
                   help="require this key (Authorization: Bearer KEY) on every request but /health and /metrics")
    p.add_argument("--api-key-env", default=None, metavar="NAME",
                   help="as --api-key, the key read from this environment variable (kept out of the command line)")
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
                       worker_id=args.worker_id, api_key=key)


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
    app = create_app(config)
    # One event loop per process by design; access logs off: at thousands of events/s they cost CPU.
    # Keep-alive outlasts nginx's upstream keepalive_timeout (60 s) so nginx closes idle connections
    # first; a bounded graceful shutdown then cancels open streams, which aborts them at the worker.
    uvicorn.run(app, host=config.host, port=config.port, log_level=level.lower(), access_log=False,
                timeout_keep_alive=75, timeout_graceful_shutdown=10)
    return 0


def register(sub: Any) -> None:
    from netra.cli import add_verb

    p = add_verb(sub, "serve")
    add_arguments(p)
    p.set_defaults(func=main)
