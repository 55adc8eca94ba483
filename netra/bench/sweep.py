"""`netra bench sweep`: the serving benchmark over concurrencies (and client counts), with a plot.

Each point runs against one upstream: ``--url`` (a running deployment), ``--profile`` (a fresh
`netra launch --profile P --detach` per point, stopped with `netra stop` afterwards) or
``--synthetic-rate`` (a fresh synthetic upstream per point; the instrument check). Points run in
order; with ``--repeats N`` the grid is repeated with the order reversed every other pass (ABBA
across the grid), so slow drift of a shared machine does not line up with one setting. One record
(all rows, every point's exact checks) and a PNG (throughput and TPOT against concurrency) land
under ``results/serving/``.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as _dt
import json
import random
import shlex
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from netra import settings
from netra.bench import serve


@dataclass(frozen=True)
class Upstream:
    url: str
    info_url: str | None
    workers: int
    run_dir: Path | None
    launch: dict[str, Any] | None = None  # identity of a launched deployment (profile and plan hashes)


def _ports_free(ports: list[int]) -> bool:
    for port in ports:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                return False
    return True


def free_port_block(count: int) -> int:
    """A base port with ``count`` consecutive free loopback ports (checked by binding each)."""
    rng = random.Random()
    for _ in range(200):
        base = rng.randrange(20000, 60000 - count)
        if _ports_free(list(range(base, base + count))):
            return base
    raise serve.BenchError(f"no block of {count} free loopback ports found")


@contextlib.contextmanager
def launched(profile: str, sets: list[str], work: Path, timeout_s: float = 900.0) -> Iterator[Upstream]:
    """`netra launch --profile P --detach` on free ports; yields the front; always `netra stop`s it."""
    work.mkdir(parents=True, exist_ok=True)
    run_dir = work / f"launch-{time.strftime('%H%M%S')}-{random.randrange(1 << 16):04x}"
    base = free_port_block(65)
    cmd = [sys.executable, "-m", "netra", "launch", "--profile", profile, "--front-port", str(base),
           "--port-base", str(base + 1), "--run-dir", str(run_dir), "--detach"]
    for item in sets:
        cmd += ["--set", item]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s, check=False)
        if proc.returncode != 0:
            raise serve.BenchError(f"{shlex.join(cmd[2:])} failed ({proc.returncode}):\n"
                                   f"{(proc.stdout + proc.stderr)[-3000:]}")
        rec = json.loads((run_dir / "launch.json").read_text())
        workers = rec["workers"]
        ident = {"profile": rec.get("profile_name"), "profile_sha256": rec.get("profile_sha256"),
                 "plan_sha256": rec.get("plan_sha256"), "set_overrides": rec.get("set_overrides"),
                 "run_dir": str(run_dir)}
        yield Upstream(url=rec["front"]["url"], info_url=workers[0]["engine_url"] if workers else None,
                       workers=len(workers), run_dir=run_dir, launch=ident)
    finally:
        if (run_dir / "launch.json").exists():
            subprocess.run([sys.executable, "-m", "netra", "stop", "--run-dir", str(run_dir)], capture_output=True,
                           timeout=120, check=False)


@contextlib.contextmanager
def synthetic_upstream(args: argparse.Namespace, work: Path) -> Iterator[Upstream]:
    from netra.bench import synthetic

    cfg = synthetic.Config(rate=args.synthetic_rate, ttft_ms=args.synthetic_ttft_ms,
                           stream_interval=args.synthetic_stream_interval, incremental=args.synthetic_incremental,
                           vocab_size=args.vocab_size or 32000)
    with synthetic.running(cfg, work) as url:
        yield Upstream(url=url, info_url=None, workers=1, run_dir=None)


def upstream(args: argparse.Namespace, work: Path, profile: str | None = None, sets: list[str] | None = None,
             url: str | None = None) -> contextlib.AbstractContextManager[Upstream]:
    """The upstream for one run: a running URL, a fresh launch of a profile, or a fresh synthetic."""
    if url:
        return contextlib.nullcontext(Upstream(url=url.rstrip("/"), info_url=None, workers=0, run_dir=None))
    if profile:
        return launched(profile, sets or [], work)
    return synthetic_upstream(args, work)


def synthetic_ideal(args: argparse.Namespace, concurrency: int, requests: int) -> float | None:
    """Output tok/s a perfect client would see from the synthetic upstream: each stream finishes a
    request every ttft + (O-1)/rate seconds, in ceil(R/C) rounds."""
    if not getattr(args, "synthetic_rate", None):
        return None  # no upstream, or burst mode (rate 0): no pacing, no ideal
    per_req = args.synthetic_ttft_ms / 1000.0 + (args.output_len - 1) / args.synthetic_rate
    rounds = -(-requests // concurrency)
    return requests * args.output_len / (rounds * per_req)


def add_upstream_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--synthetic-rate", type=float, default=None,
                   help="synthetic upstream: tokens/s per request (the instrument check)")
    p.add_argument("--synthetic-ttft-ms", type=float, default=0.0,
                   help="synthetic upstream: milliseconds before the first token")
    p.add_argument("--synthetic-stream-interval", type=int, default=1, help="synthetic upstream: tokens per event")
    p.add_argument("--synthetic-incremental", action="store_true",
                   help="synthetic upstream: send only new output_ids per event")


def add_arguments(p: argparse.ArgumentParser) -> None:
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--url", help="a running deployment")
    src.add_argument("--profile", help="launch this profile fresh for every point")
    src.add_argument("--synthetic", action="store_true", help="a fresh synthetic upstream per point")
    p.add_argument("--set", dest="sets", action="append", default=[], metavar="KEY=VALUE",
                   help="profile override passed to netra launch (repeatable)")
    p.add_argument("--concurrencies", default="1,2,4,8", help="comma-separated concurrencies")
    p.add_argument("--clients-list", default=None, help="comma-separated client counts (default --clients)")
    p.add_argument("--rounds", type=int, default=None,
                   help="requests per point = ROUNDS x concurrency (default: --requests)")
    p.add_argument("--repeats", type=int, default=1, help="passes over the grid (order reversed every other)")
    p.add_argument("--plot", type=Path, default=None, help="PNG path (default next to the record)")
    add_upstream_arguments(p)
    serve.add_load_arguments(p, sweep=True)


def _ints(text: str, name: str) -> list[int]:
    try:
        vals = [int(x) for x in text.split(",") if x.strip()]
    except ValueError as exc:
        raise serve.BenchError(f"--{name} {text!r}: expected comma-separated integers") from exc
    if not vals or min(vals) < 1:
        raise serve.BenchError(f"--{name} {text!r}: expected positive integers")
    return vals


def run_sweep(args: argparse.Namespace) -> tuple[dict[str, Any], Path | None, Path | None]:
    from netra.records import git_sha, host_device, utc_now, write_record

    if args.synthetic and args.synthetic_rate is None:
        raise serve.BenchError("--synthetic needs --synthetic-rate (0: burst mode)")
    concs = _ints(args.concurrencies, "concurrencies")
    ks = _ints(args.clients_list, "clients-list") if args.clients_list else [args.clients]
    if args.clients_list:
        grid = [(c, k) for c in concs for k in ks if k <= c]  # a client needs at least one stream
    else:
        grid = [(c, min(args.clients, c)) for c in concs]
    skipped = [(c, k) for c in concs for k in ks if k > c] if args.clients_list else []
    if skipped:
        print(f"skipping points with more clients than streams: {skipped}", flush=True)
    stamp = _dt.datetime.now(_dt.UTC).strftime("%Y%m%dT%H%M%S")
    work = args.work_dir or (settings.run_dir() / "bench" / f"sweep-{stamp}")
    rows: list[dict[str, Any]] = []
    checks: dict[str, Any] = {"points": 0, "points_passed": 0}
    for rep in range(args.repeats):
        order = grid if rep % 2 == 0 else grid[::-1]
        for c, k in order:
            with upstream(args, work, profile=args.profile, sets=args.sets, url=args.url) as up:
                base = serve.config_from_args(args, url=up.url, concurrency=c)
                requests = args.rounds * c if args.rounds else base.requests
                workers = up.workers or base.workers
                requests = max(workers, requests - requests % workers)
                cfg = replace(base, clients=k, requests=requests, workers=workers,
                              info_url=base.info_url or up.info_url, record=False,
                              work_dir=work / f"rep{rep}-c{c}-k{k}")
                result = serve.run_bench(cfg)
            checks["points"] += 1
            if not result.passed:
                serve.print_failures(result)
                raise serve.BenchError(f"point C={c} K={k} (repeat {rep}) failed its exact checks")
            checks["points_passed"] += 1
            assert result.row is not None
            row = {**result.row, "repeat": rep, "ideal_output_tok_s": synthetic_ideal(args, c, requests),
                   "checks": result.checks, "launch": up.launch}
            rows.append(row)
            print(f"C={c:>5} K={k:>2} rep {rep}: {row['output_tok_s']:10.2f} output tok/s, "
                  f"TPOT p50 {row['tpot_ms_p50']:.2f} ms, TTFT p50 {row['ttft_ms_p50']:.2f} ms", flush=True)
    scenario = args.scenario or ("synthetic" if args.synthetic else (args.profile or "url")) + \
        f"-{args.api}-i{args.input_len}-o{args.output_len}"
    record: dict[str, Any] = {
        "kind": "serving", "family": scenario, "target": args.target, "device": host_device(),
        "git_sha": git_sha(), "date": utc_now(), "command": shlex.join(["netra", "bench", "sweep", *sys.argv[3:]])
        if sys.argv[1:3] == ["bench", "sweep"] else "netra bench sweep (programmatic)",
        "status": "measured", "rows": rows, "checks": checks, "verdict": "info",
        "upstream": {"url": args.url, "profile": args.profile, "sets": args.sets,
                     "synthetic_rate": args.synthetic_rate if args.synthetic else None},
    }
    if len(ks) == 2 and args.repeats >= 3:
        record["clients_comparison"] = compare_clients(rows, ks, concs)
        for c, v in record["clients_comparison"].items():
            print(f"C={c}: K={ks[1]} vs K={ks[0]}: {v['mean_b']:.2f} vs {v['mean_a']:.2f} output tok/s "
                  f"({100 * (v['rel_diff'] or 0):+.2f}%), 95% CI [{v['ci95'][0]:.2f}, {v['ci95'][1]:.2f}], "
                  f"permutation p {v['permutation']['p']:.3f}: K={ks[1]} is {v['verdict']}", flush=True)
    path = png = None
    if not args.no_record:
        stem = f"bench-sweep-{scenario}-{stamp}"
        out = args.results_dir or settings.records_dir()
        path = write_record(record, out, stem)
        from netra.bench.plot import plot_sweep

        png = plot_sweep(rows, args.plot or out / f"{stem}.png", f"{scenario}  ({stamp})",
                         split_by_clients=bool(args.clients_list))
    elif args.plot:
        from netra.bench.plot import plot_sweep

        png = plot_sweep(rows, args.plot, scenario, split_by_clients=bool(args.clients_list))
    return record, path, png


def compare_clients(rows: list[dict[str, Any]], ks: list[int], concs: list[int]) -> dict[str, Any]:
    """Per concurrency: output tok/s with ks[1] clients (arm B) against ks[0] clients (arm A), over
    the repeats, with the A/B gate's statistics (the instrument check)."""
    from netra.bench import stats

    out: dict[str, Any] = {}
    for c in concs:
        a = [r["output_tok_s"] for r in rows if r["concurrency"] == c and r["clients"] == ks[0]]
        b = [r["output_tok_s"] for r in rows if r["concurrency"] == c and r["clients"] == ks[1]]
        if len(a) >= 2 and len(b) >= 2:
            out[str(c)] = {"clients_a": ks[0], "clients_b": ks[1], **stats.verdict(a, b)}
    return out


