"""`netra bench engine`: tiny-preset serving figures of the embedded engine on this machine.

Starts `netra engine` as a child process, drives it over HTTP with streaming `/generate` requests at
each concurrency (a closed loop: C clients, each sending its next request when the previous ends),
and reports output tokens/s over the global window (first submit to last finish), TTFT / TPOT
percentiles, bytes on the wire per output token, and the scheduler's own split of each step
(model forward, sampling, and the rest: batch building and output processing) from `/engine_stats`.
Exact checks: every request completes with exactly ``output_len`` tokens. Writes one record under
``results/serving/`` through `netra.records.write_record`.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import shlex
import statistics
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import httpx


from netra import settings
from netra.records import git_sha, host_device, utc_now, write_record


def _pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    s = sorted(values)
    return s[min(len(s) - 1, max(0, round(q / 100 * (len(s) - 1))))]


async def _one(client: httpx.AsyncClient, base: str, prompt: list[int], out_len: int) -> dict[str, Any]:
    import orjson

    body = {"input_ids": prompt, "stream": True,
            "sampling_params": {"max_new_tokens": out_len, "temperature": 0, "ignore_eos": True}}
    t0 = time.perf_counter()
    first = None
    nbytes = 0
    last: dict[str, Any] = {}
    async with client.stream("POST", base + "/generate", json=body) as r:
        r.raise_for_status()
        async for line in r.aiter_lines():
            nbytes += len(line) + 1
            if line.startswith("data: {"):
                if first is None:
                    first = time.perf_counter()
                last = orjson.loads(line[6:])
    end = time.perf_counter()
    n = int(last["meta_info"]["completion_tokens"])
    return {"start": t0, "end": end, "ttft": (first or end) - t0, "n": n, "bytes": nbytes,
            "tpot": (end - (first or end)) / (n - 1) if n > 1 else 0.0}


async def _level(base: str, concurrency: int, requests: int, in_len: int, out_len: int, seed: int
                 ) -> list[dict[str, Any]]:
    import httpx

    rng = random.Random(seed)
    prompts = [[rng.randrange(256) for _ in range(in_len)] for _ in range(requests)]
    queue: asyncio.Queue[list[int]] = asyncio.Queue()
    for p in prompts:
        queue.put_nowait(p)
    results: list[dict[str, Any]] = []

    async def client_loop(client: httpx.AsyncClient) -> None:
        while not queue.empty():
            results.append(await _one(client, base, queue.get_nowait(), out_len))

    limits = httpx.Limits(max_connections=concurrency + 4)
    async with httpx.AsyncClient(timeout=600, limits=limits) as client:
        await asyncio.gather(*[client_loop(client) for _ in range(concurrency)])
    return results


def _stats(base: str) -> dict[str, Any]:
    import httpx

    data: dict[str, Any] = httpx.get(base + "/engine_stats", timeout=30).json()
    return data


def in_process(args: argparse.Namespace) -> dict[str, Any]:
    """The same workload driven in this process with no HTTP (`Scheduler.run_until_idle`): the
    scheduler's own per-step cost without the server thread competing for the interpreter."""
    import torch

    from netra.engine.engine import build_engine
    from netra.engine.options import EngineOptions
    from netra.engine.request import Request, SamplingParams

    torch.set_num_threads(args.torch_threads)
    out: dict[str, Any] = {}
    for c in args.concurrency:
        e = build_engine(EngineOptions(preset="tiny", max_running_requests=max(args.concurrency),
                                       torch_threads=args.torch_threads))
        rng = random.Random(c)
        params = SamplingParams(max_new_tokens=args.output_len, temperature=0.0, ignore_eos=True)
        counts: dict[str, int] = {}

        def sink(o: Any, counts: dict[str, int] = counts) -> None:
            counts[o.rid] = o.completion_tokens

        for i in range(c):
            e.scheduler.submit(Request(str(i), [rng.randrange(256) for _ in range(args.input_len)], params, sink))
        t = time.perf_counter()
        e.scheduler.run_until_idle()
        wall = time.perf_counter() - t
        st = e.scheduler.stats.to_json()
        steps = max(1, st["steps"])
        out[str(c)] = {"concurrency": c, "output_tok_s": sum(counts.values()) / wall, "steps": st["steps"],
                       "forward_ms_per_step": st["forward_ms_per_step"],
                       "sample_ms_per_step": 1e3 * st["sample_s"] / steps,
                       "overhead_ms_per_step": st["overhead_ms_per_step"],
                       "forward_cpu_ms_per_step": st["forward_cpu_ms_per_step"],
                       "overhead_cpu_ms_per_step": st["overhead_cpu_ms_per_step"],
                       "output_tok_per_cpu_s": sum(counts.values()) / max(1e-9, st["step_cpu_s"]),
                       "overhead_fraction_of_step": st["overhead_s"] / max(1e-9, st["step_s"]),
                       "exact_tokens": all(v == args.output_len for v in counts.values()) and len(counts) == c}
    return out


