"""Qwen3.6 as a user meets it: `netra serve` in front of an SGLang-contract worker that answers in the
real vocabulary (the synthesized checkpoint's tokenizer.json, chat template and generation_config)
with what the real model writes — reasoning, ``</think>``, Qwen3-Coder XML tool calls, ``<|im_end|>`` —
checked with the `openai` SDK as the client, the template's own render as the reference for the
prompt sent upstream, and SGLang 0.5.23's request fields for what goes to the worker."""

from __future__ import annotations

import ast
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pytest

from netra.serve.fakeworker import FakeConfig
from netra.serve.tokenizer import ChatTemplate
from netra.tokenizers import HFTokenizer
from tests.serve.conftest import Stack, make_stack

IM_END, ENDOFTEXT, THINK_CLOSE_ID = 248046, 248044, 248069
MODEL = "fake/contract-worker"
WHEEL = Path(__import__("importlib").util.find_spec("sglang").origin).parent  # type: ignore[union-attr]
TOOLS: list[dict[str, Any]] = [
    {"type": "function", "function": {
        "name": "get_weather", "description": "Weather for a city",
        "parameters": {"type": "object", "properties": {
            "city": {"type": "string"}, "days": {"type": "integer"}, "metric": {"type": "boolean"},
            "hours": {"type": "array", "items": {"type": "integer"}}},
            "required": ["city"]}}},
    {"type": "function", "function": {
        "name": "add", "parameters": {"type": "object", "properties": {"a": {"type": "number"},
                                                                       "b": {"type": "number"}}}}},
]
REASONING = "The user wants the weather in Paris for three days.\nI should call the tool."
CALL = ("<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n<parameter=days>\n3\n"
        "</parameter>\n<parameter=metric>\ntrue\n</parameter>\n<parameter=hours>\n[9, 12]\n</parameter>\n"
        "</function>\n</tool_call>")
CALL2 = "<tool_call>\n<function=add>\n<parameter=a>\n1.5\n</parameter>\n<parameter=b>\n2\n</parameter>\n</function>\n</tool_call>"
ARGS = {"city": "Paris", "days": 3, "metric": True, "hours": [9, 12]}


@pytest.fixture(scope="module")
def tok(qwen36_checkpoint: Path) -> HFTokenizer:
    return HFTokenizer(qwen36_checkpoint / "tokenizer.json")


@pytest.fixture(scope="module", params=["cumulative", "incremental"])
def qstack(request: pytest.FixtureRequest, qwen36_checkpoint: Path) -> Iterator[Stack]:
    fake = FakeConfig(incremental=request.param == "incremental", script=[IM_END], eos_ids=(IM_END, ENDOFTEXT))
    with make_stack(qwen36_checkpoint, fake, stream_interval=1) as s:
        yield s


def _client(stack: Stack) -> openai.OpenAI:
    return openai.OpenAI(base_url=stack.url + "/v1", api_key="none", max_retries=0, timeout=60)


def _answer(stack: Stack, tok: HFTokenizer, text: str, end: int | None = IM_END) -> list[int]:
    """Script the worker: the model writes ``text`` (after the prompt's ``<think>\\n``), then ``end``."""
    ids = tok.encode(text) + ([end] if end is not None else [])
    stack.fake.config.script = ids
    return ids


def _stream(c: openai.OpenAI, **kw: Any) -> tuple[str, str, dict[int, dict[str, Any]], str | None, Any]:
    reasoning, content, calls, finish, usage = "", "", {}, None, None
    for chunk in c.chat.completions.create(model=MODEL, stream=True, stream_options={"include_usage": True}, **kw):
        if chunk.usage is not None:
            usage = chunk.usage
        for ch in chunk.choices:
            d = ch.delta
            reasoning += getattr(d, "reasoning_content", None) or ""
            content += d.content or ""
            for tc in d.tool_calls or []:
                entry = calls.setdefault(tc.index, {"id": None, "name": None, "arguments": "", "order": []})
                if tc.id:
                    assert entry["id"] is None, "a call's id is sent once"
                    entry["id"] = tc.id
                    entry["order"].append("id")
                if tc.function is not None and tc.function.name:
                    entry["name"] = tc.function.name
                if tc.function is not None and tc.function.arguments:
                    assert entry["id"] is not None, "the id and name come before any argument fragment"
                    entry["arguments"] += tc.function.arguments
                    entry["order"].append("args")
            finish = ch.finish_reason or finish
    return reasoning, content, calls, finish, usage


