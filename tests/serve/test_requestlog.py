"""Request IDs, the per-request log line (text and JSON), worker labels and the API key of the response layer."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from netra import logs
from netra.serve.fakeworker import FakeConfig

from .conftest import make_stack

CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}


def _lines(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.name == "netra.request"]


def test_request_id_is_honoured_passed_as_rid_echoed_and_logged_once(tokenizer_dir: Path,
                                                                    caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="netra.request")
    with make_stack(tokenizer_dir, FakeConfig(), worker_id="5", model_name="m") as s:
        r = httpx.post(s.url + "/v1/chat/completions", json=CHAT, headers={"X-Request-Id": "abc"}, timeout=30)
        assert r.status_code == 200 and r.headers["x-request-id"] == "abc"
        # The worker runs it under the client's id, inside this response layer's namespace (issue 24:
        # a client-chosen id alone could name, and so abort, another client's request).
        ns = s.serve.upstream.namespace
        assert s.fake.requests[-1]["rid"].startswith(ns + "-") and s.fake.requests[-1]["rid"].endswith("-abc")
        r2 = httpx.post(s.url + "/v1/chat/completions", json={**CHAT, "n": 2}, headers={"X-Request-Id": "two"},
                        timeout=30)
        assert r2.status_code == 200
        assert sorted(req["rid"].rsplit("-", 2)[1:] for req in s.fake.requests[-2:]) == [["two", "0"], ["two", "1"]]
        # No id, or one that is not a sane token: a fresh one, echoed.
        r3 = httpx.post(s.url + "/v1/chat/completions", json=CHAT, headers={"X-Request-Id": "bad id\twith space"},
                        timeout=30)
        fresh = r3.headers["x-request-id"]
        assert len(fresh) == 32 and s.fake.requests[-1]["rid"].endswith("-" + fresh)
        bad = httpx.post(s.url + "/v1/chat/completions", json={"model": "m", "messages": "nope"},
                         headers={"X-Request-Id": "err-1"}, timeout=30)
        assert bad.status_code == 400 and bad.headers["x-request-id"] == "err-1"
        metrics = httpx.get(s.url + "/metrics").text
    lines = _lines(caplog)
    abc = [r for r in lines if r.fields["id"] == "abc"]  # type: ignore[attr-defined]
    assert len(abc) == 1
    f = abc[0].fields  # type: ignore[attr-defined]
    assert (f["endpoint"], f["status"], f["completion_tokens"], f["finish_reason"], f["worker"]) == (
        "/v1/chat/completions", 200, 4, "length", "5")
    assert f["prompt_tokens"] > 0 and f["e2e_s"] > 0 and f["error"] is None
    assert "request id=abc " in abc[0].getMessage() and "status=200" in abc[0].getMessage()
    err = [r for r in lines if r.fields["id"] == "err-1"]  # type: ignore[attr-defined]
    assert len(err) == 1 and err[0].fields["status"] == 400 and "messages" in err[0].fields["error"]  # type: ignore[attr-defined]
    assert not [r for r in lines if r.fields["endpoint"] in ("/health", "/metrics")]  # type: ignore[attr-defined]
    fams = {fam.name: fam.samples for fam in text_string_to_metric_families(metrics)}
    assert all(smp.labels["worker"] == "5" and smp.labels["model_name"] == "m"
               for samples in fams.values() for smp in samples)


def test_stream_line_has_ttft_and_finish_reason(tokenizer_dir: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="netra.request")
    with make_stack(tokenizer_dir, FakeConfig(step_delay=0.01), model_name="m") as s:
        with httpx.stream("POST", s.url + "/v1/completions", headers={"X-Request-Id": "s-1"}, timeout=30,
                          json={"model": "m", "prompt": "hello", "max_tokens": 6, "stream": True}) as r:
            assert r.headers["x-request-id"] == "s-1"
            body = r.read().decode()
        assert body.endswith("data: [DONE]\n\n")
    (line,) = [r for r in _lines(caplog) if r.fields["id"] == "s-1"]  # type: ignore[attr-defined]
    f = line.fields  # type: ignore[attr-defined]
    assert f["status"] == 200 and f["completion_tokens"] == 6 and f["finish_reason"] == "length"
    assert f["ttft_s"] is not None and 0 < f["ttft_s"] <= f["e2e_s"]


def test_json_log_format_puts_fields_at_the_top_level() -> None:
    record = logging.LogRecord("netra.request", logging.INFO, __file__, 1, "request id=x", None, None)
    record.fields = {"id": "x", "status": 200}
    out = json.loads(logs.JsonFormatter().format(record))
    assert (out["logger"], out["level"], out["id"], out["status"], out["message"]) == (
        "netra.request", "INFO", "x", 200, "request id=x")


def test_api_key_401_touches_nothing(tokenizer_dir: Path) -> None:
    with make_stack(tokenizer_dir, FakeConfig(), api_key="k3y", model_name="m") as s:
        for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": "k3y"}):
            r = httpx.post(s.url + "/v1/chat/completions", json=CHAT, headers=headers, timeout=30)
            assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key"
        assert s.fake.requests == []  # nothing reached the worker
        assert httpx.get(s.url + "/health").status_code == 200  # probes stay open
        assert httpx.get(s.url + "/metrics").status_code == 200
        ok = httpx.post(s.url + "/v1/chat/completions", json=CHAT, headers={"Authorization": "Bearer k3y"},
                        timeout=30)
        assert ok.status_code == 200 and len(s.fake.requests) == 1
