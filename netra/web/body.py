"""Reading a request body before any work is spent on it: content type, size limit, nothing more.

A body that is not JSON is a 415 before a byte of it is read; a body whose `Content-Length` exceeds
the limit is a 413 before a byte of it is kept; a body sent without one is read chunk by chunk and
refused (413) as soon as it passes the limit, so memory never holds more than the limit (what the
client still sends is dropped, see `DRAIN_BYTES`). A client that goes away while sending its body
is a one-line log entry and a 499, not a traceback.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator

from starlette.requests import ClientDisconnect, Request

from netra.web.errors import OpenAIError, body_too_large, unsupported_media_type

log = logging.getLogger("netra.web")

def is_json(content_type: str | None) -> bool:
    if not content_type:
        return False
    media = content_type.split(";", 1)[0].strip().lower()
    return media == "application/json" or (media.startswith("application/") and media.endswith("+json"))


# After a refusal for size the connection must not close on unread data (the client would meet a
# reset, not the 413). On a keep-alive connection (HTTP/1.1's default) the 413 goes out at once and
# uvicorn reads and drops the rest of the body itself; a client that asked for `Connection: close`
# gets its 413 once the rest is read and dropped here, up to these bounds (past them the connection
# is closed as it is).
DRAIN_BYTES = 64 << 20
DRAIN_S = 5.0


async def _drain(chunks: AsyncIterator[bytes]) -> None:
    dropped = 0
    try:
        async with asyncio.timeout(DRAIN_S):
            async for chunk in chunks:
                dropped += len(chunk)
                if dropped > DRAIN_BYTES:
                    return
    except (TimeoutError, ClientDisconnect):
        return


async def read_body(request: Request, limit: int, require_json: bool = True) -> bytes:
    """The body, at most `limit` bytes (413 past it; 415 when `require_json` and it is not JSON;
    499 when the client went away while sending it)."""
    if require_json and not is_json(request.headers.get("content-type")):
        raise unsupported_media_type(request.headers.get("content-type"))
    declared = request.headers.get("content-length")
    chunks = request.stream()
    closing = "close" in request.headers.get("connection", "").lower()
    if declared is not None and declared.isdigit() and int(declared) > limit:
        if closing and int(declared) <= limit + DRAIN_BYTES:
            await _drain(chunks)
        raise body_too_large(limit)
    parts: list[bytes] = []
    size = 0
    try:
        async for chunk in chunks:
            size += len(chunk)
            if size > limit:
                parts.clear()  # memory back before the drain
                if closing:
                    await _drain(chunks)
                raise body_too_large(limit)
            parts.append(chunk)
    except ClientDisconnect:
        log.info("client disconnected while sending the body of %s %s (%d bytes received)",
                 request.method, request.url.path, size)
        raise OpenAIError(499, "client closed the request") from None
    return b"".join(parts)
