"""The response layer end to end against the contract fake worker (cumulative and incremental)."""

from __future__ import annotations

import math
import time
from pathlib import Path
from typing import Any

import httpx
import openai
import orjson
import pytest

from netra.serve.fakeworker import EOS, IM_END, IM_START, FakeConfig, reference_output

from .conftest import MODEL, Stack, make_stack, metric_value


def sse_events(raw: bytes) -> list[Any]:
    out: list[Any] = []
    for block in raw.split(b"\n\n"):
        if block.startswith(b"data: "):
            data = block[6:]
            out.append("[DONE]" if data == b"[DONE]" else orjson.loads(data))
    return out


def ref_text(prompt: list[int], sp: dict[str, Any], eos_after: int | None = None) -> tuple[str, int, str]:
    """Plain-Python reference: the fake model's text, completion tokens and finish reason."""
    ids, finish = reference_output(prompt, sp, eos_after)
    shown = ids[:-1] if finish["type"] == "stop" else ids
    return bytes(shown).decode("utf-8", "replace"), len(ids), finish["type"]


def client(stack: Stack) -> openai.OpenAI:
    return openai.OpenAI(base_url=stack.url + "/v1", api_key="none", max_retries=0, timeout=30)


def test_completion_matches_reference_and_stream_equals_whole(stack: Stack) -> None:
    c = client(stack)
    prompt = "Tell me about MoE."
    sp = {"max_new_tokens": 97, "temperature": 0.0, "ignore_eos": True}
    expected, n, _ = ref_text(list(prompt.encode()), sp)
    whole = c.completions.create(model=MODEL, prompt=prompt, max_tokens=97, temperature=0,
                                 extra_body={"ignore_eos": True})
    assert whole.choices[0].text == expected
    assert whole.choices[0].finish_reason == "length"
    assert whole.usage is not None
    assert (whole.usage.prompt_tokens, whole.usage.completion_tokens) == (len(prompt.encode()), n)
    chunks = list(c.completions.create(model=MODEL, prompt=prompt, max_tokens=97, temperature=0, stream=True,
                                       stream_options={"include_usage": True}, extra_body={"ignore_eos": True}))
    assert "".join(ch.choices[0].text for ch in chunks if ch.choices) == expected
    assert [ch.choices[0].finish_reason for ch in chunks if ch.choices][-1] == "length"
    usage = chunks[-1].usage
    assert usage is not None and usage.completion_tokens == 97 and usage.prompt_tokens == len(prompt.encode())


def test_chat_uses_checkpoint_template_and_stream_equals_whole(stack: Stack) -> None:
    c = client(stack)
    msgs: Any = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "héllo 日本"}]
    whole = c.chat.completions.create(model=MODEL, messages=msgs, max_tokens=64, temperature=0)
    sent = stack.fake.requests[-1]
    rendered = "<|im_start|>system\nbe brief<|im_end|>\n<|im_start|>user\nhéllo 日本<|im_end|>\n<|im_start|>assistant\n"
    expected_ids: list[int] = []
    for piece in rendered.split("<|im_start|>")[1:]:
        body, _, rest = piece.partition("<|im_end|>")
        expected_ids += [IM_START, *body.encode(), IM_END, *rest.encode()] if _ else [IM_START, *body.encode()]
    assert sent["input_ids"] == expected_ids
    expected, n, _ = ref_text(expected_ids, sent["sampling_params"])
    assert whole.choices[0].message.content == expected
    assert whole.choices[0].message.role == "assistant"
    assert whole.usage is not None and whole.usage.completion_tokens == n == 64
    stream = c.chat.completions.create(model=MODEL, messages=msgs, max_tokens=64, temperature=0, stream=True)
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(ch.choices[0].delta.content or "" for ch in chunks) == expected
    assert chunks[-1].choices[0].finish_reason == "length"


