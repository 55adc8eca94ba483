"""Cheap refusals, bounded work and request isolation at the response layer (issue 24), against the
contract fake worker: strict types, 415, unknown model, body and prompt limits, prompts x n,
admission (fairness, 503 with Retry-After), liveness of the worker, and the rid race."""

from __future__ import annotations

import asyncio
import logging
import socket
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest

from netra.serve.admission import Admission
from netra.serve.fakeworker import FakeConfig
from netra.web.errors import OpenAIError
from netra.web.server import tcp_listen_socket

from .conftest import MODEL, make_stack

FREEZE = {"model": MODEL, "prompt": ["a"] * 100, "n": 64, "max_tokens": 8}


def error_of(r: httpx.Response) -> dict[str, Any]:
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"}
    return err


def test_strict_types_content_type_and_model(tokenizer_dir: Path) -> None:
    with make_stack(tokenizer_dir) as s, httpx.Client(base_url=s.url, timeout=10) as c:
        for body, param in (({"prompt": "x", "max_tokens": "16"}, "max_tokens"),
                            ({"prompt": "x", "stream": "yes"}, "stream"),
                            ({"prompt": "x", "max_tokens": 4.0}, "max_tokens"),
                            ({"prompt": "x", "n": True}, "n")):
            r = c.post("/v1/completions", json=body)
            assert r.status_code == 400 and error_of(r)["param"] == param, r.text
        r = c.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": 5}]})
        assert r.status_code == 400 and "messages.0.content" in error_of(r)["param"]
        body = orjson.dumps({"model": MODEL, "prompt": "x", "max_tokens": 2})
        for ctype in ("text/plain", "application/x-www-form-urlencoded", None):
            headers = {"content-type": ctype} if ctype else {}
            for path in ("/v1/completions", "/v1/chat/completions", "/generate"):
                r = c.post(path, content=body, headers=headers)
                assert r.status_code == 415 and error_of(r)["code"] == "unsupported_media_type", (ctype, path)
        r = c.post("/v1/completions", content=body, headers={"content-type": "application/json; charset=utf-8"})
        assert r.status_code == 200
        r = c.post("/v1/chat/completions", json={"model": "gpt-4o", "messages": [{"role": "user", "content": "x"}]})
        err = error_of(r)
        assert r.status_code == 404 and err["code"] == "model_not_found" and err["param"] == "model"
        assert "gpt-4o" in err["message"] and MODEL in err["message"]
        assert len(s.fake.requests) == 1  # none of the refusals reached the worker


def test_freeze_request_is_refused_at_once_beside_a_small_request(tokenizer_dir: Path) -> None:
    with make_stack(tokenizer_dir, FakeConfig(step_delay=0.005)) as s:
        async def run() -> tuple[httpx.Response, float, httpx.Response, float]:
            async with httpx.AsyncClient(base_url=s.url, timeout=30) as c:
                async def timed(body: dict[str, Any]) -> tuple[httpx.Response, float]:
                    t0 = time.perf_counter()
                    r = await c.post("/v1/completions", json=body)
                    return r, time.perf_counter() - t0

                (big, big_s), (small, small_s) = await asyncio.gather(
                    timed(FREEZE), timed({"model": MODEL, "prompt": "hi", "max_tokens": 4, "temperature": 0}))
                return big, big_s, small, small_s

        big, big_s, small, small_s = asyncio.run(run())
        err = error_of(big)
        assert big.status_code == 400 and err["code"] == "too_many_choices" and err["param"] == "n"
        assert "6400" in err["message"] and "64" in err["message"]
        assert small.status_code == 200 and small.json()["usage"]["completion_tokens"] == 4
        assert big_s < 1.0 and small_s < 1.0, (big_s, small_s)
        assert len(s.fake.requests) == 1


