"""The OpenAI endpoints and the native passthrough, on top of `generation.Choice`."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import aclosing
from typing import TYPE_CHECKING, Any, TypeVar

import orjson
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse

from netra.serve.errors import OpenAIError
from netra.serve.generation import Choice, Delta, Usage
from netra.serve.protocol import ChatCompletionRequest, CompletionRequest, GenerateRequest, StreamOptions
from netra.serve.stream import TokenTracker, UpstreamProtocolError

if TYPE_CHECKING:
    from netra.serve.app import ServeState

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


async def until_disconnect(request: Request, work: Awaitable[T], on_disconnect: Callable[[], None]) -> T:
    """Run `work` unless the client goes away first (then cancel it, call `on_disconnect`, raise 499).

    Starlette cancels a streaming response when its client leaves, but not a plain handler; without
    this a dropped non-streaming request would keep a worker slot busy to its last token."""

    async def disconnected() -> None:
        while True:
            message = await request.receive()
            if message["type"] == "http.disconnect":
                return

    work_task = asyncio.ensure_future(work)
    watch_task = asyncio.ensure_future(disconnected())
    try:
        await asyncio.wait({work_task, watch_task}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        watch_task.cancel()
    if not work_task.done():
        work_task.cancel()
        on_disconnect()
        raise OpenAIError(499, "client closed the request")
    return work_task.result()


class Endpoint:
    """Shared plumbing of one OpenAI request: choices, streaming, usage and metrics."""

    def __init__(self, state: ServeState, name: str, object_kind: str, chunk_kind: str) -> None:
        self.state = state
        self.name = name
        self.object_kind = object_kind
        self.chunk_kind = chunk_kind
        self.t0 = time.monotonic()
        self.created = int(time.time())
        self.id = f"{'chatcmpl' if name == 'chat' else 'cmpl'}-{uuid.uuid4().hex}"

    def choice(self, index: int, prompt: str | list[int], params: dict[str, Any], stream: bool,
               req: CompletionRequest | ChatCompletionRequest, model_text: Any) -> Choice:
        key = "text" if isinstance(prompt, str) else "input_ids"
        body = {key: prompt, "sampling_params": params, "stream": stream, "rid": f"{self.id}-{index}"}
        return Choice(index=index, body=body, tokenizer=model_text.tokenizer, stops=req.stop_strings(),
                      keep_stop=req.no_stop_trim, skip_special_tokens=req.skip_special_tokens,
                      endpoint=self.name, metrics=self.state.metrics, t0=self.t0, timed=stream)

    def usage(self, choices: list[Choice], n: int) -> Usage:
        total = Usage()
        for c in choices:
            total.add(c.usage, count_prompt=c.index % n == 0)  # a prompt counts once, not once per choice
        return total

    def count(self, status: int, usage: Usage | None) -> None:
        m = self.state.metrics
        m.requests.labels(self.name, str(status)).inc()
        if usage is not None:
            m.prompt_tokens.labels(self.name).inc(usage.prompt_tokens)
            m.completion_tokens.labels(self.name).inc(usage.completion_tokens)

    async def whole(self, request: Request, choices: list[Choice], n: int,
                    render: Callable[[list[tuple[str, Delta]], Usage], dict[str, Any]]) -> Response:
        upstream = self.state.upstream

        async def run_all() -> list[tuple[str, Delta]]:
            async with asyncio.TaskGroup() as tg:
                tasks = [tg.create_task(c.run_whole(upstream)) for c in choices]
            return [t.result() for t in tasks]

        def abort_all() -> None:
            for c in choices:
                self.state.metrics.aborts.labels("client_disconnect").inc()
                upstream.abort_soon(c.rid)

        try:
            results = await until_disconnect(request, run_all(), abort_all)
        except* OpenAIError as group:
            raise group.exceptions[0] from None
        usage = self.usage(choices, n)
        self.count(200, usage)
        return json_response(render(results, usage))

    async def streamed(self, choices: list[Choice], n: int, options: StreamOptions | None,
                       chunk: Callable[[Delta], dict[str, Any]]) -> Response:
        include_usage = bool(options and options.include_usage)
        continuous = bool(options and options.continuous_usage_stats)
        upstream = self.state.upstream
        # Open every upstream stream first, so that a refused request still gets an HTTP error status.
        try:
            async with asyncio.TaskGroup() as tg:
                for c in choices:
                    tg.create_task(c.open(upstream))
        except* OpenAIError as group:
            for c in choices:
                if c.stream is not None:
                    upstream.abort_soon(c.rid, c.stream)
            raise group.exceptions[0] from None
        interval = self.state.config.stream_interval
        metrics = self.state.metrics

        began = False

        async def body() -> AsyncIterator[bytes]:
            nonlocal began
            began = True
            status = 499
            sent = events = 0
            try:
                try:
                    async for delta in merge(choices, upstream, interval):
                        obj = chunk(delta)
                        if continuous:  # usage so far on every event (vLLM/SGLang extension)
                            obj["usage"] = self.usage(choices, n).body()
                        data = sse(obj)
                        sent += len(data)
                        events += 1
                        yield data
                    if include_usage:
                        data = sse({"id": self.id, "object": self.chunk_kind, "created": self.created,
                                    "model": self.state.model_name_now(), "choices": [],
                                    "usage": self.usage(choices, n).body()})
                        sent += len(data)
                        events += 1
                        yield data
                    status = 200
                except OpenAIError as exc:
                    status = exc.status
                    data = exc.sse()
                    sent += len(data)
                    events += 1
                    yield data
                sent += len(DONE)
                events += 1
                yield DONE
            finally:
                metrics.stream_bytes.labels(self.name).inc(sent)
                metrics.stream_events.labels(self.name).inc(events)
                self.count(status, self.usage(choices, n) if status == 200 else None)

        response = SSEResponse(body())

        def abort_unfinished() -> None:
            if not began:
                self.count(499, None)
            for c in choices:
                if not c.finalized and c.stream is not None:
                    c.finalized = True
                    self.state.metrics.aborts.labels("client_disconnect").inc()
                    upstream.abort_soon(c.rid, c.stream)

        response.on_close.append(abort_unfinished)
        return response


async def merge(choices: list[Choice], upstream: Any, interval: int) -> AsyncIterator[Delta]:
    """Deltas of all choices in arrival order; leaving early closes every choice (aborting it)."""
    if len(choices) == 1:
        async with aclosing(choices[0].run_stream(upstream, interval)) as it:
            async for d in it:
                yield d
        return
    queue: asyncio.Queue[Delta | BaseException | None] = asyncio.Queue()

    async def pump(c: Choice) -> None:
        try:
            async with aclosing(c.run_stream(upstream, interval)) as it:
                async for d in it:
                    await queue.put(d)
            await queue.put(None)
        except Exception as exc:
            await queue.put(exc)

    tasks = [asyncio.ensure_future(pump(c)) for c in choices]
    try:
        remaining = len(tasks)
        while remaining:
            item = await queue.get()
            if item is None:
                remaining -= 1
            elif isinstance(item, BaseException):
                raise item
            else:
                yield item
    finally:
        for t in tasks:
            if not t.done():
                t.cancel()


def _seeded(params: dict[str, Any], j: int) -> dict[str, Any]:
    # n > 1 with a seed: each choice gets its own reproducible seed (seed + j), not n copies of one.
    if j and "sampling_seed" in params:
        return {**params, "sampling_seed": params["sampling_seed"] + j}
    return params


async def completions(state: ServeState, request: Request, req: CompletionRequest) -> Response:
    req.refuse_unsupported()
    ep = Endpoint(state, "completions", "text_completion", "text_completion")
    model_text = await state.model_text()
    model = await state.model_name()
    params = req.sampling_params(req.max_tokens)
    choices = [ep.choice(p * req.n + j, prompt, _seeded(params, j), req.stream, req, model_text)
               for p, prompt in enumerate(req.prompts()) for j in range(req.n)]
    if req.stream:
        def chunk(d: Delta) -> dict[str, Any]:
            choice: dict[str, Any] = {"index": d.index, "text": d.text, "finish_reason": d.finish_reason}
            if d.matched_stop is not None:
                choice["matched_stop"] = d.matched_stop
            return {"id": ep.id, "object": "text_completion", "created": ep.created, "model": model,
                    "choices": [choice]}

        return await ep.streamed(choices, req.n, req.stream_options, chunk)

    def render(results: list[tuple[str, Delta]], usage: Usage) -> dict[str, Any]:
        out = []
        for text, d in results:
            c: dict[str, Any] = {"index": d.index, "text": text, "logprobs": None, "finish_reason": d.finish_reason}
            if d.matched_stop is not None:
                c["matched_stop"] = d.matched_stop
            out.append(c)
        return {"id": ep.id, "object": "text_completion", "created": ep.created, "model": model,
                "choices": out, "usage": usage.body()}

    return await ep.whole(request, choices, req.n, render)


async def chat_completions(state: ServeState, request: Request, req: ChatCompletionRequest) -> Response:
    req.refuse_unsupported()
    ep = Endpoint(state, "chat", "chat.completion", "chat.completion.chunk")
    model_text = await state.model_text()
    model = await state.model_name()
    messages = [{**m.model_dump(exclude_none=True), "content": m.text()} for m in req.messages]
    prompt_text = model_text.chat_template.render(messages, req.add_generation_prompt, req.chat_template_kwargs)
    prompt_ids = model_text.tokenizer.encode(prompt_text)
    if not prompt_ids:
        raise OpenAIError(400, "the chat template rendered an empty prompt", param="messages")
    params = req.sampling_params(req.max_new_tokens())
    choices = [ep.choice(j, prompt_ids, _seeded(params, j), req.stream, req, model_text) for j in range(req.n)]
    if req.stream:
        started: set[int] = set()

        def chunk(d: Delta) -> dict[str, Any]:
            delta: dict[str, Any] = {}
            if d.index not in started:  # the role rides on each choice's first event
                started.add(d.index)
                delta["role"] = "assistant"
            if d.text or "role" in delta:
                delta["content"] = d.text
            choice: dict[str, Any] = {"index": d.index, "delta": delta, "finish_reason": d.finish_reason}
            if d.matched_stop is not None:
                choice["matched_stop"] = d.matched_stop
            return {"id": ep.id, "object": "chat.completion.chunk", "created": ep.created, "model": model,
                    "choices": [choice]}

        return await ep.streamed(choices, req.n, req.stream_options, chunk)

    def render(results: list[tuple[str, Delta]], usage: Usage) -> dict[str, Any]:
        out = []
        for text, d in results:
            c: dict[str, Any] = {"index": d.index, "message": {"role": "assistant", "content": text},
                                 "logprobs": None, "finish_reason": d.finish_reason}
            if d.matched_stop is not None:
                c["matched_stop"] = d.matched_stop
            out.append(c)
        return {"id": ep.id, "object": "chat.completion", "created": ep.created, "model": model,
                "choices": out, "usage": usage.body()}

    return await ep.whole(request, choices, req.n, render)


async def generate(state: ServeState, request: Request, req: GenerateRequest) -> Response:
    """The native `/generate`, forwarded: token IDs in and out, events re-sent as the worker sent them."""
    req.check()
    body = req.model_dump(exclude_none=True)
    body.setdefault("rid", f"gen-{uuid.uuid4().hex}")
    rid = str(body["rid"])
    upstream = state.upstream
    metrics = state.metrics
    t0 = time.monotonic()

    def count(status: int, meta: dict[str, Any] | None) -> None:
        metrics.requests.labels("generate", str(status)).inc()
        if meta is not None:
            metrics.prompt_tokens.labels("generate").inc(int(meta.get("prompt_tokens", 0) or 0))
            metrics.completion_tokens.labels("generate").inc(int(meta.get("completion_tokens", 0) or 0))

    if not req.stream:
        def aborted() -> None:
            metrics.aborts.labels("client_disconnect").inc()
            upstream.abort_soon(rid)

        result = await until_disconnect(request, upstream.generate(body), aborted)
        meta = result.get("meta_info")
        count(200, meta if isinstance(meta, dict) else None)
        return json_response(result)

    stream = await upstream.open_stream(body)

    started = False

    async def events() -> AsyncIterator[bytes]:
        nonlocal started
        started = True
        tracker = TokenTracker()
        status, sent, n_events = 499, 0, 0
        meta: dict[str, Any] = {}
        last = t0
        try:
            try:
                async for event in stream.events():
                    before = tracker.completion_tokens
                    try:
                        tracker.feed(event)
                    except UpstreamProtocolError as exc:
                        raise OpenAIError(502, f"worker broke the stream contract: {exc}") from exc
                    meta = event["meta_info"]
                    now = time.monotonic()
                    new = tracker.completion_tokens - before
                    if new and before == 0:
                        metrics.ttft.labels("generate").observe(now - t0)
                    elif new:
                        metrics.observe_tokens("generate", now - last, new)
                    last = now if new else last
                    data = sse(event)
                    sent += len(data)
                    n_events += 1
                    yield data
                if not tracker.finished:
                    raise OpenAIError(502, "the worker's stream ended before the request finished")
                status = 200
            except OpenAIError as exc:
                status = exc.status
                data = exc.sse()
                sent += len(data)
                yield data
            sent += len(DONE)
            yield DONE
        finally:
            metrics.upstream_bytes.inc(stream.bytes_received)
            metrics.stream_bytes.labels("generate").inc(sent)
            metrics.stream_events.labels("generate").inc(n_events)
            if status == 200:
                count(200, meta)
                await stream.aclose()
            else:
                count(status, None)
                metrics.aborts.labels("client_disconnect" if status == 499 else "error").inc()
                upstream.abort_soon(rid, stream)

    response = SSEResponse(events())

    def abort_unstarted() -> None:
        if not started:
            upstream.abort_soon(rid, stream)

    response.on_close.append(abort_unstarted)
    return response
