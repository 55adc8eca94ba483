"""200 malformed message lists against the real Qwen3.6 chat template: each is a 400 whose `param`
names the offending field (never a 500, nothing sent upstream), and the server keeps serving."""

from __future__ import annotations

import copy
import json
import random
from pathlib import Path
from typing import Any

import httpx

from netra.serve.fakeworker import FakeConfig
from netra.serve.messages import RESERVED_TEMPLATE_KWARGS
from tests.serve.conftest import make_stack

IM_END = 248046
MODEL = "fake/contract-worker"
TOOLS = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object",
                                                                        "properties": {"x": {"type": "string"}}}}}]


def _conversation() -> list[dict[str, Any]]:
    return [{"role": "system", "content": "sys"}, {"role": "user", "content": "q"},
            {"role": "assistant", "content": "",
             "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "f", "arguments": '{"x": "1"}'}}]},
            {"role": "tool", "tool_call_id": "c1", "content": "r"}, {"role": "user", "content": "again"}]


def _cases(rng: random.Random) -> list[tuple[dict[str, Any], str]]:
    """(request body, the param the 400 must name) — 200 of them, from ten kinds of malformation."""
    out: list[tuple[dict[str, Any], str]] = []

    def add(msgs: list[dict[str, Any]], param: str, **extra: Any) -> None:
        out.append(({"model": MODEL, "messages": msgs, "max_tokens": 4, "tools": TOOLS, **extra}, param))

    for role in ["bot", "function", "System", "", "USER", "ipython", 7, None, ["user"], "assistant "]:
        for pos in (0, 1, 4):
            m = _conversation()
            m[pos] = {**m[pos], "role": role}
            add(m, f"messages.{pos}.role")
    for raw in ["{x: 1}", "[1, 2", "nope", '{"x": }', "{'x': 1}", "{\"x\": 1", "}", "tru", "{,}", "\"x"]:
        m = _conversation()
        m[2]["tool_calls"][0]["function"]["arguments"] = raw
        add(m, "messages.2.tool_calls.0.function.arguments")
    for value in ["[1]", "3", '"s"', "null", "true", "[]", "1.5", '["x"]', 7, [1, 2], True]:
        m = _conversation()
        m[2]["tool_calls"][0]["function"]["arguments"] = value
        add(m, "messages.2.tool_calls.0.function.arguments")
    for drop in ("missing", "", 5, None):
        m = _conversation()
        if drop == "missing":
            del m[3]["tool_call_id"]
        else:
            m[3]["tool_call_id"] = drop
        add(m, "messages.3.tool_call_id")
    for content in [[{"type": "text", "text": [{"type": "text", "text": "x"}]}], [[{"type": "text", "text": "x"}]],
                    [{"type": "image_url", "image_url": {"url": "data:,"}}], [{"type": "text"}],
                    [{"text": "x"}], {"type": "text", "text": "x"}, 5, [{"type": "text", "text": "a", "x": 1}]]:
        for pos in (1, 4):
            m = _conversation()
            m[pos] = {**m[pos], "content": content}
            add(m, f"messages.{pos}.content")
    for key in sorted(RESERVED_TEMPLATE_KWARGS):
        for value in (None, [], "x"):
            add(_conversation(), f"chat_template_kwargs.{key}", chat_template_kwargs={key: value})
    for calls, param in [("c1", "messages.2.tool_calls"), ({"id": "c"}, "messages.2.tool_calls"),
                         ([5], "messages.2.tool_calls.0"), ([{"type": "code"}], "messages.2.tool_calls.0.type"),
                         ([{"type": "function"}], "messages.2.tool_calls.0.function"),
                         ([{"function": {"arguments": "{}"}}], "messages.2.tool_calls.0.function.name"),
                         ([{"function": {"name": "", "arguments": "{}"}}], "messages.2.tool_calls.0.function.name"),
                         ([{"function": {"name": 3, "arguments": "{}"}}], "messages.2.tool_calls.0.function.name")]:
        m = _conversation()
        m[2]["tool_calls"] = calls
        add(m, param)
    for pos in (1, 4):  # tool_calls on a message that is not the assistant's
        m = _conversation()
        m[pos]["tool_calls"] = copy.deepcopy(_conversation()[2]["tool_calls"])
        add(m, f"messages.{pos}.tool_calls")
    for value in (5, ["r"], {"r": 1}):
        m = _conversation()
        m[2]["reasoning_content"] = value
        add(m, "messages.2.reasoning_content")
        m = _conversation()
        m[2]["reasoning"] = value
        add(m, "messages.2.reasoning_content")
    by_field = len(out)  # appending a user turn leaves each of these as malformed as it was
    # What only the template can refuse: a system message that is not first, no user query at all.
    for pos in (2, 3, 4, 5):
        m = _conversation()
        m.insert(pos, {"role": "system", "content": "late"})
        add(m, "messages")
    for msgs in ([{"role": "assistant", "content": "a"}], [{"role": "system", "content": "s"}],
                 [{"role": "tool", "tool_call_id": "c", "content": "r"}]):
        add(msgs, "messages")
    add([], "messages")
    while len(out) < 200:  # the rest: random pairs of the kinds above, the first one reported
        body, param = copy.deepcopy(rng.choice(out[:by_field]))
        body["messages"] = body["messages"] + [{"role": "user", "content": rng.choice(["x", "y", "z"])}]
        out.append((body, param))
    return out[:200]


def test_two_hundred_malformed_message_lists_get_a_400_naming_the_field(qwen36_checkpoint: Path) -> None:
    cases = _cases(random.Random(0))
    assert len(cases) == 200
    fake = FakeConfig(script=[IM_END], eos_ids=(IM_END,))
    with make_stack(qwen36_checkpoint, fake) as s, httpx.Client(base_url=s.url, timeout=30) as http:
        for body, param in cases:
            r = http.post("/v1/chat/completions", json=body)
            assert r.status_code == 400, (r.status_code, r.text, json.dumps(body)[:300])
            err = r.json()["error"]
            assert err["type"] == "invalid_request_error"
            assert err["param"] == param or (err["param"] or "").startswith(param + "."), (param, err)
        assert s.fake.requests == []  # nothing malformed reached the worker
        ok = http.post("/v1/chat/completions", json={"model": MODEL, "messages": _conversation(), "max_tokens": 4,
                                                     "tools": TOOLS})
        assert ok.status_code == 200, ok.text
        metrics = http.get("/metrics").text
        assert 'status="500"' not in metrics
