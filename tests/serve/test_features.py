"""OpenAI parity features of the response layer against the contract fake worker (cumulative and
incremental streaming): logprobs shapes and alignment, SGLang-named pass-through (checked against
the pinned wheel), tool-call parsing, echo, batch /generate, unknown and refused keys, models."""

from __future__ import annotations

import ast
import importlib.util
import json
import logging
import random
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from netra.serve.fakeworker import FakeConfig, fake_logprob, prompt_token_ids, reference_output
from netra.serve.tokenizer import ChatTemplate, ModelText
from netra.serve.tools import ToolCallParser, call_text, required_grammar
from netra.tokenizers import ByteTokenizer

from .conftest import MODEL, Stack, make_stack
from .test_app import client

_SPEC = importlib.util.find_spec("sglang")
WHEEL = Path(next(iter(_SPEC.submodule_search_locations or []))) if _SPEC else Path("/nonexistent")


def _expected_logprobs(stack: Stack, k: int) -> list[tuple[float, int, list[tuple[float, int]]]]:
    body = stack.fake.requests[-1]
    out, finish = reference_output(prompt_token_ids(body), body["sampling_params"])
    visible = out[:-1] if finish["type"] == "stop" else out
    rows = [fake_logprob(i, t, k) for i, t in enumerate(visible)]
    return [(e[0], e[1], [(a[0], a[1]) for a in top]) for e, top in rows]


@pytest.mark.parametrize("interval", [1, 3])
def test_chat_logprobs_stream_equals_whole_and_match_the_worker(tokenizer_dir: Path, interval: int) -> None:
    for incremental in (False, True):
        with make_stack(tokenizer_dir, FakeConfig(incremental=incremental, stream_interval=interval),
                        stream_interval=2) as stack:
            c = client(stack)
            kw: dict[str, Any] = dict(model=MODEL, messages=[{"role": "user", "content": "héllo"}], max_tokens=17,
                                      temperature=0, logprobs=True, top_logprobs=3)
            whole = c.chat.completions.create(**kw)
            want = _expected_logprobs(stack, 3)
            got = whole.choices[0].logprobs.content  # type: ignore[union-attr]
            assert [(g.logprob, g.bytes) for g in got] == [(lp, [t]) for lp, t, _ in want]
            assert [[(a.logprob, a.bytes) for a in g.top_logprobs] for g in got] == \
                [[(alp, [at]) for alp, at in top] for _, _, top in want]
            streamed = []
            for chunk in c.chat.completions.create(stream=True, **kw):
                if chunk.choices and chunk.choices[0].logprobs is not None:
                    streamed += chunk.choices[0].logprobs.content or []
            assert [(g.logprob, g.bytes, g.token) for g in streamed] == [(g.logprob, g.bytes, g.token) for g in got]
            body = stack.fake.requests[-1]
            assert body["return_logprob"] is True and body["top_logprobs_num"] == 3


def test_completion_logprobs_legacy_shape_and_echo(stack: Stack) -> None:
    c = client(stack)
    r = c.completions.create(model=MODEL, prompt="abc", max_tokens=6, temperature=0, logprobs=2)
    want = _expected_logprobs(stack, 2)
    lp = r.choices[0].logprobs
    assert lp is not None and lp.token_logprobs == [w[0] for w in want]
    assert lp.tokens is not None and "".join(lp.tokens) == r.choices[0].text
    assert lp.text_offset == [sum(len(t) for t in lp.tokens[:i]) for i in range(len(lp.tokens))]
    assert lp.top_logprobs is not None and all(len(t) <= 2 for t in lp.top_logprobs)
    plain = c.completions.create(model=MODEL, prompt="abc", max_tokens=6, temperature=0).choices[0].text
    echoed = c.completions.create(model=MODEL, prompt="abc", max_tokens=6, temperature=0, echo=True).choices[0].text
    assert echoed == "abc" + plain
    parts = [ch.choices[0].text for ch in c.completions.create(model=MODEL, prompt=[97, 98], max_tokens=6,
                                                                temperature=0, echo=True, stream=True) if ch.choices]
    assert "".join(parts).startswith("ab") and parts[0].startswith("ab")


