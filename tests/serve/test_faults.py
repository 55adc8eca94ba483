"""Client disconnects abort upstream; worker failures end streams with an OpenAI error, never a hang."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import orjson
import pytest

from netra.serve.app import create_app
from netra.serve.config import ServeConfig
from netra.serve.fakeworker import FakeConfig, FakeState, create_fake_worker
from netra.web.server import ServerThread

from .conftest import make_stack, metric_value


def wait_for(cond: object, timeout: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():  # type: ignore[operator]
            return True
        time.sleep(0.01)
    return False


def _aborted_upstream(fake: FakeState, rid: str) -> bool:
    return rid not in fake.running and (rid in fake.aborted or rid in fake.disconnected)


@pytest.mark.parametrize("incremental", [False, True])
@pytest.mark.parametrize("endpoint", ["/v1/completions", "/v1/chat/completions", "/generate"])
def test_stream_disconnect_aborts_upstream(tokenizer_dir: Path, incremental: bool, endpoint: str) -> None:
    with make_stack(tokenizer_dir, FakeConfig(incremental=incremental, step_delay=0.01)) as s:
        body: dict[str, object]
        if endpoint == "/generate":
            body = {"input_ids": [1, 2], "sampling_params": {"max_new_tokens": 2000, "temperature": 0},
                    "stream": True}
        elif endpoint == "/v1/completions":
            body = {"prompt": "x", "max_tokens": 2000, "temperature": 0, "stream": True}
        else:
            body = {"messages": [{"role": "user", "content": "x"}], "max_tokens": 2000, "stream": True}
        with httpx.Client(base_url=s.url, timeout=10) as c, c.stream("POST", endpoint, json=body) as r:
            assert r.status_code == 200
            lines = r.iter_lines()
            got = [next(lines) for _ in range(6)]
            assert any(line.startswith("data: {") for line in got)
            rid = s.fake.requests[-1]["rid"]
            assert rid in s.fake.running
        # Leaving the block closed the connection mid-stream (2000 tokens at 10 ms would take 20 s).
        assert wait_for(lambda: _aborted_upstream(s.fake, rid)), (s.fake.running, s.fake.aborted)
        assert wait_for(lambda: metric_value(httpx.get(s.url + "/metrics").text, "netra_serve_upstream_aborts_total",
                                             reason="client_disconnect") == 1.0)


def test_nonstream_disconnect_aborts_upstream(tokenizer_dir: Path) -> None:
    with make_stack(tokenizer_dir, FakeConfig(step_delay=0.01)) as s:
        with pytest.raises(httpx.ReadTimeout):
            httpx.post(s.url + "/v1/completions", json={"prompt": "x", "max_tokens": 2000}, timeout=0.5)
        rid = s.fake.requests[-1]["rid"]
        assert wait_for(lambda: rid in s.fake.aborted)
        ok = httpx.post(s.url + "/v1/completions", json={"prompt": "x", "max_tokens": 3, "temperature": 0}, timeout=10)
        assert ok.status_code == 200


@pytest.mark.parametrize("incremental", [False, True])
def test_upstream_dies_mid_stream_ends_with_error_event(tokenizer_dir: Path, incremental: bool) -> None:
    with make_stack(tokenizer_dir, FakeConfig(incremental=incremental, fail_after=5, step_delay=0.001)) as s:
        t0 = time.monotonic()
        r = httpx.post(s.url + "/v1/chat/completions", timeout=10,
                       json={"messages": [{"role": "user", "content": "x"}], "max_tokens": 100, "stream": True})
        assert time.monotonic() - t0 < 5
        blocks = [b[6:] for b in r.content.split(b"\n\n") if b.startswith(b"data: ")]
        assert blocks[-1] == b"[DONE]"
        err = orjson.loads(blocks[-2])["error"]
        assert err["code"] in (502, 503) and "worker" in err["message"]
        assert any(b.startswith(b'{"id"') for b in blocks[:-2])  # tokens before the fault got through
        metrics = httpx.get(s.url + "/metrics").text
        assert metric_value(metrics, "netra_serve_requests_total", endpoint="chat", status="502") == 1.0
        # Non-streaming: a clean 502 error object.
        r = httpx.post(s.url + "/v1/completions", json={"prompt": "x", "max_tokens": 100, "stop": ["zz"]}, timeout=10)
        assert r.status_code == 502 and "worker" in r.json()["error"]["message"]


def test_upstream_down_and_unhealthy(tokenizer_dir: Path) -> None:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    dead = f"http://127.0.0.1:{sock.getsockname()[1]}"  # bound, never listening: connections are refused
    with ServerThread(create_app(ServeConfig(upstream=dead, model_name="m"))) as url:
        r = httpx.get(url + "/health", timeout=10)
        assert r.status_code == 503 and "not reachable" in r.json()["error"]["message"]
        r = httpx.post(url + "/generate", json={"input_ids": [1], "stream": True}, timeout=10)
        assert r.status_code == 503 and r.json()["error"]["type"] == "service_unavailable"
        r = httpx.post(url + "/v1/completions", json={"prompt": "x"}, timeout=10)
        assert r.status_code == 503
    sock.close()
    with make_stack(tokenizer_dir, FakeConfig(healthy=False)) as s:
        r = httpx.get(s.url + "/health", timeout=10)
        assert r.status_code == 503 and "503" in r.json()["error"]["message"]


def test_upstream_silence_times_out(tokenizer_dir: Path) -> None:
    with make_stack(tokenizer_dir, FakeConfig(step_delay=2.0), upstream_timeout=0.5) as s:
        r = httpx.post(s.url + "/v1/completions", json={"prompt": "x", "max_tokens": 5, "stream": True}, timeout=10)
        blocks = [b[6:] for b in r.content.split(b"\n\n") if b.startswith(b"data: ")]
        assert blocks[-1] == b"[DONE]" and orjson.loads(blocks[-2])["error"]["code"] == 504


def test_cli_process_serves_and_health_follows_upstream(tokenizer_dir: Path) -> None:
    worker = create_fake_worker(FakeConfig(), tokenizer_dir)
    with ServerThread(worker) as up:
        probe = socket.socket()
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
        probe.close()
        cmd = [sys.executable, "-m", "netra", "serve", "--upstream", up, "--port", str(port),
               "--stream-interval", "2", "--model-name", "tiny-test", "--upstream-timeout", "30"]
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env={**os.environ})
        try:
            url = f"http://127.0.0.1:{port}"

            def healthy() -> bool:
                try:
                    return httpx.get(url + "/health", timeout=1).status_code == 200
                except httpx.HTTPError:
                    return False

            assert wait_for(healthy, timeout=20), proc.stdout.read1().decode() if proc.stdout else ""
            assert httpx.get(url + "/v1/models").json()["data"][0]["id"] == "tiny-test"
            r = httpx.post(url + "/v1/completions", json={"prompt": "x", "max_tokens": 8, "stream": True}, timeout=10)
            assert r.content.endswith(b"data: [DONE]\n\n")
            worker.state.fake.config.healthy = False  # seen at the next probe of the worker (1 s)
            assert wait_for(lambda: httpx.get(url + "/health").status_code == 503, timeout=10)
        finally:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(5)
        # uvicorn shuts down gracefully, then re-raises the SIGTERM it caught (exit status -15).
        out = proc.stdout.read().decode() if proc.stdout else ""
        assert proc.returncode in (0, -signal.SIGTERM)
        assert "Application shutdown complete" in out, out


def test_cli_rejects_bad_options() -> None:
    r = subprocess.run([sys.executable, "-m", "netra", "serve", "--stream-interval", "0"], capture_output=True,
                       text=True, timeout=30)
    assert r.returncode == 2 and "--stream-interval 0" in r.stdout


def test_disconnect_with_several_choices_aborts_each_once(tokenizer_dir: Path) -> None:
    with make_stack(tokenizer_dir, FakeConfig(step_delay=0.01)) as s:
        body = {"prompt": ["a", "b"], "n": 2, "max_tokens": 2000, "temperature": 0, "stream": True}
        with httpx.Client(base_url=s.url, timeout=10) as c, c.stream("POST", "/v1/completions", json=body) as r:
            lines = r.iter_lines()
            assert next(lines).startswith("data: {")
            rids = [q["rid"] for q in s.fake.requests[-4:]]
        assert len(set(rids)) == 4
        assert wait_for(lambda: all(_aborted_upstream(s.fake, rid) for rid in rids))
        time.sleep(0.2)
        metrics = httpx.get(s.url + "/metrics").text
        assert metric_value(metrics, "netra_serve_upstream_aborts_total", reason="client_disconnect") == 4.0
        assert metric_value(metrics, "netra_serve_requests_total", endpoint="completions", status="499") == 1.0
        assert metric_value(metrics, "netra_serve_in_flight") == 0.0
        assert 'netra_serve_in_flight{model_name="' in metrics  # every series labelled


def test_sigterm_with_open_stream_exits_bounded_and_aborts_upstream(tokenizer_dir: Path) -> None:
    worker = create_fake_worker(FakeConfig(step_delay=0.01), tokenizer_dir)
    with ServerThread(worker) as up:
        probe = socket.socket()
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
        probe.close()
        proc = subprocess.Popen([sys.executable, "-m", "netra", "serve", "--upstream", up, "--port", str(port)],
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            url = f"http://127.0.0.1:{port}"

            def healthy() -> bool:
                try:
                    return httpx.get(url + "/health", timeout=1).status_code == 200
                except httpx.HTTPError:
                    return False

            assert wait_for(healthy, timeout=20)
            body = {"prompt": "x", "max_tokens": 4000, "stream": True}
            with httpx.Client(timeout=30) as c, c.stream("POST", url + "/v1/completions", json=body) as r:
                lines = r.iter_lines()
                assert next(lines).startswith("data: {")
                rid = worker.state.fake.requests[-1]["rid"]
                t0 = time.monotonic()
                proc.send_signal(signal.SIGTERM)
                proc.wait(30)
                assert time.monotonic() - t0 < 20  # graceful shutdown is bounded (10 s), not the stream's length
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait(5)
        assert wait_for(lambda: _aborted_upstream(worker.state.fake, rid), timeout=10)