@pytest.mark.parametrize("interval", [1, 4])
def test_stream_coalescing_and_each_token_once(tokenizer_dir: Path, interval: int) -> None:
    # The worker sends every token; the response layer coalesces to `interval` tokens per event.
    with make_stack(tokenizer_dir, FakeConfig(incremental=False), stream_interval=interval) as s:
        body = {"prompt": [1, 2, 3], "max_tokens": 200, "temperature": 0, "ignore_eos": True, "stream": True}
        raw = httpx.post(s.url + "/v1/completions", json=body, timeout=30).content
        events = sse_events(raw)
        assert events[-1] == "[DONE]"
        texts = [e["choices"][0]["text"] for e in events[:-1]]
        expected, _, _ = ref_text([1, 2, 3], {"max_new_tokens": 200, "temperature": 0})
        assert "".join(texts) == expected
        # Each token is sent once: no event repeats earlier text, and there are at most
        # ceil(200 / interval) events (fewer when a multi-byte character straddles a boundary).
        assert len(texts) <= math.ceil(200 / interval) + 1
        if interval == 1:
            assert len(texts) >= len(expected) - 5
        assert sum(len(t.encode()) for t in texts) == len(expected.encode())


def test_prompt_forms_and_n(stack: Stack) -> None:
    c = httpx.Client(base_url=stack.url, timeout=30)
    # One list of token IDs, a list of them, a list of strings; n=2 gives two choices per prompt.
    for prompt, expect_prompts in (([5, 6, 7], [[5, 6, 7]]), ([[5, 6], [9]], [[5, 6], [9]]),
                                   (["ab", "c"], [list(b"ab"), list(b"c")])):
        for stream in (False, True):
            r = c.post("/v1/completions", json={"prompt": prompt, "max_tokens": 9, "temperature": 0, "n": 2,
                                                "stream": stream, "stream_options": {"include_usage": True}}
                       if stream else {"prompt": prompt, "max_tokens": 9, "temperature": 0, "n": 2})
            assert r.status_code == 200, r.text
            if stream:
                events = sse_events(r.content)
                texts: dict[int, str] = {}
                for e in events[:-1]:
                    for ch in e["choices"]:
                        texts[ch["index"]] = texts.get(ch["index"], "") + ch["text"]
                usage = events[-2]["usage"]
            else:
                texts = {ch["index"]: ch["text"] for ch in r.json()["choices"]}
                usage = r.json()["usage"]
            assert sorted(texts) == list(range(2 * len(expect_prompts)))
            for i, p in enumerate(expect_prompts):
                exp, _, _ = ref_text(p, {"max_new_tokens": 9, "temperature": 0})
                assert texts[2 * i] == texts[2 * i + 1] == exp
            assert usage["completion_tokens"] == 9 * 2 * len(expect_prompts)
            assert usage["prompt_tokens"] == sum(len(p) for p in expect_prompts)


def test_stop_strings_end_early_and_abort_upstream(stack: Stack) -> None:
    c = httpx.Client(base_url=stack.url, timeout=30)
    full, _, _ = ref_text([42], {"max_new_tokens": 300, "temperature": 0})
    stop = "日本語"
    cut = full.index(stop)
    for stream in (False, True):
        body = {"prompt": [42], "max_tokens": 300, "temperature": 0, "stop": ["zzz", stop], "stream": stream}
        r = c.post("/v1/completions", json=body)
        if stream:
            events = sse_events(r.content)
            text = "".join(e["choices"][0]["text"] for e in events[:-1])
            last = events[-2]["choices"][0]
        else:
            last = r.json()["choices"][0]
            text = last["text"]
        assert text == full[:cut]
        assert last["finish_reason"] == "stop" and last["matched_stop"] == stop
        rid = stack.fake.requests[-1]["rid"]
        deadline = time.monotonic() + 5
        while rid not in stack.fake.aborted and time.monotonic() < deadline:
            time.sleep(0.01)
        assert rid in stack.fake.aborted


