"""The engine on the synthesized checkpoint (real vocabulary): the stop ids of generation_config.json end a
request on ``<|im_end|>``, the tokenizer it loads is the real one, and structured output works over the
248k vocabulary."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from netra.engine.config import ConfigError, ModelConfig
from netra.engine.engine import Engine, build_engine
from netra.engine.grammar import Grammar, grammar_tokenizer
from netra.engine.options import EngineOptions
from netra.engine.request import Output, Request, SamplingParams
from netra.tokenizers import HFTokenizer

IM_END, ENDOFTEXT = 248046, 248044


def _write_config(path: Path, gen: object | None) -> None:
    from netra.engine.config import preset

    path.mkdir()
    (path / "config.json").write_text(json.dumps(preset("tiny").to_hf()))
    if gen is not None:
        (path / "generation_config.json").write_text(json.dumps(gen))


def test_stop_ids_are_the_union_of_config_and_generation_config(tmp_path: Path) -> None:
    _write_config(tmp_path / "a", {"eos_token_id": [7, 257, 9]})
    assert ModelConfig.from_dir(tmp_path / "a").eos_token_id == (257, 7, 9)
    _write_config(tmp_path / "b", {"eos_token_id": 257})
    assert ModelConfig.from_dir(tmp_path / "b").eos_token_id == (257,)
    _write_config(tmp_path / "c", None)
    assert ModelConfig.from_dir(tmp_path / "c").eos_token_id == (257,)
    _write_config(tmp_path / "d", {"eos_token_id": ["x"]})
    with pytest.raises(ConfigError, match="eos_token_id"):
        ModelConfig.from_dir(tmp_path / "d")


@pytest.fixture(scope="module")
def engine(qwen36_checkpoint: Path) -> Engine:
    return build_engine(EngineOptions(checkpoint=str(qwen36_checkpoint), context_length=512, max_running_requests=4))


def _run(e: Engine, reqs: dict[str, tuple[list[int], SamplingParams, Grammar | None]]) -> dict[str, list[Output]]:
    events: dict[str, list[Output]] = {}
    for i, (rid, (prompt, params, grammar)) in enumerate(reqs.items()):
        e.scheduler.submit(Request(rid, prompt, params, lambda o: events.setdefault(o.rid, []).append(o),
                                   seed=1000 + i, grammar=grammar))
    e.scheduler.run_until_idle()
    return events


def test_engine_loads_the_real_tokenizer_and_stop_ids(engine: Engine) -> None:
    assert isinstance(engine.tokenizer, HFTokenizer) and engine.tokenizer.vocab_size == 248077
    assert engine.tokenizer.encode("<|im_start|>user") == [248045, 846]
    assert engine.tokenizer.decode([248068, 9419, 248069, IM_END]) == "<think>Hello</think>"
    assert engine.config.eos_token_id == (ENDOFTEXT, IM_END) and engine.config.vocab_size == 248320


def test_im_end_stops_a_request(engine: Engine) -> None:
    prompt = engine.tokenizer.encode("<|im_start|>user\nHello<|im_end|>\n<|im_start|>assistant\n")
    forced = SamplingParams(max_new_tokens=8, temperature=1.0, logit_bias=((IM_END, 100.0),))
    out = _run(engine, {"stop": (prompt, forced, None),
                        "ignored": (prompt, SamplingParams(max_new_tokens=8, temperature=1.0, ignore_eos=True,
                                                           logit_bias=((IM_END, 100.0),)), None)})
    assert out["stop"][-1].finish_reason == {"type": "stop", "matched": IM_END}
    assert out["stop"][-1].completion_tokens == 1
    assert out["ignored"][-1].finish_reason == {"type": "length", "length": 8}


def test_json_schema_output_is_valid_json(engine: Engine) -> None:
    schema = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 12},
                                                "n": {"type": "integer", "enum": [1, 22, 333]},
                                                "ok": {"type": "boolean"}},
              "required": ["name", "n", "ok"], "additionalProperties": False}
    cfg = engine.config
    llt = grammar_tokenizer(engine.tokenizer, cfg.vocab_size, cfg.eos_token_id)
    prompt = engine.tokenizer.encode("<|im_start|>user\nJSON please<|im_end|>\n<|im_start|>assistant\n")
    reqs = {f"j{i}": (prompt, SamplingParams(max_new_tokens=96, temperature=1.0),
                      Grammar(llt, "json_schema", json.dumps(schema))) for i in range(3)}
    out = _run(engine, reqs)
    for rid in reqs:
        assert out[rid][-1].finish_reason is not None and out[rid][-1].finish_reason["type"] == "stop", out[rid][-1]
        ids = [t for ev in out[rid] for t in ev.new_ids]
        doc = json.loads(engine.tokenizer.decode(ids))
        assert set(doc) == {"name", "n", "ok"} and doc["n"] in (1, 22, 333) and isinstance(doc["ok"], bool)
        assert isinstance(doc["name"], str) and len(doc["name"]) <= 12
