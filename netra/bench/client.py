"""One load-generator process: prepares its requests, waits on the barrier, streams them, logs records.

Run as ``python -m netra.bench.client SPEC.json`` by `netra bench serve` (one process per client,
each with its own event loop and one ``httpx.AsyncClient`` whose pooled connections are reused
across requests). Every finished request appends one JSON line to the spec's ``out`` file, flushed
at once, which is also how the parent counts progress.

Per-request record keys: ``idx`` (corpus index), ``rid``, ``client``, ``t_start`` / ``t_first`` /
``t_end`` (``CLOCK_MONOTONIC`` seconds), ``events`` (``[[t, new_tokens], ...]`` for every data
event), ``bytes`` (response body bytes received), ``status`` (HTTP), ``prompt_tokens``,
``completion_tokens``, ``cached_tokens`` (as the server reported them), ``finish_reason``,
``output_count`` (tokens the client reconstructed), ``output_hash``, ``error`` (None or a message),
``expect_prompt`` / ``expect_output`` (this request's exact expectations), and with a request rate
``t_arrive`` (the scheduled send instant; ``t_start`` is when a stream was free to send it).

What the hash covers: ``--api native``: sha256 of the reconstructed output token IDs (little-endian
int32), whether the server streamed cumulative or incremental ``output_ids``. ``--api openai``:
token IDs are not in an OpenAI stream, so the hash covers the UTF-8 of the concatenated text deltas,
and token counts come from the ``usage`` objects (per event when the server sends continuous usage,
otherwise one token per content-bearing event, reconciled against the final usage).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import os
import resource
import sys
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import orjson

from netra.bench import barrier

DONE = b"[DONE]"


class StreamError(Exception):
    pass


def ids_hash(ids: list[int]) -> str:
    return hashlib.sha256(np.asarray(ids, dtype="<i4").tobytes()).hexdigest()


class NativeStream:
    """Reconstructs the output of SGLang's native ``/generate`` stream, cumulative or incremental.

    ``meta_info.completion_tokens`` is cumulative in both modes (worker contract), so an event whose
    ``output_ids`` extend the known output to that count is incremental, and one whose ``output_ids``
    already have that count is cumulative. Anything else is a malformed stream.
    """

    def __init__(self) -> None:
        self.ids: list[int] = []
        self.count = 0
        self.meta: dict[str, Any] = {}

    def feed(self, event: dict[str, Any]) -> int:
        if "error" in event:
            raise StreamError(f"error event: {str(event['error'])[:300]}")
        meta = event.get("meta_info") or {}
        got = event.get("output_ids")
        if got is None:
            got = []
        cum = meta.get("completion_tokens")
        if cum is None:
            raise StreamError("event without meta_info.completion_tokens")
        before = len(self.ids)
        if before + len(got) == cum:  # incremental (or the first event of a cumulative stream)
            self.ids.extend(got)
        elif len(got) == cum and cum >= before:
            # Cumulative: the event repeats the whole output; its known part must not have changed.
            # Checking the last known token keeps this O(1) per event (a full prefix compare is
            # O(L^2) per request at L = 8K outputs).
            if before and got[before - 1] != self.ids[-1]:
                raise StreamError(f"cumulative output_ids rewrote token {before - 1}")
            self.ids = list(got)
        else:
            raise StreamError(f"event with {len(got)} output_ids and completion_tokens={cum} after "
                              f"{before} tokens is neither cumulative nor incremental")
        self.meta = meta
        new = len(self.ids) - before
        self.count = len(self.ids)
        return new

    def result(self) -> dict[str, Any]:
        fr = self.meta.get("finish_reason")
        return {
            "prompt_tokens": self.meta.get("prompt_tokens"),
            "completion_tokens": self.meta.get("completion_tokens"),
            "cached_tokens": self.meta.get("cached_tokens"),
            "finish_reason": fr.get("type") if isinstance(fr, dict) else fr,
            "finish_detail": fr if isinstance(fr, dict) else None,
            "output_count": self.count,
            "output_hash": ids_hash(self.ids),
        }


class OpenAIStream:
    """Counts tokens of a ``/v1/completions`` or ``/v1/chat/completions`` stream from usage and
    per-event content."""

    def __init__(self) -> None:
        self.text = bytearray()
        self.count = 0  # tokens seen, from continuous usage when present, else content events
        self.usage: dict[str, Any] | None = None
        self.finish_reason: str | None = None
        self.continuous = False

    def feed(self, event: dict[str, Any]) -> int:
        if "error" in event:
            raise StreamError(f"error event: {str(event['error'])[:300]}")
        new = 0
        content = False
        for choice in event.get("choices") or []:
            piece = choice.get("text") or (choice.get("delta") or {}).get("content") or ""
            if piece:
                self.text += piece.encode()
                content = True
            if choice.get("finish_reason"):
                self.finish_reason = choice["finish_reason"]
        usage = event.get("usage")
        if usage:
            cum = usage.get("completion_tokens")
            if event.get("choices") and isinstance(cum, int):
                # Continuous usage stats: each content event carries the cumulative count.
                self.continuous = True
                new = cum - self.count
                if new < 0:
                    raise StreamError(f"usage.completion_tokens went backwards ({self.count} -> {cum})")
                self.count = cum
            self.usage = usage
        elif content and not self.continuous:
            new = 1
            self.count += 1
        return new

    def result(self) -> dict[str, Any]:
        usage = self.usage or {}
        details = usage.get("prompt_tokens_details") or {}
        return {
            "prompt_tokens": usage.get("prompt_tokens"),
            "completion_tokens": usage.get("completion_tokens"),
            # None when the server does not report it (SGLang's OpenAI usage omits
            # prompt_tokens_details unless its cache report is enabled).
            "cached_tokens": details.get("cached_tokens"),
            "finish_reason": self.finish_reason,
            "finish_detail": None,
            "output_count": self.count if self.continuous else usage.get("completion_tokens"),
            "events_with_content": None if self.continuous else self.count,
            "output_hash": hashlib.sha256(bytes(self.text)).hexdigest(),
        }


PATHS = {"native": "/generate", "openai": "/v1/completions", "chat": "/v1/chat/completions"}


def request_body(spec: dict[str, Any], item: dict[str, Any], rid: str) -> bytes:
    """One request: ``item`` has ``input_ids`` (or ``text`` for chat) and its ``output_len``."""
    out = item.get("output_len", spec["output_len"])
    if spec["api"] == "native":
        body: dict[str, Any] = {
            "input_ids": item["input_ids"], "stream": True, "rid": rid,
            "sampling_params": {"max_new_tokens": out, "ignore_eos": True, "temperature": spec["temperature"]},
        }
    else:
        body = {
            "model": spec["model"], "max_tokens": out, "stream": True,
            "stream_options": {"include_usage": True, "continuous_usage_stats": spec["continuous_usage"]},
            "ignore_eos": True, "temperature": spec["temperature"],
        }
        if spec["api"] == "chat":
            body["messages"] = [{"role": "user", "content": item["text"]}]
        else:
            body["prompt"] = item["input_ids"]
    return orjson.dumps(body)


async def one_request(http: httpx.AsyncClient, spec: dict[str, Any], idx: int, body: bytes,
                      rid: str) -> dict[str, Any]:
    parser: NativeStream | OpenAIStream = NativeStream() if spec["api"] == "native" else OpenAIStream()
    rec: dict[str, Any] = {"idx": idx, "rid": rid, "client": spec["client"], "t_first": None, "events": [],
                           "bytes": 0, "status": None, "error": None}
    events: list[list[float]] = rec["events"]
    now = barrier.now
    done = False
    rec["t_start"] = now()
    try:
        async with http.stream("POST", spec["path"], content=body,
                               headers={"content-type": "application/json"}) as resp:
            rec["status"] = resp.status_code
            if resp.status_code != 200:
                text = (await resp.aread()).decode(errors="replace")
                rec["bytes"] = len(text)
                raise StreamError(f"HTTP {resp.status_code}: {text[:300]}")
            buf = b""
            async for chunk in resp.aiter_raw():
                rec["bytes"] += len(chunk)
                buf += chunk
                # SSE events end with a blank line; a chunk may hold several events or part of one.
                while True:
                    cut = buf.find(b"\n\n")
                    if cut < 0:
                        break
                    raw, buf = buf[:cut], buf[cut + 2:]
                    for line in raw.split(b"\n"):
                        if not line.startswith(b"data:"):
                            continue  # comments / keep-alives
                        payload = line[5:].strip()
                        if payload == DONE:
                            done = True
                            continue
                        t = now()
                        new = parser.feed(orjson.loads(payload))
                        if new and rec["t_first"] is None:
                            rec["t_first"] = t
                        events.append([t, new])
        if not done:
            raise StreamError("stream ended without data: [DONE]")
    except StreamError as exc:
        rec["error"] = str(exc)
    except (httpx.HTTPError, orjson.JSONDecodeError, OSError) as exc:
        rec["error"] = f"{type(exc).__name__}: {exc}"
    rec["t_end"] = now()
    rec.update(parser.result())
    return rec


async def run_client(spec: dict[str, Any]) -> int:
    if spec.get("cpus"):
        # Pinned like the article's clients, so a client never migrates onto a worker's cores.
        os.sched_setaffinity(0, spec["cpus"])
    out = Path(spec["out"])
    reqs = spec["requests"]
    bodies = [(r["idx"], f"{spec['run_id']}-{r['idx']}") for r in reqs]
    payloads = [request_body(spec, r, rid) for r, (_, rid) in zip(reqs, bodies, strict=True)]
    conc = max(1, min(spec["concurrency"], len(reqs))) if reqs else 1
    # One AsyncClient with a single kept-alive connection per stream, not one pool of C connections:
    # httpcore's pool re-scans every connection of the pool whenever a request is queued or
    # released (quadratic in the pool size); at C=128 in one process that scan took most of the
    # client's CPU in a profile (docs/bench.md). A stream sends its requests one after another, so
    # its own connection is reused by every request it sends.
    limits = httpx.Limits(max_connections=1, max_keepalive_connections=1, keepalive_expiry=600)
    timeout = httpx.Timeout(spec["timeout_s"], connect=30.0)
    async with contextlib.AsyncExitStack() as stack:
        https = [await stack.enter_async_context(httpx.AsyncClient(base_url=spec["url"], limits=limits,
                                                                   timeout=timeout)) for _ in range(conc)]
        # Open every stream's connection before the barrier, so no connection setup lands in the window.
        if spec.get("warm_path"):
            async def warm(http: httpx.AsyncClient) -> None:
                try:
                    await http.get(spec["warm_path"])
                except httpx.HTTPError:
                    pass  # warm-up only; a real connection problem shows in the measured requests
            await asyncio.gather(*(warm(h) for h in https))
        barrier.announce_ready(Path(spec["barrier"]), spec["client"])
        start = await asyncio.to_thread(barrier.wait_release, Path(spec["barrier"]), spec["barrier_timeout_s"])
        t_release, cpu_release = barrier.now(), _cpu_s()
        with out.open("ab") as fh:
            def log(i: int, rec: dict[str, Any]) -> None:
                rec["expect_prompt"] = reqs[i].get("prompt_len")
                rec["expect_output"] = reqs[i].get("output_len", spec["output_len"])
                fh.write(orjson.dumps(rec) + b"\n")
                fh.flush()

            if any(r.get("arrival") is not None for r in reqs):
                # Open loop: each request is sent at its arrival instant (from the common start),
                # on a free stream; the streams cap the requests in flight (--concurrency).
                free: asyncio.Queue[httpx.AsyncClient] = asyncio.Queue()
                for h in https:
                    free.put_nowait(h)

                async def arrive(i: int) -> None:
                    t_arrive = start + float(reqs[i]["arrival"])
                    await asyncio.sleep(max(0.0, t_arrive - barrier.now()))
                    http = await free.get()
                    try:
                        rec = await one_request(http, spec, bodies[i][0], payloads[i], bodies[i][1])
                    finally:
                        free.put_nowait(http)
                    rec["t_arrive"] = t_arrive
                    log(i, rec)

                await asyncio.gather(*(arrive(i) for i in range(len(reqs))))
            else:
                queue: asyncio.Queue[int] = asyncio.Queue()
                for i in range(len(reqs)):
                    queue.put_nowait(i)

                async def worker(http: httpx.AsyncClient) -> None:
                    while True:
                        try:
                            i = queue.get_nowait()
                        except asyncio.QueueEmpty:
                            return
                        idx, rid = bodies[i]
                        log(i, await one_request(http, spec, idx, payloads[i], rid))

                await asyncio.gather(*(worker(h) for h in https))
    # This process's CPU time over its measured part: near 1.0 busy means the client itself (one
    # event loop, one core at most) was the bottleneck.
    stats = {"client": spec["client"], "cpu_s": _cpu_s() - cpu_release, "t_release": t_release,
             "t_done": barrier.now(), "requests": len(reqs), "concurrency": conc,
             "cpus": sorted(os.sched_getaffinity(0))}
    Path(str(out) + ".stats.json").write_bytes(orjson.dumps(stats))
    return 0


def _cpu_s() -> float:
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return ru.ru_utime + ru.ru_stime


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1:
        print("usage: python -m netra.bench.client SPEC.json", file=sys.stderr)
        return 2
    spec = orjson.loads(Path(argv[0]).read_bytes())
    return asyncio.run(run_client(spec))


if __name__ == "__main__":
    sys.exit(main())
