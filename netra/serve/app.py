"""The response layer's ASGI app: routes, error shapes, and the per-process state."""

from __future__ import annotations

import logging
import os
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import orjson
from fastapi import FastAPI
from fastapi.exceptions import RequestValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response

from netra.serve import native, openai_api, requestlog
from netra.serve.config import ServeConfig
from netra.serve.intake import parse, validation_message
from netra.serve.protocol import ChatCompletionRequest, CompletionRequest, GenerateRequest
from netra.serve.requestlog import ApiKeyMiddleware, RequestIdMiddleware
from netra.serve.sse import SSEResponse, json_response
from netra.serve.state import ServeState
from netra.web.errors import OpenAIError, model_not_found
from netra.web.exposition import CONTENT_TYPE

log = logging.getLogger("netra.serve")


def _error_response(exc: OpenAIError) -> Response:
    status = exc.status if exc.status != 499 else 400  # 499 is a log label; the client is gone anyway
    return Response(orjson.dumps(exc.body()), status_code=status, media_type="application/json",
                    headers=exc.headers or None)


def audit_gate() -> str | None:
    """Why this response layer must not report healthy yet, when ``NETRA_AUDIT_FILE`` names an in-pod audit
    verdict (written by `netra.k8s.audit`): None once the verdict passes, or when no verdict is asked for."""
    path = os.environ.get("NETRA_AUDIT_FILE")
    if not path:
        return None
    try:
        verdict = orjson.loads(Path(path).read_bytes())
    except (OSError, orjson.JSONDecodeError):
        return f"the in-pod audit has not written a verdict to {path} yet"
    if isinstance(verdict, dict) and verdict.get("ok") is True:
        return None
    problems = verdict.get("problems") if isinstance(verdict, dict) else None
    return "the in-pod audit does not pass: " + "; ".join(str(p) for p in (problems or ["no verdict"]))[:2000]


def create_app(config: ServeConfig, transport: httpx.AsyncBaseTransport | None = None) -> FastAPI:
    state = ServeState(config, transport=transport)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        state.watch.start()
        yield
        await state.watch.stop()
        await state.upstream.aclose()

    app = FastAPI(title="netra serve", lifespan=lifespan, docs_url=None, redoc_url=None, openapi_url=None)
    app.state.serve = state

    if config.api_key:
        app.add_middleware(ApiKeyMiddleware, key=config.api_key)
    app.add_middleware(RequestIdMiddleware, worker=config.worker_id)  # outermost: a 401 has its id and line

    def failed(request: Request, exc: OpenAIError) -> Response:
        requestlog.note(request, error=exc.message)
        return _error_response(exc)

    @app.exception_handler(OpenAIError)
    async def _openai_error(request: Request, exc: OpenAIError) -> Response:
        return failed(request, exc)

    @app.exception_handler(RequestValidationError)
    async def _validation(request: Request, exc: RequestValidationError) -> Response:
        msg, param = validation_message(exc)
        return failed(request, OpenAIError(400, msg, param=param))

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException) -> Response:
        return failed(request, OpenAIError(exc.status_code, f"{request.method} {request.url.path}: {exc.detail}"))

    @app.exception_handler(ClientDisconnect)
    async def _gone(request: Request, exc: ClientDisconnect) -> Response:
        log.info("client disconnected during %s %s", request.method, request.url.path)
        return failed(request, OpenAIError(499, "client closed the request"))

    @app.exception_handler(Exception)
    async def _unexpected(request: Request, exc: Exception) -> Response:
        log.exception("unexpected error on %s", request.url.path)
        return failed(request, OpenAIError(500, f"internal error ({type(exc).__name__})"))

    async def guarded(endpoint: str, run: Callable[[], Awaitable[Response]]) -> Response:
        """Count requests that fail before a response exists (streams count themselves)."""
        state.metrics.in_flight.inc()
        streaming = False
        try:
            response = await run()
            if isinstance(response, SSEResponse):
                streaming = True  # in flight until the stream ends
                response.on_close.append(state.metrics.in_flight.dec)
            return response
        except OpenAIError as exc:
            state.metrics.requests.labels(endpoint, str(exc.status)).inc()
            raise
        except Exception:
            state.metrics.requests.labels(endpoint, "500").inc()
            raise
        finally:
            if not streaming:
                state.metrics.in_flight.dec()

    limit = config.max_body_bytes

    @app.post("/v1/completions")
    async def completions(request: Request) -> Response:
        async def run() -> Response:
            return await openai_api.completions(state, request, await parse(request, CompletionRequest, limit))

        return await guarded("completions", run)

    @app.post("/v1/chat/completions")
    async def chat(request: Request) -> Response:
        async def run() -> Response:
            return await openai_api.chat_completions(state, request, await parse(request, ChatCompletionRequest, limit))

        return await guarded("chat", run)

    @app.post("/generate")
    async def generate(request: Request) -> Response:
        async def run() -> Response:
            return await native.generate(state, request, await parse(request, GenerateRequest, limit))

        return await guarded("generate", run)

    async def model_card() -> dict[str, Any]:
        name = await state.model_name()
        info = await state.model_info()
        return {"id": name, "object": "model", "created": state.started, "owned_by": "netra",
                "root": info.get("model_path") or name, "max_model_len": await state.context_length()}

    @app.get("/v1/models")
    async def models() -> Response:
        return json_response({"object": "list", "data": [await model_card()]})

    @app.get("/v1/models/{model_id:path}")
    async def model(model_id: str) -> Response:
        card = await model_card()
        if model_id != card["id"]:
            raise model_not_found(model_id, card["id"])
        return json_response(card)

    @app.get("/health")
    async def health() -> Response:
        """200 when the worker is alive (netra/serve/watch.py): from the watch's latest probe when it
        is fresh, else probed now with half a probe deadline. Either way it answers soon whatever the
        worker does, so a supervisor probing this process never mistakes a hung worker for a hung
        response layer, and a loaded worker does not slow this answer down."""
        gate = audit_gate()
        if gate is not None:  # in a Kubernetes pod: Ready only once the in-pod audit passed (netra/k8s/audit.py)
            return _error_response(OpenAIError(503, gate))
        watch = state.watch
        if watch.unresponsive:
            return _error_response(OpenAIError(503, f"the worker is not answering ({watch.why})"))
        if watch.fresh():
            ok, why = watch.alive, watch.why
        else:
            ok, why = await watch.probe_within(config.probe_timeout / 2)
        if not ok:
            return _error_response(OpenAIError(503, why))
        try:
            # Healthy means able to serve text: a worker whose tokenizer this process cannot load
            # (no cache mount, no tokenizer path) would answer every chat request 503.
            await state.model_text()
        except OpenAIError as exc:
            return _error_response(OpenAIError(503, f"the worker is up but its tokenizer cannot be loaded here: "
                                                    f"{exc.message}"))
        return Response(b"", status_code=200)

    @app.get("/metrics")
    async def metrics() -> Response:
        return Response(state.metrics.render(), media_type=CONTENT_TYPE)

    return app
