"""The response layer in front of the embedded engine serving the synthesized Qwen3.6-layout checkpoint
(real vocabulary, chat template, generation_config) with ``--reasoning-parser qwen3``: constraints start
after ``</think>`` and a forced tool choice comes back as a parsed call of the template's XML form.

The weights are seeded, so the model never closes its think block by itself: ``logit_bias`` makes
``</think>`` its first choice at every step. Inside the reasoning nothing is constrained, so it is the
first token; after it the grammar masks it out and forces the constrained form.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pytest

from netra.engine.process import engine_process
from netra.serve.app import create_app
from netra.serve.config import ServeConfig
from netra.web.server import ServerThread

THINK_CLOSE = 248069
CLOSE_THINK_FIRST = {str(THINK_CLOSE): 100}
# Enum and boolean parameters only: the grammar bounds the call, whatever the seeded weights prefer.
TOOLS: list[dict[str, Any]] = [{"type": "function", "function": {
    "name": "set_mode", "parameters": {"type": "object", "properties": {
        "mode": {"type": "string", "enum": ["fast", "slow"]}, "loud": {"type": "boolean"}},
        "required": ["mode", "loud"]}}}]


@pytest.fixture(scope="module")
def client(qwen36_checkpoint: Path) -> Iterator[tuple[openai.OpenAI, str]]:
    args = ["--checkpoint", str(qwen36_checkpoint), "--reasoning-parser", "qwen3", "--context-length", "2048",
            "--max-running-requests", "4"]
    with engine_process(*args, startup_timeout=180) as up, \
            ServerThread(create_app(ServeConfig(upstream=up, probe_timeout=30.0))) as url:
        c = openai.OpenAI(base_url=url + "/v1", api_key="none", max_retries=0, timeout=300)
        yield c, c.models.list().data[0].id


def test_forced_tool_call_after_the_reasoning(client: tuple[openai.OpenAI, str]) -> None:
    c, model = client
    msgs = [{"role": "user", "content": "Switch the mode."}]
    r = c.chat.completions.create(model=model, messages=msgs, tools=TOOLS, max_tokens=64,  # type: ignore[arg-type]
                                  tool_choice={"type": "function", "function": {"name": "set_mode"}},
                                  logit_bias=CLOSE_THINK_FIRST)  # type: ignore[arg-type]
    ch = r.choices[0]
    assert ch.finish_reason == "tool_calls", ch
    calls = ch.message.tool_calls or []
    assert len(calls) == 1 and calls[0].function.name == "set_mode"  # type: ignore[union-attr]
    args = json.loads(calls[0].function.arguments)  # type: ignore[union-attr]
    assert set(args) == {"mode", "loud"} and args["mode"] in ("fast", "slow") and isinstance(args["loud"], bool)
    assert getattr(ch.message, "reasoning_content", None) is None  # </think> came first: no reasoning text
    assert r.usage is not None and r.usage.completion_tokens_details is not None
    assert r.usage.completion_tokens_details.reasoning_tokens == 1  # the </think> token


def test_json_schema_after_the_reasoning_and_without_thinking(client: tuple[openai.OpenAI, str]) -> None:
    c, model = client
    schema = {"type": "object", "properties": {"ok": {"type": "boolean"}, "n": {"enum": [1, 2, 3]}},
              "required": ["ok", "n"], "additionalProperties": False}
    fmt = {"type": "json_schema", "json_schema": {"name": "o", "schema": schema}}
    msgs = [{"role": "user", "content": "JSON please."}]
    r = c.chat.completions.create(model=model, messages=msgs, max_tokens=64, response_format=fmt,  # type: ignore[arg-type]
                                  logit_bias=CLOSE_THINK_FIRST)  # type: ignore[arg-type]
    obj = json.loads(r.choices[0].message.content or "")
    assert set(obj) == {"ok", "n"} and r.choices[0].finish_reason == "stop"
    # Thinking off: the prompt closes the block itself, the grammar applies from the first token (the
    # bias toward </think> cannot open a reasoning phase), and nothing is reasoning.
    r = c.chat.completions.create(model=model, messages=msgs, max_tokens=64, response_format=fmt,  # type: ignore[arg-type]
                                  logit_bias=CLOSE_THINK_FIRST,  # type: ignore[arg-type]
                                  extra_body={"chat_template_kwargs": {"enable_thinking": False}})
    assert set(json.loads(r.choices[0].message.content or "")) == {"ok", "n"}
    assert r.usage is not None and r.usage.completion_tokens_details is None
