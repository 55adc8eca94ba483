"""`netra launch --profile local` for real: 2 embedded-engine workers (tiny, CPU), 2 response layers,
nginx; driven with the `openai` SDK, from another shell (`--detach`, `netra status`, `netra stop`)."""

from __future__ import annotations

import os
import re
import signal
import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from itertools import pairwise
from pathlib import Path

import httpx
import openai
import pytest

from netra.deploy.record import is_alive
from tests.deploy.conftest import MODEL, Local, needs_nginx, netra

pytestmark = [needs_nginx, pytest.mark.timeout(420)]
def served_per_worker(local: Local) -> list[float]:
    counts = []
    for w in local.record()["workers"]:
        text = httpx.get(w["serve_url"] + "/metrics", timeout=10).text
        counts.append(sum(float(v) for v in re.findall(r'^netra_serve_requests_total\{[^}]*\} (\S+)$', text, re.M)))
    return counts


def test_record_and_status(local: Local) -> None:
    rec = local.record()
    assert rec["state"] == "serving" and rec["profile_name"] == "local"
    assert all(w["status"] == "up" and w["audit"] == [] for w in rec["workers"])
    st = netra("status", "--run-dir", str(local.run_dir), timeout=60)
    assert st.returncode == 0 and "local: serving" in st.stdout, st.stdout + st.stderr


@pytest.mark.parametrize("api", ["chat", "completions"])
def test_openai_stream_equals_non_stream(local: Local, api: str) -> None:
    c = local.client()
    kw = {"model": MODEL, "max_tokens": 24, "temperature": 0, "extra_body": {"ignore_eos": True}}
    if api == "chat":
        messages = [{"role": "user", "content": "Tell me about Netra."}]
        full = c.chat.completions.create(messages=messages, **kw)
        text = full.choices[0].message.content
        stream = c.chat.completions.create(messages=messages, stream=True,
                                           stream_options={"include_usage": True}, **kw)
        parts, usage = [], None
        for chunk in stream:
            if chunk.choices and chunk.choices[0].delta.content:
                parts.append(chunk.choices[0].delta.content)
            usage = chunk.usage or usage
    else:
        full = c.completions.create(prompt="Netra serves", **kw)
        text = full.choices[0].text
        stream = c.completions.create(prompt="Netra serves", stream=True, stream_options={"include_usage": True},
                                      **kw)
        parts, usage = [], None
        for chunk in stream:
            if chunk.choices and chunk.choices[0].text:
                parts.append(chunk.choices[0].text)
            usage = chunk.usage or usage
    assert text and "".join(parts) == text
    assert full.usage.completion_tokens == 24 and usage is not None
    assert (usage.prompt_tokens, usage.completion_tokens) == (full.usage.prompt_tokens, 24)


def test_round_robin_spreads_2n_requests_n_n(local: Local) -> None:
    n = 6
    before = served_per_worker(local)
    c = local.client()
    for _ in range(2 * n):
        c.completions.create(model=MODEL, prompt="hi", max_tokens=1, temperature=0)
    after = served_per_worker(local)
    assert [a - b for a, b in zip(after, before, strict=True)] == [n, n]


def test_malformed_requests_get_openai_errors(local: Local) -> None:
    bad = [
        (b"{not json", "application/json"),
        (b'{"model": "netra-tiny"}', "application/json"),  # no messages
        (b'{"model": "netra-tiny", "messages": [{"role": "user", "content": "x"}], "max_tokens": -1}',
         "application/json"),
        (b'{"model": "netra-tiny", "messages": "x", "temperature": "hot"}', "application/json"),
    ]
    with httpx.Client(timeout=30) as h:
        for body, ctype in bad:
            r = h.post(local.url + "/v1/chat/completions", content=body, headers={"Content-Type": ctype})
            assert 400 <= r.status_code < 500, (body, r.status_code, r.text)
            err = r.json()["error"]
            assert err["message"] and err["type"] and err["code"] == r.status_code
        r = h.post(local.url + "/v1/completions", json={"model": MODEL, "prompt": "hi", "max_tokens": 2})
        assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 2
    with pytest.raises(openai.BadRequestError):
        local.client().completions.create(model=MODEL, prompt="hi", max_tokens=1, temperature=-1)


class LongStream:
    """A long streamed completion in a thread; `progress` counts text chunks; `stop` closes it early."""

    def __init__(self, local: Local) -> None:
        self.local = local
        self.progress = 0
        self.outcome: str | None = None
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self.run, daemon=True)
        self.thread.start()

    def run(self) -> None:
        try:
            stream = self.local.client().completions.create(
                model=MODEL, prompt="go", max_tokens=3000, temperature=0, stream=True,
                extra_body={"ignore_eos": True})
            for chunk in stream:
                if chunk.choices and chunk.choices[0].text:
                    self.progress += 1
                if self.stop.is_set():
                    stream.close()  # a client that goes away: its request is aborted upstream
                    self.outcome = "closed"
                    return
            self.outcome = "finished"
        except (openai.APIError, httpx.HTTPError) as exc:
            self.outcome = f"error: {type(exc).__name__}: {exc}"


