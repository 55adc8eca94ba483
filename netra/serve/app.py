"""The response layer's ASGI app: routes, error shapes, and the per-process state."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import PurePath
from typing import Any

import httpx
import orjson
from fastapi import FastAPI
from fastapi.exceptions import RequestValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response

from netra.serve import native, openai_api, requestlog
from netra.serve.admission import Admission
from netra.serve.config import ServeConfig
from netra.serve.errors import OpenAIError, model_not_found
from netra.serve.intake import parse, validation_message
from netra.serve.metrics import CONTENT_TYPE, Metrics
from netra.serve.protocol import ChatCompletionRequest, CompletionRequest, GenerateRequest
from netra.serve.requestlog import ApiKeyMiddleware, RequestIdMiddleware
from netra.serve.tokenizer import ModelText, load_for_worker
from netra.serve.upstream import Upstream
from netra.serve.watch import EngineWatch

log = logging.getLogger("netra.serve")


class ServeState:
    """What one process shares across requests: the pooled upstream client, admission, the worker's
    liveness watch, metrics, and the model's tokenizer (loaded on first use, so start-up does not
    wait for the worker)."""

    def __init__(self, config: ServeConfig, transport: httpx.AsyncBaseTransport | None = None) -> None:
        self.config = config
        self.metrics = Metrics(lambda: {"worker": config.worker_id, "model_name": self.model_name_now()})
        self.upstream = Upstream(config.upstream_base, config.upstream_timeout, config.pool_size,
                                 transport=transport)
        self.admission = Admission(config.max_inflight, config.max_waiting, config.queue_timeout)
        self.watch = EngineWatch(self.upstream, config.probe_interval, config.probe_timeout,
                                 config.probe_misses, config.stall_timeout)
        self.started = int(time.time())
        self._info: dict[str, Any] | None = None
        self._text: ModelText | None = None
        self._name: str | None = config.model_name
        self._context: int | None = None
        self._lock = asyncio.Lock()

    async def model_info(self) -> dict[str, Any]:
        if self._info is None:
            self._info = await self.upstream.get_json("/model_info")
        return self._info

    async def model_text(self) -> ModelText:
        if self._text is None:
            async with self._lock:
                if self._text is None:
                    info = await self.model_info()
                    # Reading a large tokenizer.json takes a while: keep the event loop serving.
                    self._text = await asyncio.to_thread(load_for_worker, info)
                    log.info("tokenizer loaded from %s", self._text.source)
        return self._text

    async def model_name(self) -> str:
        if self._name is None:
            info = await self.model_info()
            path = info.get("served_model_name") or info.get("model_path")
            if isinstance(path, str) and path.startswith("preset:"):  # the embedded engine's seeded presets
                self._name = f"netra-{path.removeprefix('preset:')}"
            elif isinstance(path, str) and path:
                self._name = path if not PurePath(path).is_absolute() else PurePath(path).name
            else:
                self._name = f"netra-{info.get('preset', 'model')}"
        return self._name

    async def context_length(self) -> int | None:
        """The worker's context length: `/model_info` (netra engine), else SGLang's own `/v1/models`
        card (`max_model_len`), else unknown (the worker's default then applies)."""
        if self._context is None:
            info = await self.model_info()
            value = info.get("context_length") or info.get("max_model_len")
            if not isinstance(value, int):
                try:
                    cards = (await self.upstream.get_json("/v1/models")).get("data") or [{}]
                    value = cards[0].get("max_model_len")
                except OpenAIError:
                    value = None
            self._context = value if isinstance(value, int) and value > 0 else 0
        return self._context or None

    def sampling_defaults(self, text: ModelText) -> dict[str, float | int]:
        """The sampling values a request leaves out (``--sampling-defaults``): the checkpoint's or none."""
        return text.sampling_defaults if self.config.sampling_defaults == "model" else {}

    def model_name_now(self) -> str:
        return self._name or "unknown"

    async def check_model(self, requested: str | None) -> str:
        """The served name; a request naming another model is a 404 `model_not_found`."""
        name = await self.model_name()
        if requested is not None and requested != name:
            raise model_not_found(requested, name)
        return name

    def check_worker(self) -> None:
        """Refuse at once while the worker is unresponsive (nginx passes a 503 to another worker)."""
        if self.watch.unresponsive:
            raise OpenAIError(503, f"the worker is not answering ({self.watch.why})")


def _error_response(exc: OpenAIError) -> Response:
    status = exc.status if exc.status != 499 else 400  # 499 is a log label; the client is gone anyway
    return Response(orjson.dumps(exc.body()), status_code=status, media_type="application/json",
                    headers=exc.headers or None)


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
            if isinstance(response, openai_api.SSEResponse):
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
        return openai_api.json_response({"object": "list", "data": [await model_card()]})

    @app.get("/v1/models/{model_id:path}")
    async def model(model_id: str) -> Response:
        card = await model_card()
        if model_id != card["id"]:
            raise model_not_found(model_id, card["id"])
        return openai_api.json_response(card)

    @app.get("/health")
    async def health() -> Response:
        """200 when the worker is alive (netra/serve/watch.py): from the watch's latest probe when it
        is fresh, else probed now with half a probe deadline. Either way it answers soon whatever the
        worker does, so a supervisor probing this process never mistakes a hung worker for a hung
        response layer, and a loaded worker does not slow this answer down."""
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