def test_many_choices_do_not_starve_a_small_request(tokenizer_dir: Path) -> None:
    # Four requests of 16 choices (the limit here), 8 tokens at 50 ms a token, fill all 16 upstream
    # slots: each runs 4 choices at once (its share), each choice admitted on its own, so a small
    # request arriving behind them waits for one choice to end (<= 0.4 s), not for a whole big
    # request (1.6 s).
    with make_stack(tokenizer_dir, FakeConfig(step_delay=0.05), max_inflight=16, max_choices=16) as s:
        async def run() -> tuple[float, float, int, list[int]]:
            async with httpx.AsyncClient(base_url=s.url, timeout=60) as c:
                assert (await c.post("/v1/completions", json={"prompt": "x", "max_tokens": 1})).status_code == 200
                t0 = time.perf_counter()
                bigs = [asyncio.ensure_future(c.post("/v1/completions", json={
                    "prompt": [[i + 1] for i in range(8)], "n": 2, "max_tokens": 8, "ignore_eos": True}))
                    for _ in range(4)]
                while s.serve.admission.free:  # every slot taken by the big requests
                    assert time.perf_counter() - t0 < 1.5
                    await asyncio.sleep(0.01)
                t1 = time.perf_counter()
                small = await c.post("/v1/completions", json={"prompt": "hi", "max_tokens": 1})
                small_s = time.perf_counter() - t1
                done = await asyncio.gather(*bigs)
                return small_s, time.perf_counter() - t0, small.status_code, [r.status_code for r in done]

        small_s, big_s, small_status, big_status = asyncio.run(run())
        assert small_status == 200 and big_status == [200] * 4
        assert small_s < 1.0 and big_s > 1.5, (small_s, big_s)
        assert s.serve.admission.free == 16 and s.serve.admission.waiting == 0


def test_upstream_work_in_flight_stays_at_the_admission_limit(tokenizer_dir: Path) -> None:
    """200 concurrent streams through 8 upstream slots: the worker never sees more than 8 requests
    at once, and the response layer never opens more connections than its pool (8 + 8)."""
    with make_stack(tokenizer_dir, FakeConfig(step_delay=0.005, incremental=True), max_inflight=8,
                    max_choices=8) as s:
        peak = 0
        stop = threading.Event()

        def sample() -> None:
            nonlocal peak
            while not stop.is_set():
                peak = max(peak, len(s.fake.running))
                time.sleep(0.005)

        sampler = threading.Thread(target=sample)
        sampler.start()

        async def run() -> list[int]:
            async with httpx.AsyncClient(base_url=s.url, timeout=120,
                                         limits=httpx.Limits(max_connections=200)) as c:
                rs = await asyncio.gather(*[c.post("/v1/completions", json={
                    "prompt": "x", "max_tokens": 10, "ignore_eos": True, "stream": True}) for _ in range(200)])
                return [r.status_code for r in rs]

        try:
            statuses = asyncio.run(run())
        finally:
            stop.set()
            sampler.join()
        assert statuses == [200] * 200
        assert 1 <= peak <= 8, peak
        assert len(set(s.fake.client_ports)) <= s.serve.config.pool_size == 16


def test_capacity_gives_503_with_retry_after(tokenizer_dir: Path) -> None:
    with make_stack(tokenizer_dir, FakeConfig(step_delay=0.01), max_inflight=1, max_choices=1, max_waiting=1,
                    queue_timeout=0.5) as s:
        async def run() -> list[httpx.Response]:
            async with httpx.AsyncClient(base_url=s.url, timeout=30) as c:
                long = {"prompt": "x", "max_tokens": 200, "ignore_eos": True, "stream": True}
                first = asyncio.ensure_future(c.post("/v1/completions", json=long))
                await asyncio.sleep(0.2)
                queued = asyncio.ensure_future(c.post("/v1/completions", json={"prompt": "x", "max_tokens": 1}))
                await asyncio.sleep(0.1)
                refused = await c.post("/v1/completions", json={"prompt": "x", "max_tokens": 1})
                return [await first, await queued, refused]

        first, queued, refused = asyncio.run(run())
        assert first.status_code == 200 and first.content.endswith(b"data: [DONE]\n\n")
        for r in (queued, refused):  # one waited past queue_timeout, one found the queue full
            assert r.status_code == 503 and error_of(r)["code"] == "server_at_capacity"
            assert int(r.headers["retry-after"]) >= 1
        assert "waiting" in refused.json()["error"]["message"]
        assert "no upstream slot within 0.5 s" in queued.json()["error"]["message"]


def test_admission_grants_in_order_and_survives_cancellation() -> None:
    async def run() -> list[str]:
        adm = Admission(4, max_waiting=10, wait_timeout_s=5)
        order: list[str] = []
        await adm.acquire(3)

        async def want(name: str, weight: int) -> None:
            await adm.acquire(weight)
            order.append(name)

        big = asyncio.ensure_future(want("big", 4))
        await asyncio.sleep(0)
        small = asyncio.ensure_future(want("small", 1))  # fits now, but waits its turn behind big
        gone = asyncio.ensure_future(want("gone", 1))
        await asyncio.sleep(0.01)
        assert order == [] and adm.waiting == 3
        gone.cancel()
        await asyncio.sleep(0.01)
        adm.release(3)
        await asyncio.wait_for(big, 1)
        assert adm.free == 0 and order == ["big"]
        adm.release(4)
        await asyncio.wait_for(small, 1)
        adm.release(1)
        assert adm.free == 4 and adm.waiting == 0
        with pytest.raises(ValueError):
            await adm.acquire(5)
        return order

    assert asyncio.run(run()) == ["big", "small"]


