"""The worker HTTP server: SGLang's native API as written in docs/worker-contract.md.

FastAPI on uvicorn; JSON through orjson. The scheduler runs on its own thread; each request has an
asyncio queue its outputs are posted to (thread-safe hand-off), and the handler turns them into the
response: one JSON object, or SSE events (cumulative by default, new suffix only with
``--incremental-streaming-output``) ending with ``data: [DONE]``. A client that goes away mid-request
has its request aborted, which frees its slot.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import random
import sys
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import PurePath
from typing import Any

import orjson
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import Response, StreamingResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

import netra
from netra.engine.engine import Engine, build_engine
from netra.engine.grammar import Grammar, GrammarError, grammar_tokenizer
from netra.engine.metrics import EngineMetrics
from netra.engine.options import EngineOptions
from netra.engine.protocol import RequestError, check_request, parse_generate, parse_json
from netra.engine.request import Output, SamplingParams
from netra.engine.request import Request as EngineRequest
from netra.tokenizers import IncrementalDecoder
from netra.web.body import read_body
from netra.web.errors import OpenAIError, error_body
from netra.web.exposition import CONTENT_TYPE as PROMETHEUS_CONTENT_TYPE
from netra.web.server import tcp_listen_socket

log = logging.getLogger("netra.engine")
# The reasoning parsers' end of a think block (qwen3: every parser EngineOptions knows).
THINK_END = "</think>"

# A /generate body carries one prompt of fewer than context_length tokens; the response layers in
# front refuse bodies past 8 MiB. This bound keeps a direct client from making the engine parse
# hundreds of megabytes (refused while reading, before anything is buffered past it).
MAX_BODY_BYTES = 32 << 20


def json_response(obj: Any, status: int = 200) -> Response:
    return Response(orjson.dumps(obj), status_code=status, media_type="application/json")


def error_response(message: str, status: int = 400) -> Response:
    """The shared OpenAI error object (netra/web/errors.py), so the worker and the response layer fail alike."""
    return json_response(error_body(status, message), status)


# The exit status of an engine whose scheduler thread died: not 0 (a clean stop) nor 1 (a startup failure).
SCHEDULER_DIED = 70


def _exit_on_scheduler_death(exc: BaseException) -> None:
    """The scheduler thread is gone: no request will be served again. End the process (logs flushed) so
    `/health` cannot keep a listener up that hangs every request, and the supervisor restarts the engine."""
    log.critical("engine exiting (status %d): the scheduler thread died: %r", SCHEDULER_DIED, exc)
    logging.shutdown()
    os._exit(SCHEDULER_DIED)


@dataclass
class _Pending:
    rid: str
    prompt_tokens: int
    params: SamplingParams
    queue: asyncio.Queue[Output]
    started: float
    decoder: IncrementalDecoder
    ids: list[int] = field(default_factory=list)
    completion_tokens: int = 0
    finish_reason: dict[str, Any] | None = None
    logprob_text: bool = False  # return_text_in_logprobs
    logprobs: list[list[Any]] = field(default_factory=list)  # SGLang's [logprob, token_id, text|None]
    top_logprobs: list[list[list[Any]]] = field(default_factory=list)
    request: EngineRequest | None = None  # the scheduler's object (its admission time)
    first_token: float | None = None  # perf_counter of the first output token


class Server:
    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self.sched = engine.scheduler
        self.opt = engine.options
        self.tok = engine.tokenizer
        self.inflight: dict[str, _Pending] = {}
        self._seeds = random.Random(engine.options.seed)
        self.limit = self.opt.max_new_tokens_limit or self.opt.context_length
        name = self.opt.served_model_name or (PurePath(self.opt.checkpoint).name if self.opt.checkpoint
                                              else f"netra-{self.opt.preset}")
        self.metrics = EngineMetrics(self.sched, self.opt.worker_id, name)
        self.app = self._build_app()

    # ---- requests --------------------------------------------------------------------------------
    def _start(self, rid: str, prompt: list[int], params: SamplingParams, stream: bool,
               grammar: Grammar | None = None, logprob_text: bool = False) -> _Pending:
        loop = asyncio.get_running_loop()
        q: asyncio.Queue[Output] = asyncio.Queue()
        pending = _Pending(rid, len(prompt), params, q, time.perf_counter(),
                           self.tok.incremental(params.skip_special_tokens), logprob_text=logprob_text)
        self.inflight[rid] = pending
        seed = params.sampling_seed if params.sampling_seed is not None else self._seeds.getrandbits(63)

        def sink(out: Output) -> None:  # scheduler thread -> this request's queue on the event loop
            loop.call_soon_threadsafe(q.put_nowait, out)

        pending.request = EngineRequest(rid, prompt, params, sink=sink, stream=stream, seed=seed, grammar=grammar)
        self.sched.submit(pending.request)
        return pending

    def _finished(self, p: _Pending, reason: str) -> None:
        admitted = p.request.admitted if p.request is not None else None
        self.metrics.finish(p.started, p.first_token, admitted, p.prompt_tokens, p.completion_tokens, reason)

    def _entry(self, p: _Pending, lp: float, tok: int) -> list[Any]:
        return [lp, tok, self.tok.decode([tok], skip_special_tokens=False) if p.logprob_text else None]

    def _payload(self, p: _Pending, out: Output, incremental: bool) -> dict[str, Any]:
        """One event (or the whole response): tokens and text since the last event, or cumulative.
        Text is decoded incrementally (linear in the output for the byte tokenizer)."""
        p.ids.extend(out.new_ids)
        if out.completion_tokens and p.first_token is None:  # a trimmed stop token is a first token too
            p.first_token = time.perf_counter()
        p.completion_tokens = out.completion_tokens
        p.finish_reason = out.finish_reason
        if out.finish_reason is not None:
            self._finished(p, str(out.finish_reason.get("type", "unknown")))
        new_text = p.decoder.push(out.new_ids, final=out.finish_reason is not None)
        meta: dict[str, Any] = {"id": p.rid, "finish_reason": out.finish_reason, "prompt_tokens": p.prompt_tokens,
                                "completion_tokens": out.completion_tokens, "cached_tokens": 0,
                                "e2e_latency": time.perf_counter() - p.started}
        if self.opt.speculative_algorithm:  # SGLang's: verify forwards, completion tokens per verify
            meta["spec_verify_ct"] = out.spec_verify_ct
            meta["spec_accept_length"] = out.spec_accept_length
        if p.params.return_logprob:
            # SGLang's shapes: one entry per completion token (a matched stop token included); in
            # incremental streaming only the new entries, as SGLang slices them.
            new_lp = [self._entry(p, lp, tok) for lp, tok in out.logprobs]
            new_top = [[self._entry(p, lp, tok) for lp, tok in row] for row in out.top_logprobs]
            p.logprobs.extend(new_lp)
            p.top_logprobs.extend(new_top)
            meta["output_token_logprobs"] = new_lp if incremental else list(p.logprobs)
            meta["output_top_logprobs"] = new_top if incremental else list(p.top_logprobs)
            meta["input_token_logprobs"] = []
        if incremental:
            return {"text": new_text, "output_ids": list(out.new_ids), "meta_info": meta}
        return {"text": p.decoder.text, "output_ids": list(p.ids), "meta_info": meta}

    async def _stream(self, p: _Pending) -> AsyncIterator[bytes]:
        try:
            while True:
                out = await p.queue.get()
                payload = self._payload(p, out, self.opt.incremental_streaming_output)
                yield b"data: " + orjson.dumps(payload) + b"\n\n"
                if out.finish_reason is not None:
                    break
            yield b"data: [DONE]\n\n"
        finally:
            self.inflight.pop(p.rid, None)
            if p.finish_reason is None:  # the client went away (or the server stops): free the slot
                self.sched.abort(p.rid, "client disconnected")
                self._finished(p, "abort")

    async def _wait(self, p: _Pending, request: Request) -> Response:
        try:
            while True:
                try:
                    out = await asyncio.wait_for(p.queue.get(), timeout=0.5)
                except TimeoutError:
                    if await request.is_disconnected():
                        self.sched.abort(p.rid, "client disconnected")
                        return error_response("client disconnected", 499)
                    continue
                # The non-streaming body is always the whole output, in both streaming modes.
                payload = self._payload(p, out, incremental=False)
                if out.finish_reason is not None:
                    return json_response(payload)
        finally:
            self.inflight.pop(p.rid, None)
            if p.finish_reason is None:
                self.sched.abort(p.rid, "client disconnected")
                self._finished(p, "abort")

    async def generate(self, request: Request) -> Response:
        try:
            body = await read_body(request, MAX_BODY_BYTES, require_json=False)
        except OpenAIError as exc:
            return error_response(exc.message, exc.status)
        try:
            req = parse_generate(body)
            if (req.input_ids is None) == (req.text is None):
                raise RequestError("exactly one of input_ids and text is required")
            prompt = list(req.input_ids) if req.input_ids is not None else self.tok.encode(req.text or "")
            params = check_request(req, prompt, self.engine.config.vocab_size, self.opt.context_length, self.limit)
            rid = req.rid or uuid.uuid4().hex
            if rid in self.inflight:
                raise RequestError(f"request id {rid!r} is already in flight")
            spec = req.grammar()
            grammar = (await asyncio.to_thread(self._grammar, *spec, req.require_reasoning)
                       if spec is not None else None)
        except (RequestError, GrammarError) as exc:
            return error_response(str(exc))
        if not self.sched.alive:
            return error_response("the scheduler is not running", 503)
        pending = self._start(rid, prompt, params, req.stream, grammar, req.return_text_in_logprobs)
        if req.stream:
            return StreamingResponse(self._stream(pending), media_type="text/event-stream",
                                     headers={"Cache-Control": "no-cache"})
        return await self._wait(pending, request)

    def _grammar(self, kind: str, source: str, require_reasoning: bool) -> Grammar:
        cfg = self.engine.config
        # As SGLang: the request's flag takes effect only on a worker started with a reasoning parser.
        end = tuple(self.tok.encode(THINK_END)) if require_reasoning and self.opt.reasoning_parser else ()
        return Grammar(grammar_tokenizer(self.tok, cfg.vocab_size, cfg.eos_token_id), kind, source, end)

    async def health_generate(self) -> Response:
        if not self.sched.alive:
            return error_response("the scheduler is not running", 503)
        rid = "health-" + uuid.uuid4().hex
        p = self._start(rid, [0], SamplingParams(max_new_tokens=1, temperature=0.0, ignore_eos=True), False)
        try:
            out = await asyncio.wait_for(p.queue.get(), timeout=60)
        except TimeoutError:
            self.sched.abort(rid, "health check timed out")
            return error_response("generation timed out", 503)
        finally:
            self.inflight.pop(rid, None)
        if out.finish_reason is None or out.finish_reason.get("type") != "length" or out.completion_tokens != 1:
            return error_response(f"health generation ended with {out.finish_reason}", 503)
        return json_response({"ok": True})

    async def abort_request(self, request: Request) -> Response:
        try:
            data = parse_json(await read_body(request, 1 << 16, require_json=False))
            if not isinstance(data, dict) or not isinstance(data.get("rid"), str) or set(data) - {"rid"}:
                raise RequestError('expected {"rid": "<request id>"}')
        except RequestError as exc:
            return error_response(str(exc))
        except OpenAIError as exc:
            return error_response(exc.message, exc.status)
        rid = data["rid"]
        found = rid in self.inflight
        if found:
            self.sched.abort(rid, "aborted by /abort_request")
        return json_response({"rid": rid, "found": found})

    # ---- info ------------------------------------------------------------------------------------
    def model_info(self) -> dict[str, Any]:
        return {"model_path": self.opt.checkpoint or f"preset:{self.opt.preset}",
                "tokenizer_path": self.tok.name, "is_generation": True, "preset": self.opt.preset,
                "vocab_size": self.engine.config.vocab_size, "eos_token_id": list(self.engine.config.eos_token_id),
                "context_length": self.opt.context_length, "engine": "netra"}

    def server_info(self) -> dict[str, Any]:
        from netra.ops._common import decisions
        from netra.runtime import loaded_tactics

        code_objects = [{"sha256": t.sha256, "name": t.name, "family": t.contract.family, "device": dev}
                        for (_, dev), t in sorted(loaded_tactics().items())]
        return {**self.opt.to_json(), "engine": "netra", "version": netra.__version__,
                "startup_s": self.engine.startup_s, "state_pool_bytes": self.engine.pools.nbytes(),
                "pool_slots": self.engine.pool_plan.slots, "pools": self.engine.pool_plan.describe(),
                "load": self.sched.load(), "code_objects": code_objects, "dispatch": decisions()}

    async def _load_lines(self) -> None:
        """Every interval: update sglang:gen_throughput and, while busy, log the load line."""
        while True:
            await asyncio.sleep(self.opt.load_log_interval_s)
            line = self.metrics.tick()
            if line is not None:
                log.info("worker %s %s", self.opt.worker_id, line)

    def _build_app(self) -> FastAPI:
        @contextlib.asynccontextmanager
        async def lifespan(app: FastAPI) -> AsyncIterator[None]:
            self.sched.on_fatal = _exit_on_scheduler_death
            self.sched.start()
            ticker = asyncio.ensure_future(self._load_lines()) if self.opt.load_log_interval_s > 0 else None
            yield
            if ticker is not None:
                ticker.cancel()
            self.sched.stop()

        app = FastAPI(title="netra engine", lifespan=lifespan, docs_url=None, redoc_url=None, openapi_url=None)

        @app.exception_handler(RequestValidationError)
        async def _bad_request(request: Request, exc: RequestValidationError) -> Response:
            return error_response(f"invalid request: {exc.errors()[:3]}")

        @app.exception_handler(StarletteHTTPException)
        async def _http(request: Request, exc: StarletteHTTPException) -> Response:
            return error_response(f"{request.method} {request.url.path}: {exc.detail}", exc.status_code)

        app.add_api_route("/generate", self.generate, methods=["POST"])
        app.add_api_route("/health_generate", self.health_generate, methods=["GET"])
        app.add_api_route("/abort_request", self.abort_request, methods=["POST"])

        async def health() -> Response:
            # A dead scheduler thread makes the process useless: say so, so a supervisor restarts it.
            if self.sched.started and not self.sched.alive:
                return error_response("the scheduler thread has stopped", 503)
            if not self.sched.warm.is_set():
                return error_response("warming up: compiling the prefill path and capturing the decode graphs", 503)
            # Progress, for liveness (netra/serve/watch.py): a busy scheduler is alive while its
            # steps complete; step_age_s is how long the current step (or wait) has lasted.
            load = self.sched.load()
            busy = bool(load["waiting"] or load["prefilling"] or load["running"])
            age = time.monotonic() - self.sched.progress_at if busy else 0.0
            return json_response({"ok": True, "busy": busy, "steps": self.sched.stats.steps,
                                  "step_age_s": round(age, 3)})

        async def ready() -> Response:
            return (json_response({"ready": True}) if self.sched.alive and self.sched.warm.is_set()
                    else error_response("starting", 503))

        async def model_info() -> Response:
            return json_response(self.model_info())

        async def server_info() -> Response:
            return json_response(self.server_info())

        async def engine_stats() -> Response:
            return json_response({**self.sched.stats.to_json(), **self.sched.load()})

        async def flush_cache() -> Response:
            return json_response({"flushed": True, "note": "no prefix cache"})

        app.add_api_route("/health", health, methods=["GET"])
        app.add_api_route("/ready", ready, methods=["GET"])
        app.add_api_route("/model_info", model_info, methods=["GET"])
        app.add_api_route("/get_model_info", model_info, methods=["GET"])
        app.add_api_route("/server_info", server_info, methods=["GET"])
        app.add_api_route("/get_server_info", server_info, methods=["GET"])
        app.add_api_route("/engine_stats", engine_stats, methods=["GET"])
        app.add_api_route("/flush_cache", flush_cache, methods=["POST", "GET"])
        if self.opt.enable_metrics:
            async def metrics() -> Response:
                return Response(self.metrics.render(), media_type=PROMETHEUS_CONTENT_TYPE)

            app.add_api_route("/metrics", metrics, methods=["GET"])
        return app


def serve(options: EngineOptions) -> int:
    """Build the engine, bind the socket (port 0 picks a free one), print the address, serve until stopped."""
    import torch
    import uvicorn

    torch.set_num_threads(options.torch_threads)  # the process's setting: workers share a few cores
    engine = build_engine(options)
    server = Server(engine)
    sock = tcp_listen_socket(options.host, options.port)
    port = sock.getsockname()[1]
    # Keep-alive outlasts the response layer's pool expiry (60 s), so the client closes an idle
    # connection first: a server closing it just as the client reuses it fails that request.
    config = uvicorn.Config(server.app, log_level="warning", access_log=False, timeout_graceful_shutdown=3,
                            backlog=4096, timeout_keep_alive=75)
    print(f"netra engine listening on http://{options.host}:{port} (startup {engine.startup_s:.2f} s)",
          flush=True, file=sys.stdout)
    uvicorn.Server(config).run(sockets=[sock])
    return 0
