"""The response layer in front of the real embedded engine (`netra engine --preset tiny`, CPU)."""

from __future__ import annotations

import importlib.util
import time
from collections.abc import Iterator

import httpx
import openai
import orjson
import pytest

from netra.bench.wirebytes import engine_worker
from netra.serve.app import create_app
from netra.serve.config import ServeConfig
from netra.web.server import ServerThread

pytestmark = pytest.mark.skipif(importlib.util.find_spec("netra.engine.server") is None,
                                reason="the embedded engine (netra/engine) is not in this checkout")


@pytest.fixture(scope="module", params=["cumulative", "incremental"])
def engine_stack(request: pytest.FixtureRequest) -> Iterator[tuple[str, str]]:
    with engine_worker(incremental=request.param == "incremental") as up, \
            ServerThread(create_app(ServeConfig(upstream=up, stream_interval=2))) as url:
        yield up, url


def test_models_and_health(engine_stack: tuple[str, str]) -> None:
    _, url = engine_stack
    assert httpx.get(url + "/health", timeout=10).status_code == 200
    assert httpx.get(url + "/v1/models", timeout=10).json()["data"][0]["id"] == "netra-tiny"


def test_sdk_streaming_chat_equals_greedy_whole(engine_stack: tuple[str, str]) -> None:
    _, url = engine_stack
    c = openai.OpenAI(base_url=url + "/v1", api_key="none", max_retries=0, timeout=120)
    msgs: list[dict[str, str]] = [{"role": "user", "content": "Say something, 日本."}]
    whole = c.chat.completions.create(model="netra-tiny", messages=msgs, max_tokens=24, temperature=0,  # type: ignore[arg-type]
                                      extra_body={"ignore_eos": True})
    chunks = list(c.chat.completions.create(model="netra-tiny", messages=msgs, max_tokens=24, temperature=0,  # type: ignore[arg-type]
                                            stream=True, stream_options={"include_usage": True},
                                            extra_body={"ignore_eos": True}))
    text = "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)
    assert text == whole.choices[0].message.content
    assert whole.usage is not None and whole.usage.completion_tokens == 24
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 24
    assert chunks[-1].usage.prompt_tokens == whole.usage.prompt_tokens == len("user: Say something, 日本.\nassistant:".encode())


def test_token_id_prompt_and_native_passthrough_agree(engine_stack: tuple[str, str]) -> None:
    up, url = engine_stack
    prompt = [72, 101, 108, 108, 111]
    sp = {"max_new_tokens": 12, "temperature": 0, "ignore_eos": True}
    native = httpx.post(up + "/generate", json={"input_ids": prompt, "sampling_params": sp}, timeout=120).json()
    passed = httpx.post(url + "/generate", json={"input_ids": prompt, "sampling_params": sp}, timeout=120).json()
    assert passed["output_ids"] == native["output_ids"] and len(native["output_ids"]) == 12
    comp = httpx.post(url + "/v1/completions", json={"prompt": prompt, "max_tokens": 12, "temperature": 0,
                                                     "ignore_eos": True, "skip_special_tokens": True},
                      timeout=120).json()
    from netra.tokenizers import ByteTokenizer

    assert comp["choices"][0]["text"] == ByteTokenizer().decode(native["output_ids"])
    assert comp["usage"] == {"prompt_tokens": 5, "completion_tokens": 12, "total_tokens": 17,
                             "prompt_tokens_details": {"cached_tokens": native["meta_info"].get("cached_tokens", 0)}}


def test_disconnect_frees_the_engine_slot(engine_stack: tuple[str, str]) -> None:
    up, url = engine_stack
    body = {"prompt": "x", "max_tokens": 3000, "temperature": 0, "ignore_eos": True, "stream": True}
    with httpx.Client(base_url=url, timeout=60) as c, c.stream("POST", "/v1/completions", json=body) as r:
        lines = r.iter_lines()
        assert next(lines).startswith("data: {")
    deadline = time.monotonic() + 20
    load = {}
    while time.monotonic() < deadline:
        load = httpx.get(up + "/server_info", timeout=10).json()["load"]
        if load["running"] == 0 and load["waiting"] == 0 and load["prefilling"] == 0:
            break
        time.sleep(0.1)
    assert load["running"] == 0 and load["waiting"] == 0, load


def test_stop_token_ids_match_native(engine_stack: tuple[str, str]) -> None:
    up, url = engine_stack
    stops = list(range(0, 128))  # any ASCII byte ends it: a random-weight model hits one within a few tokens
    sp = {"max_new_tokens": 64, "temperature": 0, "stop_token_ids": stops}
    native = httpx.post(up + "/generate", json={"input_ids": [1, 2, 3], "sampling_params": sp}, timeout=120).json()
    assert native["meta_info"]["finish_reason"]["type"] == "stop"
    body = {"prompt": [1, 2, 3], "max_tokens": 64, "temperature": 0, "stop_token_ids": stops}
    whole = httpx.post(url + "/v1/completions", json=body, timeout=120).json()
    raw = httpx.post(url + "/v1/completions", json={**body, "stream": True, "stream_options": {"include_usage": True}},
                     timeout=120).content
    events = [orjson.loads(b[6:]) for b in raw.split(b"\n\n") if b.startswith(b"data: {")]
    from netra.tokenizers import ByteTokenizer

    expected = ByteTokenizer().decode(native["output_ids"])
    assert whole["choices"][0]["text"] == expected
    assert "".join(e["choices"][0]["text"] for e in events if e["choices"]) == expected
    assert whole["choices"][0]["finish_reason"] == events[-2]["choices"][0]["finish_reason"] == "stop"
    assert whole["choices"][0]["matched_stop"] == native["meta_info"]["finish_reason"]["matched"]
    n = native["meta_info"]["completion_tokens"]
    assert whole["usage"]["completion_tokens"] == events[-1]["usage"]["completion_tokens"] == n