def test_body_limit_while_reading(tokenizer_dir: Path) -> None:
    with make_stack(tokenizer_dir, max_body_bytes=1 << 20) as s, httpx.Client(base_url=s.url, timeout=30) as c:
        big = b'{"prompt": "' + b"a" * (50 << 20) + b'"}'
        t0 = time.perf_counter()
        r = c.post("/v1/completions", content=big, headers={"content-type": "application/json"})
        declared_s = time.perf_counter() - t0
        assert r.status_code == 413 and error_of(r)["code"] == "request_too_large"

        def chunks() -> Any:  # no Content-Length: refused once the limit is passed while reading
            for i in range(0, len(big), 1 << 16):
                yield big[i:i + (1 << 16)]

        t0 = time.perf_counter()
        r = c.post("/v1/completions", content=chunks(), headers={"content-type": "application/json"})
        chunked_s = time.perf_counter() - t0
        assert r.status_code == 413 and "1048576" in error_of(r)["message"]
        assert declared_s < 5 and chunked_s < 5, (declared_s, chunked_s)
        ok = c.post("/v1/completions", json={"prompt": "x", "max_tokens": 2})
        assert ok.status_code == 200


def test_prompt_length_checked_before_upstream(tokenizer_dir: Path) -> None:
    with make_stack(tokenizer_dir, FakeConfig(context_length=64)) as s, httpx.Client(base_url=s.url, timeout=30) as c:
        cases = [("/v1/completions", {"prompt": "a" * 64}, "prompt"),
                 ("/v1/completions", {"prompt": "a" * 5_000_000}, "prompt"),  # refused before tokenizing
                 ("/v1/completions", {"prompt": list(range(64))}, "prompt"),
                 ("/v1/completions", {"prompt": "a" * 40, "max_tokens": 30}, "max_tokens"),
                 ("/v1/chat/completions", {"messages": [{"role": "user", "content": "b" * 80}]}, "messages"),
                 ("/generate", {"input_ids": list(range(70))}, "input_ids")]
        for path, body, param in cases:
            t0 = time.perf_counter()
            r = c.post(path, json=body)
            err = error_of(r)
            assert r.status_code == 400 and err["code"] == "context_length_exceeded" and err["param"] == param, r.text
            assert time.perf_counter() - t0 < 5
        assert s.fake.requests == []
        r = c.post("/v1/completions", json={"prompt": "a" * 40, "max_tokens": 20})
        assert r.status_code == 200 and s.fake.requests[-1]["input_ids"] == [ord("a")] * 40


@pytest.mark.parametrize("attacker_streams", [False, True])
def test_rid_race_cannot_abort_another_clients_stream(tokenizer_dir: Path, attacker_streams: bool) -> None:
    """Client B reuses client A's rid and hangs up within 5 ms: only B's own request is aborted."""
    with make_stack(tokenizer_dir, FakeConfig(step_delay=0.01, incremental=True)) as s:
        victim = {"input_ids": [1, 2, 3], "rid": "victim",
                  "sampling_params": {"max_new_tokens": 60, "temperature": 0, "ignore_eos": True}, "stream": True}
        with httpx.Client(base_url=s.url, timeout=30) as c, c.stream("POST", "/generate", json=victim) as r:
            lines = r.iter_lines()
            first = next(lines)
            assert first.startswith("data: {") and orjson.loads(first[6:])["meta_info"]["id"] == "victim"
            attack = orjson.dumps({"input_ids": [1], "rid": "victim", "stream": attacker_streams,
                                   "sampling_params": {"max_new_tokens": 500}})
            for _ in range(5):
                sock = socket.create_connection(("127.0.0.1", int(s.url.rsplit(":", 1)[1])))
                sock.sendall(b"POST /generate HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
                             b"content-length: %d\r\n\r\n%s" % (len(attack), attack))
                time.sleep(0.005)
                sock.close()
            rest = [line for line in lines if line.startswith("data: ")]
        assert rest[-1] == "data: [DONE]"
        final = orjson.loads(rest[-2][6:])["meta_info"]
        assert final["finish_reason"]["type"] == "length" and final["completion_tokens"] == 60
        upstream_rids = [q["rid"] for q in s.fake.requests]
        victim_rid = upstream_rids[0]
        assert victim_rid.endswith("-victim") and victim_rid != "victim"
        assert len(set(upstream_rids)) == len(upstream_rids)  # every upstream request has its own rid
        time.sleep(0.3)
        assert victim_rid not in s.fake.aborted and victim_rid not in s.fake.disconnected


