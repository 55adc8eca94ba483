"""Bytes on the wire per output token stay flat to the client whatever the worker's streaming mode."""

from __future__ import annotations

from pathlib import Path

import pytest

from netra.bench.wirebytes import Row, measure, summarize


@pytest.fixture(scope="module")
def rows() -> list[Row]:
    return measure("fake", [16, 256, 2048], stream_interval=1, log=lambda *_: None)


def test_usage_exact_and_stream_equals_whole(rows: list[Row]) -> None:
    assert len(rows) == 2 * 2 * 3
    for r in rows:
        assert r.completion_tokens == r.output_len
        assert r.stream_equals_whole
        # `netra serve` ran as its own process: its CPU time for the stream was read from /proc.
        assert (r.serve_cpu_s is None) == (r.output_len < 256)


def test_client_bytes_per_token_flat_in_both_modes(rows: list[Row]) -> None:
    summary = summarize(rows)
    for endpoint in ("completions", "chat"):
        for mode in ("cumulative", "incremental"):
            s = summary[f"{endpoint}/{mode}"]
            # Flat: at 16 tokens the per-request overhead (usage event, [DONE]) and the text's mix of
            # multi-byte characters move it; a stream that re-sent the output would grow ~L/2 (x100).
            assert s["client_bpt_max_over_min"] < 2.0, (endpoint, mode, s)
            by_len = {r.output_len: r for r in rows if r.endpoint == endpoint and r.mode == mode}
            b256 = by_len[256].client_bytes / 256
            b2048 = by_len[2048].client_bytes / 2048
            assert 0.8 < b2048 / b256 < 1.25, (endpoint, mode, b256, b2048)
            # The client sees the same bytes whichever mode the worker streams in (ids and timestamps
            # have fixed widths, the text and the events are the same).
            other = "incremental" if mode == "cumulative" else "cumulative"
            same = {r.output_len: r for r in rows if r.endpoint == endpoint and r.mode == other}
            for n in (16, 256, 2048):
                assert (by_len[n].client_bytes, by_len[n].client_events) == \
                    (same[n].client_bytes, same[n].client_events)


def test_cumulative_upstream_grows_incremental_does_not(rows: list[Row]) -> None:
    summary = summarize(rows)
    for endpoint in ("completions", "chat"):
        assert summary[f"{endpoint}/cumulative"]["upstream_bpt_longest_over_shortest"] > 10
        assert 0.8 < summary[f"{endpoint}/incremental"]["upstream_bpt_longest_over_shortest"] < 1.25
        cum = {r.output_len: r for r in rows if r.endpoint == endpoint and r.mode == "cumulative"}
        # Quadratic: total cumulative upstream bytes grow ~64x from 256 to 2048 tokens (8x length).
        assert cum[2048].upstream_bytes / cum[256].upstream_bytes > 30


def test_record_written(tmp_path: Path) -> None:
    import json

    from netra.bench.wirebytes import main

    assert main(["--worker", "fake", "--lengths", "16", "64", "--endpoints", "completions", "--out",
                 str(tmp_path)]) == 0
    rec = json.loads((tmp_path / "wire-bytes-fake-si1.json").read_text())
    assert rec["kind"] == "serving" and rec["target"] == "cpu" and rec["status"] == "measured"
    assert rec["command"].startswith("netra bench wirebytes --worker fake")
    assert {r["scenario"] for r in rec["rows"]} == {"wire-bytes/completions/cumulative",
                                                   "wire-bytes/completions/incremental"}
    assert rec["checks"]["completion_tokens_exact"] is True
    assert rec["checks"]["same_text_in_both_modes"] is True
