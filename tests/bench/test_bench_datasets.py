"""Datasets, arrival schedules, goodput and the wider latency statistics of `netra bench serve`."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

from netra.bench import corpus, datasets, summarize
from netra.tokenizers import ByteTokenizer


def _cspec(**kw: object) -> corpus.CorpusSpec:
    return corpus.CorpusSpec(**{"requests": 12, "input_len": 16, "vocab_size": 200, "workers": 2, "seed": 3,
                                "avoid_ids": (7,), **kw})  # type: ignore[arg-type]


def test_random_fixed_lengths_is_the_corpus_and_range_ratio_bounds_lengths() -> None:
    items = datasets.build(datasets.LoadSpec(), _cspec(), 8, None, None)
    assert [i["input_ids"] for i in items] == corpus.build_corpus(_cspec())
    assert all(i["prompt_len"] == 16 and i["output_len"] == 8 for i in items)
    varied = datasets.build(datasets.LoadSpec(range_ratio=0.5), _cspec(), 8, None, None)
    ins, outs = [i["prompt_len"] for i in varied], [i["output_len"] for i in varied]
    assert all(8 <= n <= 16 for n in ins) and all(4 <= n <= 8 for n in outs) and len(set(ins)) > 1
    assert all(len(i["input_ids"]) == i["prompt_len"] and 7 not in i["input_ids"] for i in varied)
    assert varied[0] == varied[1] and varied[2] == varied[3]  # round robin: each worker gets the same work


def test_shared_prefix_requests_share_their_group_prefix() -> None:
    items = datasets.build(datasets.LoadSpec(dataset="shared-prefix", prefix_len=10, num_prefixes=3),
                           _cspec(requests=12, workers=1), 4, None, None)
    assert all(i["prompt_len"] == 26 for i in items)
    for j, item in enumerate(items):
        assert item["input_ids"][:10] == items[j % 3]["input_ids"][:10]
    assert items[0]["input_ids"][:10] != items[1]["input_ids"][:10]
    assert items[0]["input_ids"][10:] != items[3]["input_ids"][10:]


def test_sharegpt_file_and_chat_prompts(tmp_path: Path) -> None:
    convs = [{"conversations": [{"from": "human", "value": f"question number {i}"},
                                {"from": "gpt", "value": "an answer " * (i + 1)}]} for i in range(10)]
    convs.append({"conversations": [{"from": "human", "value": "hi"}, {"from": "gpt", "value": "no"}]})  # too short
    path = tmp_path / "sg.json"
    path.write_text(json.dumps(convs))
    tok = ByteTokenizer()
    spec = datasets.LoadSpec(dataset="sharegpt", dataset_path=str(path))
    items = datasets.build(spec, _cspec(requests=8, workers=1), 99, None, tok)
    assert all(i["output_len"] == len(("an answer " * (int(bytes(i["input_ids"]).split()[-1]) + 1)).encode())
               for i in items)
    chat = datasets.build(spec, _cspec(requests=4, workers=1), 99, lambda t: [0, 1, *tok.encode(t)], tok)
    assert all(i["prompt_len"] == 2 + len(i["text"].encode()) and "input_ids" not in i for i in chat)
    with pytest.raises(datasets.DatasetError, match="usable"):
        datasets.build(spec, _cspec(requests=20, workers=1), 99, None, tok)


def test_arrivals_are_gamma_with_the_requested_rate_and_burstiness() -> None:
    assert datasets.arrivals(5, math.inf, 1.0, 0) is None
    for burst in (0.5, 1.0, 4.0):
        offsets = np.asarray(datasets.arrivals(20000, 4.0, burst, 1))
        gaps = np.diff(offsets)
        assert offsets[0] == 0.0 and abs(gaps.mean() - 0.25) < 0.01
        assert abs(gaps.std() / gaps.mean() - 1 / math.sqrt(burst)) < 0.05  # gamma: CV = 1/sqrt(shape)
    assert datasets.arrivals(50, 4.0, 1.0, 9) == datasets.arrivals(50, 4.0, 1.0, 9)


def test_slo_parsing_and_goodput() -> None:
    assert datasets.parse_slo("ttft_ms=200,tpot_ms=20") == {"ttft_ms": 200.0, "tpot_ms": 20.0}
    for bad in ("ttft=1", "ttft_ms=x", "tpot_ms=-1"):
        with pytest.raises(datasets.DatasetError):
            datasets.parse_slo(bad)

    def rec(idx: int, t0: float, first: float, gaps: list[float]) -> dict[str, object]:
        t, events = t0 + first, [[t0 + first, 1]]
        for g in gaps:
            t += g
            events.append([t, 1])
        return {"idx": idx, "t_start": t0, "t_first": t0 + first, "t_end": t, "events": events,
                "completion_tokens": len(gaps) + 1, "prompt_tokens": 4, "bytes": 10, "error": None}

    recs = [rec(0, 0.0, 0.1, [0.01, 0.01, 0.05]), rec(1, 0.0, 0.3, [0.01, 0.01]), rec(2, 0.5, 0.05, [0.02])]
    s = summarize.summarize(recs, {"ttft_ms": 200.0, "tpot_ms": 30.0})
    # request 0: ttft 100, tpot (70/3) ok; request 1: ttft 300 misses; request 2: ok
    assert s["goodput"]["good_requests"] == 2 and s["goodput"]["good_fraction"] == pytest.approx(2 / 3)
    assert s["goodput"]["goodput_req_s"] == pytest.approx(2 / s["window_s"])
    itl = np.asarray([0.01, 0.01, 0.05, 0.01, 0.01, 0.02]) * 1e3
    assert s["itl_ms"]["max"] == pytest.approx(itl.max()) and s["itl_ms"]["std"] == pytest.approx(itl.std())
    assert s["itl_ms"]["p95"] == pytest.approx(np.percentile(itl, 95))
    assert summarize.summarize(recs, {"itl_ms": 40.0})["goodput"]["good_requests"] == 2  # request 0's 50 ms gap
