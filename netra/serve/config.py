"""The response layer's options: one frozen dataclass, the CLI's defaults are read from it."""

from __future__ import annotations

from dataclasses import dataclass, field

ENGINES = ("embedded", "sglang")


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
    # Upstream connection pool size: one in-flight request holds one connection while it streams.
    max_connections: int = 4096
    # The `worker` label of every metric this process exposes (the launcher passes the worker index).
    worker_id: str = "0"
    # Every request but /health and /metrics must carry it (Authorization: Bearer KEY); None: open.
    api_key: str | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        if not self.upstream.startswith(("http://", "https://")):
            raise ValueError(f"--upstream {self.upstream!r}: expected an http:// URL")
        if self.stream_interval < 1:
            raise ValueError(f"--stream-interval {self.stream_interval}: expected an integer >= 1")
        if self.engine not in ENGINES:
            raise ValueError(f"--engine {self.engine!r}: expected one of {ENGINES}")
        if not self.upstream_timeout > 0:
            raise ValueError(f"--upstream-timeout {self.upstream_timeout}: expected seconds > 0")
        if not 0 <= self.port <= 65535:
            raise ValueError(f"--port {self.port}: expected 0..65535")

    @property
    def upstream_base(self) -> str:
        return self.upstream.rstrip("/")
