"""Prometheus metrics of one response-layer process (its own registry, so tests can run several).

Every series a Netra process exposes carries ``worker`` (the worker index the launcher gave it) and
``model_name`` labels, added at exposition time by `WithLabels`, so the front can put all workers'
series in one scrape (netra/deploy/metrics.py) and Prometheus never sees two processes as one.
"""

from __future__ import annotations

from collections.abc import Callable

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from netra.web.exposition import labelled_exposition

# TTFT spans a prefill at load (tens of ms to seconds); inter-token time a decode step (ms).
_TTFT_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
_ITL_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.56)

class Metrics:
    def __init__(self, labels: Callable[[], dict[str, str]] | None = None) -> None:
        self.registry = CollectorRegistry()
        self._render = labelled_exposition(self.registry, labels or (lambda: {}))
        r = self.registry
        self.requests = Counter("netra_serve_requests", "requests by endpoint and final HTTP status "
                                "(499: client went away; a stream that failed midway counts its error status)",
                                ["endpoint", "status"], registry=r)
        self.prompt_tokens = Counter("netra_serve_prompt_tokens", "prompt tokens of finished requests",
                                     ["endpoint"], registry=r)
        self.completion_tokens = Counter("netra_serve_completion_tokens",
                                         "completion tokens of finished requests", ["endpoint"], registry=r)
        self.ttft = Histogram("netra_serve_ttft_seconds", "time from request arrival to its first token",
                              ["endpoint"], buckets=_TTFT_BUCKETS, registry=r)
        self.inter_token = Histogram("netra_serve_inter_token_seconds",
                                     "time between consecutive tokens (an event of k tokens counts k gaps "
                                     "of 1/k of its wait)", ["endpoint"], buckets=_ITL_BUCKETS, registry=r)
        self.stream_bytes = Counter("netra_serve_stream_bytes", "response body bytes sent on streams "
                                    "(SSE framing included)", ["endpoint"], registry=r)
        self.stream_events = Counter("netra_serve_stream_events", "SSE events sent on streams",
                                     ["endpoint"], registry=r)
        self.upstream_bytes = Counter("netra_serve_upstream_stream_bytes",
                                      "native stream bytes received from the worker", registry=r)
        self.aborts = Counter("netra_serve_upstream_aborts", "requests aborted at the worker, by reason",
                              ["reason"], registry=r)
        self.in_flight = Gauge("netra_serve_in_flight", "requests being served", registry=r)

    def observe_tokens(self, endpoint: str, wait_s: float, n: int) -> None:
        if n <= 0:
            return
        gap = wait_s / n
        child = self.inter_token.labels(endpoint)
        for _ in range(n):
            child.observe(gap)

    def render(self) -> bytes:
        return self._render()
