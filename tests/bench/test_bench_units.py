"""Unit tests of the serving benchmark's pieces, against hand-computed values."""

from __future__ import annotations

import hashlib
import os
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from netra.bench import barrier, corpus, summarize
from netra.bench.client import NativeStream, OpenAIStream, StreamError, ids_hash


def test_corpus_exact_lengths_deterministic_and_round_robin_balanced() -> None:
    spec = corpus.CorpusSpec(requests=12, input_len=7, vocab_size=50, workers=3, seed=5, avoid_ids=(0, 49))
    a = corpus.build_corpus(spec)
    assert a == corpus.build_corpus(spec)
    assert len(a) == 12 and all(len(p) == 7 for p in a)
    assert all(0 < t < 49 for p in a for t in p)
    # Round robin over 3 workers in arrival (index) order: worker w gets requests w, w+3, ...
    per_worker = [[a[j] for j in range(w, 12, 3)] for w in range(3)]
    assert per_worker[0] == per_worker[1] == per_worker[2]
    assert len({tuple(p) for p in per_worker[0]}) == 4  # distinct prompts inside one worker's share
    other = corpus.build_corpus(corpus.CorpusSpec(requests=12, input_len=7, vocab_size=50, workers=3, seed=6))
    assert other != a


def test_corpus_rejects_bad_input_naming_it() -> None:
    with pytest.raises(corpus.CorpusError, match="multiple of workers"):
        corpus.build_corpus(corpus.CorpusSpec(requests=10, input_len=4, vocab_size=50, workers=3))
    with pytest.raises(corpus.CorpusError, match="inside the vocabulary"):
        corpus.build_corpus(corpus.CorpusSpec(requests=2, input_len=4, vocab_size=50, high=60))
    with pytest.raises(corpus.CorpusError, match="no token IDs left"):
        corpus.build_corpus(corpus.CorpusSpec(requests=2, input_len=4, vocab_size=2, avoid_ids=(0, 1)))


def test_split_and_assign() -> None:
    assert corpus.split(10, 4) == [3, 3, 2, 2]
    assert sum(corpus.split(1023, 8)) == 1023
    assert corpus.assign_clients(7, 3) == [[0, 3, 6], [1, 4], [2, 5]]


def _native_events(ids: list[int], interval: int, cumulative: bool) -> list[dict]:
    events, sent = [], 0
    while sent < len(ids):
        nxt = min(len(ids), 1 if sent == 0 else sent + interval)
        out = ids[:nxt] if cumulative else ids[sent:nxt]
        fr = {"type": "length", "length": nxt} if nxt == len(ids) else None
        events.append({"output_ids": out, "meta_info": {"completion_tokens": nxt, "prompt_tokens": 3,
                                                        "cached_tokens": 0, "finish_reason": fr}})
        sent = nxt
    return events


@pytest.mark.parametrize("interval", [1, 3, 4])
def test_native_stream_reconstructs_cumulative_and_incremental_identically(interval: int) -> None:
    ids = [5, 9, 9, 2, 7, 1, 1, 8, 3, 6]
    results = []
    for cumulative in (True, False):
        s = NativeStream()
        counts = [s.feed(e) for e in _native_events(ids, interval, cumulative)]
        assert sum(counts) == len(ids) and counts[0] == 1
        assert s.ids == ids
        results.append(s.result())
    assert results[0] == results[1]
    assert results[0]["output_hash"] == hashlib.sha256(np.asarray(ids, dtype="<i4").tobytes()).hexdigest()
    assert results[0]["finish_reason"] == "length" and results[0]["output_count"] == 10


def test_native_stream_rejects_malformed_events() -> None:
    s = NativeStream()
    s.feed({"output_ids": [1, 2], "meta_info": {"completion_tokens": 2}})
    with pytest.raises(StreamError, match="neither cumulative nor incremental"):
        s.feed({"output_ids": [3], "meta_info": {"completion_tokens": 5}})
    s = NativeStream()
    s.feed({"output_ids": [1, 2], "meta_info": {"completion_tokens": 2}})
    with pytest.raises(StreamError, match="rewrote"):
        s.feed({"output_ids": [1, 9, 4], "meta_info": {"completion_tokens": 3}})
    with pytest.raises(StreamError, match="error event"):
        NativeStream().feed({"error": {"message": "boom"}})


