"""The embedded engine's /metrics (SGLang's names, worker + model_name labels) and its load log line."""

from __future__ import annotations

import time
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from netra.engine.process import engine_process

SP = {"max_new_tokens": 6, "temperature": 0, "ignore_eos": True}


def _families(url: str) -> dict[str, list]:
    r = httpx.get(url + "/metrics", timeout=10)
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain")
    return {f.name: f.samples for f in text_string_to_metric_families(r.text)}


def test_engine_metrics_have_sglang_names_labels_and_exact_counts(tmp_path: Path) -> None:
    log = tmp_path / "engine.log"
    with engine_process("--preset", "tiny", "--context-length", "256", "--enable-metrics", "--worker-id", "3",
                        "--served-model-name", "tiny-test", "--load-log-interval", "0.2",
                        log_path=str(log)) as url:
        before = _families(url)
        for name in ("sglang:num_running_reqs", "sglang:num_queue_reqs", "sglang:token_usage",
                     "sglang:gen_throughput", "sglang:time_to_first_token_seconds",
                     "sglang:e2e_request_latency_seconds", "sglang:queue_time_seconds", "sglang:prompt_tokens",
                     "sglang:generation_tokens", "netra_engine_requests_finished"):
            assert name in before, name
        assert all(s.labels["worker"] == "3" and s.labels["model_name"] == "tiny-test"
                   for samples in before.values() for s in samples)
        prompts = [[1, 2, 3], [4, 5, 6, 7, 8]]
        for p in prompts:
            r = httpx.post(url + "/generate", json={"input_ids": p, "sampling_params": SP}, timeout=60)
            assert r.status_code == 200 and len(r.json()["output_ids"]) == 6
        stop = httpx.post(url + "/generate", json={"input_ids": [9], "sampling_params": {
            "max_new_tokens": 8, "temperature": 0, "stop_token_ids": list(range(256)), "ignore_eos": True}},
            timeout=60).json()
        assert stop["meta_info"]["finish_reason"]["type"] == "stop"
        time.sleep(0.5)  # at least one load interval with work in it
        after = _families(url)
        stats = httpx.get(url + "/engine_stats", timeout=10).json()

    def value(fams: dict[str, list], sample: str, **labels: str) -> float:
        name = sample.removesuffix("_total").removesuffix("_count").removesuffix("_sum")
        return sum(s.value for s in fams[name] if s.name == sample
                   and all(s.labels.get(k) == v for k, v in labels.items()))

    assert value(after, "sglang:e2e_request_latency_seconds_count") == 3
    assert value(after, "sglang:time_to_first_token_seconds_count") == 3
    assert value(after, "sglang:queue_time_seconds_count") == 3
    assert value(after, "sglang:prompt_tokens_total") == 3 + 5 + 1
    assert value(after, "sglang:generation_tokens_total") == 6 + 6 + 1
    assert value(after, "netra_engine_requests_finished_total", finish_reason="length") == 2
    assert value(after, "netra_engine_requests_finished_total", finish_reason="stop") == 1
    assert value(after, "sglang:num_running_reqs") == 0 and value(after, "sglang:num_queue_reqs") == 0
    # one host-time and one gap observation per step, by kind: three one-step prefills, 5 + 5 decode steps
    for name in ("netra_engine_step_host_seconds", "netra_engine_step_device_gap_seconds"):
        assert value(after, f"{name}_count", kind="prefill") == 3 == stats["prefill_steps"]
        assert value(after, f"{name}_count", kind="decode") == 10 == stats["decode_steps"]
        assert value(after, f"{name}_count") == stats["steps"] == 13
    host = value(after, "netra_engine_step_host_seconds_sum")
    assert 0 < host == pytest.approx(stats["host_s"]) and host < stats["step_s"]
    assert value(after, "netra_engine_step_device_gap_seconds_sum") == pytest.approx(host)  # CPU: gap = host time
    e2e = value(after, "sglang:e2e_request_latency_seconds_sum")
    assert 0 < value(after, "sglang:time_to_first_token_seconds_sum") <= e2e
    text = log.read_text()
    lines = [line for line in text.splitlines() if "load: #running-req" in line]
    assert lines and "worker 3" in lines[0] and "gen throughput (token/s)" in lines[0], text[-2000:]


def test_metrics_are_off_unless_enabled(engine_url: str) -> None:
    assert httpx.get(engine_url + "/metrics", timeout=10).status_code == 404
