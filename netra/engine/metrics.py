"""The embedded engine's `/metrics` and its periodic load line, under SGLang's names where the
meaning is the same (so an SGLang dashboard reads a Netra worker unchanged):

| metric | kind | meaning |
|---|---|---|
| `sglang:num_running_reqs` | gauge | requests holding a slot (prefilling or decoding) |
| `sglang:num_queue_reqs` | gauge | requests waiting for a slot |
| `sglang:token_usage` | gauge | tokens held by running requests / the pools' token capacity (slots x context) |
| `sglang:gen_throughput` | gauge | output tokens/s over the last load interval |
| `sglang:time_to_first_token_seconds` | histogram | arrival at the server to the first output token |
| `sglang:e2e_request_latency_seconds` | histogram | arrival to the finish |
| `sglang:queue_time_seconds` | histogram | arrival to admission into a slot |
| `sglang:prompt_tokens_total`, `sglang:generation_tokens_total` | counter | tokens of finished requests |
| `netra_engine_requests_finished_total{finish_reason}` | counter | finished requests by reason (stop, length, abort) |
| `netra_engine_step_host_seconds{kind}` | histogram | host time of one scheduler step (kind: prefill, decode, mixed); on CUDA the step less its wait for the device |
| `netra_engine_step_device_gap_seconds{kind}` | histogram | device idle time before the step's first device work (CUDA events; on a CPU, the host time) |
| `netra_engine_step_device_seconds{kind}` | histogram | device time of a step that waits for the device: its first device work to its last wait's end (CUDA events; not on a CPU). Against the host time it tells a host-bound step from a device-bound one |
| `netra_engine_spec_decode_num_drafts_total` | counter | speculative decoding (vLLM's names under the engine's prefix): request rows of verify steps that were offered drafts |
| `netra_engine_spec_decode_num_draft_tokens_total` | counter | drafts offered |
| `netra_engine_spec_decode_num_accepted_tokens_total` | counter | drafts committed to an output (a finish inside a block cuts them too) |
| `netra_engine_spec_decode_num_accepted_tokens_per_pos_total{position}` | counter | drafts committed at each block position (0: the first draft) |
| `sglang:spec_accept_length` | gauge | tokens per verified row: 1 + accepted / drafts rows (SGLang's name) |
| `sglang:spec_accept_rate` | gauge | accepted / offered drafts |

The speculative series appear with ``--speculative-algorithm``, read from the scheduler's counters at each scrape.

Every series carries `worker` and `model_name` labels (netra/serve/metrics.py).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector

from netra.web.exposition import labelled_exposition

log = logging.getLogger("netra.engine")

# SGLang's bucket edges for these histograms (sglang/srt/metrics/collector.py, 0.5.x), trimmed.
_TTFT = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 15.0, 20.0,
         25.0, 30.0)
_E2E = (0.1, 0.2, 0.4, 0.6, 0.8, 1.0, 2.0, 4.0, 6.0, 8.0, 10.0, 20.0, 40.0, 60.0, 80.0, 100.0, 200.0, 400.0)
_STEP = (0.0001, 0.0002, 0.0005, 0.001, 0.002, 0.003, 0.005, 0.0075, 0.01, 0.015, 0.02, 0.03, 0.05, 0.1, 0.25, 0.5,
         1.0)
_QUEUE = (0.0, 0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1.0, 2.0, 5.0, 10.0, 30.0, 60.0, 120.0)


class SpecCollector(Collector):
    """The speculative counters and gauges from the scheduler's `StepStats`, at each scrape (exact: the counters
    are the scheduler's own, never sampled)."""

    def __init__(self, scheduler: Any) -> None:
        self.sched = scheduler

    def collect(self) -> Iterator[Metric]:
        st = self.sched.stats
        p = "netra_engine_spec_decode_"
        yield CounterMetricFamily(p + "num_drafts", "verify rows offered drafts", value=st.drafts)
        yield CounterMetricFamily(p + "num_draft_tokens", "drafts offered", value=st.draft_tokens)
        yield CounterMetricFamily(p + "num_accepted_tokens", "drafts committed to an output",
                                  value=st.accepted_tokens)
        per_pos = CounterMetricFamily(p + "num_accepted_tokens_per_pos", "drafts committed, by block position",
                                      labels=["position"])
        for pos, n in sorted(dict(st.accepted_per_pos).items()):
            per_pos.add_metric([str(pos)], n)
        yield per_pos
        yield GaugeMetricFamily("sglang:spec_accept_length", "tokens per verified row: 1 + accepted / drafts rows",
                                value=1.0 + st.accepted_tokens / st.drafts if st.drafts else 0.0)
        yield GaugeMetricFamily("sglang:spec_accept_rate", "accepted drafts over offered drafts",
                                value=st.accepted_tokens / st.draft_tokens if st.draft_tokens else 0.0)


