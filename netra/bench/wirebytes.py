"""Bytes on the wire per output token, client side and upstream side, cumulative vs incremental worker.

    netra bench wirebytes [--worker engine|fake] [--lengths 16 256 2048] [--stream-interval 1]

For each worker streaming mode (cumulative: the whole output in every event, as SGLang sends by
default; incremental: only the new suffix) and each output length (exact, `ignore_eos`), it sends
one greedy streaming request per OpenAI endpoint through a response layer and counts

- client bytes: the response body the client receives (SSE framing, the usage event and
  `[DONE]` included; HTTP chunk headers excluded), and
- upstream bytes: the native stream body the response layer received from the worker for that
  request (from its `netra_serve_upstream_stream_bytes_total` counter),

divided by the completion tokens the usage reports (checked equal to the requested length). It
also checks that the concatenated stream text equals the non-streamed text of the same request.
Prints a table and writes a result record under results/serving/ (kind "serving", target "cpu").
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import httpx



MODES = ("cumulative", "incremental")
ENDPOINTS = ("completions", "chat")
PROMPT = "Explain why a streaming protocol should send each new token once."


@dataclass
class Row:
    endpoint: str
    mode: str
    output_len: int
    completion_tokens: int
    client_bytes: int
    client_events: int
    upstream_bytes: int
    stream_equals_whole: bool | None  # None: not checked at this length (--whole-check-max)
    serve_cpu_s: float | None = None  # the response-layer process's CPU time for the stream (10 ms ticks)
    text_sha256: str = ""  # of the streamed text: the same request must give the same text in both modes

    def record_row(self, stream_interval: int, worker: str) -> dict[str, Any]:
        return {"scenario": f"wire-bytes/{self.endpoint}/{self.mode}", "concurrency": 1, "requests": 1,
                "input_len": None, "output_len": self.output_len, "completion_tokens": self.completion_tokens,
                "output_tok_s": None, "ttft_ms_p50": None, "ttft_ms_p99": None, "tpot_ms_p50": None,
                "tpot_ms_p99": None, "bytes_per_output_token": round(self.client_bytes / self.completion_tokens, 2),
                "upstream_bytes_per_output_token": round(self.upstream_bytes / self.completion_tokens, 2),
                "client_bytes": self.client_bytes, "client_events": self.client_events,
                "upstream_bytes": self.upstream_bytes, "stream_interval": stream_interval,
                "upstream_mode": self.mode, "endpoint": self.endpoint, "worker": worker,
                "stream_equals_whole": self.stream_equals_whole, "text_sha256": self.text_sha256,
                "serve_cpu_us_per_output_token": (None if self.serve_cpu_s is None
                                                  else round(1e6 * self.serve_cpu_s / self.completion_tokens, 1)),
                "clients": 1, "workers": 1}


@contextlib.contextmanager
def engine_worker(incremental: bool, timeout: float = 120.0) -> Iterator[str]:
    """`netra engine --preset tiny` on a free port, upstream stream interval 1 (the worst case)."""
    from netra.engine.process import engine_process

    args = ["--preset", "tiny", "--stream-interval", "1"] + (["--incremental-streaming-output"] if incremental else [])
    with engine_process(*args, startup_timeout=timeout) as url:
        yield url


def process_cpu_s(pid: int) -> float:
    """User + system CPU seconds of a process so far (Linux /proc; clock-tick resolution)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


@contextlib.contextmanager
def serve_process(upstream: str, stream_interval: int, timeout: float = 60.0) -> Iterator[tuple[str, int]]:
    """`netra serve` as its own process (as the launcher runs it), on a free loopback port."""
    from netra.procutil import terminate, wait_healthy

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    cmd = [sys.executable, "-m", "netra", "serve", "--upstream", upstream, "--host", "127.0.0.1", "--port",
           str(port), "--stream-interval", str(stream_interval), "--log-level", "warning"]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    url = f"http://127.0.0.1:{port}"
    try:
        try:
            wait_healthy(url, proc, time.monotonic() + timeout, "netra serve did not become healthy", interval=0.1)
        except RuntimeError as exc:
            raise RuntimeError(f"{exc}: {proc.stderr.read() if proc.stderr else ''}") from None
        yield url, proc.pid
    finally:
        terminate(proc, 15)