def test_unresponsive_worker_fails_fast_and_recovers(tokenizer_dir: Path) -> None:
    with make_stack(tokenizer_dir, FakeConfig(step_delay=0.01), probe_interval=0.2, probe_timeout=1.0,
                    probe_misses=2) as s, httpx.Client(base_url=s.url, timeout=30) as c:
        assert c.post("/v1/completions", json={"prompt": "x", "max_tokens": 2}).status_code == 200
        result: dict[str, Any] = {}

        def inflight() -> None:  # a non-streaming request already at the worker when it stops
            t0 = time.perf_counter()
            r = httpx.post(s.url + "/v1/completions", json={"prompt": "x", "max_tokens": 50}, timeout=30)
            result.update(status=r.status_code, s=time.perf_counter() - t0, body=r.json())

        t = threading.Thread(target=inflight)
        t.start()
        time.sleep(0.1)
        s.fake.config.hung = True  # the worker stops answering anything (SIGSTOP-like)
        t.join(10)
        assert result["status"] == 503 and result["s"] < 5, result
        assert "stopped answering" in result["body"]["error"]["message"]
        t0 = time.perf_counter()
        r = c.post("/v1/completions", json={"prompt": "x", "max_tokens": 2})
        assert r.status_code == 503 and time.perf_counter() - t0 < 0.5
        assert "not answering" in error_of(r)["message"]
        h = c.get("/health")
        assert h.status_code == 503
        s.fake.config.hung = False
        deadline = time.monotonic() + 5
        while c.get("/health").status_code != 200:
            assert time.monotonic() < deadline
            time.sleep(0.05)
        assert c.post("/v1/completions", json={"prompt": "x", "max_tokens": 2}).status_code == 200
        assert s.serve.admission.free == s.serve.admission.capacity


def test_errors_name_no_internal_address_and_disconnect_is_one_line(
        tokenizer_dir: Path, caplog: pytest.LogCaptureFixture) -> None:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    from netra.serve.app import create_app
    from netra.serve.config import ServeConfig
    from netra.web.server import ServerThread

    dead = f"http://127.0.0.1:{sock.getsockname()[1]}"
    with ServerThread(create_app(ServeConfig(upstream=dead, model_name="m"))) as url:
        for r in (httpx.get(url + "/health", timeout=10),
                  httpx.post(url + "/generate", json={"input_ids": [1], "stream": True}, timeout=10),
                  httpx.post(url + "/v1/completions", json={"prompt": "x"}, timeout=10)):
            assert r.status_code == 503
            assert "127.0.0.1" not in r.text and "http://" not in r.text, r.text
    sock.close()
    with make_stack(tokenizer_dir) as s:
        caplog.set_level(logging.INFO)
        host, port = s.url.removeprefix("http://").split(":")
        c = socket.create_connection((host, int(port)))
        c.sendall(b"POST /v1/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
                  b"content-length: 100000\r\n\r\n{\"prompt\": \"")
        time.sleep(0.2)
        c.close()
        deadline = time.monotonic() + 5
        while not any("disconnected" in rec.getMessage() for rec in caplog.records):
            assert time.monotonic() < deadline, [rec.getMessage() for rec in caplog.records]
            time.sleep(0.05)
        gone = [rec for rec in caplog.records if "disconnected" in rec.getMessage()]
        assert len(gone) == 1 and gone[0].levelno == logging.INFO and gone[0].exc_info is None
        assert not [rec for rec in caplog.records if rec.levelno >= logging.ERROR]


def test_listen_socket_gives_nodelay_connections() -> None:
    srv = tcp_listen_socket("127.0.0.1", 0)
    srv.listen(1)
    cli = socket.create_connection(srv.getsockname())
    conn, _ = srv.accept()
    try:
        assert conn.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) != 0
        assert conn.proto == socket.IPPROTO_TCP  # so asyncio sets TCP_NODELAY on its transport too
    finally:
        conn.close()
        cli.close()
        srv.close()


def test_openai_error_carries_headers() -> None:
    e = OpenAIError(503, "full", headers={"retry-after": "2"})
    assert e.body()["error"]["code"] == 503 and e.headers == {"retry-after": "2"}
