"""Synthetic upstream: a worker that follows docs/worker-contract.md and emits tokens at a known rate.

It has two uses. It is the instrument-check upstream: every request decodes one token every
``1 / rate`` seconds on an absolute schedule (no drift), so the ideal output rate at concurrency C
is known (about ``C * rate`` once the pipeline is full) and any shortfall at the client side is the
instrument's (or the shared CPU's). And it is the deliberately wrong upstream for the exact-check
tests: ``--fault`` makes the ``--fault-nth`` received request (0-based; -1 = every request) send
one token too few or too many, an error event, an abort, an HTTP 500, a cached-token report, a
wrong prompt count, or a stream cut before ``[DONE]``.

Output token ``i`` of a request is ``(sum(prompt) + 7919 * i) % vocab`` (skipping ID 0, the
synthetic EOS), so the output is a deterministic function of the prompt and the hash is checkable.

Run: ``netra bench synthetic --port 0 --port-file F --rate 100 [--incremental]``.
"""

# No `from __future__ import annotations`: FastAPI reads the handlers' `Request` annotation, and
# fastapi is imported inside create_app (so `netra bench synthetic --help` needs only the core).

import argparse
import asyncio
import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from netra.procutil import wait_healthy

FAULTS = ("none", "short", "long", "error-event", "abort", "http500", "cached", "prompt", "truncate")


@dataclass
class Config:
    rate: float = 100.0  # tokens per second per request; 0 = burst (no pacing)
    ttft_ms: float = 0.0  # extra delay before the first token (a stand-in for prefill)
    stream_interval: int = 1
    incremental: bool = False
    vocab_size: int = 32000
    fault: str = "none"
    fault_nth: int = -1


def output_token(prompt_sum: int, i: int, vocab: int) -> int:
    return 1 + (prompt_sum + 7919 * i) % (vocab - 1)