@contextlib.contextmanager
def fake_worker(incremental: bool, step_delay: float = 0.0) -> Iterator[str]:
    from netra.serve.fakeworker import FakeConfig, create_fake_worker
    from netra.web.server import ServerThread

    cfg = FakeConfig(incremental=incremental, stream_interval=1, step_delay=step_delay)
    with ServerThread(create_fake_worker(cfg)) as url:
        yield url


def _upstream_counter(client: httpx.Client) -> float:
    from prometheus_client.parser import text_string_to_metric_families

    return sum(s.value for fam in text_string_to_metric_families(client.get("/metrics").text)
               for s in fam.samples if s.name == "netra_serve_upstream_stream_bytes_total")


def _body(endpoint: str, n: int, stream: bool) -> tuple[str, dict[str, Any]]:
    common: dict[str, Any] = {"max_tokens": n, "temperature": 0, "ignore_eos": True, "stream": stream}
    if stream:
        common["stream_options"] = {"include_usage": True}
    if endpoint == "chat":
        return "/v1/chat/completions", {"messages": [{"role": "user", "content": PROMPT}], **common}
    return "/v1/completions", {"prompt": PROMPT, **common}


def measure_one(client: httpx.Client, endpoint: str, mode: str, n: int, check_whole: bool = True,
                serve_pid: int | None = None) -> Row:
    import orjson

    path, body = _body(endpoint, n, stream=True)
    before = _upstream_counter(client)
    # CPU time comes in 10 ms ticks: below 256 tokens a stream costs only a few of them.
    timed = serve_pid is not None and n >= 256
    cpu0 = process_cpu_s(serve_pid) if timed and serve_pid is not None else 0.0
    raw = bytearray()
    with client.stream("POST", path, json=body) as r:
        if r.status_code != 200:
            raise RuntimeError(f"{path} returned {r.status_code}: {r.read()!r}")
        for chunk in r.iter_raw():
            raw += chunk
    cpu = process_cpu_s(serve_pid) - cpu0 if timed and serve_pid is not None else None
    upstream = int(_upstream_counter(client) - before)
    events = [b[6:] for b in bytes(raw).split(b"\n\n") if b.startswith(b"data: ")]
    if events[-1] != b"[DONE]":
        raise RuntimeError(f"{path} stream did not end with [DONE]")
    objs = [orjson.loads(e) for e in events[:-1]]
    if "error" in objs[-1]:
        raise RuntimeError(f"{path} stream failed: {objs[-1]['error']}")
    usage = objs[-1]["usage"]
    if endpoint == "chat":
        text = "".join(o["choices"][0]["delta"].get("content", "") for o in objs if o["choices"])
    else:
        text = "".join(o["choices"][0]["text"] for o in objs if o["choices"])
    equal = None
    if check_whole:
        path, whole_body = _body(endpoint, n, stream=False)
        choice = client.post(path, json=whole_body).json()["choices"][0]
        equal = text == (choice["message"]["content"] if endpoint == "chat" else choice["text"])
    return Row(endpoint, mode, n, int(usage["completion_tokens"]), len(raw), len(events), upstream, equal, cpu,
               hashlib.sha256(text.encode()).hexdigest()[:16])


@contextlib.contextmanager
def serve_thread(upstream: str, stream_interval: int) -> Iterator[tuple[str, int | None]]:
    from netra.serve.app import create_app
    from netra.serve.config import ServeConfig
    from netra.web.server import ServerThread

    with ServerThread(create_app(ServeConfig(upstream=upstream, stream_interval=stream_interval))) as url:
        yield url, None


