"""The response layer's options: one frozen dataclass, the CLI's defaults are read from it."""

from __future__ import annotations

from dataclasses import dataclass, field

ENGINES = ("embedded", "sglang")
# Where a request's unset sampling values come from: the checkpoint's generation_config.json (SGLang's
# default, --sampling-defaults model) or the neutral OpenAI values (temperature 1, no top-k/p cut).
SAMPLING_DEFAULTS = ("model", "openai")


@dataclass(frozen=True)
class ServeConfig:
    upstream: str = "http://127.0.0.1:30000"
    host: str = "127.0.0.1"
    port: int = 8100
    # Tokens per client event; the article's plateau was at 4, SGLang's default is 1.
    stream_interval: int = 1
    # Name reported by /v1/models and in responses; None: derived from the upstream's /model_info.
    model_name: str | None = None
    engine: str = "embedded"
    # Seconds to connect to the upstream and the longest silence tolerated between two upstream
    # events (a long prefill at high load must fit inside it).
    upstream_timeout: float = 600.0
    # Upstream connection pool size; None: max_inflight plus a few (admission bounds the requests).
    max_connections: int | None = None
    # Bytes of one request body (refused with 413 while reading, past it).
    max_body_bytes: int = 8 << 20
    # Choices per request: prompts x n (refused with 400 past it).
    max_choices: int = 64
    # Upstream requests in flight at once (admission capacity; the launcher sizes it from the profile).
    max_inflight: int = 256
    # Requests waiting for admission, and how long one may wait, before a 503 with Retry-After.
    max_waiting: int = 1024
    queue_timeout: float = 60.0
    # The worker's liveness probe (netra/serve/watch.py): one every probe_interval s, each with a
    # deadline of probe_timeout s; probe_misses misses in a row mark it unresponsive; a busy worker
    # that completed no step for stall_timeout s is a miss.
    probe_interval: float = 1.0
    probe_timeout: float = 2.0
    probe_misses: int = 2
    stall_timeout: float = 120.0
    # The `worker` label of every metric this process exposes (the launcher passes the worker index).
    worker_id: str = "0"
    # Every request but /health and /metrics must carry it (Authorization: Bearer KEY); None: open.
    api_key: str | None = field(default=None, repr=False)
    sampling_defaults: str = "model"

    def __post_init__(self) -> None:
        if not self.upstream.startswith(("http://", "https://")):
            raise ValueError(f"--upstream {self.upstream!r}: expected an http:// URL")
        if self.stream_interval < 1:
            raise ValueError(f"--stream-interval {self.stream_interval}: expected an integer >= 1")
        if self.sampling_defaults not in SAMPLING_DEFAULTS:
            raise ValueError(f"--sampling-defaults {self.sampling_defaults!r}: expected one of {SAMPLING_DEFAULTS}")
        if self.engine not in ENGINES:
            raise ValueError(f"--engine {self.engine!r}: expected one of {ENGINES}")
        if not self.upstream_timeout > 0:
            raise ValueError(f"--upstream-timeout {self.upstream_timeout}: expected seconds > 0")
        if not 0 <= self.port <= 65535:
            raise ValueError(f"--port {self.port}: expected 0..65535")
        for name in ("max_body_bytes", "max_choices", "max_inflight", "probe_misses"):
            if getattr(self, name) < 1:
                raise ValueError(f"--{name.replace('_', '-')} {getattr(self, name)}: expected an integer >= 1")
        if self.max_choices > self.max_inflight:
            raise ValueError(f"--max-choices {self.max_choices} exceeds --max-inflight {self.max_inflight}: a "
                             "streamed request runs all its choices at once")
        if self.max_connections is not None and self.max_connections < self.max_inflight:
            raise ValueError(f"--max-connections {self.max_connections}: expected >= --max-inflight "
                             f"{self.max_inflight}")
        if self.max_waiting < 0:
            raise ValueError(f"--max-waiting {self.max_waiting}: expected >= 0")
        for name in ("queue_timeout", "probe_interval", "probe_timeout", "stall_timeout"):
            if not getattr(self, name) > 0:
                raise ValueError(f"--{name.replace('_', '-')} {getattr(self, name)}: expected seconds > 0")

    @property
    def upstream_base(self) -> str:
        return self.upstream.rstrip("/")

    @property
    def pool_size(self) -> int:
        return self.max_connections if self.max_connections is not None else self.max_inflight + 8

    @property
    def request_share(self) -> int:
        """Upstream requests one non-streamed request may run at once (its choices go in waves)."""
        return max(1, min(self.max_choices, self.max_inflight // 4))
