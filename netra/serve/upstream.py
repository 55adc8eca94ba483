"""The worker client: pooled `httpx.AsyncClient`s per response-layer process (see `Upstream`).

Speaks only docs/worker-contract.md. Failures become `OpenAIError`s with a status that says
whose fault it was: 4xx when the worker refused the request, 502 when it broke the contract or
failed, 503 when it cannot be reached, 504 when it went silent past `--upstream-timeout`.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import secrets
from collections.abc import AsyncIterator, Callable
from typing import Any

import httpx
import orjson

from netra.web.errors import OpenAIError

log = logging.getLogger("netra.serve.upstream")


def _upstream_message(status: int, body: bytes) -> str:
    try:
        obj = orjson.loads(body)
    except orjson.JSONDecodeError:
        return body.decode("utf-8", "replace")[:500] or f"HTTP {status}"
    if isinstance(obj, dict):
        err = obj.get("error")
        if isinstance(err, dict) and "message" in err:
            return str(err["message"])
        if isinstance(err, str):
            return err
        if "message" in obj:  # SGLang's OpenAI-style {"object": "error", "message": ...}
            return str(obj["message"])
    return body.decode("utf-8", "replace")[:500]


def _status_error(status: int, body: bytes, where: str) -> OpenAIError:
    msg = _upstream_message(status, body)
    if 400 <= status < 500 and status != 404:
        return OpenAIError(status, msg)
    return OpenAIError(502, f"the worker's {where} returned HTTP {status}: {msg}")


def _transport_error(exc: Exception, base: str) -> OpenAIError:
    """The client's error for a failed call; the worker's address goes to the log, never to the client."""
    log.warning("worker at %s: %s: %s", base, type(exc).__name__, exc)
    if isinstance(exc, httpx.TimeoutException):
        return OpenAIError(504, f"the worker did not answer in time ({type(exc).__name__})")
    if isinstance(exc, httpx.ConnectError):
        return OpenAIError(503, "the worker is not reachable")
    return OpenAIError(502, f"the worker failed: {type(exc).__name__}")


class UpstreamStream:
    """An open native SSE stream: iterate `events()`; `aclose()` drops the connection (the worker
    aborts a request whose client went away)."""

    def __init__(self, response: httpx.Response, base: str, on_done: Callable[[], None] | None = None) -> None:
        self._response = response
        self._base = base
        self._on_done = on_done
        self.bytes_received = 0
        self.closed = False

    async def events(self) -> AsyncIterator[dict[str, Any]]:
        buf = b""
        data_lines: list[bytes] = []
        done = False
        try:
            async for chunk in self._response.aiter_raw():
                self.bytes_received += len(chunk)
                if done:
                    continue  # after [DONE]: read the body to its end so the connection can be reused
                buf += chunk
                *lines, buf = buf.split(b"\n")
                for raw in lines:
                    line = raw.rstrip(b"\r")
                    if line:
                        if line.startswith(b"data:"):
                            data_lines.append(line[5:].lstrip(b" "))
                        continue  # comments (":...") and other SSE fields carry nothing here
                    if not data_lines:
                        continue
                    data = b"\n".join(data_lines)
                    data_lines = []
                    if data == b"[DONE]":
                        done = True
                        if self._on_done is not None:
                            self._on_done()  # the request is over at the worker: never abort it
                        break
                    try:
                        event = orjson.loads(data)
                    except orjson.JSONDecodeError as exc:
                        raise OpenAIError(502, "the worker sent a malformed stream event") from exc
                    if isinstance(event, dict) and "error" in event and "meta_info" not in event:
                        raise OpenAIError(502, f"the worker's stream failed: {_upstream_message(200, data)}")
                    if not isinstance(event, dict):
                        raise OpenAIError(502, "the worker sent a non-object stream event")
                    yield event
        except httpx.HTTPError as exc:
            raise _transport_error(exc, self._base) from exc

    async def aclose(self) -> None:
        if not self.closed:
            self.closed = True
            await self._response.aclose()


class Upstream:
    """Two pooled clients to one worker: `client` carries generation requests (its pool is sized to
    the admission limit, so it never holds more connections than requests in flight and httpx's
    per-request scheduling stays cheap), `control` carries health probes, aborts and info requests
    (a few connections of their own: a probe or an abort never queues behind generation).

    Request IDs sent upstream are this process's own (`new_rid`): a client-chosen `rid` is prefixed
    with this response layer's namespace, and an abort is only ever sent for a request this process
    submitted and has not seen finish."""

    def __init__(self, base: str, timeout: float, max_connections: int = 256,
                 transport: httpx.AsyncBaseTransport | None = None) -> None:
        self.base = base.rstrip("/")
        self.timeout = timeout
        self.client = httpx.AsyncClient(
            base_url=self.base,
            timeout=httpx.Timeout(timeout, connect=min(timeout, 30.0)),
            limits=httpx.Limits(max_connections=max_connections, max_keepalive_connections=max_connections,
                                keepalive_expiry=60.0),
            transport=transport,
        )
        self.control = httpx.AsyncClient(
            base_url=self.base, timeout=httpx.Timeout(10.0, connect=min(timeout, 5.0)),
            limits=httpx.Limits(max_connections=8, max_keepalive_connections=4, keepalive_expiry=30.0),
            transport=transport,
        )
        self._background: set[asyncio.Task[None]] = set()
        self.namespace = f"n{secrets.token_hex(4)}"  # this process's rids: <namespace>-<n>[-<client rid>]
        self._rids = itertools.count()
        self.submitted: set[str] = set()  # sent upstream and not seen to finish: the only ones we abort

    def new_rid(self, client_rid: str | None = None) -> str:
        rid = f"{self.namespace}-{next(self._rids)}"
        return f"{rid}-{client_rid}" if client_rid else rid

    async def aclose(self) -> None:
        if self._background:
            await asyncio.wait(self._background, timeout=5.0)
        await self.client.aclose()
        await self.control.aclose()

    async def probe_health(self, timeout: float) -> tuple[bool, str, int, bytes]:
        """(answered, why, status, body) of one `GET /health` with a deadline of `timeout` seconds."""
        try:
            r = await self.control.get("/health", timeout=timeout)
        except httpx.TimeoutException:
            return False, f"the worker did not answer /health within {timeout:g} s", 0, b""
        except httpx.HTTPError as exc:
            log.warning("worker at %s /health: %r", self.base, exc)
            return False, f"the worker is not reachable ({type(exc).__name__})", 0, b""
        return True, "answered", r.status_code, r.content

    async def get_json(self, path: str) -> dict[str, Any]:
        try:
            r = await self.control.get(path)
        except httpx.HTTPError as exc:
            raise _transport_error(exc, self.base) from exc
        if r.status_code != 200:
            raise _status_error(r.status_code, r.content, path)
        try:
            obj = orjson.loads(r.content)
        except orjson.JSONDecodeError as exc:
            raise OpenAIError(502, f"worker {path} did not return JSON") from exc
        if not isinstance(obj, dict):
            raise OpenAIError(502, f"worker {path} did not return a JSON object")
        return obj

    async def generate(self, body: dict[str, Any]) -> dict[str, Any]:
        """Non-streaming `/generate`."""
        rid = str(body["rid"])
        self.submitted.add(rid)
        try:
            r = await self.client.post("/generate", content=orjson.dumps(body),
                                       headers={"content-type": "application/json"})
        except httpx.HTTPError as exc:
            self._failed(rid, exc)
            raise _transport_error(exc, self.base) from exc
        self.submitted.discard(rid)  # the worker answered: the request is over there
        if r.status_code != 200:
            raise _status_error(r.status_code, r.content, "/generate")
        try:
            obj = orjson.loads(r.content)
        except orjson.JSONDecodeError as exc:
            raise OpenAIError(502, "the worker's /generate did not return JSON") from exc
        if not isinstance(obj, dict):
            raise OpenAIError(502, "the worker's /generate did not return a JSON object")
        return obj

    async def open_stream(self, body: dict[str, Any]) -> UpstreamStream:
        """Send a streaming `/generate` and check its status before any byte goes to the client, so
        a refused request still gets a proper HTTP error."""
        rid = str(body["rid"])
        req = self.client.build_request("POST", "/generate", content=orjson.dumps(body),
                                        headers={"content-type": "application/json",
                                                 "accept": "text/event-stream"})
        self.submitted.add(rid)
        try:
            response = await self.client.send(req, stream=True)
        except httpx.HTTPError as exc:
            self._failed(rid, exc)
            raise _transport_error(exc, self.base) from exc
        if response.status_code != 200:
            self.submitted.discard(rid)  # refused: nothing runs there
            try:
                content = await response.aread()
            except httpx.HTTPError:
                content = b""
            finally:
                await response.aclose()
            raise _status_error(response.status_code, content, "/generate")
        return UpstreamStream(response, self.base, lambda: self.submitted.discard(rid))

    def _failed(self, rid: str, exc: httpx.HTTPError) -> None:
        """A call that failed: never delivered (connect) means nothing runs; otherwise abort it."""
        if isinstance(exc, httpx.ConnectError):
            self.submitted.discard(rid)
        else:
            self.abort_soon(rid)

    def abort_soon(self, rid: str, stream: UpstreamStream | None = None) -> None:
        """Close the stream and abort the request in a detached task: callable from a cancelled
        generator's `finally`, where awaiting is no longer possible. The abort is sent only for a
        request this process submitted and has not seen finish (never for a client-named rid)."""
        if rid not in self.submitted and stream is None:
            return
        task = asyncio.get_running_loop().create_task(self._abort(rid, stream))
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def _abort(self, rid: str, stream: UpstreamStream | None) -> None:
        if stream is not None:
            try:
                await stream.aclose()
            except Exception as exc:  # closing a broken connection may fail; the abort below still runs
                log.debug("closing upstream stream of %s: %r", rid, exc)
        if rid not in self.submitted:
            return
        self.submitted.discard(rid)
        try:
            await self.control.post("/abort_request", content=orjson.dumps({"rid": rid}),
                                    headers={"content-type": "application/json"}, timeout=10.0)
        except httpx.HTTPError as exc:
            log.warning("abort of %s at %s failed: %r", rid, self.base, exc)
