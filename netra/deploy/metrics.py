"""The front's `/metrics`: every worker's series in one scrape, never one worker's picked at random.

nginx round-robins everything else, so `GET /metrics` through it would answer with whichever
response layer came next (counters then jump between workers' values, which Prometheus reads as
resets). Instead nginx passes `/metrics` to this aggregator: the launcher serves it on a unix
socket in the run dir (`metrics.sock`), and each scrape fetches, concurrently, every worker's
response-layer and engine `/metrics`, merges them family by family (each series already carries its
`worker` and `model_name` labels, netra/serve/metrics.py; an SGLang worker's get the target's
`worker` label here) and adds
`netra_scrape_up{worker, process}` (1 when that process answered). `netra plan` prints the same
per-worker targets for a Prometheus that scrapes workers directly (and for compose deployments,
whose front has no aggregator).
"""

from __future__ import annotations

import socketserver
import threading
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
SOCKET_NAME = "metrics.sock"


@dataclass(frozen=True)
class Target:
    worker: str
    process: str  # serve | engine
    url: str  # .../metrics


def targets(plan: Any) -> list[Target]:
    """Every process of the plan that serves /metrics (response layers; engines with metrics on)."""
    out = []
    engine_metrics = bool(plan.profile.get("engine", {}).get("enable_metrics"))
    for w in plan.workers:
        out.append(Target(str(w.index), "serve", f"{w.serve_url}/metrics"))
        if engine_metrics:
            out.append(Target(str(w.index), "engine", f"{w.engine_url}/metrics"))
    return out


def aggregate(texts: Iterable[tuple[Target, str | None]]) -> bytes:
    """One exposition of every family of every text (None: that target did not answer)."""
    from prometheus_client import CollectorRegistry, generate_latest
    from prometheus_client.metrics_core import Metric
    from prometheus_client.parser import text_string_to_metric_families

    families: dict[str, Metric] = {}
    up = Metric("netra_scrape_up", "1 when the front's aggregator could scrape this process", "gauge")
    for target, text in texts:
        up.add_sample("netra_scrape_up", {"worker": target.worker, "process": target.process},
                      0.0 if text is None else 1.0)
        if text is None:
            continue
        for fam in text_string_to_metric_families(text):
            merged = families.setdefault(fam.name, Metric(fam.name, fam.documentation, fam.type, fam.unit))
            # Netra's processes label their series; an SGLang worker's carry no worker label, and two
            # workers' identical series would collide: the target's worker is added where missing.
            merged.samples.extend(s if "worker" in s.labels else s._replace(labels={**s.labels, "worker": target.worker})
                                  for s in fam.samples)

    class _Families:
        def collect(self) -> Iterable[Metric]:
            yield up
            yield from families.values()

    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Families())  # type: ignore[arg-type]
    return generate_latest(registry)


def scrape(targets_: list[Target], timeout: float = 5.0) -> bytes:
    import httpx

    def one(t: Target) -> tuple[Target, str | None]:
        try:
            r = httpx.get(t.url, timeout=timeout)
        except httpx.HTTPError:
            return t, None
        return t, r.text if r.status_code == 200 else None

    with ThreadPoolExecutor(max_workers=min(32, max(1, len(targets_)))) as pool:
        return aggregate(pool.map(one, targets_))


class _Server(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
    daemon_threads = True


class MetricsProxy:
    """The aggregator on a unix socket (nginx: ``proxy_pass http://unix:PATH:/metrics``), in a thread."""

    def __init__(self, path: Path, targets_: list[Target]) -> None:
        self.path = path
        self.targets = targets_
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                if self.path.split("?", 1)[0] != "/metrics":
                    self.send_error(404)
                    return
                body = scrape(proxy.targets)
                self.send_response(200)
                self.send_header("Content-Type", CONTENT_TYPE)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def address_string(self) -> str:
                return "nginx"  # a unix socket peer has no address

            def log_message(self, format: str, *args: Any) -> None:
                pass  # nginx's access log has the request

        path.unlink(missing_ok=True)
        self.server = _Server(str(path), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, name="netra-metrics", daemon=True)

    def start(self) -> None:
        self.thread.start()

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.path.unlink(missing_ok=True)