def test_sglang_names_pass_through_and_validate_in_the_pinned_wheel(stack: Stack, tmp_path: Path) -> None:
    c = client(stack)
    c.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "x"}], max_tokens=4, frequency_penalty=0.5,
        presence_penalty=-0.25, logit_bias={"65": 3.0}, seed=3, logprobs=True, top_logprobs=2,
        response_format={"type": "json_schema", "json_schema": {"name": "o", "schema": {"type": "object"}}},
        extra_body={"repetition_penalty": 1.2, "min_tokens": 2, "top_k": 5})
    chat_body = stack.fake.requests[-1]
    sp = chat_body["sampling_params"]
    assert (sp["frequency_penalty"], sp["presence_penalty"], sp["repetition_penalty"], sp["min_new_tokens"]) == \
        (0.5, -0.25, 1.2, 2)
    assert sp["logit_bias"] == {"65": 3.0} and json.loads(sp["json_schema"]) == {"type": "object"}
    c.completions.create(model=MODEL, prompt="x", max_tokens=4, extra_body={"regex": "[ab]+"})
    regex_body = stack.fake.requests[-1]
    tools = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]
    c.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "x"}], max_tokens=4, tools=tools,
                              tool_choice="required")
    tool_body = stack.fake.requests[-1]
    added = stack.serve._text.added_tokens if stack.serve._text is not None else ()
    assert tool_body["sampling_params"]["ebnf"] == required_grammar(tools, None, True, added)
    bodies = tmp_path / "bodies.json"
    bodies.write_text(json.dumps([chat_body, regex_body, tool_body]))
    # Every key is a field of SGLang 0.5.23's GenerateReqInput (read from the wheel's source), and
    # every sampling_params dict builds and verifies as the wheel's own SamplingParams.
    tree = ast.parse((WHEEL / "srt" / "managers" / "io_struct.py").read_text())
    cls = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "GenerateReqInput")
    fields = {s.target.id for s in cls.body if isinstance(s, ast.AnnAssign) and isinstance(s.target, ast.Name)}
    for body in (chat_body, regex_body, tool_body):
        assert set(body) <= fields, set(body) - fields
    script = ("import json, sys\nfrom netra.deploy.sglang import _import_server_args\n_import_server_args()\n"
              "from sglang.srt.sampling.sampling_params import SamplingParams\n"
              "for b in json.load(open(sys.argv[1])):\n"
              "    p = SamplingParams(**b['sampling_params']); p.verify(300)\n"
              "print('verified', len(json.load(open(sys.argv[1]))))\n")
    out = subprocess.run([sys.executable, "-c", script, str(bodies)], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0 and "verified 3" in out.stdout, out.stdout + out.stderr


def test_unknown_keys_are_ignored_with_a_warning_and_unsupported_ones_refused(
        stack: Stack, caplog: pytest.LogCaptureFixture) -> None:
    c = client(stack)
    with caplog.at_level(logging.WARNING, logger="netra.serve"):
        r = c.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "x"}], max_tokens=2,
                                      extra_body={"stream_reasoning": True, "my_knob": 1})
    assert r.choices[0].finish_reason == "length"
    assert any("my_knob" in rec.getMessage() and "stream_reasoning" in rec.getMessage() for rec in caplog.records)
    for key, value in (("suffix", "x"), ("functions", []), ("structural_tag", {})):
        with pytest.raises(openai.BadRequestError) as e:
            c.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "x"}], extra_body={key: value})
        assert e.value.body["param"] == key  # type: ignore[index]
    with pytest.raises(openai.BadRequestError, match="at most one output constraint"):
        c.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "x"}],
                                  response_format={"type": "json_object"}, extra_body={"regex": "a"})
    with pytest.raises(openai.BadRequestError, match="not among the tools"):
        c.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "x"}],
                                  tools=[{"type": "function", "function": {"name": "f"}}],
                                  tool_choice={"type": "function", "function": {"name": "g"}})


