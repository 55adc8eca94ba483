"""The native `/generate`, passed through to the worker (token IDs in and out, SGLang's batch form).

A client's `rid` names its request to the client only: upstream the request runs under this
process's own rid (`Upstream.new_rid`), and events carry the client's rid back in `meta_info.id`.
So no client can name, and so abort, another client's request.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

from starlette.requests import Request
from starlette.responses import Response

from netra.serve import requestlog
from netra.serve.prompts import check_ids
from netra.serve.protocol import GenerateRequest
from netra.serve.sse import DONE, SSEResponse, all_or_abort, guard, json_response, sse
from netra.serve.state import ServeState, check_choices
from netra.serve.stream import TokenTracker, UpstreamProtocolError
from netra.serve.upstream import UpstreamStream
from netra.web.errors import OpenAIError

log = logging.getLogger("netra.serve")


async def generate(state: ServeState, request: Request, req: GenerateRequest) -> Response:
    """The native `/generate`, forwarded: token IDs in and out, events re-sent as the worker sent them."""
    req.check()
    state.check_worker()
    if req.is_batch():
        return await _generate_batch(state, request, req)
    context = await state.context_length()
    max_new = req.sampling_params.get("max_new_tokens")
    max_new = max_new if isinstance(max_new, int) and not isinstance(max_new, bool) else None
    if req.input_ids is not None:
        check_ids(len(req.input_ids), context, max_new, "input_ids")
    elif req.text is not None and context is not None:
        text = await state.model_text()
        if len(req.text) > 2 * context * text.max_token_chars:
            raise OpenAIError(400, f"the text has {len(req.text)} characters, more than this model's context "
                                   f"length ({context} tokens) can hold", param="text", code="context_length_exceeded")
    body = req.model_dump(exclude_none=True)
    upstream = state.upstream
    record = requestlog.current(request)
    # The client's rid (or the request id) names the request to the client and in the worker's logs;
    # upstream it runs in this process's namespace, so no client can name another's request.
    client_rid = req.rid if isinstance(req.rid, str) else record.id if record is not None else f"gen-{uuid.uuid4().hex}"
    rid = body["rid"] = upstream.new_rid(client_rid)
    admission = state.admission
    metrics = state.metrics
    t0 = time.monotonic()

    def own(event: dict[str, Any]) -> dict[str, Any]:
        meta = event.get("meta_info")
        if isinstance(meta, dict) and "id" in meta:
            meta["id"] = client_rid
        return event

    def count(status: int, meta: dict[str, Any] | None) -> None:
        metrics.requests.labels("generate", str(status)).inc()
        if meta is not None:
            metrics.prompt_tokens.labels("generate").inc(int(meta.get("prompt_tokens", 0) or 0))
            metrics.completion_tokens.labels("generate").inc(int(meta.get("completion_tokens", 0) or 0))
            finish = meta.get("finish_reason")
            requestlog.note(request, status=status, prompt_tokens=int(meta.get("prompt_tokens", 0) or 0),
                            completion_tokens=int(meta.get("completion_tokens", 0) or 0),
                            finish_reasons=[finish.get("type") if isinstance(finish, dict) else None])
        else:
            requestlog.note(request, status=status)

    if not req.stream:
        def aborted() -> None:
            if rid in upstream.submitted:
                metrics.aborts.labels("client_disconnect").inc()
                upstream.abort_soon(rid)

        async def run() -> dict[str, Any]:
            async with admission.hold(1):
                return await upstream.generate(body)

        result = own(await guard(request, state.watch.lost(), run(), aborted))
        meta = result.get("meta_info")
        count(200, meta if isinstance(meta, dict) else None)
        return json_response(result)

    async def admit_and_open() -> UpstreamStream:
        await admission.acquire(1)
        try:
            return await upstream.open_stream(body)
        except BaseException:
            admission.release(1)
            raise

    def never_opened() -> None:
        pass  # a cancelled open sends its abort itself (`Upstream._failed`)

    stream = await guard(request, state.watch.lost(), admit_and_open(), never_opened)

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
                        raise OpenAIError(502, f"the worker broke the stream contract: {exc}") from exc
                    meta = event["meta_info"]
                    now = time.monotonic()
                    new = tracker.completion_tokens - before
                    if new and before == 0:
                        metrics.ttft.labels("generate").observe(now - t0)
                    elif new:
                        metrics.observe_tokens("generate", now - last, new)
                    last = now if new else last
                    data = sse(own(event))
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
                if status == 499:
                    log.info("client disconnected from a generate stream after %d events", n_events)

    response = SSEResponse(events())

    def end() -> None:
        if not started:
            upstream.abort_soon(rid, stream)
        admission.release(1)

    response.on_close.append(end)
    return response


async def _generate_batch(state: ServeState, request: Request, req: GenerateRequest) -> Response:
    """SGLang's batch `/generate`: one upstream request per prompt, answered as a list in order."""
    bodies = req.split()
    check_choices(state, len(bodies), 1)
    context = await state.context_length()
    upstream = state.upstream
    client_rids: list[str] = []
    for b in bodies:
        if "input_ids" in b:
            check_ids(len(b["input_ids"]), context, None, "input_ids")
        client = b.get("rid")
        client_rids.append(str(client) if client else f"gen-{uuid.uuid4().hex}")
        b["rid"] = upstream.new_rid(str(client) if client else None)
    admission = state.admission
    wave = asyncio.Semaphore(state.config.request_share)  # as a non-streamed request's choices

    async def one(b: dict[str, Any]) -> dict[str, Any]:
        async with wave, admission.hold(1):
            return await upstream.generate(b)

    def abort_all() -> None:
        for b in bodies:
            if b["rid"] in upstream.submitted:
                upstream.abort_soon(str(b["rid"]))

    try:
        results = await all_or_abort(request, state.watch.lost(), [one(b) for b in bodies], abort_all)
    except OpenAIError:
        abort_all()  # one prompt failed: the others are not wanted either
        raise
    for r, client in zip(results, client_rids, strict=True):
        meta = r.get("meta_info") if isinstance(r, dict) else None
        if isinstance(meta, dict) and "id" in meta:
            meta["id"] = client
    for r in results:
        meta = r.get("meta_info") if isinstance(r, dict) else None
        state.metrics.requests.labels("generate", "200").inc()
        if isinstance(meta, dict):
            state.metrics.prompt_tokens.labels("generate").inc(int(meta.get("prompt_tokens", 0) or 0))
            state.metrics.completion_tokens.labels("generate").inc(int(meta.get("completion_tokens", 0) or 0))
    return json_response(results)
