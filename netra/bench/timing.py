"""The one kernel timing protocol, used by every family's benchmark (CONVENTIONS.md 12).

- Each provider is a function of one input set; the harness rotates over several input sets (sized
  by the caller to exceed the L2 together) so that no call reads what the previous one left in L2.
- Sub-100 µs work is timed as CUDA-graph replay: one graph per provider holds ``calls`` invocations
  over the rotated inputs (at least ``min_calls``), so the launch gaps are what a captured engine
  step pays, not Python's.
- Warm-up: every provider runs eagerly once per input set before capture (Triton compiles, code
  objects load, dispatch decides), then its graph replays a few times.
- Providers are interleaved in one run: sample i of every provider is taken before sample i + 1 of
  any, so clock and thermal drift land on all of them alike. The statistic is the median; p10 and
  p90 are kept.
- The ceiling is measured in the same run: `copy_bandwidth` (a device-to-device copy, bytes read
  plus bytes written), so a row's floor fraction is ``floor_bytes / copy_bw / median``.

Nothing here imports torch at module level (the CLI imports bench modules lazily).
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any


def _torch() -> Any:
    import torch

    return torch


def event_ms(fn: Callable[[], Any]) -> float:
    """One call of ``fn`` on the current stream, timed with CUDA events (ms)."""
    torch = _torch()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    fn()
    end.record()
    end.synchronize()
    return float(start.elapsed_time(end))


def copy_bandwidth(nbytes: int = 2 << 30, samples: int = 20) -> float:
    """Device-to-device copy rate in bytes/s (read + written), the median of ``samples`` copies."""
    torch = _torch()
    src = torch.empty(nbytes // 4, dtype=torch.float32, device="cuda").normal_()
    dst = torch.empty_like(src)
    for _ in range(3):
        dst.copy_(src)
    med = statistics.median(event_ms(lambda: dst.copy_(src)) for _ in range(samples))
    return 2 * nbytes / (med * 1e-3)


def capture(fn: Callable[[], Any]) -> tuple[Any, Any]:
    """``fn`` run once eagerly on a side stream (PyTorch's advice before capture), then captured:
    (the CUDA graph, the output tensor its replays write)."""
    torch = _torch()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        fn()
    torch.cuda.current_stream().wait_stream(side)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        out = fn()
    return g, out


def quantile(xs: Sequence[float], q: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, round(q * (len(s) - 1)))]


@dataclass
class Provider:
    """One provider's CUDA graph: ``reps`` passes over the rotated inputs per replay.

    ``fn(i)`` runs the provider on input set ``i``; it must be graph-capturable (no host
    synchronisation, no first-use loading: the eager warm-up does that). ``hold`` keeps whatever
    the graph reads or writes alive for the graph's lifetime.
    """

    name: str
    fn: Callable[[int], Any]
    n_inputs: int
    min_calls: int = 32
    graph: bool = True
    hold: Any = None
    calls: int = 0
    samples_us: list[float] = field(default_factory=list)
    _graph: Any = None

    def prepare(self) -> None:
        torch = _torch()
        reps = max(1, -(-self.min_calls // self.n_inputs))
        self.calls = reps * self.n_inputs
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):  # eager warm-up off the capture stream (PyTorch's advice)
            for i in range(self.n_inputs):
                self.fn(i)
        torch.cuda.current_stream().wait_stream(side)
        torch.cuda.synchronize()
        if not self.graph:
            return
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            for _ in range(reps):
                for i in range(self.n_inputs):
                    self.fn(i)
        for _ in range(3):
            g.replay()
        torch.cuda.synchronize()
        self._graph = g

    def run(self) -> None:
        if self._graph is not None:
            self._graph.replay()
            return
        for _ in range(self.calls // self.n_inputs):
            for i in range(self.n_inputs):
                self.fn(i)

    def sample(self) -> None:
        self.samples_us.append(event_ms(self.run) * 1e3 / self.calls)

    @property
    def median_us(self) -> float:
        return statistics.median(self.samples_us)

    def stats(self) -> dict[str, float | int | str]:
        return {"median_us": round(self.median_us, 3), "p10_us": round(quantile(self.samples_us, 0.1), 3),
                "p90_us": round(quantile(self.samples_us, 0.9), 3), "samples": len(self.samples_us),
                "calls_per_sample": self.calls, "mode": "graph" if self.graph else "eager"}


def interleave(providers: Sequence[Provider], samples: int = 50,
               deadline_s: float | None = None) -> dict[str, dict[str, float | int | str]]:
    """Prepare every provider, then take ``samples`` round-robin samples of each (stopping early,
    with at least 5 samples each, if ``deadline_s`` of wall time has passed); stats per provider."""
    import time

    for p in providers:
        p.prepare()
    t0 = time.monotonic()
    for i in range(samples):
        for p in providers:
            p.sample()
        if deadline_s is not None and i >= 4 and time.monotonic() - t0 > deadline_s:
            break
    return {p.name: p.stats() for p in providers}


def row(op: str, shape: Sequence[int] | dict[str, int], dtype: str, provider: str,
        stats: dict[str, float | int | str], floor_bytes: float | None = None,
        copy_bps: float | None = None, **extra: Any) -> dict[str, Any]:
    """A result row (RESULTS.md): op, shape, dtype, provider, mode, median / p90, and, given the
    bytes the call must move and the measured copy rate, GB/s and the fraction of the floor."""
    med = float(stats["median_us"])
    out: dict[str, Any] = {"op": op, "shape": shape, "dtype": dtype, "provider": provider, "mode": stats["mode"],
                           "median_us": med, "p10_us": stats["p10_us"], "p90_us": stats["p90_us"],
                           "samples": stats["samples"]}
    if floor_bytes is not None and copy_bps:
        floor_us = floor_bytes / copy_bps * 1e6
        out.update(gbps=round(floor_bytes / (med * 1e-6) / 1e9, 1), floor_us=round(floor_us, 3),
                   floor_fraction=round(floor_us / med, 4))
    out.update(extra)
    return out