def run(args: argparse.Namespace) -> dict[str, Any]:
    from netra.engine.process import engine_process

    rows: list[dict[str, Any]] = []
    sched: dict[str, Any] = {}
    checks: dict[str, Any] = {"requests_completed": 0, "requests_sent": 0, "token_mismatches": 0}
    engine_args = ["--preset", "tiny", "--torch-threads", str(args.torch_threads),
                   "--max-running-requests", str(max(args.concurrency))]
    with engine_process(*engine_args) as base:
        asyncio.run(_level(base, 2, 4, args.input_len, 8, seed=1))  # warm-up
        for c in args.concurrency:
            n_req = max(args.min_requests, args.requests_per_client * c)
            before = _stats(base)
            res = asyncio.run(_level(base, c, n_req, args.input_len, args.output_len, seed=c))
            after = _stats(base)
            window = max(r["end"] for r in res) - min(r["start"] for r in res)
            tokens = sum(r["n"] for r in res)
            checks["requests_sent"] += n_req
            checks["requests_completed"] += len(res)
            checks["token_mismatches"] += sum(r["n"] != args.output_len for r in res)
            d = {k: after[k] - before[k] for k in ("steps", "decode_steps", "prefill_steps", "mixed_steps", "decode_rows",
                                                   "padded_rows", "forward_s", "sample_s", "step_s",
                                                   "forward_cpu_s", "sample_cpu_s", "step_cpu_s")}
            steps = max(1, d["steps"])
            overhead = d["step_s"] - d["forward_s"] - d["sample_s"]
            sched[str(c)] = {**d, "forward_ms_per_step": 1e3 * d["forward_s"] / steps,
                             "sample_ms_per_step": 1e3 * d["sample_s"] / steps,
                             "overhead_ms_per_step": 1e3 * overhead / steps,
                             "forward_cpu_ms_per_step": 1e3 * d["forward_cpu_s"] / steps,
                             "overhead_cpu_ms_per_step": 1e3 * (d["step_cpu_s"] - d["forward_cpu_s"]
                                                                - d["sample_cpu_s"]) / steps,
                             "overhead_fraction_of_step": overhead / max(1e-9, d["step_s"]),
                             # decode rows ride in decode steps and in mixed steps (prompts arriving)
                             "mean_decode_batch": d["decode_rows"] / max(1, d["decode_steps"] + d["mixed_steps"])}
            ttft = [r["ttft"] * 1e3 for r in res]
            tpot = [r["tpot"] * 1e3 for r in res if r["n"] > 1]
            rows.append({"scenario": "engine-tiny-closed-loop", "concurrency": c, "requests": len(res),
                         "input_len": args.input_len, "output_len": args.output_len,
                         "output_tok_s": tokens / window, "ttft_ms_p50": _pct(ttft, 50), "ttft_ms_p99": _pct(ttft, 99),
                         "tpot_ms_p50": _pct(tpot, 50), "tpot_ms_p99": _pct(tpot, 99),
                         "bytes_per_output_token": sum(r["bytes"] for r in res) / max(1, tokens),
                         "clients": 1, "workers": 1, "window_s": window,
                         "scheduler_overhead_ms_per_step": sched[str(c)]["overhead_ms_per_step"],
                         "forward_ms_per_step": sched[str(c)]["forward_ms_per_step"],
                         "scheduler_overhead_cpu_ms_per_step": sched[str(c)]["overhead_cpu_ms_per_step"],
                         "forward_cpu_ms_per_step": sched[str(c)]["forward_cpu_ms_per_step"],
                         "mean_tpot_ms": statistics.fmean(tpot) if tpot else float("nan")})
    checks["exact_tokens"] = checks["token_mismatches"] == 0 and checks["requests_completed"] == checks["requests_sent"]
    return {"rows": rows, "scheduler": sched, "checks": checks}


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--concurrency", type=int, nargs="+", default=[1, 16], help="concurrency levels to measure")
    p.add_argument("--input-len", type=int, default=32, help="prompt tokens per request")
    p.add_argument("--output-len", type=int, default=64, help="output tokens per request")
    p.add_argument("--requests-per-client", type=int, default=3, help="requests per concurrent stream at each level")
    p.add_argument("--min-requests", type=int, default=6, help="at least this many requests per level")
    p.add_argument("--torch-threads", type=int, default=1, help="torch threads of the engine process")
    p.add_argument("--out", type=Path, default=None,
                   help="record directory (default: $NETRA_RUN_DIR/records; results/serving to keep it)")
    p.add_argument("--stem", default="engine-tiny-cpu", help="record file name (without .json)")
    p.add_argument("--no-record", action="store_true", help="print only; write no record")