def test_reasoning_is_separated_whole_and_streamed(qstack: Stack, tok: HFTokenizer) -> None:
    ids = _answer(qstack, tok, REASONING + "\n</think>\n\nIt will be sunny.")
    c = _client(qstack)
    msgs = [{"role": "user", "content": "Weather in Paris?"}]
    r = c.chat.completions.create(model=MODEL, messages=msgs, max_tokens=200)  # type: ignore[arg-type]
    m = r.choices[0].message
    assert (m.content, getattr(m, "reasoning_content", None)) == ("It will be sunny.", REASONING)
    assert r.choices[0].finish_reason == "stop"
    think = ids.index(THINK_CLOSE_ID) + 1  # </think> counts, as in SGLang
    assert r.usage is not None and r.usage.completion_tokens == len(ids)  # the matched <|im_end|> counts
    assert r.usage.completion_tokens_details is not None
    assert r.usage.completion_tokens_details.reasoning_tokens == think
    assert qstack.fake.requests[-1]["require_reasoning"] is True
    reasoning, content, calls, finish, usage = _stream(c, messages=msgs, max_tokens=200)
    assert (reasoning, content, calls, finish) == (REASONING, "It will be sunny.", {}, "stop")
    assert usage.completion_tokens_details.reasoning_tokens == think
    # SGLang's separate_reasoning: false keeps it inline; enable_thinking: false opens no block.
    r = c.chat.completions.create(model=MODEL, messages=msgs, max_tokens=200,  # type: ignore[arg-type]
                                  extra_body={"separate_reasoning": False})
    assert r.choices[0].message.content == REASONING + "\n</think>\n\nIt will be sunny."
    _answer(qstack, tok, "Sunny.")
    r = c.chat.completions.create(model=MODEL, messages=msgs, max_tokens=200,  # type: ignore[arg-type]
                                  extra_body={"chat_template_kwargs": {"enable_thinking": False}})
    assert r.choices[0].message.content == "Sunny." and getattr(r.choices[0].message, "reasoning_content", None) is None
    assert "require_reasoning" not in qstack.fake.requests[-1]
    assert r.usage is not None and r.usage.completion_tokens_details is None