def test_models_retrieve_max_model_len_and_default_max_tokens(stack: Stack) -> None:
    c = client(stack)
    card = c.models.retrieve(c.models.list().data[0].id)
    assert card.model_extra is not None and card.model_extra["max_model_len"] == 4096  # the fake's context
    with pytest.raises(openai.NotFoundError):
        c.models.retrieve("no-such-model")
    c.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "x"}])
    body = stack.fake.requests[-1]
    assert body["sampling_params"]["max_new_tokens"] == 4096 - len(body["input_ids"])


def test_generate_batch_and_logprob_fields(stack: Stack) -> None:
    with httpx.Client(base_url=stack.url, timeout=30) as h:
        r = h.post("/generate", json={"input_ids": [[1, 2], [3, 4, 5]], "sampling_params": {"max_new_tokens": 3},
                                      "return_logprob": True, "top_logprobs_num": 2})
        assert r.status_code == 200
        results = r.json()
        assert [x["meta_info"]["prompt_tokens"] for x in results] == [2, 3]
        for prompt, res in zip(([1, 2], [3, 4, 5]), results, strict=True):
            out, _ = reference_output(prompt, {"max_new_tokens": 3})
            assert res["output_ids"] == out
            assert res["meta_info"]["output_token_logprobs"] == [fake_logprob(i, t, 2)[0] for i, t in enumerate(out)]
        r = h.post("/generate", json={"text": ["a", "b"], "stream": True})
        assert r.status_code == 400 and "batch" in r.json()["error"]["message"]


def test_tool_call_parser_any_split_equals_whole() -> None:
    text = ("Let me check.\n" + call_text("get_weather", {"city": "Paris"}) + "\n"
            + call_text("add", '{"a": 1, "b": 2}') + "\n<tool_call>\nnot json\n</tool_call> tail <tool")
    whole = ToolCallParser()
    content, calls = whole.push(text)
    content += whole.flush()
    assert [(c.name, json.loads(c.arguments)) for c in calls] == [("get_weather", {"city": "Paris"}),
                                                                  ("add", {"a": 1, "b": 2})]
    assert content == "Let me check.\n<tool_call>\nnot json\n</tool_call> tail <tool"
    rng = random.Random(0)
    for _ in range(50):
        p = ToolCallParser()
        cuts = sorted(rng.sample(range(1, len(text)), 8))
        got, names = "", []
        for a, b in zip([0, *cuts], [*cuts, len(text)], strict=True):
            part, new = p.push(text[a:b])
            got += part
            names += [c.name for c in new]
        got += p.flush()
        assert (got, names) == (content, ["get_weather", "add"])


def test_tools_reach_the_template_and_calls_come_back(tokenizer_dir: Path) -> None:
    # What reaches the worker: a checkpoint template gets `tools`; the plain template (seeded presets)
    # gets Qwen3's instructions and replayed calls as the model writes them. (Parsing calls out of a
    # real model's output: tests/deploy/test_openai_parity.py.)
    with make_stack(tokenizer_dir) as stack:
        c = client(stack)
        tools = [{"type": "function", "function": {"name": "get_weather",
                                                   "parameters": {"type": "object",
                                                                  "properties": {"city": {"type": "string"}}}}}]
        c.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "x"}], max_tokens=2, tools=tools)
        rendered = bytes(t for t in stack.fake.requests[-1]["input_ids"] if t < 256).decode("utf-8", "replace")
        assert "get_weather" not in rendered  # the fake's ChatML template ignores tools ...
        stack.serve._text = ModelText(ByteTokenizer(), ChatTemplate(None), "byte")
        history = [{"role": "user", "content": "x"},
                   {"role": "assistant", "content": None,
                    "tool_calls": [{"id": "c1", "type": "function",
                                    "function": {"name": "get_weather", "arguments": '{"city": "Oslo"}'}}]},
                   {"role": "tool", "tool_call_id": "c1", "content": "sunny"}]
        c.chat.completions.create(model=MODEL, messages=history, max_tokens=2, tools=tools)  # type: ignore[arg-type]
        rendered = bytes(stack.fake.requests[-1]["input_ids"]).decode("utf-8", "replace")
        assert rendered.startswith("system: # Tools") and '"name": "get_weather"' in rendered
        assert call_text("get_weather", {"city": "Oslo"}) in rendered and "tool: sunny" in rendered