def test_killed_engine_streams_end_with_an_error_then_100_requests_complete(local: Local) -> None:
    rec = local.record()
    victim = rec["workers"][1]
    old_pid = victim["engine"]["pid"]
    # Two long streams, one per worker (round robin), both producing when worker 1's engine is killed.
    streams = [LongStream(local) for _ in range(2)]
    deadline = time.monotonic() + 60
    while not all(s.progress > 0 for s in streams):
        assert time.monotonic() < deadline and all(s.outcome is None for s in streams)
        time.sleep(0.1)
    os.kill(old_pid, signal.SIGKILL)
    killed_at = time.monotonic()
    while not any(s.outcome for s in streams):
        assert time.monotonic() - killed_at < 30, "no stream ended after its engine was killed: a hang"
        time.sleep(0.1)
    for s in streams:
        s.stop.set()
        s.thread.join(60)
    results = [(s.outcome or "", s.progress) for s in streams]
    # The stream on the dead worker ended with an error; the other was still running (then closed).
    assert sorted(r[0].split(":")[0] for r in results) == ["closed", "error"], results
    # The next 100 requests all complete while the worker restarts.
    with httpx.Client(timeout=60) as h, ThreadPoolExecutor(4) as pool:
        codes = Counter(pool.map(lambda _: h.post(local.url + "/v1/completions", json={
            "model": MODEL, "prompt": "hi", "max_tokens": 1}).status_code, range(100)))
    assert codes == Counter({200: 100})
    while True:
        w = local.record()["workers"][1]
        if w["status"] == "up" and w["engine"]["pid"] != old_pid:
            break
        # A restart is a fresh Python + torch start: seconds on an idle machine, tens on a loaded one.
        assert time.monotonic() - killed_at < 90, f"worker 1 not back within 90 s: {w['status']}"
        time.sleep(0.2)
    back_s = time.monotonic() - killed_at
    print(f"worker 1 back {back_s:.1f} s after SIGKILL")
    assert w["restarts"][-1]["exit_code"] == -9 and w["restarts"][-1]["pid"] == old_pid
    assert is_alive(w["engine"]["pid"], w["engine"]["ticks"])
    # And it takes traffic again once nginx's passive-health window (fail_timeout) has passed.
    time.sleep(local.record()["profile"]["front"]["fail_timeout_s"] + 0.5)
    before = served_per_worker(local)
    c = local.client()
    for _ in range(6):
        c.completions.create(model=MODEL, prompt="hi", max_tokens=1)
    after = served_per_worker(local)
    assert after[1] - before[1] >= 2


def test_front_metrics_has_every_worker_and_its_counters_only_grow(local: Local) -> None:
    """Six scrapes of the front's /metrics with requests in between: both workers' series every time
    (response layer and engine, labelled worker + model_name), each worker's counter never decreasing."""
    from prometheus_client.parser import text_string_to_metric_families

    seen: list[dict[str, float]] = []
    for i in range(6):
        r = httpx.post(local.url + "/v1/completions", timeout=120,
                       json={"model": MODEL, "prompt": f"scrape {i}", "max_tokens": 2, "temperature": 0})
        assert r.status_code == 200, r.text
        text = httpx.get(local.url + "/metrics", timeout=30).text
        fams = {f.name: f.samples for f in text_string_to_metric_families(text)}
        per_worker: dict[str, float] = {}
        for s in fams["netra_serve_requests"]:
            if s.name == "netra_serve_requests_total":
                assert s.labels["model_name"] == MODEL
                per_worker[s.labels["worker"]] = per_worker.get(s.labels["worker"], 0.0) + s.value
        seen.append(per_worker)
        assert {s.labels["worker"] for s in fams["sglang:num_running_reqs"]} == {"0", "1"}
        assert {(s.labels["worker"], s.labels["process"], s.value) for s in fams["netra_scrape_up"]} == {
            ("0", "serve", 1.0), ("0", "engine", 1.0), ("1", "serve", 1.0), ("1", "engine", 1.0)}
    assert all(set(s) == {"0", "1"} for s in seen), seen
    for before, after in pairwise(seen):
        assert all(after[w] >= before[w] for w in before), seen
    assert sum(seen[-1].values()) - sum(seen[0].values()) == 5, seen


def test_request_id_is_logged_once_reaches_the_engine_and_is_echoed(local: Local) -> None:
    rid = f"abc-{os.getpid()}"
    r = httpx.post(local.url + "/v1/chat/completions", headers={"X-Request-Id": rid}, timeout=120,
                   json={"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3,
                         "temperature": 0})
    assert r.status_code == 200 and r.headers["x-request-id"] == rid
    # The native API shows the id the engine ran the request under (meta_info.id).
    native = httpx.post(local.url + "/generate", headers={"X-Request-Id": rid + "-native"}, timeout=120,
                        json={"input_ids": [1, 2, 3], "sampling_params": {"max_new_tokens": 2, "temperature": 0}})
    assert native.status_code == 200 and native.json()["meta_info"]["id"] == rid + "-native"
    # A refused request has its line too, and an id nginx made up when the client sent none.
    bad = httpx.post(local.url + "/v1/chat/completions", json={"model": MODEL, "messages": []}, timeout=60)
    assert bad.status_code == 400 and re.fullmatch(r"[0-9a-f]{32}", bad.headers["x-request-id"])
    time.sleep(0.5)
    logs = "".join(Path(w["serve"]["log"]).read_text() for w in local.record()["workers"])
    lines = [line for line in logs.splitlines() if f"request id={rid} " in line]
    assert len(lines) == 1, lines
    line = lines[0]
    for field in ("endpoint=/v1/chat/completions", "status=200", "prompt_tokens=", "completion_tokens=3",
                  "finish_reason=length", "e2e_s="):
        assert field in line, line
    bad_lines = [ln for ln in logs.splitlines() if f"request id={bad.headers['x-request-id']} " in ln]
    assert len(bad_lines) == 1 and "status=400" in bad_lines[0] and "error=" in bad_lines[0], bad_lines
    assert "HTTP Request:" not in logs  # httpx's per-call INFO lines are silenced
    access = Path(local.record()["front"]["conf"]).with_name("nginx.access.log")
    deadline = time.monotonic() + 5  # nginx flushes its access log buffer every second
    while f"rid={rid} " not in access.read_text() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert f"rid={rid} " in access.read_text()