def measure(worker: str, lengths: list[int], stream_interval: int, endpoints: tuple[str, ...] = ENDPOINTS,
            log: Any = print, whole_check_max: int | None = None, serve_as_process: bool = True,
            fake_step_delay: float = 0.0) -> list[Row]:
    import httpx

    rows: list[Row] = []
    for mode in MODES:
        def start(incremental: bool) -> contextlib.AbstractContextManager[str]:
            if worker == "engine":
                return engine_worker(incremental)
            return fake_worker(incremental, fake_step_delay)

        serve = serve_process if serve_as_process else serve_thread
        with start(mode == "incremental") as up, serve(up, stream_interval) as (url, pid), \
                httpx.Client(base_url=url, timeout=httpx.Timeout(1800.0)) as client:
            for endpoint in endpoints:  # warm-up: the tokenizer loads on the first request, not measured
                measure_one(client, endpoint, mode, 4, check_whole=False)
            for endpoint in endpoints:
                for n in lengths:
                    t0 = time.monotonic()
                    row = measure_one(client, endpoint, mode, n,
                                      check_whole=whole_check_max is None or n <= whole_check_max, serve_pid=pid)
                    log(f"  {mode:11s} {endpoint:11s} {n:5d} tokens: {row.client_bytes / n:8.1f} B/token to the "
                        f"client, {row.upstream_bytes / n:9.1f} B/token from the worker ({time.monotonic() - t0:.1f} s)")
                    rows.append(row)
    return rows


def summarize(rows: list[Row]) -> dict[str, Any]:
    """Per (endpoint, mode): client and upstream bytes per token at the longest over the shortest length."""
    out: dict[str, Any] = {}
    for endpoint in sorted({r.endpoint for r in rows}):
        for mode in MODES:
            sel = sorted((r for r in rows if r.endpoint == endpoint and r.mode == mode), key=lambda r: r.output_len)
            if len(sel) < 2:
                continue
            lo, hi = sel[0], sel[-1]
            client = [r.client_bytes / r.completion_tokens for r in sel]
            out[f"{endpoint}/{mode}"] = {
                "client_bpt_longest_over_shortest": round(client[-1] / client[0], 3),
                "client_bpt_max_over_min": round(max(client) / min(client), 3),
                "upstream_bpt_longest_over_shortest": round((hi.upstream_bytes / hi.completion_tokens)
                                                            / (lo.upstream_bytes / lo.completion_tokens), 3),
            }
    return out


def table(rows: list[Row]) -> str:
    lines = [f"{'endpoint':11s} {'worker mode':11s} {'tokens':>6s} {'client B/tok':>12s} {'events':>6s} "
             f"{'upstream B/tok':>14s} {'upstream/client':>15s} {'serve CPU us/tok':>16s}"]
    for r in rows:
        c = r.client_bytes / r.completion_tokens
        u = r.upstream_bytes / r.completion_tokens
        cpu = "-" if r.serve_cpu_s is None else f"{1e6 * r.serve_cpu_s / r.completion_tokens:.0f}"
        lines.append(f"{r.endpoint:11s} {r.mode:11s} {r.output_len:6d} {c:12.1f} {r.client_events:6d} {u:14.1f} "
                     f"{u / c:15.2f} {cpu:>16s}")
    return "\n".join(lines)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--worker", choices=["engine", "fake"], default="engine",
                   help="engine: `netra engine --preset tiny` (CPU); fake: the contract fake worker")
    p.add_argument("--lengths", type=int, nargs="+", default=[16, 256, 2048], help="output lengths (tokens) to measure")
    p.add_argument("--stream-interval", type=int, default=1, help="the response layer's --stream-interval")
    p.add_argument("--endpoints", nargs="+", choices=ENDPOINTS, default=list(ENDPOINTS),
                   help="OpenAI endpoints to measure")
    p.add_argument("--whole-check-max", type=int, default=None,
                   help="compare with the non-streamed text only up to this length (the CPU engine is slow)")
    p.add_argument("--fake-step-delay", type=float, default=0.0,
                   help="fake worker: seconds per decode step (0: back to back; >0: one event per wakeup)")
    p.add_argument("--out", type=Path, default=None, help="record directory (default: $NETRA_RUN_DIR/records; results/serving to keep it)")
    p.add_argument("--no-record", action="store_true", help="print only; write no record")


