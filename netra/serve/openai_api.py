"""The OpenAI endpoints and the native passthrough, on top of `generation.Choice`."""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import AsyncIterator, Callable
from contextlib import aclosing
from typing import Any

from starlette.requests import Request
from starlette.responses import Response

from netra.serve import requestlog
from netra.serve.chat_output import ChatOutput
from netra.serve.generation import Choice, Delta, Usage
from netra.serve.logprobs import TokenText, chat_logprobs, completion_logprobs
from netra.serve.messages import normalize, template_kwargs
from netra.serve.prompts import check_ids, encode_checked
from netra.serve.protocol import ChatCompletionRequest, CompletionRequest, StreamOptions
from netra.serve.reasoning import THINK_CLOSE, TOOL_OPEN, ReasoningCounter, opens_reasoning
from netra.serve.sse import DONE, SSEResponse, all_or_abort, guard, json_response, sse
from netra.serve.state import ServeState, check_choices
from netra.serve.tokenizer import ModelText
from netra.serve.tools import parser_for
from netra.web.errors import OpenAIError

log = logging.getLogger("netra.serve")
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
        self.request: Request | None = None
        self.request_id = uuid.uuid4().hex
        self.finish_reasons: list[str | None] = []

    def attach(self, request: Request) -> None:
        """Take the request's X-Request-Id (netra/serve/requestlog.py): the worker runs it under that id."""
        self.request = request
        record = requestlog.current(request)
        if record is not None:
            self.request_id = record.id

    def name_choices(self, choices: list[Choice]) -> list[Choice]:
        """A single choice runs at the worker under the request id (in this process's namespace);
        choice i of several under ID-i."""
        if len(choices) == 1:
            choices[0].body["rid"] = self.state.upstream.new_rid(self.request_id)
        return choices

    def choice(self, index: int, prompt: list[int], params: dict[str, Any], stream: bool,
               req: CompletionRequest | ChatCompletionRequest, model_text: Any) -> Choice:
        # Upstream, the request runs under this process's own rid with the request id inside it (so
        # the worker's logs carry the id): never under a client-chosen name alone (request isolation).
        body = {"input_ids": prompt, "sampling_params": params, "stream": stream,
                "rid": self.state.upstream.new_rid(f"{self.request_id}-{index}")}
        return Choice(index=index, body=body, tokenizer=model_text.tokenizer, stops=req.stop_strings(),
                      keep_stop=req.no_stop_trim, skip_special_tokens=req.skip_special_tokens,
                      endpoint=self.name, metrics=self.state.metrics, t0=self.t0, timed=stream)

    def envelope(self, model: str, choices: list[dict[str, Any]], *, chunk: bool) -> dict[str, Any]:
        """A response body (a stream event's when ``chunk``) around ``choices``."""
        return {"id": self.id, "object": self.chunk_kind if chunk else self.object_kind, "created": self.created,
                "model": model, "choices": choices}

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
        if self.request is not None:
            requestlog.note(self.request, status=status, finish_reasons=self.finish_reasons,
                            prompt_tokens=usage.prompt_tokens if usage is not None else None,
                            completion_tokens=usage.completion_tokens if usage is not None else None)

    async def whole(self, request: Request, choices: list[Choice], n: int,
                    render: Callable[[list[tuple[str, Delta]], Usage], dict[str, Any]]) -> Response:
        upstream = self.state.upstream
        admission = self.state.admission
        # At most `request_share` of its choices at once, each admitted on its own: a choice that
        # ends hands its slot to whoever waited first, so other requests interleave with this one.
        wave = asyncio.Semaphore(self.state.config.request_share)

        async def one(c: Choice) -> tuple[str, Delta]:
            async with wave, admission.hold(1):
                return await c.run_whole(upstream)

        def abort_all() -> None:
            for c in choices:
                if c.rid in upstream.submitted:
                    self.state.metrics.aborts.labels("client_disconnect").inc()
                    upstream.abort_soon(c.rid)

        results = await all_or_abort(request, self.state.watch.lost(), [one(c) for c in choices], abort_all)
        usage = self.usage(choices, n)
        self.finish_reasons = [d.finish_reason for _, d in results]
        self.count(200, usage)
        return json_response(render(results, usage))

    async def streamed(self, request: Request, choices: list[Choice], n: int, options: StreamOptions | None,
                       chunk: Callable[[Delta], dict[str, Any] | None]) -> Response:
        include_usage = bool(options and options.include_usage)
        continuous = bool(options and options.continuous_usage_stats)
        upstream = self.state.upstream
        admission = self.state.admission
        weight = len(choices)  # a stream runs all its choices at once

        async def admit_and_open() -> None:
            # Open every upstream stream first, so that a refused request still gets an HTTP error status.
            await admission.acquire(weight)
            try:
                async with asyncio.TaskGroup() as tg:
                    for c in choices:
                        tg.create_task(c.open(upstream))
            except BaseException:
                admission.release(weight)
                close_opened()
                raise

        def close_opened() -> None:
            for c in choices:
                if c.stream is not None and not c.finalized:
                    c.finalized = True
                    upstream.abort_soon(c.rid, c.stream)

        try:
            await guard(request, self.state.watch.lost(), admit_and_open(), close_opened)
        except* OpenAIError as group:
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
                        if delta.finish_reason is not None:
                            self.finish_reasons.append(delta.finish_reason)
                        obj = chunk(delta)
                        if obj is None:  # nothing to say yet (e.g. inside a tool call being parsed)
                            continue
                        if continuous:  # usage so far on every event (vLLM/SGLang extension)
                            obj["usage"] = self.usage(choices, n).body()
                        data = sse(obj)
                        sent += len(data)
                        events += 1
                        yield data
                    if include_usage:
                        data = sse({**self.envelope(self.state.model_name_now(), [], chunk=True),
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
                if status == 499:
                    log.info("client disconnected from a %s stream after %d events", self.name, events)

        response = SSEResponse(body())

        def abort_unfinished() -> None:
            if not began:
                self.count(499, None)
            for c in choices:
                if not c.finalized and c.stream is not None:
                    c.finalized = True
                    self.state.metrics.aborts.labels("client_disconnect").inc()
                    upstream.abort_soon(c.rid, c.stream)
            admission.release(weight)  # once: the response has ended, however it ended

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


def _stopped(choice: dict[str, Any], d: Delta) -> dict[str, Any]:
    """``choice`` with the stop string that ended it, if one did (SGLang's `matched_stop`)."""
    if d.matched_stop is not None:
        choice["matched_stop"] = d.matched_stop
    return choice


def _logprob_fields(body: dict[str, Any], top: int | None) -> None:
    """Ask the worker for logprobs (SGLang's top-level keys)."""
    body["return_logprob"] = True
    body["top_logprobs_num"] = top or 0


async def _endpoint(state: ServeState, request: Request, req: CompletionRequest | ChatCompletionRequest,
                    name: str, object_kind: str, chunk_kind: str) -> tuple[Endpoint, str, ModelText, int | None]:
    """The checks every OpenAI endpoint makes first (fields it refuses, the model's name, the worker's health),
    then its `Endpoint`, the model's text side and the context length."""
    req.refuse_unsupported()
    model = await state.check_model(req.model)
    state.check_worker()
    ep = Endpoint(state, name, object_kind, chunk_kind)
    ep.attach(request)
    return ep, model, await state.model_text(), await state.context_length()


async def completions(state: ServeState, request: Request, req: CompletionRequest) -> Response:
    prompts = req.prompts()
    check_choices(state, len(prompts), req.n)
    ep, model, model_text, context = await _endpoint(state, request, req, "completions", "text_completion",
                                                     "text_completion")
    token_prompts: list[list[int]] = []
    for prompt in prompts:  # tokenized here, so the length is checked before anything goes upstream
        if isinstance(prompt, str):
            token_prompts.append(await encode_checked(model_text, prompt, context, req.max_tokens, "prompt"))
        else:
            check_ids(len(prompt), context, req.max_tokens, "prompt")
            token_prompts.append(prompt)
    params = req.sampling_params(req.max_tokens, state.sampling_defaults(model_text))
    choices = ep.name_choices([ep.choice(p * req.n + j, prompt, _seeded(params, j), req.stream, req, model_text)
                               for p, prompt in enumerate(token_prompts) for j in range(req.n)])
    if req.logprobs is not None:
        for c in choices:
            _logprob_fields(c.body, req.logprobs)
    names = TokenText(model_text.tokenizer)

    def echo(index: int) -> str:
        if not req.echo:
            return ""
        prompt = prompts[index // req.n]
        return prompt if isinstance(prompt, str) else model_text.tokenizer.decode(prompt, skip_special_tokens=False)

    if req.stream:
        offsets: dict[int, int] = {}

        def chunk(d: Delta) -> dict[str, Any]:
            text = d.text
            if d.index not in offsets:  # the echoed prompt rides on each choice's first event
                text = echo(d.index) + text
                offsets[d.index] = len(text) - len(d.text)
            choice: dict[str, Any] = {"index": d.index, "text": text, "logprobs": None,
                                      "finish_reason": d.finish_reason}
            if req.logprobs is not None:
                choice["logprobs"] = completion_logprobs(d.logprobs, names, offsets[d.index])
                offsets[d.index] += sum(len(t) for t in choice["logprobs"]["tokens"])
            return ep.envelope(model, [_stopped(choice, d)], chunk=True)

        return await ep.streamed(request, choices, req.n, req.stream_options, chunk)

    def render(results: list[tuple[str, Delta]], usage: Usage) -> dict[str, Any]:
        out = []
        for text, d in results:
            prefix = echo(d.index)
            c: dict[str, Any] = {"index": d.index, "text": prefix + text, "logprobs": None,
                                 "finish_reason": d.finish_reason}
            if req.logprobs is not None:
                c["logprobs"] = completion_logprobs(d.logprobs, names, len(prefix))
            out.append(_stopped(c, d))
        return {**ep.envelope(model, out, chunk=False), "usage": usage.body()}

    return await ep.whole(request, choices, req.n, render)


async def chat_completions(state: ServeState, request: Request, req: ChatCompletionRequest) -> Response:
    check_choices(state, 1, req.n)
    ep, model, model_text, context = await _endpoint(state, request, req, "chat", "chat.completion",
                                                     "chat.completion.chunk")
    template = model_text.chat_template
    plain = template.source is None
    tools = req.prompt_tools()
    messages = normalize(req, plain, tools)
    prompt_text = template.render(messages, req.add_generation_prompt, template_kwargs(req), tools=tools)
    prompt_ids = await encode_checked(model_text, prompt_text, context, req.max_new_tokens(), "messages")
    if not prompt_ids:
        raise OpenAIError(400, "the chat template rendered an empty prompt", param="messages")
    max_new = req.max_new_tokens()
    if max_new is None and context is not None:  # SGLang's and vLLM's default: the rest of the context
        max_new = context - len(prompt_ids)
    params = req.sampling_params(max_new, state.sampling_defaults(model_text))
    # The prompt opened a think block (Qwen3.5/3.6 with thinking on): the output starts with reasoning,
    # and a constraint applies only after it (the worker's --reasoning-parser, told by require_reasoning).
    reasoning = not plain and opens_reasoning(prompt_text)
    if tools is not None and (req.tool_choice == "required" or req.named_tool() is not None):
        params["ebnf"] = parser_for(template.source, tools).grammar(tools, req.named_tool(), req.parallel_tool_calls,
                                                                   added_tokens=model_text.added_tokens)
    choices = ep.name_choices([ep.choice(j, prompt_ids, _seeded(params, j), req.stream, req, model_text)
                               for j in range(req.n)])
    for c in choices:
        if req.logprobs:
            _logprob_fields(c.body, req.top_logprobs)
        if reasoning:
            c.body["require_reasoning"] = True
            tok = model_text.tokenizer
            c.reasoning = ReasoningCounter(tok.encode(THINK_CLOSE), tok.encode(TOOL_OPEN))
    names = TokenText(model_text.tokenizer)
    outputs = {j: ChatOutput(reasoning and req.separate_reasoning,
                             parser_for(template.source, tools) if tools is not None else None)
               for j in range(req.n)}

    def finish_reason(index: int, reason: str | None) -> str | None:
        return "tool_calls" if reason == "stop" and outputs[index].calls else reason

    if req.stream:
        started: set[int] = set()

        def chunk(d: Delta) -> dict[str, Any] | None:
            delta: dict[str, Any] = {}
            if d.index not in started:  # the role rides on each choice's first event
                started.add(d.index)
                delta["role"] = "assistant"
            out = outputs[d.index]
            piece = out.push(d.text)
            if d.finish_reason is not None:
                piece.extend(out.flush())
            if piece.reasoning:
                delta["reasoning_content"] = piece.reasoning
            if piece.content or "role" in delta:
                delta["content"] = piece.content
            if piece.tool_deltas:
                delta["tool_calls"] = piece.tool_deltas
            if not delta and d.finish_reason is None and not d.logprobs:
                return None
            choice: dict[str, Any] = {"index": d.index, "delta": delta, "logprobs": None,
                                      "finish_reason": finish_reason(d.index, d.finish_reason)}
            if req.logprobs:
                choice["logprobs"] = chat_logprobs(d.logprobs, names)
            return ep.envelope(model, [_stopped(choice, d)], chunk=True)

        return await ep.streamed(request, choices, req.n, req.stream_options, chunk)

    def render(results: list[tuple[str, Delta]], usage: Usage) -> dict[str, Any]:
        out = []
        for text, d in results:
            output = outputs[d.index]
            piece = output.push(text)
            piece.extend(output.flush())
            calls = output.calls
            message: dict[str, Any] = {"role": "assistant",
                                       "content": piece.content if piece.content.strip() or not calls else None}
            if output.splitter is not None:
                message["reasoning_content"] = piece.reasoning or None
            if calls:
                message["tool_calls"] = [c.body() for c in calls]
            c: dict[str, Any] = {"index": d.index, "message": message,
                                 "logprobs": chat_logprobs(d.logprobs, names) if req.logprobs else None,
                                 "finish_reason": finish_reason(d.index, d.finish_reason)}
            out.append(_stopped(c, d))
        return {**ep.envelope(model, out, chunk=False), "usage": usage.body()}

    return await ep.whole(request, choices, req.n, render)