class EngineMetrics:
    def __init__(self, scheduler: Any, worker: str, model_name: str) -> None:
        self.sched = scheduler
        self.registry = r = CollectorRegistry()
        self.render = labelled_exposition(r, lambda: {"worker": worker, "model_name": model_name})
        Gauge("sglang:num_running_reqs", "requests holding a slot (prefilling or decoding)",
              registry=r).set_function(lambda: self._load()["running"] + self._load()["prefilling"])
        Gauge("sglang:num_queue_reqs", "requests waiting for a slot", registry=r).set_function(
            lambda: self._load()["waiting"])
        Gauge("sglang:token_usage", "tokens held by running requests over the pools' token capacity",
              registry=r).set_function(self.token_usage)
        self.gen_throughput = Gauge("sglang:gen_throughput", "output tokens per second over the last interval",
                                    registry=r)
        self.ttft = Histogram("sglang:time_to_first_token_seconds", "arrival to the first output token",
                              buckets=_TTFT, registry=r)
        self.e2e = Histogram("sglang:e2e_request_latency_seconds", "arrival to the finish", buckets=_E2E, registry=r)
        self.queue = Histogram("sglang:queue_time_seconds", "arrival to admission into a slot", buckets=_QUEUE,
                               registry=r)
        self.prompt_tokens = Counter("sglang:prompt_tokens", "prompt tokens of finished requests", registry=r)
        self.generation_tokens = Counter("sglang:generation_tokens", "output tokens of finished requests",
                                         registry=r)
        self.finished = Counter("netra_engine_requests_finished", "finished requests by finish reason",
                                ["finish_reason"], registry=r)
        self.step_host = Histogram("netra_engine_step_host_seconds", "host time of one scheduler step",
                                   ["kind"], buckets=_STEP, registry=r)
        self.step_gap = Histogram("netra_engine_step_device_gap_seconds",
                                  "device idle time between the previous step and this one", ["kind"],
                                  buckets=_STEP, registry=r)
        self.step_device = Histogram("netra_engine_step_device_seconds",
                                     "device time of one step, its first device work to its last wait's end "
                                     "(CUDA events; steps that wait for the device)", ["kind"], buckets=_STEP,
                                     registry=r)
        scheduler.step_observer = self.observe_step
        if getattr(scheduler, "spec", None) is not None:
            r.register(SpecCollector(scheduler))
        self._last: tuple[float, int] = (time.monotonic(), 0)

    def observe_step(self, kind: str, host_s: float, gap_s: float, device_s: float | None = None) -> None:
        """Called on the scheduler thread after every step."""
        self.step_host.labels(kind).observe(host_s)
        self.step_gap.labels(kind).observe(gap_s)
        if device_s is not None:
            self.step_device.labels(kind).observe(device_s)

    def _load(self) -> dict[str, int]:
        load: dict[str, int] = self.sched.load()
        return load

    def token_usage(self) -> float:
        pools = self.sched.pools
        capacity = max(1, (pools.num_slots - 1) * pools.context_length)  # one slot is the pad row
        held = sum(r.cached for r in list(self.sched.prefilling) + list(self.sched.decoding))
        return held / capacity

    def finish(self, started: float, first_token: float | None, admitted: float | None, prompt_tokens: int,
               completion_tokens: int, reason: str) -> None:
        now = time.perf_counter()
        self.e2e.observe(now - started)
        if first_token is not None:
            self.ttft.observe(first_token - started)
        if admitted is not None:
            self.queue.observe(max(0.0, admitted - started))
        self.prompt_tokens.inc(prompt_tokens)
        self.generation_tokens.inc(completion_tokens)
        self.finished.labels(reason).inc()

    def tick(self) -> str | None:
        """Update gen_throughput from the scheduler's output counter; the load line to log, when the
        interval saw work (SGLang logs its decode batches the same way)."""
        now, tokens = time.monotonic(), int(self.sched.stats.output_tokens)
        then, before = self._last
        self._last = (now, tokens)
        rate = (tokens - before) / max(1e-9, now - then)
        self.gen_throughput.set(rate)
        load = self._load()
        running = load["running"] + load["prefilling"]
        if not (running or load["waiting"] or tokens > before):
            return None
        return (f"load: #running-req {running}, #queue-req {load['waiting']}, token usage "
                f"{self.token_usage():.3f}, gen throughput (token/s) {rate:.2f}, free slots {load['free_slots']}")