def test_openai_stream_counts_from_continuous_usage_and_final_usage() -> None:
    s = OpenAIStream()
    u = {"prompt_tokens": 4, "prompt_tokens_details": {"cached_tokens": 0}}
    assert s.feed({"choices": [{"text": " a", "finish_reason": None}], "usage": {**u, "completion_tokens": 1}}) == 1
    assert s.feed({"choices": [{"text": " b c", "finish_reason": "length"}],
                   "usage": {**u, "completion_tokens": 3}}) == 2
    assert s.feed({"choices": [], "usage": {**u, "completion_tokens": 3}}) == 0
    r = s.result()
    assert (r["prompt_tokens"], r["completion_tokens"], r["output_count"], r["cached_tokens"]) == (4, 3, 3, 0)
    assert r["finish_reason"] == "length"
    assert r["output_hash"] == hashlib.sha256(b" a b c").hexdigest()
    plain = OpenAIStream()  # no continuous usage: one token per content event, counts from final usage
    plain.feed({"choices": [{"text": " a"}]})
    plain.feed({"choices": [{"text": " b", "finish_reason": "length"}]})
    plain.feed({"choices": [], "usage": {**u, "completion_tokens": 2}})
    assert plain.result()["output_count"] == 2 and plain.result()["events_with_content"] == 2


def _rec(idx: int, client: int, t0: float, ttft: float, gaps: list[float], n_per_event: int = 1) -> dict:
    events, t = [], t0 + ttft
    events.append([t, 1])
    for g in gaps:
        t += g
        events.append([t, n_per_event])
    n = 1 + n_per_event * len(gaps)
    return {"idx": idx, "rid": f"r-{idx}", "client": client, "t_start": t0, "t_first": t0 + ttft, "t_end": t + 0.001,
            "events": events, "bytes": 100 * n, "status": 200, "error": None, "prompt_tokens": 8,
            "completion_tokens": n, "cached_tokens": 0, "finish_reason": "length", "output_count": n,
            "output_hash": ids_hash(list(range(n)))}


def test_summary_uses_one_global_window_and_hand_computed_latencies() -> None:
    # Client 0 runs early and fast, client 1 late: summing per-client rates would overstate.
    recs = [_rec(0, 0, 10.0, 0.1, [0.01, 0.02, 0.03]), _rec(1, 1, 10.5, 0.2, [0.05, 0.05, 0.05])]
    s = summarize.summarize(recs)
    window = (10.5 + 0.2 + 0.15 + 0.001) - 10.0
    assert s["window_s"] == pytest.approx(window)
    assert s["output_tok_s"] == pytest.approx(8 / window)
    assert s["total_tok_s"] == pytest.approx(24 / window)
    assert s["req_s"] == pytest.approx(2 / window)
    per_client_sum = sum(4 / (r["t_end"] - r["t_start"]) for r in recs)
    assert per_client_sum > s["output_tok_s"] * 2
    assert s["ttft_ms"]["mean"] == pytest.approx(150.0)
    assert s["ttft_ms"]["p50"] == pytest.approx(150.0)
    assert s["tpot_ms"]["mean"] == pytest.approx((20.0 + 50.0) / 2)
    itl = [10, 20, 30, 50, 50, 50]
    assert s["itl_ms"]["mean"] == pytest.approx(np.mean(itl))
    assert s["itl_ms"]["p90"] == pytest.approx(np.percentile(itl, 90))
    assert s["bytes_per_output_token"] == pytest.approx(100.0)


