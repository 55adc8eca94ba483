"""OpenAI error objects: every failure the response layer reports has this one shape."""

from __future__ import annotations

from typing import Any

import orjson

# HTTP status -> OpenAI error type, as the OpenAI API and SGLang's OpenAI layer name them.
_TYPES = {
    400: "invalid_request_error",
    404: "not_found_error",
    405: "invalid_request_error",
    413: "invalid_request_error",
    422: "invalid_request_error",
    499: "client_closed_request",
    500: "internal_server_error",
    502: "upstream_error",
    503: "service_unavailable",
    504: "upstream_timeout",
}


class OpenAIError(Exception):
    """An error to report as ``{"error": {"message", "type", "param", "code"}}`` with ``status``."""

    def __init__(self, status: int, message: str, *, param: str | None = None, err_type: str | None = None,
                 code: str | int | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.err_type = err_type or _TYPES.get(status, "invalid_request_error" if status < 500 else "server_error")
        self.code = code if code is not None else status

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.err_type, "param": self.param, "code": self.code}}

    def sse(self) -> bytes:
        """The error as one SSE event, for a stream that fails after its headers were sent."""
        return b"data: " + orjson.dumps(self.body()) + b"\n\n"
