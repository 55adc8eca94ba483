"""`netra bench compare`: arm A (control) against arm B (candidate), ABBA order, statistical verdict.

Each arm is a running URL (``--a-url``), a profile launched fresh for every run (``--a-profile P``
with ``--a-set KEY=VALUE`` overrides, through `netra launch --detach` / `netra stop`), or a server
command launched fresh for every run (``--a-cmd 'python -m ... --port {port}'``; the run waits for
``GET /health`` on ``http://127.0.0.1:{port}``). Runs go A B B A A B B A ... (``--runs`` per arm,
at least 3), so a drifting machine hurts both arms alike; every run passes the exact checks or the
comparison stops. The metric (default output tok/s) of the runs of each arm feeds Welch's t, an
exact permutation test and the 95% interval of mean(B) - mean(A); the verdict rule is in
`netra.bench.stats`. One record with every run and the verdict lands under ``results/serving/``.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as _dt
import os
import shlex
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

from netra import settings
from netra.bench import serve, sweep

METRICS = {  # name -> higher is better
    "output_tok_s": True, "total_tok_s": True, "req_s": True,
    "ttft_ms_p50": False, "ttft_ms_p99": False, "tpot_ms_p50": False, "tpot_ms_p99": False,
    "itl_ms_p50": False, "e2e_ms_p50": False, "bytes_per_output_token": False,
}


def abba(runs: int) -> list[str]:
    """A B B A A B B A ...: ``runs`` of each arm, alternating which goes first in each pair."""
    order: list[str] = []
    for i in range(runs):
        order += ["A", "B"] if i % 2 == 0 else ["B", "A"]
    return order


@contextlib.contextmanager
def command_upstream(template: str, work: Path, timeout_s: float = 600.0) -> Iterator[sweep.Upstream]:
    """Start ``template`` (with ``{port}`` filled by a free port) in its own process group; wait for
    /health; always stop the whole group afterwards."""
    import httpx

    port = sweep.free_port_block(1)
    cmd = template.format(port=port)
    work.mkdir(parents=True, exist_ok=True)
    log = (work / f"arm-{port}.log").open("ab")
    proc = subprocess.Popen(cmd, shell=True, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + timeout_s
        while True:
            if proc.poll() is not None:
                raise serve.BenchError(f"arm command exited with {proc.returncode} before serving: {cmd} "
                                       f"(log {log.name})")
            try:
                if httpx.get(url + "/health", timeout=2.0).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                raise serve.BenchError(f"arm command not healthy after {timeout_s:.0f} s: {cmd}")
            time.sleep(0.2)
        yield sweep.Upstream(url=url, info_url=None, workers=0, run_dir=None)
    finally:
        _stop_group(proc)
        log.close()


def _stop_group(proc: subprocess.Popen[bytes], timeout_s: float = 30.0) -> None:
    """SIGTERM the command's whole process group (the shell and what it started), wait until every
    member is gone, SIGKILL what is left after ``timeout_s``."""
    def group_alive() -> bool:
        try:
            os.killpg(proc.pid, 0)
        except ProcessLookupError:
            return False
        return True

    if group_alive():
        os.killpg(proc.pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout_s
    while group_alive() and time.monotonic() < deadline:
        proc.poll()  # reap the shell so it does not linger as a zombie member
        time.sleep(0.05)
    if group_alive():
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(timeout=timeout_s)


def arm_upstream(args: argparse.Namespace, arm: str, work: Path) -> contextlib.AbstractContextManager[sweep.Upstream]:
    a = arm.lower()
    url, profile, cmd = getattr(args, f"{a}_url"), getattr(args, f"{a}_profile"), getattr(args, f"{a}_cmd")
    if cmd:
        return command_upstream(cmd, work)
    if profile:
        return sweep.launched(profile, getattr(args, f"{a}_sets"), work)
    if url:
        return sweep.upstream(args, work, url=url)
    if args.synthetic_rate is not None:
        return sweep.synthetic_upstream(args, work)
    raise serve.BenchError(f"arm {arm}: give --{a}-url, --{a}-profile or --{a}-cmd")


def add_arguments(p: argparse.ArgumentParser) -> None:
    for arm, what in (("a", "control"), ("b", "candidate")):
        p.add_argument(f"--{arm}-name", default=arm.upper(), help=f"label of arm {arm.upper()} ({what})")
        p.add_argument(f"--{arm}-url", default=None, help="a running server (no fresh process per run)")
        p.add_argument(f"--{arm}-profile", default=None, help="profile launched fresh for every run")
        p.add_argument(f"--{arm}-set", dest=f"{arm}_sets", action="append", default=[], metavar="KEY=VALUE",
                       help="override for this arm's profile (repeatable)")
        p.add_argument(f"--{arm}-cmd", default=None, help="server command launched fresh per run; {port} is "
                                                          "replaced by a free port")
    p.add_argument("--runs", type=int, default=4, help="runs per arm (>= 3), in ABBA order")
    p.add_argument("--metric", choices=sorted(METRICS), default="output_tok_s", help="the metric the verdict is on")
    p.add_argument("--concurrency", "-C", type=int, default=8, help="global concurrent requests of every run")
    sweep.add_upstream_arguments(p)
    serve.add_load_arguments(p, sweep=True)


def run_compare(args: argparse.Namespace) -> tuple[dict[str, Any], Path | None]:
    from netra.bench import stats
    from netra.records import git_sha, host_device, utc_now, write_record

    if args.runs < 3:
        raise serve.BenchError(f"--runs must be >= 3 per arm, got {args.runs}")
    stamp = _dt.datetime.now(_dt.UTC).strftime("%Y%m%dT%H%M%S")
    work = args.work_dir or (settings.run_dir() / "bench" / f"compare-{stamp}")
    rows: list[dict[str, Any]] = []
    values: dict[str, list[float]] = {"A": [], "B": []}
    fresh = {arm: not getattr(args, f"{arm.lower()}_url") for arm in "AB"}
    for i, arm in enumerate(abba(args.runs)):
        with arm_upstream(args, arm, work) as up:
            base = serve.config_from_args(args, url=up.url)
            workers = up.workers or base.workers
            cfg = replace(base, workers=workers, requests=max(workers, base.requests - base.requests % workers),
                          info_url=base.info_url or up.info_url, record=False, work_dir=work / f"run{i:02d}-{arm}")
            result = serve.run_bench(cfg)
        if not result.passed:
            serve.print_failures(result)
            raise serve.BenchError(f"run {i} (arm {arm}) failed its exact checks; no verdict")
        assert result.row is not None
        value = result.row[args.metric]
        if value is None:
            raise serve.BenchError(f"run {i} (arm {arm}) has no {args.metric}")
        values[arm].append(float(value))
        rows.append({**result.row, "run": i, "arm": arm, "arm_name": getattr(args, f"{arm.lower()}_name"),
                     "checks": result.checks, "launch": up.launch})
        print(f"run {i:2d} arm {arm}: {args.metric} = {value:.3f}", flush=True)
    v = stats.verdict(values["A"], values["B"], higher_is_better=METRICS[args.metric])
    # The same gate on every other metric, for the record (the verdict is on --metric alone).
    others: dict[str, Any] = {}
    for name, higher in METRICS.items():
        a = [r[name] for r in rows if r["arm"] == "A" and r.get(name) is not None]
        b = [r[name] for r in rows if r["arm"] == "B" and r.get(name) is not None]
        if name != args.metric and len(a) == len(values["A"]) and len(b) == len(values["B"]):
            try:
                o = stats.verdict(a, b, higher_is_better=higher)
            except stats.StatsError:
                continue
            others[name] = {k: o[k] for k in ("verdict", "mean_a", "mean_b", "diff", "rel_diff", "ci95")} | {
                "permutation_p": o["permutation"]["p"], "welch_p": o["welch"]["p"]}
    record_verdict = {"better": "accepted", "worse": "rejected", "indistinguishable": "inconclusive"}[v["verdict"]]
    arms = {arm: {"name": getattr(args, f"{arm.lower()}_name"), "url": getattr(args, f"{arm.lower()}_url"),
                  "profile": getattr(args, f"{arm.lower()}_profile"), "sets": getattr(args, f"{arm.lower()}_sets"),
                  "cmd": getattr(args, f"{arm.lower()}_cmd"), "fresh_process_per_run": fresh[arm],
                  "values": values[arm]} for arm in "AB"}
    scenario = args.scenario or f"compare-{args.api}-i{args.input_len}-o{args.output_len}-c{args.concurrency}"
    record: dict[str, Any] = {
        "kind": "serving", "family": scenario, "target": args.target, "device": host_device(), "git_sha": git_sha(),
        "date": utc_now(), "command": shlex.join(["netra", *sys.argv[1:]]) if sys.argv[1:3] == ["bench", "compare"]
        else "netra bench compare (programmatic)",
        "status": "measured", "rows": rows, "verdict": record_verdict,
        "checks": {"runs": len(rows), "runs_passed_exact_checks": len(rows), "order": "".join(abba(args.runs))},
        "comparison": {"metric": args.metric, "arms": arms, **v, "other_metrics": others},
    }
    path = None
    if not args.no_record:
        path = write_record(record, args.results_dir or settings.records_dir(), f"bench-{scenario}-{stamp}")
    return record, path


def print_verdict(record: dict[str, Any]) -> None:
    from rich.console import Console
    from rich.table import Table

    c = record["comparison"]
    t = Table(title=f"netra bench compare — {c['metric']} ({'higher' if c['higher_is_better'] else 'lower'} is better)")
    for col in ("arm", "name", "runs", "mean", "sd", "values"):
        t.add_column(col)
    for arm in "AB":
        a = c["arms"][arm]
        t.add_row(arm, a["name"], str(len(a["values"])), f"{c['mean_' + arm.lower()]:.3f}",
                  f"{c['sd_' + arm.lower()]:.3f}", ", ".join(f"{x:.2f}" for x in a["values"]))
    console = Console()
    console.print(t)
    lo, hi = c["ci95"]
    rel = f" ({100 * c['rel_diff']:+.2f}%)" if c["rel_diff"] is not None else ""
    console.print(f"B - A = {c['diff']:.3f}{rel}, 95% CI [{lo:.3f}, {hi:.3f}]; Welch t = {c['welch']['t']:.3f} "
                  f"(df {c['welch']['df']:.1f}, p {c['welch']['p']:.4f}); exact permutation p = "
                  f"{c['permutation']['p']:.4f} over {c['permutation']['splits']} splits")
    console.print(f"[bold]verdict: B is {c['verdict']}[/] than A" if c["verdict"] != "indistinguishable"
                  else "[bold]verdict: indistinguishable[/]")
    console.print(f"rule: {c['rule']}", markup=False)
    for name, o in c.get("other_metrics", {}).items():
        rel = f"{100 * o['rel_diff']:+.2f}%" if o["rel_diff"] is not None else "-"
        console.print(f"  {name}: A {o['mean_a']:.3f}, B {o['mean_b']:.3f} ({rel}), 95% CI "
                      f"[{o['ci95'][0]:.3f}, {o['ci95'][1]:.3f}], permutation p {o['permutation_p']:.3f}: "
                      f"{o['verdict']}", markup=False)


def main(args: argparse.Namespace) -> int:
    from netra.bench import barrier, stats

    try:
        record, path = run_compare(args)
    except (serve.BenchError, barrier.BarrierError, stats.StatsError) as exc:
        print(f"netra bench compare: {exc}", file=sys.stderr)
        return 1
    print_verdict(record)
    if path:
        print(f"record: {path}")
    return 0
