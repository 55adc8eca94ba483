"""Reading a request before any work is spent on it: the body within its limit (netra/web/body.py: content
type and size refused first), then JSON and strict validation into a pydantic model, every failure a 400
that names the field."""

from __future__ import annotations

from typing import TypeVar

import orjson
from fastapi.exceptions import RequestValidationError
from pydantic import BaseModel, ValidationError
from starlette.requests import Request

from netra.web.body import read_body
from netra.web.errors import OpenAIError

M = TypeVar("M", bound=BaseModel)


def validation_message(exc: ValidationError | RequestValidationError) -> tuple[str, str | None]:
    """One line naming each failing field (the first five) and the first field as `param`."""
    parts = []
    param = None
    for e in exc.errors()[:5]:
        loc = ".".join(str(x) for x in e.get("loc", ()) if x != "body")
        param = param or loc or None
        msg = "unknown field" if e.get("type") == "extra_forbidden" else e.get("msg")
        parts.append(f"{loc or 'body'}: {msg}")
    return "; ".join(parts), param


async def parse(request: Request, model: type[M], limit: int) -> M:
    body = await read_body(request, limit)
    try:
        obj = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise OpenAIError(400, f"request body is not valid JSON: {exc}") from exc
    del body
    if not isinstance(obj, dict):
        raise OpenAIError(400, "request body must be a JSON object")
    try:
        return model.model_validate(obj)
    except ValidationError as exc:
        msg, param = validation_message(exc)
        raise OpenAIError(400, msg, param=param) from None
