"""A worker that follows docs/worker-contract.md exactly, with a deterministic "model".

It exists to test the response layer and to measure its bytes on the wire where no engine runs:
cumulative or incremental events, any stream interval, stop tokens, aborts, and injected faults.
Its tokenizer is a byte-level BPE written as a Hugging Face `tokenizer.json` (one token per
byte, so multi-byte UTF-8 characters span tokens) with a ChatML chat template.

The "model": output token i is byte (offset + i) of a fixed multilingual text, where the offset
derives from the prompt (and the seed when sampling), so a greedy request is reproducible. With
`FakeConfig.script` it answers every request with those token ids instead (in any vocabulary: a real
model's output, e.g. reasoning, ``</think>``, a tool call and ``<|im_end|>``), stopping at the first
of `FakeConfig.eos_ids`, as a worker serving a real checkpoint would.
"""

from __future__ import annotations

import asyncio
import json
import tempfile
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson
from fastapi import FastAPI
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse

from netra.tokenizers import bytes_to_unicode

TEXT = ("Netra serves hybrid MoE models. Größe, café, naïve — 日本語のテキスト, 한국어, "
        "emoji 🙂🚀 and ASCII punctuation: {}[]<>!? ").encode()
EOS, IM_START, IM_END = 256, 257, 258
CHATML = ("{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
          "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
FAKE_CONTEXT = 4096
TOP_KEYS = {"input_ids", "text", "sampling_params", "stream", "rid", "return_logprob", "top_logprobs_num",
            "logprob_start_len", "return_text_in_logprobs", "require_reasoning"}
SAMPLING_KEYS = {"max_new_tokens", "temperature", "top_p", "top_k", "min_p", "ignore_eos", "stop_token_ids",
                 "skip_special_tokens", "sampling_seed", "no_stop_trim", "frequency_penalty", "presence_penalty",
                 "repetition_penalty", "min_new_tokens", "logit_bias", "json_schema", "regex", "ebnf"}


def fake_logprob(i: int, token: int, k: int) -> tuple[list[Any], list[list[Any]]]:
    """The fake's logprob entry for output position ``i`` (SGLang's shape) and its top ``k``."""
    lp = -0.1 - 0.25 * (i % 5)
    return [lp, token, None], [[lp - j, (token + j) % 256, None] for j in range(k)]


def add_logprobs(event: dict[str, Any], body: dict[str, Any], out: list[int], lo: int, hi: int) -> None:
    """SGLang's `output_token_logprobs` / `output_top_logprobs` for output positions [lo, hi)."""
    if not body.get("return_logprob"):
        return
    pairs = [fake_logprob(i, out[i], int(body.get("top_logprobs_num", 0))) for i in range(lo, hi)]
    event["meta_info"]["output_token_logprobs"] = [e for e, _ in pairs]
    event["meta_info"]["output_top_logprobs"] = [t for _, t in pairs]


def write_tokenizer(directory: Path) -> Path:
    """Write tokenizer.json and tokenizer_config.json (ChatML template) into `directory`."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

    vocab = {ch: b for b, ch in bytes_to_unicode().items()}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([AddedToken(t, special=True) for t in ("<|endoftext|>", "<|im_start|>", "<|im_end|>")])
    directory.mkdir(parents=True, exist_ok=True)
    tok.save(str(directory / "tokenizer.json"))
    (directory / "tokenizer_config.json").write_text(json.dumps(
        {"chat_template": CHATML, "eos_token": "<|im_end|>", "bos_token": None}))
    return directory


@dataclass
class FakeConfig:
    incremental: bool = False
    stream_interval: int = 1
    step_delay: float = 0.0  # seconds per decode step
    eos_after: int | None = None  # emit EOS after this many tokens unless ignore_eos
    fail_after: int | None = None  # break the connection mid-stream after this many tokens
    healthy: bool = True
    # As an SGLang worker started with a Hugging Face id reports it: model_path = tokenizer_path = the id,
    # which the response layer then looks up in its own Hugging Face cache. None: the local tokenizer dir.
    hub_id: str | None = None
    # While set, every endpoint waits before answering (a stopped or wedged worker; clear to resume).
    hung: bool = False
    context_length: int | None = None  # reported in /model_info when set
    # The scripted model: every request's output is these token ids (up to max_new_tokens), ending at
    # the first of eos_ids (counted, not returned, as a matched stop) unless ignore_eos.
    script: list[int] | None = None
    eos_ids: tuple[int, ...] = (EOS,)


@dataclass
class FakeState:
    config: FakeConfig
    tokenizer_dir: Path
    aborted: set[str] = field(default_factory=set)  # rids aborted by /abort_request
    disconnected: set[str] = field(default_factory=set)  # rids whose client went away mid-stream
    requests: list[dict[str, Any]] = field(default_factory=list)
    running: set[str] = field(default_factory=set)
    client_ports: list[int] = field(default_factory=list)  # the upstream connection of each /generate


def _bad(message: str) -> Response:
    return Response(orjson.dumps({"error": {"message": message, "type": "invalid_request_error", "code": 400}}),
                    status_code=400, media_type="application/json")


def _check(body: Any) -> str | None:
    if not isinstance(body, dict):
        return "body must be a JSON object"
    extra = set(body) - TOP_KEYS
    if extra:
        return f"unknown keys {sorted(extra)}"
    if ("input_ids" in body) == ("text" in body):
        return "exactly one of input_ids and text"
    sp = body.get("sampling_params", {})
    if not isinstance(sp, dict):
        return "sampling_params must be an object"
    extra = set(sp) - SAMPLING_KEYS
    if extra:
        return f"unknown sampling_params {sorted(extra)}"
    mnt = sp.get("max_new_tokens", 128)
    if not isinstance(mnt, int) or mnt < 0:
        return "max_new_tokens must be an int >= 0"
    if float(sp.get("temperature", 1.0)) < 0:
        return "temperature must be >= 0"
    ids = body.get("input_ids")
    if ids is not None and (not isinstance(ids, list) or not ids or not all(isinstance(t, int) and t >= 0 for t in ids)):
        return "input_ids must be a non-empty list of token IDs"
    return None


def prompt_token_ids(body: dict[str, Any]) -> list[int]:
    """The fake's tokenization of a `/generate` body (its `text` is encoded byte by byte)."""
    if "input_ids" in body:
        return list(body["input_ids"])
    return list(body["text"].encode())


def reference_output(prompt: list[int], sp: dict[str, Any], eos_after: int | None = None,
                     script: list[int] | None = None, eos_ids: tuple[int, ...] = (EOS,),
                     ) -> tuple[list[int], dict[str, Any]]:
    """The whole output of one request (the matched stop token last, when one matched) and its finish."""
    limit = int(sp.get("max_new_tokens", 128))
    if script is not None:
        stops = set(sp.get("stop_token_ids") or []) | (set() if sp.get("ignore_eos") else set(eos_ids))
        for i, t in enumerate(script[:limit]):
            if t in stops:
                return [*script[:i], t], {"type": "stop", "matched": t}
        if len(script) < limit:
            raise ValueError("a script must end with a stop token or be cut by max_new_tokens")
        return script[:limit], {"type": "length", "length": limit}
    offset = sum((i + 1) * t for i, t in enumerate(prompt))
    if float(sp.get("temperature", 1.0)) > 0:
        offset += 7919 * int(sp.get("sampling_seed", 0))
    stop_ids = set(sp.get("stop_token_ids") or [])
    ignore_eos = bool(sp.get("ignore_eos", False))
    out: list[int] = []
    for i in range(limit):
        if eos_after is not None and not ignore_eos and i == eos_after:
            return [*out, EOS], {"type": "stop", "matched": EOS}
        t = TEXT[(offset + i) % len(TEXT)]
        if t in stop_ids:
            return [*out, t], {"type": "stop", "matched": t}
        out.append(t)
    return out, {"type": "length", "length": limit}


def create_fake_worker(config: FakeConfig | None = None, tokenizer_dir: Path | None = None) -> FastAPI:
    cfg = config or FakeConfig()
    tdir = tokenizer_dir or write_tokenizer(Path(tempfile.mkdtemp(prefix="netra-fake-tok-")))
    state = FakeState(cfg, tdir)
    app = FastAPI()
    app.state.fake = state

    async def while_hung() -> None:
        while cfg.hung:
            await asyncio.sleep(0.01)

    def result(rid: str, prompt: list[int], ids: list[int], n_counted: int, finish: dict[str, Any] | None,
               keep_stop: bool, t0: float, skip_special: bool) -> dict[str, Any]:
        shown = ids
        if finish is not None and finish.get("type") == "stop" and not keep_stop:
            shown = ids[:-1]  # the matched stop token is counted but not returned
        text = bytes(t for t in shown if t < 256).decode("utf-8", "replace") if skip_special else ""
        return {"text": text, "output_ids": shown,
                "meta_info": {"id": rid, "finish_reason": finish, "prompt_tokens": len(prompt),
                              "completion_tokens": n_counted, "cached_tokens": 0,
                              "e2e_latency": time.monotonic() - t0}}

    @app.post("/generate")
    async def generate(request: Request) -> Response:
        await while_hung()
        try:
            body = orjson.loads(await request.body())
        except orjson.JSONDecodeError:
            return _bad("body is not JSON")
        problem = _check(body)
        if problem:
            return _bad(problem)
        state.requests.append(body)
        state.client_ports.append(request.client.port if request.client else -1)
        rid = str(body.get("rid") or uuid.uuid4().hex)
        sp = body.get("sampling_params", {})
        prompt = prompt_token_ids(body)
        out, finish = reference_output(prompt, sp, cfg.eos_after, cfg.script, cfg.eos_ids)
        keep = bool(sp.get("no_stop_trim", False))
        t0 = time.monotonic()
        if not body.get("stream", False):
            await asyncio.sleep(cfg.step_delay * len(out))
            await while_hung()
            whole = result(rid, prompt, out, len(out), finish, keep, t0, True)
            add_logprobs(whole, body, out, 0, len(out))
            return Response(orjson.dumps(whole), media_type="application/json")

        async def events() -> AsyncIterator[bytes]:
            state.running.add(rid)
            sent = 0
            done = False
            try:
                for step in range(1, len(out) + 1):
                    if cfg.step_delay:
                        await asyncio.sleep(cfg.step_delay)
                    else:
                        await asyncio.sleep(0)
                    await while_hung()
                    if rid in state.aborted:
                        ev = result(rid, prompt, out[:sent] if not cfg.incremental else [], sent,
                                    {"type": "abort", "message": "aborted by /abort_request"}, keep, t0, True)
                        yield b"data: " + orjson.dumps(ev) + b"\n\n"
                        done = True
                        break
                    if cfg.fail_after is not None and step > cfg.fail_after:
                        raise RuntimeError("injected fault: the worker died mid-stream")
                    last = step == len(out)
                    if step - sent < cfg.stream_interval and not last:
                        continue
                    fin = finish if last else None
                    ids = out[sent:step] if cfg.incremental else out[:step]
                    ev = result(rid, prompt, ids, step, fin, keep, t0, True)
                    if cfg.incremental and fin is not None and fin.get("type") == "stop" and not keep:
                        ev["output_ids"] = out[sent:step - 1]
                    if cfg.incremental:
                        ev["text"] = bytes(t for t in ev["output_ids"] if t < 256).decode("utf-8", "replace")
                    add_logprobs(ev, body, out, sent if cfg.incremental else 0, step)
                    sent = step
                    yield b"data: " + orjson.dumps(ev) + b"\n\n"
                if not out:
                    yield b"data: " + orjson.dumps(result(rid, prompt, [], 0, finish, keep, t0, True)) + b"\n\n"
                yield b"data: [DONE]\n\n"
                done = True
            finally:
                state.running.discard(rid)
                if not done:
                    state.disconnected.add(rid)

        return StreamingResponse(events(), media_type="text/event-stream")

    @app.post("/abort_request")
    async def abort(request: Request) -> Response:
        body = orjson.loads(await request.body())
        state.aborted.add(str(body.get("rid")))
        return Response(b"{}", media_type="application/json")

    @app.get("/health")
    async def health() -> Response:
        await while_hung()
        return Response(b"", status_code=200 if cfg.healthy else 503)

    @app.get("/health_generate")
    async def health_generate() -> Response:
        return Response(b"", status_code=200 if cfg.healthy else 503)

    @app.get("/ready")
    async def ready() -> Response:
        return Response(b"", status_code=200 if cfg.healthy else 503)

    @app.get("/model_info")
    async def model_info() -> Response:
        path = cfg.hub_id or str(tdir)
        info: dict[str, Any] = {"model_path": cfg.hub_id or "fake/contract-worker", "tokenizer_path": path,
                                "is_generation": True, "preset": None}
        if cfg.context_length is not None:
            info["context_length"] = cfg.context_length
        return Response(orjson.dumps(info), media_type="application/json")

    @app.get("/v1/models")
    async def models() -> Response:  # SGLang's own card: where its context length is published
        return Response(orjson.dumps({"object": "list", "data": [{"id": "fake/contract-worker", "object": "model",
                                                                  "max_model_len": cfg.context_length or FAKE_CONTEXT}]}),
                        media_type="application/json")

    @app.get("/server_info")
    async def server_info() -> Response:
        return Response(orjson.dumps({"version": "fake", "incremental_streaming_output": cfg.incremental,
                                      "stream_interval": cfg.stream_interval}), media_type="application/json")

    return app