def test_itl_spreads_coalesced_events_over_their_tokens() -> None:
    s = summarize.summarize([_rec(0, 0, 0.0, 0.1, [0.04, 0.04], n_per_event=4)])
    assert s["itl_ms"]["mean"] == pytest.approx(10.0)
    assert s["tpot_ms"]["mean"] == pytest.approx(80.0 / 8)
    assert s["tokens_per_event"] == pytest.approx(9 / 3)


def test_exact_checks_name_each_bad_request() -> None:
    expect = summarize.Expect(requests=4, input_len=8, output_len=4)
    good = [_rec(i, 0, 0.0, 0.1, [0.01] * 3) for i in range(4)]
    checks, failures = summarize.check_records(good, expect)
    assert failures == [] and checks["passed"] and checks["completion_tokens_total"] == 16
    bad = [dict(r) for r in good[:3]]
    bad[1]["completion_tokens"] = 3
    bad[1]["output_count"] = 3
    bad[2]["cached_tokens"] = 8
    checks, failures = summarize.check_records(bad, expect)
    assert not checks["passed"]
    assert any("completed 3 of 4" in f and "missing requests [3]" in f for f in failures)
    assert any(f.startswith("request 1 ") and "completion_tokens=3 != output_len 4" in f for f in failures)
    assert any(f.startswith("request 2 ") and "cached_tokens=8" in f for f in failures)
    unreported = [dict(r, cached_tokens=None) for r in good]
    _, failures = summarize.check_records(unreported, expect)
    assert len(failures) == 4 and all("cached_tokens=None" in f for f in failures)
    checks, failures = summarize.check_records(unreported, summarize.Expect(4, 8, 4, cached_required=False))
    assert failures == [] and checks["cached_tokens_unreported"] == 4
    wide = [_rec(0, 0, 0.0, 0.1, [0.01], n_per_event=5)]
    _, failures = summarize.check_records(wide, summarize.Expect(1, 8, 6, stream_interval=4))
    assert any("5 tokens > stream interval 4" in f for f in failures)


def test_barrier_releases_only_after_every_client_is_ready(tmp_path: Path) -> None:
    starts: list[float] = []

    def client(k: int, delay: float) -> None:
        time.sleep(delay)
        barrier.announce_ready(tmp_path, k)
        starts.append(barrier.wait_release(tmp_path, timeout_s=30))

    threads = [threading.Thread(target=client, args=(k, 0.05 * k)) for k in range(3)]
    for t in threads:
        t.start()
    t_before = barrier.now()
    start = barrier.release_when_ready(tmp_path, 3, timeout_s=30)
    for t in threads:
        t.join()
    assert start >= t_before + 0.1  # waited for the slowest client (0.1 s)
    assert starts == [start] * 3
    assert barrier.now() >= start


def test_barrier_reports_a_dead_client(tmp_path: Path) -> None:
    with pytest.raises(barrier.BarrierError, match="client 1 died"):
        barrier.release_when_ready(tmp_path, 2, timeout_s=30, alive=lambda: "client 1 died")
    with pytest.raises(barrier.BarrierError, match=r"clients \[0, 1\] not ready"):
        barrier.release_when_ready(tmp_path, 2, timeout_s=0.05)


def test_record_command_reproduces_the_configuration() -> None:
    import shlex
    from dataclasses import replace

    from netra.bench import serve
    from netra.cli import build_parser

    cfg = serve.BenchConfig(url="http://127.0.0.1:8100", api="openai", clients=3, concurrency=12, requests=48,
                            input_len=100, output_len=20, stream_interval=4, workers=2, seed=7, vocab_size=264,
                            info_url="http://127.0.0.1:30100", token_range="0:256", avoid_ids=[5, 6],
                            model="netra-tiny", continuous_usage=False, warmup=2, scenario="x", target="cpu",
                            client_cpus=[min(os.sched_getaffinity(0))])
    argv = shlex.split(cfg.command())
    assert argv[:3] == ["netra", "bench", "serve"]
    args = build_parser(argv[1:]).parse_args(argv[1:])
    again = serve.config_from_args(args)
    assert replace(again, work_dir=None, progress=True) == replace(cfg, work_dir=None, progress=True)
