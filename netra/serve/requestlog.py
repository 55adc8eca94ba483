"""Request IDs and the one structured log line per request of the response layer.

`RequestIdMiddleware` (pure ASGI, so streams pass through untouched) takes the client's
``X-Request-Id`` when it is a sane token (1-128 of ``[A-Za-z0-9._:-]``; nginx sends its own
``$request_id`` when the client sent none) or makes one, keeps it in the request's state for the
endpoints (who pass it to the worker as the request's ``rid``), echoes it in the response's
``X-Request-Id`` header, and when the response has ended logs one line on the ``netra.request``
logger: id, method, endpoint, status, prompt and completion tokens, finish reason, TTFT (first body
byte of a stream), e2e, and the error message of a failed request. With ``--log-format json`` its
fields are top-level keys of the JSON line.
"""

from __future__ import annotations

import hmac
import json
import logging
import re
import time
import uuid
from dataclasses import asdict, dataclass
from typing import Any

log = logging.getLogger("netra.request")
_ID = re.compile(r"^[A-Za-z0-9._:-]{1,128}$")
HEADER = b"x-request-id"


@dataclass
class RequestLog:
    id: str
    method: str
    endpoint: str
    worker: str
    status: int | None = None
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    finish_reason: str | None = None
    ttft_s: float | None = None
    e2e_s: float | None = None
    error: str | None = None

    def line(self) -> str:
        parts = []
        for key, value in asdict(self).items():
            if isinstance(value, float):
                value = f"{value:.4f}"
            elif isinstance(value, str) and (not value or " " in value or '"' in value):
                value = '"' + value.replace('"', "'") + '"'
            parts.append(f"{key}={'-' if value is None else value}")
        return "request " + " ".join(parts)


def request_id_of(headers: list[tuple[bytes, bytes]]) -> str:
    for key, value in headers:
        if key.lower() == HEADER:
            text = value.decode("latin-1").strip()
            if _ID.match(text):
                return text
    return uuid.uuid4().hex


def current(scope_or_request: Any) -> RequestLog | None:
    """The request's log record (from a Starlette Request or an ASGI scope), if the middleware ran."""
    scope = getattr(scope_or_request, "scope", scope_or_request)
    state = scope.get("state") or {}
    record = state.get("netra_request")
    return record if isinstance(record, RequestLog) else None


def note(request: Any, *, status: int | None = None, prompt_tokens: int | None = None,
         completion_tokens: int | None = None, finish_reasons: list[str | None] | None = None,
         error: str | None = None) -> None:
    record = current(request)
    if record is None:
        return
    if status is not None:
        record.status = status
    if prompt_tokens is not None:
        record.prompt_tokens = prompt_tokens
    if completion_tokens is not None:
        record.completion_tokens = completion_tokens
    if finish_reasons:
        reasons = sorted({r for r in finish_reasons if r})
        record.finish_reason = ",".join(reasons) or None
    if error is not None:
        record.error = error[:300]


class RequestIdMiddleware:
    def __init__(self, app: Any, worker: str) -> None:
        self.app = app
        self.worker = worker

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        rid = request_id_of(scope.get("headers", []))
        path = scope.get("path", "")
        record = RequestLog(rid, scope.get("method", ""), path, self.worker)
        scope.setdefault("state", {})["netra_request"] = record
        t0 = time.monotonic()
        streaming = False

        async def send_with_id(message: Any) -> None:
            nonlocal streaming
            if message["type"] == "http.response.start":
                headers = [(k, v) for k, v in message.get("headers", []) if k.lower() != HEADER]
                headers.append((HEADER, rid.encode()))
                message = {**message, "headers": headers}
                if record.status is None:
                    record.status = int(message["status"])
                streaming = any(k.lower() == b"content-type" and v.startswith(b"text/event-stream")
                                for k, v in headers)
            elif message["type"] == "http.response.body" and streaming and record.ttft_s is None \
                    and message.get("body"):
                record.ttft_s = time.monotonic() - t0
            await send(message)

        try:
            await self.app(scope, receive, send_with_id)
        except Exception as exc:
            record.status = record.status or 500
            record.error = record.error or f"{type(exc).__name__}: {exc}"[:300]
            raise
        finally:
            record.e2e_s = time.monotonic() - t0
            if path not in ("/health", "/metrics"):  # probes and scrapes are not requests
                log.info(record.line(), extra={"fields": {"event": "request", **asdict(record)}})


OPEN_PATHS = ("/health", "/metrics")


class ApiKeyMiddleware:
    """``--api-key``: a request without ``Authorization: Bearer KEY`` gets 401 before anything else
    happens (no body read, nothing sent to the worker); /health and /metrics stay open for probes."""

    def __init__(self, app: Any, key: str) -> None:
        self.app = app
        self.key = key.encode()

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http" or scope.get("path") in OPEN_PATHS:
            await self.app(scope, receive, send)
            return
        given = b""
        for k, v in scope.get("headers", []):
            if k.lower() == b"authorization" and v[:7].lower() == b"bearer ":
                given = v[7:].strip()
        if hmac.compare_digest(given, self.key):
            await self.app(scope, receive, send)
            return
        note(scope, error="missing or wrong API key")
        body = json.dumps({"error": {"message": "missing or wrong API key (Authorization: Bearer KEY)",
                                     "type": "invalid_request_error", "param": None,
                                     "code": "invalid_api_key"}}).encode()
        await send({"type": "http.response.start", "status": 401,
                    "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
                                (b"www-authenticate", b"Bearer")]})
        await send({"type": "http.response.body", "body": body})