def test_xml_tool_calls_whole_and_streamed(qstack: Stack, tok: HFTokenizer) -> None:
    _answer(qstack, tok, REASONING + "\n</think>\n\n" + CALL + "\n" + CALL2)
    c = _client(qstack)
    msgs = [{"role": "user", "content": "Weather in Paris, and 1.5 + 2?"}]
    r = c.chat.completions.create(model=MODEL, messages=msgs, tools=TOOLS, max_tokens=300)  # type: ignore[arg-type]
    ch = r.choices[0]
    assert ch.finish_reason == "tool_calls"
    assert ch.message.content is None and getattr(ch.message, "reasoning_content", None) == REASONING
    calls = ch.message.tool_calls or []
    assert [(t.function.name, json.loads(t.function.arguments)) for t in calls] == [  # type: ignore[union-attr]
        ("get_weather", ARGS), ("add", {"a": 1.5, "b": 2})]
    assert all(t.id.startswith("call_") for t in calls)
    reasoning, content, streamed, finish, _ = _stream(c, messages=msgs, tools=TOOLS, max_tokens=300)
    assert (reasoning, content.strip(), finish) == (REASONING, "", "tool_calls")
    assert sorted(streamed) == [0, 1]
    assert [(streamed[i]["name"], streamed[i]["arguments"]) for i in (0, 1)] == [
        (t.function.name, t.function.arguments) for t in calls]  # type: ignore[union-attr]
    assert streamed[0]["order"][0] == "id" and streamed[0]["order"].count("args") >= 2  # fragments as params end
    # A call opened without closing </think> ends the reasoning too; text before a call is content.
    _answer(qstack, tok, "Let me look.\n" + CALL)
    r = c.chat.completions.create(model=MODEL, messages=msgs, tools=TOOLS, max_tokens=300)  # type: ignore[arg-type]
    m = r.choices[0].message
    assert getattr(m, "reasoning_content", None) == "Let me look." and m.content is None
    assert json.loads(m.tool_calls[0].function.arguments) == ARGS  # type: ignore[index,union-attr]
    # Markup that is not a well-formed call stays content, never dropped.
    bad = "<tool_call>\n<function=get_weath"
    _answer(qstack, tok, "</think>\n\nBroken: " + bad)
    r = c.chat.completions.create(model=MODEL, messages=msgs, tools=TOOLS, max_tokens=300)  # type: ignore[arg-type]
    assert r.choices[0].finish_reason == "stop" and not r.choices[0].message.tool_calls
    assert r.choices[0].message.content == "Broken: " + bad
    # Cut inside a parameter (max_tokens): the call, already announced when streamed, closes with the
    # parameters that completed; the unfinished one stays content.
    cut = _answer(qstack, tok, "</think>\n\n" + CALL[:CALL.index("<parameter=days>") + 24], end=None)
    r = c.chat.completions.create(model=MODEL, messages=msgs, tools=TOOLS,  # type: ignore[arg-type]
                                  max_tokens=len(cut))
    m = r.choices[0].message
    assert r.choices[0].finish_reason == "length" and m.content == "<parameter=days>\n3\n</par"
    assert [json.loads(t.function.arguments) for t in m.tool_calls or []] == [{"city": "Paris"}]  # type: ignore[union-attr]


