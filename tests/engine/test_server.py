"""The worker server as a real process on loopback (docs/worker-contract.md)."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import httpx
import orjson

PROMPTS = [[(7 * i + 3 * j) % 256 for j in range(4 + 5 * i)] for i in range(6)]


def _gen(base: str, body: dict[str, Any], timeout: float = 60) -> httpx.Response:
    return httpx.post(base + "/generate", json=body, timeout=timeout)


def _stream_events(base: str, body: dict[str, Any]) -> list[dict[str, Any]]:
    events: list[dict[str, Any]] = []
    with httpx.stream("POST", base + "/generate", json={**body, "stream": True}, timeout=60) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        done = False
        for line in r.iter_lines():
            if not line:
                continue
            assert line.startswith("data: ") and not done
            if line == "data: [DONE]":
                done = True
                continue
            events.append(orjson.loads(line[6:]))
        assert done
    return events


def test_endpoints(engine_url: str) -> None:
    assert httpx.get(engine_url + "/health").status_code == 200
    assert httpx.get(engine_url + "/ready").status_code == 200
    assert httpx.get(engine_url + "/health_generate", timeout=60).status_code == 200
    info = httpx.get(engine_url + "/model_info").json()
    assert info["is_generation"] is True and info["preset"] == "tiny"
    si = httpx.get(engine_url + "/server_info").json()
    assert si["max_running_requests"] == 64 and si["context_length"] == 1024 and si["kv_cache_dtype"] == "fp8_e4m3"
    assert si["mamba_ssm_dtype"] == "float32" and si["incremental_streaming_output"] is False and si["version"]


def test_greedy_is_deterministic_and_stream_reassembles(engine_url: str) -> None:
    sp = {"max_new_tokens": 24, "temperature": 0, "ignore_eos": True}
    first = [_gen(engine_url, {"input_ids": p, "sampling_params": sp}).json() for p in PROMPTS]
    # the same set again, now all at once (different batch composition), and streamed
    async def burst() -> list[dict[str, Any]]:
        async with httpx.AsyncClient(timeout=60) as c:
            rs = await asyncio.gather(*[c.post(engine_url + "/generate", json={"input_ids": p, "sampling_params": sp})
                                        for p in PROMPTS])
            return [r.json() for r in rs]
    second = asyncio.run(burst())
    for a, b, p in zip(first, second, PROMPTS, strict=True):
        assert a["output_ids"] == b["output_ids"] and a["text"] == b["text"]
        assert len(a["output_ids"]) == 24
        m = a["meta_info"]
        assert m["finish_reason"] == {"type": "length", "length": 24}
        assert (m["prompt_tokens"], m["completion_tokens"], m["cached_tokens"]) == (len(p), 24, 0)
        events = _stream_events(engine_url, {"input_ids": p, "sampling_params": sp})
        assert len(events) == 24  # stream interval 1: one event per token
        for i, ev in enumerate(events):
            assert ev["output_ids"] == a["output_ids"][:i + 1]  # cumulative
            assert ev["meta_info"]["completion_tokens"] == i + 1
            assert a["text"].startswith(ev["text"])
            assert (ev["meta_info"]["finish_reason"] is None) == (i < 23)
        assert events[-1]["output_ids"] == a["output_ids"] and events[-1]["text"] == a["text"]


def test_incremental_stream_reassembles(incremental_url: str) -> None:
    sp = {"max_new_tokens": 20, "temperature": 0, "ignore_eos": True}
    for p in PROMPTS[:3]:
        full = _gen(incremental_url, {"input_ids": p, "sampling_params": sp}).json()
        events = _stream_events(incremental_url, {"input_ids": p, "sampling_params": sp})
        assert [e["meta_info"]["completion_tokens"] for e in events] == [1, 3, 6, 9, 12, 15, 18, 20]
        assert [t for e in events for t in e["output_ids"]] == full["output_ids"]
        assert "".join(e["text"] for e in events) == full["text"]
        assert events[-1]["meta_info"]["finish_reason"] == {"type": "length", "length": 20}
    text = _gen(incremental_url, {"text": "héllo", "sampling_params": sp}).json()
    assert text["meta_info"]["prompt_tokens"] == len("héllo".encode())


def test_64_concurrent_streams_exact_counts(engine_url: str) -> None:
    async def one(c: httpx.AsyncClient, i: int) -> tuple[int, int, int]:
        n = 8 + i % 9
        body = {"input_ids": [(i * 13 + j) % 256 for j in range(3 + i % 7)], "stream": True,
                "sampling_params": {"max_new_tokens": n, "temperature": 0.7, "ignore_eos": True, "sampling_seed": i}}
        last: dict[str, Any] = {}
        ids: list[int] = []
        async with c.stream("POST", engine_url + "/generate", json=body) as r:
            assert r.status_code == 200
            async for line in r.aiter_lines():
                if line.startswith("data: {"):
                    last = orjson.loads(line[6:])
                    ids = last["output_ids"]
        return n, last["meta_info"]["completion_tokens"], len(ids)

    async def run() -> list[tuple[int, int, int]]:
        limits = httpx.Limits(max_connections=100)
        async with httpx.AsyncClient(timeout=120, limits=limits) as c:
            return await asyncio.gather(*[one(c, i) for i in range(64)])

    for want, got, n_ids in asyncio.run(run()):
        assert got == want and n_ids == want


BAD: list[tuple[Any, str]] = [
    (b"{not json", "invalid JSON"),
    (b"[1, 2]", "JSON object"),
    ({"input_ids": "abc"}, "input_ids"),
    ({"input_ids": [1, "x"]}, "input_ids"),
    ({"input_ids": []}, "empty"),
    ({"text": ""}, "empty"),
    ({}, "exactly one"),
    ({"input_ids": [1], "text": "a"}, "exactly one"),
    ({"input_ids": [1] * 1024}, "context length"),
    ({"input_ids": [1], "sampling_params": {"max_new_tokens": -5}}, "negative"),
    ({"input_ids": [1], "sampling_params": {"max_new_tokens": 10**12}}, "max_new_tokens"),
    ({"input_ids": [1], "sampling_params": {"max_new_tokens": 1.5}}, "max_new_tokens"),
    ({"input_ids": [1], "sampling_params": {"bogus_key": 1}}, "bogus_key"),
    ({"input_ids": [1], "sampling_params": {"temperature": "hot"}}, "temperature"),
    ({"input_ids": [1], "sampling_params": {"top_p": 0}}, "top_p"),
    ({"input_ids": [1], "sampling_params": {"top_k": 0}}, "top_k"),
    ({"input_ids": [1], "sampling_params": 5}, "sampling_params"),
    ({"input_ids": [1], "stream": "yes"}, "stream"),
    ({"input_ids": [1], "unknown_top_level": 1}, "unknown_top_level"),
    ({"input_ids": [999999]}, "vocabulary"),
    ({"input_ids": [-1]}, "vocabulary"),
    ({"input_ids": [1], "sampling_params": {"stop_token_ids": [1, "a"]}}, "stop_token_ids"),
]


def test_bad_input_is_400_and_server_keeps_serving(engine_url: str) -> None:
    for body, needle in BAD:
        content = body if isinstance(body, bytes) else orjson.dumps(body)
        r = httpx.post(engine_url + "/generate", content=content, timeout=30,
                       headers={"content-type": "application/json"})
        assert r.status_code == 400, (body, r.text)
        err = r.json()["error"]
        assert err["code"] == 400 and needle.lower() in err["message"].lower(), (body, err)
    assert httpx.post(engine_url + "/abort_request", content=b"{}", timeout=10).status_code == 400
    ok = _gen(engine_url, {"input_ids": [1, 2], "sampling_params": {"max_new_tokens": 3, "temperature": 0}})
    assert ok.status_code == 200 and ok.json()["meta_info"]["completion_tokens"] <= 3
    zero = _gen(engine_url, {"input_ids": [1, 2], "sampling_params": {"max_new_tokens": 0}}).json()
    assert zero["output_ids"] == [] and zero["meta_info"]["finish_reason"] == {"type": "length", "length": 0}


def _free_slots(base: str) -> int:
    return int(httpx.get(base + "/server_info", timeout=10).json()["load"]["free_slots"])


def test_disconnect_and_abort_free_the_slot(engine_url: str) -> None:
    body = {"input_ids": [5, 6, 7], "stream": True,
            "sampling_params": {"max_new_tokens": 900, "temperature": 0, "ignore_eos": True}}
    base_free = _free_slots(engine_url)
    with httpx.stream("POST", engine_url + "/generate", json=body, timeout=60) as r:
        seen = 0
        for line in r.iter_lines():
            if line.startswith("data: {"):
                seen += 1
                if seen == 3:
                    assert _free_slots(engine_url) == base_free - 1
                    break  # leaving the block closes the connection mid-stream
    deadline = time.monotonic() + 20
    while _free_slots(engine_url) != base_free and time.monotonic() < deadline:
        time.sleep(0.1)
    assert _free_slots(engine_url) == base_free

    # /abort_request on a running non-streaming request returns its partial output with an abort reason
    async def run() -> dict[str, Any]:
        async with httpx.AsyncClient(timeout=60) as c:
            task = asyncio.create_task(c.post(engine_url + "/generate", json={**body, "stream": False, "rid": "victim"}))
            for _ in range(200):
                await asyncio.sleep(0.05)
                if _free_slots(engine_url) == base_free - 1:
                    break
            r = await c.post(engine_url + "/abort_request", json={"rid": "victim"})
            assert r.json() == {"rid": "victim", "found": True}
            return (await task).json()

    res = asyncio.run(run())
    assert res["meta_info"]["finish_reason"]["type"] == "abort" and res["meta_info"]["id"] == "victim"
    assert res["meta_info"]["completion_tokens"] == len(res["output_ids"]) < 900
    deadline = time.monotonic() + 20
    while _free_slots(engine_url) != base_free and time.monotonic() < deadline:
        time.sleep(0.1)
    assert _free_slots(engine_url) == base_free


def test_greedy_identical_across_processes(engine_url: str) -> None:
    """A second engine process (other slot count, requests sent concurrently) gives the same tokens."""
    from netra.engine.process import engine_process

    sp = {"max_new_tokens": 16, "temperature": 0, "ignore_eos": True}
    first = [_gen(engine_url, {"input_ids": p, "sampling_params": sp}).json()["output_ids"] for p in PROMPTS]

    async def burst(base: str) -> list[list[int]]:
        async with httpx.AsyncClient(timeout=60) as c:
            rs = await asyncio.gather(*[c.post(base + "/generate", json={"input_ids": p, "sampling_params": sp})
                                        for p in PROMPTS])
            return [r.json()["output_ids"] for r in rs]

    with engine_process("--preset", "tiny", "--max-running-requests", "3", "--context-length", "512") as other:
        assert asyncio.run(burst(other)) == first


def _events(raw: bytes) -> list[dict[str, Any]]:
    return [orjson.loads(b[6:]) for b in raw.split(b"\n\n") if b.startswith(b"data: {")]


def test_logprobs_grammar_and_penalty_fields_at_the_worker(engine_url: str, incremental_url: str) -> None:
    body = {"input_ids": [5, 6, 7], "sampling_params": {"max_new_tokens": 6, "temperature": 0, "ignore_eos": True},
            "return_logprob": True, "top_logprobs_num": 3, "return_text_in_logprobs": True}
    with httpx.Client(timeout=60) as h:
        whole = h.post(engine_url + "/generate", json=body).json()
        meta = whole["meta_info"]
        assert [e[1] for e in meta["output_token_logprobs"]] == whole["output_ids"]
        assert all(len(top) == 3 and top[0][0] >= top[1][0] >= top[2][0] for top in meta["output_top_logprobs"])
        assert all(e[2] == bytes([e[1]]).decode("utf-8", "replace") for e in meta["output_token_logprobs"]
                   if e[1] < 256)
        # streamed: cumulative lists in every event, only the new entries in incremental streaming
        cum = _events(h.post(engine_url + "/generate", json={**body, "stream": True}).content)
        assert cum[-1]["meta_info"]["output_token_logprobs"] == meta["output_token_logprobs"]
        inc = _events(h.post(incremental_url + "/generate", json={**body, "stream": True}).content)
        assert [e for ev in inc for e in ev["meta_info"]["output_token_logprobs"]] == meta["output_token_logprobs"]
        # a regex holds the output; an invalid grammar and out-of-range penalties are refused by name
        r = h.post(engine_url + "/generate", json={"input_ids": [1], "sampling_params": {
            "max_new_tokens": 20, "regex": "(ab|cd){2}", "temperature": 1.0, "frequency_penalty": 0.5}}).json()
        assert bytes(r["output_ids"]).decode() in {a + b for a in ("ab", "cd") for b in ("ab", "cd")}
        assert r["meta_info"]["finish_reason"]["type"] == "stop"
        for sp, word in (({"json_schema": "{bad"}, "json_schema"), ({"regex": "(", "ebnf": "start: x"}, "at most one"),
                         ({"presence_penalty": 3}, "presence_penalty"), ({"logit_bias": {"999": 1}}, "logit_bias"),
                         ({"min_new_tokens": 9, "max_new_tokens": 4}, "min_new_tokens")):
            bad = h.post(engine_url + "/generate", json={"input_ids": [1], "sampling_params": sp})
            assert bad.status_code == 400 and word in bad.json()["error"]["message"], (sp, bad.text)
        bad = h.post(engine_url + "/generate", json={"input_ids": [1], "return_logprob": True, "logprob_start_len": 0})
        assert bad.status_code == 400 and "logprob_start_len" in bad.text