def test_stop_token_ids_and_eos_usage(stack: Stack) -> None:
    c = httpx.Client(base_url=stack.url, timeout=30)
    full_ids, _ = reference_output([3], {"max_new_tokens": 200, "temperature": 0})
    stop_tok = ord("!")
    body = {"prompt": [3], "max_tokens": 200, "temperature": 0, "stop_token_ids": [stop_tok]}
    expected, n, finish = ref_text([3], {**body, "max_new_tokens": 200})
    assert finish == "stop" and n == full_ids.index(stop_tok) + 1
    whole = c.post("/v1/completions", json=body).json()
    assert whole["choices"][0]["text"] == expected
    assert whole["choices"][0]["matched_stop"] == stop_tok
    assert whole["usage"]["completion_tokens"] == n  # the stop token is generated, so it counts
    events = sse_events(c.post("/v1/completions", json={**body, "stream": True,
                                                        "stream_options": {"include_usage": True}}).content)
    assert "".join(e["choices"][0]["text"] for e in events[:-2]) == expected
    assert events[-3]["choices"][0]["finish_reason"] == "stop"
    assert events[-2]["usage"]["completion_tokens"] == n


def test_eos_finish(tokenizer_dir: Path) -> None:
    for incremental in (False, True):
        with make_stack(tokenizer_dir, FakeConfig(incremental=incremental, eos_after=17, stream_interval=3)) as s:
            c = openai.OpenAI(base_url=s.url + "/v1", api_key="none", max_retries=0)
            chunks = list(c.completions.create(model=MODEL, prompt="x", max_tokens=50, temperature=0, stream=True,
                                               stream_options={"include_usage": True}))
            expected, n, _ = ref_text(list(b"x"), {"max_new_tokens": 50, "temperature": 0}, eos_after=17)
            assert "".join(ch.choices[0].text for ch in chunks if ch.choices) == expected
            assert chunks[-2].choices[0].finish_reason == "stop"
            assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == n == 18
            whole = c.completions.create(model=MODEL, prompt="x", max_tokens=50, temperature=0)
            assert whole.choices[0].text == expected and whole.choices[0].finish_reason == "stop"
            assert getattr(chunks[-2].choices[0], "matched_stop", None) == EOS


def test_generate_passthrough(stack: Stack) -> None:
    c = httpx.Client(base_url=stack.url, timeout=30)
    sp = {"max_new_tokens": 20, "temperature": 0, "ignore_eos": True}
    ids, _ = reference_output([10, 11], sp)
    r = c.post("/generate", json={"input_ids": [10, 11], "sampling_params": sp})
    assert r.status_code == 200
    assert r.json()["output_ids"] == ids and r.json()["meta_info"]["completion_tokens"] == 20
    events = sse_events(c.post("/generate", json={"input_ids": [10, 11], "sampling_params": sp,
                                                  "stream": True}).content)
    assert events[-1] == "[DONE]"
    got: list[int] = []
    for e in events[:-1]:
        ct = e["meta_info"]["completion_tokens"]
        got = e["output_ids"] if len(e["output_ids"]) == ct else got + e["output_ids"]
    assert got == ids
    # The worker's own 400 comes back as an OpenAI error naming the problem.
    r = c.post("/generate", json={"input_ids": [1], "sampling_params": {"bogus_param": 1}})
    assert r.status_code == 400 and "bogus_param" in r.json()["error"]["message"]


@pytest.mark.parametrize("body,param", [
    ({"max_tokens": 5}, "prompt"),
    ({"prompt": "x", "temperature": -1}, "temperature"),
    ({"prompt": "x", "top_k": 0}, "top_k"),
    ({"prompt": "x", "top_p": 0}, "top_p"),
    ({"prompt": "x", "suffix": "y"}, "suffix"),  # refused by name (unknown keys are ignored)
    ({"prompt": "x", "max_tokens": -3}, "max_tokens"),
    ({"prompt": "x", "frequency_penalty": 2.5}, "frequency_penalty"),
    ({"prompt": "x", "logprobs": 21}, "logprobs"),
    ({"prompt": "x", "logit_bias": {"a": 1}}, "logit_bias"),
    ({"prompt": "x", "echo": True, "logprobs": 1}, "echo"),
    ({"prompt": [], "max_tokens": 2}, "prompt"),
    ({"prompt": [-1], "max_tokens": 2}, "prompt"),
    ({"prompt": "x", "n": 0}, "n"),
    ({"prompt": "x", "stop": ""}, "stop"),
    ({"prompt": "x", "stream_options": {"include_usage": True}}, "stream_options"),
])
def test_malformed_completions_get_openai_400(stack: Stack, body: dict[str, Any], param: str) -> None:
    r = httpx.post(stack.url + "/v1/completions", json=body, timeout=10)
    assert r.status_code == 400
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"}
    assert err["type"] == "invalid_request_error" and param in (err["param"] or "") + err["message"]


