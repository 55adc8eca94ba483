"""SSE responses and the guards around a request's first byte, shared by the OpenAI endpoints and the
native passthrough: an SSE response whose close callbacks always run, one-event encoding, and the wait
for work that a departing client or an unresponsive worker cancels (499 / 503)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine
from typing import Any, TypeVar

import orjson
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse

from netra.web.errors import OpenAIError

log = logging.getLogger("netra.serve")
T = TypeVar("T")
DONE = b"data: [DONE]\n\n"
SSE_HEADERS = {"cache-control": "no-cache", "x-accel-buffering": "no"}


class SSEResponse(StreamingResponse):
    """An SSE stream whose close callbacks run however it ends, even when the client left before
    the first byte (then the body generator never starts, and its own cleanup never runs)."""

    def __init__(self, content: AsyncIterator[bytes]) -> None:
        super().__init__(content, media_type="text/event-stream", headers=SSE_HEADERS)
        self.on_close: list[Callable[[], None]] = []

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            for callback in self.on_close:
                callback()


def json_response(obj: Any, status: int = 200) -> Response:
    return Response(orjson.dumps(obj), status_code=status, media_type="application/json")


def sse(obj: Any) -> bytes:
    return b"data: " + orjson.dumps(obj) + b"\n\n"


async def guard(request: Request, lost: asyncio.Event, work: Awaitable[T], on_abort: Callable[[], None]) -> T:
    """Run `work` (anything before the response's first byte) unless the client goes away first
    (cancel it, call `on_abort`, 499) or the worker stops answering first (cancel it, call
    `on_abort`, 503: nothing was sent, so nginx may pass the request to another worker).

    Starlette cancels a streaming response when its client leaves, but not a plain handler; without
    this a dropped non-streaming request would keep a worker slot busy to its last token."""

    async def disconnected() -> None:
        while True:
            message = await request.receive()
            if message["type"] == "http.disconnect":
                return

    work_task = asyncio.ensure_future(work)
    watch_task = asyncio.ensure_future(disconnected())
    lost_task = asyncio.ensure_future(lost.wait())
    try:
        done, _ = await asyncio.wait({work_task, watch_task, lost_task}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        watch_task.cancel()
        lost_task.cancel()
    if not work_task.done():
        work_task.cancel()
        try:
            await work_task  # let it release what it holds (admission permits) before we answer
        except BaseException:
            pass
        on_abort()
        if watch_task not in done:
            raise OpenAIError(503, "the worker stopped answering before this request started")
        log.info("client disconnected before the response of %s %s", request.method, request.url.path)
        raise OpenAIError(499, "client closed the request")
    return work_task.result()


async def all_or_abort(request: Request, lost: asyncio.Event, works: list[Coroutine[Any, Any, T]],
                       abort: Callable[[], None]) -> list[T]:
    """Run ``works`` together; the first error is raised as itself, and a client that leaves first
    (or a worker that stops answering first) has them cancelled and ``abort`` called (`guard`)."""

    async def run_all() -> list[T]:
        async with asyncio.TaskGroup() as tg:
            tasks = [tg.create_task(w) for w in works]
        return [t.result() for t in tasks]

    try:
        return await guard(request, lost, run_all(), abort)
    except* OpenAIError as group:
        raise group.exceptions[0] from None