def test_multi_turn_tool_conversation_renders_as_the_template_does(qstack: Stack, tok: HFTokenizer,
                                                                   qwen36_checkpoint: Path) -> None:
    _answer(qstack, tok, "</think>\n\nSunny, 21 °C.")
    c = _client(qstack)
    history: list[dict[str, Any]] = [
        {"role": "developer", "content": "Answer briefly."},
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": "", "reasoning": "Call the tool.",
         "tool_calls": [{"id": "call_1", "type": "function",
                         "function": {"name": "get_weather", "arguments": json.dumps(ARGS)}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "sunny, 21 C"},
    ]
    r = c.chat.completions.create(model=MODEL, messages=history, tools=TOOLS, max_tokens=100)  # type: ignore[arg-type]
    assert r.choices[0].message.content == "Sunny, 21 °C."
    reference = [{"role": "system", "content": "Answer briefly."}, history[1],
                 {**history[2], "reasoning_content": "Call the tool.",
                  "tool_calls": [{**history[2]["tool_calls"][0],
                                  "function": {"name": "get_weather", "arguments": ARGS}}]}, history[3]]
    del reference[2]["reasoning"]
    template = ChatTemplate((qwen36_checkpoint / "chat_template.jinja").read_text())
    text = template.render(reference, True, None, tools=TOOLS)
    assert "<parameter=days>\n3\n</parameter>" in text and "<think>\nCall the tool.\n</think>" in text
    assert qstack.fake.requests[-1]["input_ids"] == tok.encode(text)


def test_generation_config_defaults_go_upstream_and_requests_override(qwen36_checkpoint: Path,
                                                                     tok: HFTokenizer) -> None:
    defaults = json.loads((qwen36_checkpoint / "generation_config.json").read_text())
    fake = FakeConfig(script=[*tok.encode("</think>\n\nok"), IM_END], eos_ids=(IM_END, ENDOFTEXT))
    msgs = [{"role": "user", "content": "hi"}]
    with make_stack(qwen36_checkpoint, fake) as s:
        c = _client(s)
        c.chat.completions.create(model=MODEL, messages=msgs, max_tokens=8)  # type: ignore[arg-type]
        sp = s.fake.requests[-1]["sampling_params"]
        assert {k: sp.get(k) for k in ("temperature", "top_k", "top_p")} == \
            {k: defaults[k] for k in ("temperature", "top_k", "top_p")}
        c.chat.completions.create(model=MODEL, messages=msgs, max_tokens=8, temperature=0.3,  # type: ignore[arg-type]
                                  top_p=0.5, extra_body={"top_k": 4})
        sp = s.fake.requests[-1]["sampling_params"]
        assert (sp["temperature"], sp["top_p"], sp["top_k"]) == (0.3, 0.5, 4)
        c.completions.create(model=MODEL, prompt="hi", max_tokens=4)
        assert s.fake.requests[-1]["sampling_params"]["top_k"] == defaults["top_k"]
    with make_stack(qwen36_checkpoint, fake, sampling_defaults="openai") as s:
        _client(s).chat.completions.create(model=MODEL, messages=msgs, max_tokens=8)  # type: ignore[arg-type]
        sp = s.fake.requests[-1]["sampling_params"]
        assert sp["temperature"] == 1.0 and "top_k" not in sp and "top_p" not in sp


def test_constraints_start_after_the_reasoning(qstack: Stack, tok: HFTokenizer, tmp_path: Path) -> None:
    """What goes upstream: the grammar plus require_reasoning when the prompt opened a think block (the
    worker's --reasoning-parser then starts it after </think>), none with thinking off; a forced tool
    choice is the XML form's grammar. Every body is a valid SGLang 0.5.23 GenerateReqInput."""
    _answer(qstack, tok, '</think>\n\n{"a": 1}')
    c = _client(qstack)
    msgs = [{"role": "user", "content": "json please"}]
    fmt = {"type": "json_schema", "json_schema": {"name": "o", "schema": {"type": "object"}}}
    c.chat.completions.create(model=MODEL, messages=msgs, max_tokens=50, response_format=fmt)  # type: ignore[arg-type]
    thinking = qstack.fake.requests[-1]
    assert thinking["require_reasoning"] is True and json.loads(thinking["sampling_params"]["json_schema"]) == {
        "type": "object"}
    _answer(qstack, tok, '{"a": 1}')
    c.chat.completions.create(model=MODEL, messages=msgs, max_tokens=50, response_format=fmt,  # type: ignore[arg-type]
                              extra_body={"chat_template_kwargs": {"enable_thinking": False}})
    assert "require_reasoning" not in qstack.fake.requests[-1]
    _answer(qstack, tok, "</think>\n\n" + CALL)
    r = c.chat.completions.create(model=MODEL, messages=msgs, max_tokens=300, tools=TOOLS,  # type: ignore[arg-type]
                                  tool_choice={"type": "function", "function": {"name": "get_weather"}})
    assert r.choices[0].finish_reason == "tool_calls"
    forced = qstack.fake.requests[-1]
    assert forced["require_reasoning"] is True and "<function=get_weather>" in forced["sampling_params"]["ebnf"]
    assert "<function=add>" not in forced["sampling_params"]["ebnf"]
    prompt = tok.decode(forced["input_ids"], skip_special_tokens=False)
    assert '"name": "get_weather"' in prompt and '"name": "add"' not in prompt  # a named choice renders only it
    c.chat.completions.create(model=MODEL, messages=msgs, max_tokens=300, tools=TOOLS,  # type: ignore[arg-type]
                              tool_choice="none")
    assert "<tools>" not in tok.decode(qstack.fake.requests[-1]["input_ids"], skip_special_tokens=False)
    tree = ast.parse((WHEEL / "srt" / "managers" / "io_struct.py").read_text())
    cls = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "GenerateReqInput")
    fields = {s.target.id for s in cls.body if isinstance(s, ast.AnnAssign) and isinstance(s.target, ast.Name)}
    for body in (thinking, forced):
        assert set(body) <= fields, set(body) - fields