def test_malformed_requests_and_service_continues(stack: Stack) -> None:
    c = httpx.Client(base_url=stack.url, timeout=10)
    cases = [
        c.post("/v1/completions", content=b"{not json", headers={"content-type": "application/json"}),
        c.post("/v1/completions", content=b"[1, 2]", headers={"content-type": "application/json"}),
        c.post("/v1/chat/completions", json={"messages": []}),
        c.post("/v1/chat/completions", json={"messages": [{"role": "wizard", "content": "x"}]}),
        c.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "x"}], "tools": [{}]}),
        c.post("/generate", json={"input_ids": [1], "text": "both"}),
        c.post("/generate", json={"sampling_params": {}}),
    ]
    for r in cases:
        assert r.status_code == 400, r.text
        assert set(r.json()["error"]) == {"message", "type", "param", "code"}
    r = c.get("/v1/nothing-here")
    assert r.status_code == 404 and r.json()["error"]["type"] == "not_found_error"
    r = c.get("/v1/completions")
    assert r.status_code == 405 and "error" in r.json()
    ok = c.post("/v1/completions", json={"prompt": "x", "max_tokens": 3, "temperature": 0})
    assert ok.status_code == 200 and ok.json()["usage"]["completion_tokens"] == 3


def test_models_health_and_metrics(stack: Stack) -> None:
    c = httpx.Client(base_url=stack.url, timeout=10)
    assert c.get("/health").status_code == 200
    models = c.get("/v1/models").json()
    assert models["data"][0]["id"] == "fake/contract-worker" and models["object"] == "list"

    def metric(text: str, name: str, labels: str = "") -> float:
        pairs = dict(kv.split("=", 1) for kv in labels.split(",") if kv)
        return metric_value(text, name, **{k: v.strip('"') for k, v in pairs.items()})

    before = c.get("/metrics").text
    raw = c.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "m"}], "max_tokens": 33,
                                               "temperature": 0, "stream": True}).content
    c.post("/v1/completions", json={"prompt": "abc", "max_tokens": 5, "temperature": 0})
    c.post("/v1/completions", json={"prompt": "abc", "temperature": -5})
    after = c.get("/metrics").text
    assert metric(after, "netra_serve_stream_bytes_total", 'endpoint="chat"') - \
        metric(before, "netra_serve_stream_bytes_total", 'endpoint="chat"') == len(raw)
    assert metric(after, "netra_serve_completion_tokens_total", 'endpoint="chat"') - \
        metric(before, "netra_serve_completion_tokens_total", 'endpoint="chat"') == 33
    assert metric(after, "netra_serve_completion_tokens_total", 'endpoint="completions"') - \
        metric(before, "netra_serve_completion_tokens_total", 'endpoint="completions"') == 5
    assert metric(after, "netra_serve_prompt_tokens_total", 'endpoint="completions"') - \
        metric(before, "netra_serve_prompt_tokens_total", 'endpoint="completions"') == 3
    for status, delta in (("200", 1), ("400", 1)):
        lab = f'endpoint="completions",status="{status}"'
        assert metric(after, "netra_serve_requests_total", lab) - metric(before, "netra_serve_requests_total", lab) == delta
    assert metric(after, "netra_serve_ttft_seconds_count", 'endpoint="chat"') - \
        metric(before, "netra_serve_ttft_seconds_count", 'endpoint="chat"') == 1
    assert metric(after, "netra_serve_inter_token_seconds_count", 'endpoint="chat"') - \
        metric(before, "netra_serve_inter_token_seconds_count", 'endpoint="chat"') == 32
    assert metric(after, "netra_serve_upstream_stream_bytes_total") > metric(before, "netra_serve_upstream_stream_bytes_total")
    assert metric(after, "netra_serve_in_flight") == 0.0