def cli(args: argparse.Namespace) -> int:

    from netra import settings
    from netra.records import git_sha, host_device, utc_now, write_record

    sha = git_sha()
    t0 = time.monotonic()
    rows = measure(args.worker, args.lengths, args.stream_interval, tuple(args.endpoints),
                   whole_check_max=args.whole_check_max, fake_step_delay=args.fake_step_delay)
    print(table(rows))
    summary = summarize(rows)
    for k, v in summary.items():
        print(f"{k}: {v}")
    by_key: dict[tuple[str, int], dict[str, Row]] = {}
    for r in rows:
        by_key.setdefault((r.endpoint, r.output_len), {})[r.mode] = r
    pairs = [v for v in by_key.values() if len(v) == 2]
    checks = {
        "completion_tokens_exact": all(r.completion_tokens == r.output_len for r in rows),
        # The client stream's event boundaries follow the worker's: identical bytes need identical
        # worker events, while the text must be the same whichever mode the worker streams in.
        "same_text_in_both_modes": all(v["cumulative"].text_sha256 == v["incremental"].text_sha256 for v in pairs),
        "same_client_bytes_in_both_modes": all(v["cumulative"].client_bytes == v["incremental"].client_bytes
                                               for v in pairs),
        "stream_text_equals_whole_text": all(r.stream_equals_whole is not False for r in rows),
        "stream_text_compared_at": sorted({r.output_len for r in rows if r.stream_equals_whole is not None}),
        "flatness": summary,
    }
    print(f"checks: completion tokens exact {checks['completion_tokens_exact']}, same text in both modes "
          f"{checks['same_text_in_both_modes']}, same client bytes {checks['same_client_bytes_in_both_modes']}, "
          f"stream text == whole text {checks['stream_text_equals_whole_text']} ({time.monotonic() - t0:.0f} s)")
    if args.no_record:
        return 0
    command = "netra bench wirebytes " + " ".join(
        [f"--worker {args.worker}", "--lengths " + " ".join(map(str, args.lengths)),
         f"--stream-interval {args.stream_interval}", "--endpoints " + " ".join(args.endpoints)]
        + ([f"--whole-check-max {args.whole_check_max}"] if args.whole_check_max is not None else [])
        + ([f"--fake-step-delay {args.fake_step_delay}"] if args.fake_step_delay else []))
    record = {"kind": "serving", "family": "wire-bytes", "target": "cpu", "device": host_device(),
              "git_sha": sha, "date": utc_now(), "command": command, "status": "measured",
              "rows": [r.record_row(args.stream_interval, args.worker) for r in rows], "checks": checks,
              "verdict": "info",
              "notes": "client bytes: response body incl. SSE framing, usage event and [DONE]; upstream bytes: "
                       "native /generate stream body received by the response layer; worker stream interval 1; serve CPU: "
                       "user+system time of the `netra serve` process during the stream (10 ms ticks, >= 256 tokens)"}
    stem = f"wire-bytes-{args.worker}-si{args.stream_interval}"
    if args.fake_step_delay:
        stem += f"-step{round(args.fake_step_delay * 1000)}ms"
    path = write_record(record, args.out or settings.records_dir(), stem)
    print(f"record: {path}")
    return 0


def main(argv: list[str] | None = None) -> int:
    from netra.cli import run_module

    return run_module("netra bench wirebytes", __doc__, add_arguments, cli, argv)


if __name__ == "__main__":
    sys.exit(main())
