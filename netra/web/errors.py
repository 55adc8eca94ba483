"""OpenAI error objects: every failure the response layer (and the embedded engine) reports has this
one shape, ``{"error": {"message", "type", "param", "code"}}``.

Messages are for clients: they never carry internal addresses (worker URLs, ports); the response
layer logs those itself. The helpers below name the refusals other modules raise, so that every
module spells a given refusal (its status, type and code) the same way.
"""

from __future__ import annotations

from typing import Any

import orjson

# HTTP status -> OpenAI error type, as the OpenAI API and SGLang's OpenAI layer name them.
_TYPES = {
    400: "invalid_request_error",
    404: "not_found_error",
    405: "invalid_request_error",
    413: "invalid_request_error",
    415: "invalid_request_error",
    422: "invalid_request_error",
    499: "client_closed_request",
    500: "internal_server_error",
    502: "upstream_error",
    503: "service_unavailable",
    504: "upstream_timeout",
}


def error_type(status: int) -> str:
    return _TYPES.get(status, "invalid_request_error" if status < 500 else "server_error")


def error_body(status: int, message: str, *, param: str | None = None, err_type: str | None = None,
               code: str | int | None = None) -> dict[str, Any]:
    """The error object itself (the engine's server builds its errors with this too)."""
    return {"error": {"message": message, "type": err_type or error_type(status), "param": param,
                      "code": code if code is not None else status}}


class OpenAIError(Exception):
    """An error to report as ``{"error": {"message", "type", "param", "code"}}`` with ``status``;
    ``headers`` go on the HTTP response (``Retry-After`` on a 503 for capacity)."""

    def __init__(self, status: int, message: str, *, param: str | None = None, err_type: str | None = None,
                 code: str | int | None = None, headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.err_type = err_type or error_type(status)
        self.code = code if code is not None else status
        self.headers = headers or {}

    def body(self) -> dict[str, Any]:
        return error_body(self.status, self.message, param=self.param, err_type=self.err_type, code=self.code)

    def sse(self) -> bytes:
        """The error as one SSE event, for a stream that fails after its headers were sent."""
        return b"data: " + orjson.dumps(self.body()) + b"\n\n"


def model_not_found(name: str, served: str) -> OpenAIError:
    return OpenAIError(404, f"the model {name!r} does not exist; this server serves {served!r}", param="model",
                       err_type="invalid_request_error", code="model_not_found")


def unsupported_media_type(content_type: str | None) -> OpenAIError:
    got = f"content-type {content_type!r}" if content_type else "no content-type"
    return OpenAIError(415, f"expected a JSON body (content-type: application/json), got {got}",
                       code="unsupported_media_type")


def body_too_large(limit: int) -> OpenAIError:
    return OpenAIError(413, f"request body exceeds the limit of {limit} bytes", code="request_too_large")


def at_capacity(why: str, retry_after_s: int) -> OpenAIError:
    """503 with ``Retry-After``: the server is full, the request was not started and may be retried."""
    return OpenAIError(503, f"the server is at capacity ({why}); retry after {retry_after_s} s",
                       code="server_at_capacity", headers={"retry-after": str(retry_after_s)})