def test_chat_n_counts_prompt_once_and_continuous_usage(stack: Stack) -> None:
    c = httpx.Client(base_url=stack.url, timeout=30)
    msgs = [{"role": "user", "content": "q"}]
    whole = c.post("/v1/chat/completions", json={"messages": msgs, "n": 3, "max_tokens": 5, "temperature": 0}).json()
    prompt_len = len(stack.fake.requests[-1]["input_ids"])
    assert [ch["index"] for ch in whole["choices"]] == [0, 1, 2]
    assert whole["usage"]["prompt_tokens"] == prompt_len and whole["usage"]["completion_tokens"] == 15
    events = sse_events(c.post("/v1/chat/completions", json={
        "messages": msgs, "max_tokens": 12, "temperature": 0, "stream": True, "ignore_eos": True,
        "stream_options": {"include_usage": True, "continuous_usage_stats": True}}).content)[:-1]
    running = [e["usage"]["completion_tokens"] for e in events if e["choices"]]
    assert running == sorted(running) and running[-1] == 12  # usage so far, on every event
    assert events[-1]["choices"] == [] and events[-1]["usage"]["completion_tokens"] == 12


def test_checkpoint_template_kwargs_and_template_errors(tmp_path: Path) -> None:
    import json

    from netra.serve.fakeworker import write_tokenizer

    tdir = write_tokenizer(tmp_path)
    template = ("{% if messages[0].role != 'user' %}{{ raise_exception('first message must be from the user') }}"
                "{% endif %}{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n"
                "{% endfor %}<|im_start|>assistant\n{% if enable_thinking is defined and not enable_thinking %}"
                "<think></think>{% endif %}")
    (tdir / "tokenizer_config.json").write_text(json.dumps({"chat_template": template, "eos_token": "<|im_end|>"}))
    with make_stack(tdir) as s:
        c = httpx.Client(base_url=s.url, timeout=30)
        r = c.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "a"}], "max_tokens": 2,
                                                 "chat_template_kwargs": {"enable_thinking": False}})
        assert r.status_code == 200
        ids = s.fake.requests[-1]["input_ids"]
        assert bytes(t for t in ids if t < 256).decode().endswith("assistant\n<think></think>")
        r = c.post("/v1/chat/completions", json={"messages": [{"role": "assistant", "content": "a"}]})
        assert r.status_code == 400 and "first message must be from the user" in r.json()["error"]["message"]


def test_concurrent_streams_do_not_mix_and_reuse_upstream_connections(stack: Stack) -> None:
    import concurrent.futures

    def one(i: int) -> tuple[int, str, int]:
        body = {"prompt": [i + 1, 7], "max_tokens": 40 + i, "temperature": 0, "ignore_eos": True, "stream": True,
                "stream_options": {"include_usage": True}}
        events = sse_events(httpx.post(stack.url + "/v1/completions", json=body, timeout=60).content)
        text = "".join(e["choices"][0]["text"] for e in events[:-1] if e["choices"])
        return i, text, events[-2]["usage"]["completion_tokens"]

    with concurrent.futures.ThreadPoolExecutor(16) as pool:
        results = list(pool.map(one, range(32)))
    for i, text, n in results:
        expected, _, _ = ref_text([i + 1, 7], {"max_new_tokens": 40 + i, "temperature": 0})
        assert text == expected and n == 40 + i
    # Sequential streams read to [DONE] hand their upstream connection back to the pool.
    start = len(stack.fake.client_ports)
    for _ in range(8):
        httpx.post(stack.url + "/v1/completions", json={"prompt": "x", "max_tokens": 5, "stream": True}, timeout=30)
    assert len(set(stack.fake.client_ports[start:])) == 1