def create_app(cfg: Config) -> Any:
    import orjson
    from fastapi import FastAPI, Request
    from fastapi.responses import JSONResponse, Response, StreamingResponse

    app = FastAPI()
    counter = {"n": 0}

    def sse(obj: Any) -> bytes:
        return b"data: " + orjson.dumps(obj) + b"\n\n"

    def plan(ids: list[int], max_new: int) -> tuple[str, int, int, int]:
        n = counter["n"]
        counter["n"] += 1
        fault = cfg.fault if cfg.fault_nth in (-1, n) else "none"
        emit = max_new - 1 if fault == "short" else max_new + 1 if fault == "long" else max_new
        cached = 1 if fault == "cached" else 0
        prompt = len(ids) - 1 if fault == "prompt" else len(ids)
        return fault, emit, cached, prompt

    async def ticks(emit: int) -> AsyncIterator[int]:
        """Yields the number of tokens decoded so far at each event instant (absolute schedule)."""
        t0 = time.monotonic() + cfg.ttft_ms / 1000.0
        sent = 0
        while sent < emit:
            if cfg.rate <= 0:  # burst mode: no pacing
                sent = min(emit, 1 if sent == 0 else sent + cfg.stream_interval)
                yield sent
                continue
            # First event: the prefill token alone (as SGLang sends it); then every stream_interval.
            nxt = min(emit, 1 if sent == 0 else sent + cfg.stream_interval)
            delay = t0 + (nxt - 1) / cfg.rate - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
            sent = nxt
            yield sent

    async def paced(fault: str, emit: int, event: Callable[[int, int], bytes], last: bytes) -> AsyncIterator[bytes]:
        """One request's stream: ``event(prev, n)`` at each tick (tokens prev..n), then ``last`` (if any) and
        [DONE]; ``fault`` turns it into an error event half way, or cuts it before its last token."""
        prev = 0
        async for n in ticks(emit):
            if fault == "error-event" and n > emit // 2:
                yield sse({"error": {"message": "synthetic error event", "code": 500}})
                yield b"data: [DONE]\n\n"
                return
            if fault == "truncate" and n == emit:
                return
            yield event(prev, n)
            prev = n
        if last:
            yield last
        yield b"data: [DONE]\n\n"

    def bad_request(msg: str) -> Any:
        return JSONResponse({"error": {"message": msg, "type": "invalid_request_error", "code": 400}},
                            status_code=400)

    @app.post("/generate")
    async def generate(request: Request) -> Any:
        body = orjson.loads(await request.body())
        ids = body.get("input_ids")
        if not isinstance(ids, list) or not all(isinstance(t, int) and 0 <= t < cfg.vocab_size for t in ids):
            return bad_request("input_ids must be a list of token IDs inside the vocabulary")
        sp = body.get("sampling_params") or {}
        max_new = int(sp.get("max_new_tokens", 128))
        rid = body.get("rid") or f"syn-{counter['n']}"
        fault, emit, cached, prompt = plan(ids, max_new)
        if fault == "http500":
            return Response("synthetic failure", status_code=500)
        psum = sum(ids)
        out = [output_token(psum, i, cfg.vocab_size) for i in range(emit)]

        def meta(n: int, final: bool) -> dict[str, Any]:
            fr: Any = None
            if final:
                fr = ({"type": "abort", "message": "synthetic abort"} if fault == "abort"
                      else {"type": "length", "length": n})
            return {"id": rid, "finish_reason": fr, "prompt_tokens": prompt, "completion_tokens": n,
                    "cached_tokens": cached}

        if not body.get("stream"):
            async for _ in ticks(emit):
                pass
            return JSONResponse({"text": "", "output_ids": out, "meta_info": meta(emit, True)})

        def event(prev: int, n: int) -> bytes:
            ids_out = out[prev:n] if cfg.incremental else out[:n]
            return sse({"text": "", "output_ids": ids_out, "meta_info": meta(n, n == emit)})

        def stream() -> AsyncIterator[bytes]:
            last = sse({"text": "", "output_ids": [], "meta_info": meta(0, True)}) if emit == 0 else b""
            return paced(fault, emit, event, last)

        if cfg.rate <= 0 and fault == "none":
            # Burst mode: the whole stream in one body, as fast as the server can send it, so the
            # run measures the client's own event-processing ceiling (instrument check).
            body_bytes = b"".join([chunk async for chunk in stream()])
            return Response(body_bytes, media_type="text/event-stream")
        return StreamingResponse(stream(), media_type="text/event-stream")

    @app.post("/v1/completions")
    async def completions(request: Request) -> Any:
        body = orjson.loads(await request.body())
        ids = body.get("prompt")
        if not isinstance(ids, list) or not all(isinstance(t, int) for t in ids):
            return bad_request("prompt must be a list of token IDs")
        max_new = int(body.get("max_tokens", 16))
        fault, emit, cached, prompt = plan(ids, max_new)
        if fault == "http500":
            return Response("synthetic failure", status_code=500)
        opts = body.get("stream_options") or {}
        psum = sum(ids)

        def usage(n: int) -> dict[str, Any]:
            return {"prompt_tokens": prompt, "completion_tokens": n, "total_tokens": prompt + n,
                    "prompt_tokens_details": {"cached_tokens": cached}}

        def event(prev: int, n: int) -> bytes:
            text = "".join(f" t{output_token(psum, i, cfg.vocab_size)}" for i in range(prev, n))
            fin = ("abort" if fault == "abort" else "length") if n == emit else None
            chunk: dict[str, Any] = {"id": "cmpl-syn", "object": "text_completion", "model": "synthetic",
                                     "choices": [{"index": 0, "text": text, "finish_reason": fin}]}
            if opts.get("continuous_usage_stats"):
                chunk["usage"] = usage(n)
            return sse(chunk)

        last = (sse({"id": "cmpl-syn", "object": "text_completion", "model": "synthetic", "choices": [],
                     "usage": usage(emit)}) if opts.get("include_usage") else b"")
        return StreamingResponse(paced(fault, emit, event, last), media_type="text/event-stream")

    @app.get("/v1/models")
    async def models() -> Any:
        return {"object": "list", "data": [{"id": "synthetic", "object": "model"}]}

    @app.get("/model_info")
    async def model_info() -> Any:
        return {"model_path": "synthetic", "tokenizer_path": None, "is_generation": True, "preset": "synthetic",
                "vocab_size": cfg.vocab_size, "eos_token_id": 0}

    @app.get("/server_info")
    async def server_info() -> Any:
        # cpu_s lets the benchmark report how busy this upstream was during a run (instrument check).
        return {"engine": "synthetic", "cpu_s": time.process_time(), "rate": cfg.rate, "stream_interval": cfg.stream_interval,
                "incremental_streaming_output": cfg.incremental, "fault": cfg.fault}

    @app.get("/health")
    @app.get("/health_generate")
    @app.get("/ready")
    async def health() -> Any:
        return Response(status_code=200)

    @app.post("/abort_request")
    async def abort_request() -> Any:
        return Response(status_code=200)

    return app