def cli(args: argparse.Namespace) -> int:
    result = run(args)
    result["in_process"] = in_process(args)
    for r in result["rows"]:
        print(f"C={r['concurrency']:>3}  {r['output_tok_s']:8.1f} out tok/s  TTFT p50 {r['ttft_ms_p50']:7.1f} ms  "
              f"TPOT p50 {r['tpot_ms_p50']:6.1f} ms  step: forward {r['forward_ms_per_step']:.2f} ms, "
              f"scheduler overhead {r['scheduler_overhead_ms_per_step']:.2f} ms (CPU: forward "
              f"{r['forward_cpu_ms_per_step']:.2f}, overhead {r['scheduler_overhead_cpu_ms_per_step']:.2f} ms)")
    for c, r in result["in_process"].items():
        print(f"in-process C={c:>3}  {r['output_tok_s']:8.1f} out tok/s  forward {r['forward_ms_per_step']:.2f} ms/step, "
              f"sampling {r['sample_ms_per_step']:.2f}, scheduler overhead {r['overhead_ms_per_step']:.3f} ms/step; "
              f"CPU time: forward {r['forward_cpu_ms_per_step']:.2f}, overhead {r['overhead_cpu_ms_per_step']:.3f} ms/step, "
              f"{r['output_tok_per_cpu_s']:.0f} tok per CPU-second")
    result["checks"]["in_process_exact_tokens"] = all(r["exact_tokens"] for r in result["in_process"].values())
    print("checks:", result["checks"])
    if args.no_record:
        return 0
    import os

    record = {"kind": "serving", "family": "engine-tiny", "target": "cpu", "device": host_device(),
              "cpu_count": os.cpu_count(), "git_sha": git_sha(), "date": utc_now(),
              "command": shlex.join(["netra", *sys.argv[1:]]) if sys.argv[1:3] == ["bench", "engine"]
              else "netra bench engine (programmatic)",
              "status": "measured", "rows": result["rows"], "scheduler": result["scheduler"],
              "scheduler_in_process": result["in_process"],
              "checks": result["checks"], "verdict": "info" if result["checks"]["exact_tokens"] else "rejected",
              "notes": "client and engine share the machine's cores (and, here, other engineers' jobs); "
                       "forward = model forward incl. logits; overhead = step time outside forward and sampling"}
    path = write_record(record, args.out or settings.records_dir(), args.stem)
    print("record:", path)
    return 0


def main(argv: list[str] | None = None) -> int:
    from netra.cli import run_module

    return run_module("netra bench engine", __doc__, add_arguments, cli, argv)


if __name__ == "__main__":
    sys.exit(main())
