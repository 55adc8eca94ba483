"""The front's metrics aggregator (netra/deploy/metrics.py) as a function: merged families, worker labels."""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families

from netra.deploy.metrics import Target, aggregate

SGLANG = """# HELP sglang:num_running_reqs The number of running requests.
# TYPE sglang:num_running_reqs gauge
sglang:num_running_reqs{model_name="qwen"} %d
# HELP sglang:prompt_tokens_total Number of prefill tokens processed.
# TYPE sglang:prompt_tokens_total counter
sglang:prompt_tokens_total{model_name="qwen"} %d
"""
NETRA = """# HELP netra_serve_requests_total requests
# TYPE netra_serve_requests_total counter
netra_serve_requests_total{worker="%s",model_name="qwen",endpoint="chat",status="200"} %d
"""


def test_aggregate_merges_families_and_labels_every_workers_series() -> None:
    texts = [(Target("0", "engine", "u0"), SGLANG % (3, 100)), (Target("1", "engine", "u1"), SGLANG % (5, 70)),
             (Target("0", "serve", "s0"), NETRA % ("0", 4)), (Target("1", "serve", "s1"), NETRA % ("1", 6)),
             (Target("2", "serve", "s2"), None)]
    text = aggregate(texts).decode()
    assert text.count("# TYPE sglang:num_running_reqs gauge") == 1  # one family, not one per worker
    fams = {f.name: f.samples for f in text_string_to_metric_families(text)}
    running = {s.labels["worker"]: s.value for s in fams["sglang:num_running_reqs"]}
    assert running == {"0": 3.0, "1": 5.0}
    assert {s.labels["worker"]: s.value for s in fams["sglang:prompt_tokens"]} == {"0": 100.0, "1": 70.0}
    assert {s.labels["worker"]: s.value for s in fams["netra_serve_requests"]
            if s.name.endswith("_total")} == {"0": 4.0, "1": 6.0}
    up = {(s.labels["worker"], s.labels["process"]): s.value for s in fams["netra_scrape_up"]}
    assert up == {("0", "engine"): 1.0, ("1", "engine"): 1.0, ("0", "serve"): 1.0, ("1", "serve"): 1.0,
                  ("2", "serve"): 0.0}