def print_table(rows: list[dict[str, Any]]) -> None:
    """The sweep's final table: one line per point, the figures `vllm bench serve` and
    `sglang.bench_serving` report (milliseconds)."""
    from rich.console import Console
    from rich.table import Table

    t = Table(title="netra bench sweep")
    cols = [("C", "concurrency", "{:d}"), ("K", "clients", "{:d}"), ("rep", "repeat", "{:d}"),
            ("out tok/s", "output_tok_s", "{:.1f}"), ("req/s", "req_s", "{:.2f}"),
            ("goodput req/s", "goodput_req_s", "{:.2f}"), ("TTFT p50", "ttft_ms_p50", "{:.1f}"),
            ("TTFT p99", "ttft_ms_p99", "{:.1f}"), ("TPOT p50", "tpot_ms_p50", "{:.2f}"),
            ("TPOT p99", "tpot_ms_p99", "{:.2f}"), ("ITL p95", "itl_ms_p95", "{:.2f}"), ("ITL max", "itl_ms_max", "{:.1f}")]
    for head, _, _ in cols:
        t.add_column(head, justify="right")
    for r in sorted(rows, key=lambda r: (r["concurrency"], r["clients"], r.get("repeat", 0))):
        t.add_row(*("-" if r.get(key) is None else fmt.format(r[key]) for _, key, fmt in cols))
    Console().print(t)


def main(args: argparse.Namespace) -> int:
    from netra.bench import barrier

    try:
        record, path, png = run_sweep(args)
        print_table(record["rows"])
    except (serve.BenchError, barrier.BarrierError) as exc:
        print(f"netra bench sweep: {exc}", file=sys.stderr)
        return 1
    if path:
        print(f"record: {path}")
    if png:
        print(f"plot: {png}")
    return 0
