"""Router tier: SMG (PyPI smg, the router the Kubernetes render deploys) with file discovery in front of
the `local` profile's response layers, launched for real by `netra launch`.

Exact round-robin split, a worker added by replacing the manifest, a SIGKILLed response layer costing
no request, streamed chat through SMG with the openai SDK.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import openai
import pytest
from deploy.conftest import Local, free_port, launched, needs_nginx

SMG = shutil.which("smg", path=str(Path(sys.executable).parent)) or shutil.which("smg")
pytestmark = [needs_nginx, pytest.mark.skipif(SMG is None, reason="PyPI smg is not installed (the dev extra)")]
MODEL = "netra-tiny"
CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "Hello"}], "max_tokens": 2}


def write_manifest(path: Path, urls: list[str]) -> None:
    """SMG's file-discovery manifest, replaced atomically (SMG rereads it on change)."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps({"version": 1, "workers": [{"url": u} for u in urls]}))
    tmp.replace(path)


@dataclass
class Router:
    url: str
    manifest: Path
    proc: subprocess.Popen[bytes]

    def workers(self) -> list[str]:
        with urllib.request.urlopen(self.url + "/workers", timeout=10) as r:
            data = json.load(r)
        return sorted(w["url"] for w in data["workers"] if w.get("is_healthy"))

    def wait_workers(self, urls: list[str], timeout: float = 30) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                if self.workers() == sorted(urls):
                    return
            except OSError:
                pass
            time.sleep(0.2)
        raise AssertionError(f"SMG lists {self.workers()}, expected {sorted(urls)}")

    def client(self) -> openai.OpenAI:
        return openai.OpenAI(base_url=self.url + "/v1", api_key="unused", max_retries=0, timeout=120)


@pytest.fixture(scope="module")
def local(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Local]:
    with launched("local", tmp_path_factory) as served:
        yield served


def serve_urls(local: Local) -> list[str]:
    return [w["serve_url"] for w in local.record()["workers"]]


@pytest.fixture
def router(tmp_path: Path) -> Iterator[Router]:
    assert SMG is not None
    port, metrics = free_port(), free_port()
    manifest = tmp_path / "workers.json"
    log = (tmp_path / "smg.log").open("wb")
    proc = subprocess.Popen([SMG, "launch", "--host", "127.0.0.1", "--port", str(port), "--policy", "round_robin",
                             "--discovery-provider", "file", "--discovery-file", str(manifest),
                             "--discovery-check-interval-secs", "1", "--prometheus-port", str(metrics),
                             "--health-check-interval-secs", "1", "--shutdown-grace-period-secs", "1", "--log-level", "warn"],
                            stdout=log, stderr=subprocess.STDOUT)
    r = Router(f"http://127.0.0.1:{port}", manifest, proc)
    deadline = time.monotonic() + 30
    while True:
        try:
            r.workers()
            break
        except OSError:
            assert proc.poll() is None and time.monotonic() < deadline, (tmp_path / "smg.log").read_text()[-2000:]
            time.sleep(0.2)
    try:
        yield r
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()


def chats_by_worker(local: Local) -> list[int]:
    """Chat requests each response layer has answered 200 (its own /metrics)."""
    out = []
    for url in serve_urls(local):
        with urllib.request.urlopen(url + "/metrics", timeout=10) as r:
            text = r.read().decode()
        m = re.search(r'^netra_serve_requests_total\{endpoint="chat",[^}]*status="200"[^}]*\} ([0-9.]+)$', text, re.M)
        out.append(int(float(m.group(1))) if m else 0)
    return out


def delta(before: list[int], after: list[int]) -> list[int]:
    return [a - b for a, b in zip(after, before, strict=True)]


def test_round_robin_split_is_exact(local: Local, router: Router) -> None:
    urls = serve_urls(local)
    write_manifest(router.manifest, urls)
    router.wait_workers(urls)
    client = router.client()
    before = chats_by_worker(local)
    for _ in range(20):
        out = client.chat.completions.create(**CHAT)
        assert out.choices[0].finish_reason in ("length", "stop")
    assert delta(before, chats_by_worker(local)) == [10, 10]


def test_worker_added_by_replacing_the_manifest(local: Local, router: Router) -> None:
    urls = serve_urls(local)
    write_manifest(router.manifest, urls[:1])
    router.wait_workers(urls[:1])
    client = router.client()
    before = chats_by_worker(local)
    for _ in range(6):
        client.chat.completions.create(**CHAT)
    mid = chats_by_worker(local)
    assert delta(before, mid) == [6, 0]
    write_manifest(router.manifest, urls)
    router.wait_workers(urls)
    for _ in range(10):
        client.chat.completions.create(**CHAT)
    assert delta(mid, chats_by_worker(local)) == [5, 5]


def test_sigkilled_worker_costs_no_request(local: Local, router: Router) -> None:
    urls = serve_urls(local)
    write_manifest(router.manifest, urls)
    router.wait_workers(urls)
    client = router.client()
    failures: list[str] = []
    done = [0]
    stop = threading.Event()

    def loop() -> None:
        while not stop.is_set():
            try:
                out = client.chat.completions.create(**CHAT)
                assert out.choices[0].message.content is not None
                done[0] += 1
            except Exception as exc:  # every failure is the test's finding
                failures.append(repr(exc))

    threads = [threading.Thread(target=loop) for _ in range(4)]
    for t in threads:
        t.start()
    time.sleep(3)
    victim = local.record()["workers"][1]["serve"]["pid"]
    os.kill(victim, signal.SIGKILL)
    time.sleep(6)
    stop.set()
    for t in threads:
        t.join(timeout=120)
    assert failures == []
    assert done[0] >= 8
    # The launcher's supervisor restarts the response layer; SMG takes it back once healthy.
    deadline = time.monotonic() + 90
    while local.record()["workers"][1]["serve"]["pid"] == victim and time.monotonic() < deadline:
        time.sleep(0.5)
    assert local.record()["workers"][1]["serve"]["pid"] != victim


def test_streamed_chat_through_smg(local: Local, router: Router) -> None:
    urls = serve_urls(local)
    write_manifest(router.manifest, urls)
    router.wait_workers(urls)
    chunks = list(router.client().chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "Hello"}], max_tokens=8, stream=True))
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text
    assert len([c for c in chunks if c.choices and c.choices[0].finish_reason]) == 1
