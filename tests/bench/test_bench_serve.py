"""`netra bench serve` end to end against the synthetic upstream (subprocess on a free port)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from netra.bench import serve, summarize, synthetic


def _cfg(url: str, tmp: Path, **kw: object) -> serve.BenchConfig:
    base: dict[str, object] = dict(url=url, clients=1, concurrency=1, requests=4, input_len=8, output_len=5,
                                   record=False, work_dir=tmp / "work", progress=False, timeout_s=30.0)
    base.update(kw)
    return serve.BenchConfig(**base)  # type: ignore[arg-type]


@pytest.mark.parametrize(("fault", "api", "expected"), [
    ("short", "native", "completion_tokens=4 != output_len 5"),
    ("long", "native", "completion_tokens=6 != output_len 5"),
    ("error-event", "native", "error: error event"),
    ("http500", "native", "error: HTTP 500"),
    ("truncate", "native", "without data: [DONE]"),
    ("cached", "native", "cached_tokens=1 != 0"),
    ("abort", "native", "finish_reason='abort'"),
    ("short", "openai", "completion_tokens=4 != output_len 5"),
    ("long", "openai", "completion_tokens=6 != output_len 5"),
    ("prompt", "openai", "prompt_tokens=7 != input_len 8"),
    ("cached", "openai", "cached_tokens=1 != 0"),
])
def test_wrong_upstream_fails_the_run_naming_the_request(tmp_path: Path, fault: str, api: str, expected: str) -> None:
    # Concurrency 1 and one client: the upstream's 3rd received request is corpus request 2.
    cfg = synthetic.Config(rate=2000.0, vocab_size=1000, fault=fault, fault_nth=2)
    with synthetic.running(cfg, tmp_path) as url:
        result = serve.run_bench(_cfg(url, tmp_path, api=api, record=True, results_dir=tmp_path / "records"))
    assert not result.passed
    named = [f for f in result.failures if f.startswith("request 2 ")]
    assert len(named) == 1 and expected in named[0], result.failures
    assert len(result.failures) == 1, result.failures  # only that request
    assert result.record_path is None and not (tmp_path / "records").exists()


def test_cli_exits_nonzero_and_prints_the_request(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from netra.cli import main

    cfg = synthetic.Config(rate=2000.0, vocab_size=1000, fault="short", fault_nth=1)
    with synthetic.running(cfg, tmp_path) as url:
        rc = main(["bench", "serve", "--url", url, "-K", "1", "-C", "1", "-R", "3", "-I", "4", "-O", "3",
                   "--no-record", "--no-progress", "--work-dir", str(tmp_path / "w")])
    assert rc == 1
    err = capsys.readouterr().err
    assert "BENCH FAILED" in err and "request 1 (rid bench-" in err and "completion_tokens=2 != output_len 3" in err


@pytest.mark.parametrize("incremental", [False, True])
def test_summary_throughput_equals_recomputation_from_raw_records(tmp_path: Path, incremental: bool) -> None:
    cfg = synthetic.Config(rate=500.0, vocab_size=1000, incremental=incremental, stream_interval=2)
    with synthetic.running(cfg, tmp_path) as url:
        result = serve.run_bench(_cfg(url, tmp_path, clients=2, concurrency=4, requests=16, output_len=9,
                                      stream_interval=2, record=True, results_dir=tmp_path / "records"))
    assert result.passed, result.failures
    raw = [json.loads(line) for p in sorted((tmp_path / "work").glob("client-*.jsonl"))
           for line in p.read_text().splitlines()]
    assert sorted(r["idx"] for r in raw) == list(range(16))
    assert {r["client"] for r in raw} == {0, 1}
    window = max(r["t_end"] for r in raw) - min(r["t_start"] for r in raw)
    total_out = sum(r["completion_tokens"] for r in raw)
    assert total_out == 16 * 9
    assert result.summary is not None and result.record_path is not None
    assert result.summary["output_tok_s"] == pytest.approx(total_out / window, rel=1e-12)
    record = json.loads(result.record_path.read_text())
    assert record["kind"] == "serving" and record["checks"]["passed"] is True
    assert record["rows"][0]["output_tok_s"] == pytest.approx(total_out / window, rel=1e-12)
    assert record["rows"][0]["clients"] == 2 and record["rows"][0]["concurrency"] == 4
    assert record["command"].startswith("netra bench serve --url ")
    assert result.record_path.name.startswith("bench-")
    # The synthetic output is a known function of the prompt: the hash checks reconstruction.
    for r in raw:
        prompt = result.records[r["idx"]]  # same request, via the loaded records
        assert prompt["output_hash"] == r["output_hash"]
    prompts = json.loads((tmp_path / "work" / "client-0.spec.json").read_text())["requests"]
    from netra.bench.client import ids_hash
    for p in prompts:
        want = [synthetic.output_token(sum(p["input_ids"]), i, 1000) for i in range(9)]
        got = next(r for r in raw if r["idx"] == p["idx"])
        assert got["output_hash"] == ids_hash(want)
    # Coalescing by 2 after the first token: events carry 1, 2, 2, 2, 2 tokens.
    assert [n for _, n in raw[0]["events"]] == [1, 2, 2, 2, 2]


def test_openai_api_passes_with_and_without_continuous_usage(tmp_path: Path) -> None:
    cfg = synthetic.Config(rate=1000.0, vocab_size=1000)
    with synthetic.running(cfg, tmp_path) as url:
        for cont in (True, False):
            result = serve.run_bench(_cfg(url, tmp_path, api="openai", clients=2, concurrency=2, requests=4,
                                          continuous_usage=cont))
            assert result.passed, result.failures
            assert result.summary is not None and result.summary["output_tokens"] == 20
            # The same work dir twice: the second run's barrier starts from scratch, so both clients
            # start together at the release instant (a stale release would let each start whenever
            # its process came up, seconds apart).
            release = float((tmp_path / "work" / "barrier" / "release").read_text())
            for k in (0, 1):
                first = min(r["t_start"] for r in result.records if r["client"] == k)
                assert release <= first < release + 0.2


def test_summarize_loads_every_client_file(tmp_path: Path) -> None:
    cfg = synthetic.Config(rate=1000.0, vocab_size=1000)
    cpu = min(os.sched_getaffinity(0))
    with synthetic.running(cfg, tmp_path) as url:
        result = serve.run_bench(_cfg(url, tmp_path, clients=3, concurrency=3, requests=9, client_cpus=[cpu]))
    assert result.passed, result.failures
    assert result.record is not None
    assert [c["cpus"] for c in result.record["cpu"]["clients"]] == [[cpu]] * 3  # pinned
    recs = summarize.load_records(sorted((tmp_path / "work").glob("client-*.jsonl")))
    assert [r["idx"] for r in recs] == list(range(9))
    assert sorted({r["client"] for r in recs}) == [0, 1, 2]


def test_burst_mode_upstream_passes_exact_checks(tmp_path: Path) -> None:
    # rate 0: each stream is sent at once (the client's ceiling); the exact checks still hold.
    cfg = synthetic.Config(rate=0.0, vocab_size=1000, stream_interval=3)
    with synthetic.running(cfg, tmp_path) as url:
        result = serve.run_bench(_cfg(url, tmp_path, clients=2, concurrency=4, requests=8, output_len=10,
                                      stream_interval=3))
    assert result.passed, result.failures
    assert result.summary is not None and result.summary["output_tokens"] == 80
    assert [n for _, n in result.records[0]["events"]] == [1, 3, 3, 3]