def serve(cfg: Config, host: str, port: int, port_file: Path | None) -> None:
    import uvicorn

    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    if port_file is not None:
        tmp = port_file.with_name(port_file.name + ".tmp")
        tmp.write_text(str(sock.getsockname()[1]))
        os.replace(tmp, port_file)
    config = uvicorn.Config(create_app(cfg), log_level="warning", access_log=False, backlog=4096,
                            timeout_keep_alive=600)
    uvicorn.Server(config).run(sockets=[sock])


@contextlib.contextmanager
def running(cfg: Config, workdir: Path, timeout_s: float = 60.0) -> Iterator[str]:
    """Start the synthetic upstream in a subprocess on a free loopback port; yields its base URL and
    always stops it (SIGTERM, then SIGKILL) on exit."""
    workdir.mkdir(parents=True, exist_ok=True)
    port_file = workdir / f"synthetic-{os.getpid()}-{time.monotonic_ns()}.port"
    cmd = [sys.executable, "-m", "netra.bench.synthetic", "--port", "0", "--port-file", str(port_file),
           "--rate", str(cfg.rate), "--ttft-ms", str(cfg.ttft_ms), "--stream-interval", str(cfg.stream_interval),
           "--vocab-size", str(cfg.vocab_size), "--fault", cfg.fault, "--fault-nth", str(cfg.fault_nth)]
    if cfg.incremental:
        cmd.append("--incremental")
    log = (workdir / "synthetic.log").open("ab")
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.monotonic() + timeout_s
        while not port_file.exists():
            if proc.poll() is not None:
                raise RuntimeError(f"synthetic upstream exited with {proc.returncode}; see {workdir / 'synthetic.log'}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"synthetic upstream did not bind within {timeout_s:.0f} s")
            time.sleep(0.02)
        url = f"http://127.0.0.1:{int(port_file.read_text())}"
        # bound is not serving: wait for the app to answer
        wait_healthy(url, proc, deadline, f"synthetic upstream not healthy; see {workdir / 'synthetic.log'}")
        yield url
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=10)
        log.close()
        port_file.unlink(missing_ok=True)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--host", default="127.0.0.1", help="address to listen on")
    p.add_argument("--port", type=int, default=0, help="0 picks a free port (written to --port-file)")
    p.add_argument("--port-file", type=Path, help="write the bound port here (for --port 0)")
    p.add_argument("--rate", type=float, default=100.0,
                   help="tokens per second per request; 0 = burst (each stream sent at once: the client's ceiling)")
    p.add_argument("--ttft-ms", type=float, default=0.0, help="milliseconds before each request's first token")
    p.add_argument("--stream-interval", type=int, default=1, help="tokens per event")
    p.add_argument("--incremental", action="store_true", help="send only new output_ids per event")
    p.add_argument("--vocab-size", type=int, default=32000, help="token IDs are drawn below this")
    p.add_argument("--fault", choices=FAULTS, default="none", help="misbehave this way (instrument and fault tests)")
    p.add_argument("--fault-nth", type=int, default=-1, help="0-based received request to fault; -1 = all")


def cli(a: argparse.Namespace) -> int:
    if a.rate < 0 or a.stream_interval < 1 or a.vocab_size < 2:
        print("netra bench synthetic: --rate must be >= 0, --stream-interval >= 1, --vocab-size >= 2",
              file=sys.stderr)
        return 2
    cfg = Config(rate=a.rate, ttft_ms=a.ttft_ms, stream_interval=a.stream_interval, incremental=a.incremental,
                 vocab_size=a.vocab_size, fault=a.fault, fault_nth=a.fault_nth)
    serve(cfg, a.host, a.port, a.port_file)
    return 0


def main(argv: list[str] | None = None) -> int:
    from netra.cli import run_module

    return run_module("netra bench synthetic", __doc__, add_arguments, cli, argv)


if __name__ == "__main__":
    sys.exit(main())
