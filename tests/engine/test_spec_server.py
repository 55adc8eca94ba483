"""Speculative decoding at the worker's interface: SGLang's flags, meta_info, /server_info and /metrics, exact on
a scripted run (the forced-acceptance oracle commits a known number of drafts per verify)."""

from __future__ import annotations

import httpx
import orjson
import pytest
from prometheus_client.parser import text_string_to_metric_families

from netra.engine.cli import add_arguments, options_from_args
from netra.engine.options import EngineOptions, OptionsError
from netra.engine.process import engine_process


def test_speculative_options_are_sglangs_and_checked() -> None:
    import argparse

    p = argparse.ArgumentParser()
    add_arguments(p)
    opt = options_from_args(p.parse_args(["--speculative-algorithm", "ORACLE", "--speculative-num-draft-tokens", "6",
                                          "--speculative-oracle-accept", "1,5", "3"]))
    assert (opt.speculative_algorithm, opt.speculative_num_draft_tokens, opt.speculative_oracle_accept) == \
        ("oracle", 6, (1, 5, 3))
    assert opt.to_json()["speculative_oracle_accept"] == [1, 5, 3]
    for bad, match in (({"speculative_algorithm": "eagle"}, "speculative-algorithm"),
                       ({"speculative_algorithm": "dflash"}, "draft-model-path"),
                       ({"speculative_num_draft_tokens": 4}, "need --speculative-algorithm"),
                       ({"speculative_algorithm": "oracle", "speculative_num_draft_tokens": 1}, "at least 2"),
                       ({"speculative_algorithm": "oracle", "speculative_oracle_accept": (-1,)}, "oracle-accept")):
        with pytest.raises(OptionsError, match=match):
            EngineOptions(**bad)  # type: ignore[arg-type]


def _families(url: str) -> dict[str, list]:
    text = httpx.get(url + "/metrics", timeout=10).text
    return {f.name: f.samples for f in text_string_to_metric_families(text)}


def _value(fams: dict[str, list], sample: str, **labels: str) -> float:
    return sum(s.value for samples in fams.values() for s in samples
               if s.name == sample and all(s.labels.get(k) == v for k, v in labels.items()))


def test_meta_info_server_info_and_metrics_are_exact_on_a_scripted_run() -> None:
    """T = 4, every verify commits 2 drafts + the bonus (3 tokens) unless max_new_tokens cuts the block: a request
    of 10 tokens takes the prefill's token and 3 verifies (accept length 10/3), one of 9 ends its third block after
    2 tokens (one draft). meta_info reports SGLang's spec_verify_ct and spec_accept_length per request, /metrics the
    counters summed over both, /server_info the algorithm and T."""
    with engine_process("--preset", "tiny", "--context-length", "256", "--enable-metrics",
                        "--speculative-algorithm", "oracle", "--speculative-num-draft-tokens", "4",
                        "--speculative-oracle-accept", "2") as url:
        info = httpx.get(url + "/server_info", timeout=10).json()
        assert info["speculative_algorithm"] == "oracle" and info["speculative_num_draft_tokens"] == 4
        metas = {}
        for n, stream in ((10, False), (9, True)):
            body = {"input_ids": [1, 2, 3], "stream": stream,
                    "sampling_params": {"max_new_tokens": n, "temperature": 0, "ignore_eos": True}}
            if stream:
                with httpx.stream("POST", url + "/generate", json=body, timeout=60) as r:
                    events = [line for line in r.iter_lines() if line.startswith("data: {")]
                last = orjson.loads(events[-1][6:])
                assert len(events) == 4  # the prefill's token, then one event per verify
            else:
                last = httpx.post(url + "/generate", json=body, timeout=60).json()
            assert len(last["output_ids"]) == n
            metas[n] = last["meta_info"]
        fams = _families(url)
    assert metas[10]["spec_verify_ct"] == 3 and metas[10]["spec_accept_length"] == pytest.approx(10 / 3)
    assert metas[9]["spec_verify_ct"] == 3 and metas[9]["spec_accept_length"] == pytest.approx(9 / 3)
    assert metas[10]["completion_tokens"] == 10
    p = "netra_engine_spec_decode_"
    assert _value(fams, p + "num_drafts_total") == 6
    assert _value(fams, p + "num_draft_tokens_total") == 18
    assert _value(fams, p + "num_accepted_tokens_total") == 11  # 2 + 2 + 2, then 2 + 2 + 1
    assert _value(fams, p + "num_accepted_tokens_per_pos_total", position="0") == 6
    assert _value(fams, p + "num_accepted_tokens_per_pos_total", position="1") == 5
    assert _value(fams, "sglang:spec_accept_length") == pytest.approx(1 + 11 / 6)
    assert _value(fams, "sglang:spec_accept_rate") == pytest.approx(11 / 18)


def test_no_speculative_fields_without_speculation(engine_url: str) -> None:
    r = httpx.post(engine_url + "/generate", json={"input_ids": [1, 2], "sampling_params": {
        "max_new_tokens": 2, "temperature": 0}}, timeout=60).json()
    assert "spec_verify_ct" not in r["meta_info"]
    assert httpx.get(engine_url + "/server_info", timeout=10).json()["speculative_algorithm"] is None
