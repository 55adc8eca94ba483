"""`netra bench serve`: synchronized multi-process serving load generator with exact token checks.

K client processes (``python -m netra.bench.client``), each with its own event loop and pooled
connections, prepare their share of a deterministic token-ID corpus, open their connections,
announce readiness on a filesystem barrier and start together. Each streams C/K concurrent requests
and logs one record per request; the parent shows progress, runs the exact checks (completed ==
requested, prompt_tokens == I, completion_tokens == O, cached_tokens == 0, finish reason length, no
errors; each failure names the request) and summarizes over one global window. A run that fails a
check writes no serving record and exits 1; its raw records stay in the work directory.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import os
import shlex
import shutil
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from netra import settings
from netra.bench import barrier, datasets


class BenchError(RuntimeError):
    pass


@dataclass
class BenchConfig:
    url: str
    api: str = "native"
    clients: int = 1
    concurrency: int = 8
    requests: int = 64
    input_len: int = 128
    output_len: int = 64
    stream_interval: int | None = None
    workers: int = 1
    seed: int = 0
    vocab_size: int | None = None
    info_url: str | None = None  # where /model_info is read (default url)
    token_range: str | None = None  # "LOW:HIGH"
    avoid_ids: list[int] = field(default_factory=list)
    temperature: float = 0.0
    model: str | None = None
    continuous_usage: bool = True
    timeout_s: float = 600.0
    warmup: int = 0
    scenario: str | None = None
    target: str = "cpu"
    record: bool = True  # write a result record
    results_dir: Path | None = None  # where (None: $NETRA_RUN_DIR/records)
    work_dir: Path | None = None
    warm_path: str = "/health"
    client_cpus: list[int] = field(default_factory=list)  # pin client k to client_cpus[k % n]
    progress: bool = True
    load: datasets.LoadSpec = field(default_factory=datasets.LoadSpec)  # dataset and arrivals
    slo: dict[str, float] = field(default_factory=dict)  # goodput objectives (ms)

    def scenario_name(self) -> str:
        return self.scenario or f"{self.api}-i{self.input_len}-o{self.output_len}"

    def command(self) -> str:
        """The `netra bench serve` command line that reproduces this run."""
        d = BenchConfig(url=self.url)
        parts = ["netra", "bench", "serve", "--url", self.url]
        for name in ("api", "clients", "concurrency", "requests", "input_len", "output_len", "stream_interval",
                     "workers", "seed", "vocab_size", "info_url", "token_range", "temperature", "model", "timeout_s",
                     "warmup", "scenario", "target", "warm_path"):
            val = getattr(self, name)
            if val is not None and val != getattr(d, name):
                parts += [f"--{name.replace('_', '-')}", str(val)]
        if self.avoid_ids:
            parts += ["--avoid-ids", ",".join(map(str, self.avoid_ids))]
        if self.client_cpus:
            parts += ["--client-cpus", ",".join(map(str, self.client_cpus))]
        d_load = datasets.LoadSpec()
        for name in ("dataset", "range_ratio", "prefix_len", "num_prefixes", "dataset_path", "request_rate",
                     "burstiness"):
            val = getattr(self.load, name)
            if val != getattr(d_load, name):
                parts += [f"--{name.replace('_', '-')}", str(val)]
        if self.slo:
            parts += ["--slo", ",".join(f"{k}={v:g}" for k, v in self.slo.items())]
        if not self.continuous_usage:
            parts.append("--no-continuous-usage")
        if not self.record:
            parts.append("--no-record")
        elif self.results_dir is not None:
            parts += ["--results-dir", str(self.results_dir)]
        return shlex.join(parts)


@dataclass
class BenchResult:
    config: BenchConfig
    records: list[dict[str, Any]]
    checks: dict[str, Any]
    failures: list[str]
    summary: dict[str, Any] | None
    row: dict[str, Any] | None
    record: dict[str, Any] | None
    record_path: Path | None
    work_dir: Path

    @property
    def passed(self) -> bool:
        return not self.failures


def _get_json(url: str, path: str) -> dict[str, Any] | None:
    import httpx

    try:
        resp = httpx.get(url.rstrip("/") + path, timeout=10.0)
    except httpx.HTTPError:
        return None
    if resp.status_code != 200:
        return None
    try:
        data = resp.json()
    except ValueError:
        return None
    return data if isinstance(data, dict) else None


def resolve_vocab(cfg: BenchConfig) -> tuple[int, list[int]]:
    """Vocabulary size and IDs to avoid: flags first, else the worker's /model_info."""
    src = cfg.info_url or cfg.url
    info = _get_json(src, "/model_info") or {}
    vocab = cfg.vocab_size or info.get("vocab_size")
    if not isinstance(vocab, int):
        raise BenchError(f"{src}/model_info reports no vocab_size; pass --vocab-size (or --info-url WORKER_URL)")
    avoid = set(cfg.avoid_ids)
    for key in ("eos_token_id", "eos_token_ids", "special_token_ids", "bos_token_id", "pad_token_id"):
        val = info.get(key)
        if isinstance(val, int):
            avoid.add(val)
        elif isinstance(val, list):
            avoid.update(v for v in val if isinstance(v, int))
    return vocab, sorted(avoid)


def client_paths() -> dict[str, str]:
    from netra.bench.client import PATHS

    return PATHS


def resolve_model(cfg: BenchConfig) -> str:
    if cfg.model:
        return cfg.model
    data = _get_json(cfg.url, "/v1/models") or {}
    models = data.get("data") or []
    if not models or not isinstance(models[0], dict) or "id" not in models[0]:
        raise BenchError(f"{cfg.url}/v1/models lists no model; pass --model")
    return str(models[0]["id"])


def _model_text(cfg: BenchConfig) -> Any:
    """The model's tokenizer and chat template, as the response layer loads them from /model_info."""
    from netra.serve.tokenizer import load_for_worker
    from netra.web.errors import OpenAIError

    src = cfg.info_url or cfg.url
    info = _get_json(src, "/model_info")
    if info is None:
        raise BenchError(f"{src}/model_info is not available: --api chat and --dataset sharegpt need the model's "
                         "tokenizer (pass --info-url WORKER_URL)")
    try:
        return load_for_worker(info)
    except OpenAIError as exc:
        raise BenchError(f"cannot load the model's tokenizer: {exc.message}") from exc


def build_items(cfg: BenchConfig, vocab: int, avoid: list[int], low: int, high: int | None) -> list[dict[str, Any]]:
    """The requests (prompt, exact expected lengths, arrival offset) in arrival order."""
    from netra.bench import corpus

    cspec = corpus.CorpusSpec(requests=cfg.requests, input_len=cfg.input_len, vocab_size=vocab, workers=cfg.workers,
                              seed=cfg.seed, low=low, high=high, avoid_ids=tuple(avoid))
    text = _model_text(cfg) if cfg.api == "chat" or cfg.load.dataset == "sharegpt" else None
    chat = None
    if cfg.api == "chat":
        model_text: Any = text

        def chat(t: str) -> list[int]:
            return list(model_text.tokenizer.encode(model_text.chat_template.render([{"role": "user", "content": t}])))
    try:
        items = datasets.build(cfg.load, cspec, cfg.output_len, chat, text.tokenizer if text else None)
    except (corpus.CorpusError, datasets.DatasetError) as exc:
        raise BenchError(str(exc)) from exc
    offsets = datasets.arrivals(len(items), cfg.load.request_rate, cfg.load.burstiness, cfg.seed)
    for j, item in enumerate(items):
        item["arrival"] = None if offsets is None else offsets[j]
    return items


def _warmup(cfg: BenchConfig, spec: dict[str, Any], item: dict[str, Any]) -> None:
    import asyncio

    import httpx

    from netra.bench import client

    async def go() -> None:
        async with httpx.AsyncClient(base_url=cfg.url, timeout=cfg.timeout_s) as http:
            for i in range(cfg.warmup):
                body = client.request_body(spec, item, f"{spec['run_id']}-warmup-{i}")
                rec = await client.one_request(http, spec, -1 - i, body, f"{spec['run_id']}-warmup-{i}")
                if rec["error"]:
                    raise BenchError(f"warm-up request {i} failed: {rec['error']}")

    asyncio.run(go())


def _host_jiffies() -> tuple[int, int] | None:
    """(busy, total) CPU jiffies of the whole host, from /proc/stat."""
    try:
        fields = [int(x) for x in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
    except (OSError, ValueError, IndexError):
        return None
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)
    return sum(fields) - idle, sum(fields)


def _upstream_cpu_s(url: str) -> float | None:
    """The upstream's own CPU seconds, when its /server_info reports ``cpu_s`` (the synthetic does)."""
    info = _get_json(url, "/server_info") or {}
    return float(info["cpu_s"]) if isinstance(info.get("cpu_s"), int | float) else None


def _cpu_usage(host_before: tuple[int, int] | None, host_after: tuple[int, int] | None, up_before: float | None,
               up_after: float | None, outs: list[Path]) -> dict[str, Any]:
    """Busy fractions over the run: clients and upstream in cores (1.0 = one core fully busy), the
    host as the fraction of all its cores."""
    import orjson

    clients = []
    t0 = t1 = None
    for out in outs:
        path = Path(str(out) + ".stats.json")
        if path.exists():
            st = orjson.loads(path.read_bytes())
            wall = st["t_done"] - st["t_release"]
            t0 = st["t_release"] if t0 is None else min(t0, st["t_release"])
            t1 = st["t_done"] if t1 is None else max(t1, st["t_done"])
            clients.append({"client": st["client"], "cpu_s": st["cpu_s"], "wall_s": wall, "cpus": st.get("cpus"),
                            "busy": st["cpu_s"] / wall if wall > 0 else None})
    host = None
    if host_before and host_after and host_after[1] > host_before[1]:
        host = (host_after[0] - host_before[0]) / (host_after[1] - host_before[1])
    upstream = None
    if up_before is not None and up_after is not None and t0 is not None and t1 is not None and t1 > t0:
        upstream = (up_after - up_before) / (t1 - t0)
    return {"clients": clients, "host_busy": host, "host_cores": os.cpu_count(), "upstream_busy": upstream}


def _count_lines(path: Path) -> int:
    try:
        with path.open("rb") as fh:
            return sum(chunk.count(b"\n") for chunk in iter(lambda: fh.read(1 << 20), b""))
    except FileNotFoundError:
        return 0


def run_bench(cfg: BenchConfig) -> BenchResult:
    import orjson

    from netra.bench import corpus, summarize
    from netra.records import git_sha, host_device, utc_now, write_record

    if cfg.api not in client_paths():
        raise BenchError(f"--api must be one of {sorted(client_paths())}, got {cfg.api!r}")
    for name in ("clients", "concurrency", "requests", "input_len", "output_len", "workers"):
        if getattr(cfg, name) < 1:
            raise BenchError(f"--{name.replace('_', '-')} must be >= 1, got {getattr(cfg, name)}")
    if cfg.clients > cfg.concurrency:
        raise BenchError(f"--clients ({cfg.clients}) must not exceed --concurrency ({cfg.concurrency})")
    vocab, avoid = resolve_vocab(cfg)
    low, high = 0, None
    if cfg.token_range:
        try:
            low_s, high_s = cfg.token_range.split(":")
            low, high = int(low_s), int(high_s)
        except ValueError as exc:
            raise BenchError(f"--token-range {cfg.token_range!r}: expected LOW:HIGH") from exc
    items = build_items(cfg, vocab, avoid, low, high)
    model = resolve_model(cfg) if cfg.api != "native" else None
    run_id = f"bench-{uuid.uuid4().hex[:10]}"
    work = cfg.work_dir or (settings.run_dir() / "bench" / run_id)
    work.mkdir(parents=True, exist_ok=True)
    bar_dir = work / "barrier"
    if bar_dir.exists():  # a reused work dir: stale ready/release files would start clients unsynchronized
        shutil.rmtree(bar_dir)
    bar_dir.mkdir()
    base_spec: dict[str, Any] = {
        "url": cfg.url, "api": cfg.api, "path": client_paths()[cfg.api],
        "output_len": cfg.output_len, "temperature": cfg.temperature, "model": model,
        "continuous_usage": cfg.continuous_usage, "timeout_s": cfg.timeout_s, "run_id": run_id,
        "barrier": str(bar_dir), "barrier_timeout_s": 600.0, "warm_path": cfg.warm_path,
    }
    if cfg.warmup:
        _warmup(cfg, {**base_spec, "client": -1}, items[0])
    shares = corpus.assign_clients(cfg.requests, cfg.clients)
    concs = corpus.split(cfg.concurrency, cfg.clients)
    procs: list[subprocess.Popen[bytes]] = []
    outs: list[Path] = []
    logs = []
    try:
        for k in range(cfg.clients):
            out = work / f"client-{k}.jsonl"
            out.unlink(missing_ok=True)
            Path(str(out) + ".stats.json").unlink(missing_ok=True)
            outs.append(out)
            spec = {**base_spec, "client": k, "concurrency": concs[k], "out": str(out),
                    "cpus": [cfg.client_cpus[k % len(cfg.client_cpus)]] if cfg.client_cpus else None,
                    "requests": [{"idx": j, **items[j]} for j in shares[k]]}
            spec_path = work / f"client-{k}.spec.json"
            spec_path.write_bytes(orjson.dumps(spec))
            log = (work / f"client-{k}.log").open("wb")
            logs.append(log)
            procs.append(subprocess.Popen([sys.executable, "-m", "netra.bench.client", str(spec_path)],
                                          stdout=log, stderr=subprocess.STDOUT))

        def dead_client() -> str | None:
            for k, p in enumerate(procs):
                if p.poll() is not None:
                    tail = (work / f"client-{k}.log").read_text(errors="replace")[-2000:]
                    return f"client {k} exited with {p.returncode} before the barrier:\n{tail}"
            return None

        # The upstream's CPU is read while nothing is in flight (its GET must not land inside the
        # window, where it would also shift a round-robin front by one); the host's at the start.
        up_before: list[float | None] = []
        start = barrier.release_when_ready(bar_dir, cfg.clients, timeout_s=600.0, alive=dead_client,
                                           on_ready=lambda: up_before.append(_upstream_cpu_s(cfg.url)))
        time.sleep(max(0.0, start - barrier.now()))
        host_before = _host_jiffies()
        _wait_clients(cfg, procs, outs)
        host_after = _host_jiffies()
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait(timeout=10)
        for log in logs:
            log.close()
    cpu = _cpu_usage(host_before, host_after, up_before[0], _upstream_cpu_s(cfg.url), outs)
    bad = [(k, p.returncode) for k, p in enumerate(procs) if p.returncode != 0]
    records = summarize.load_records(outs)
    expect = summarize.Expect(cfg.requests, cfg.input_len, cfg.output_len, cfg.stream_interval,
                              cached_required=cfg.api == "native", cached_zero=cfg.load.dataset != "shared-prefix")
    checks, failures = summarize.check_records(records, expect)
    for k, rc in bad:
        tail = (work / f"client-{k}.log").read_text(errors="replace")[-1500:]
        failures.insert(0, f"client {k} exited with {rc}:\n{tail}")
    checks["passed"] = not failures
    result = BenchResult(cfg, records, checks, failures, None, None, None, None, work)
    if failures:
        return result
    summ = summarize.summarize(records, cfg.slo)
    row = summarize.serving_row(summ, scenario=cfg.scenario_name(), concurrency=cfg.concurrency,
                                requests=cfg.requests, input_len=cfg.input_len, output_len=cfg.output_len,
                                clients=cfg.clients, workers=cfg.workers)
    row["client_cpu_busy_max"] = max((c["busy"] for c in cpu["clients"]), default=None)
    row["host_cpu_busy"] = cpu["host_busy"]
    row["upstream_cpu_busy"] = cpu["upstream_busy"]
    # The worker's effective options (engine, stream interval, loaded code objects) when known.
    server_info = _get_json(cfg.info_url or cfg.url, "/server_info")
    record: dict[str, Any] = {
        "kind": "serving", "family": cfg.scenario_name(), "target": cfg.target,
        "device": (server_info or {}).get("device") or host_device(), "git_sha": git_sha(), "date": utc_now(),
        "command": cfg.command(), "status": "measured", "rows": [row], "checks": checks, "verdict": "info",
        "summary": summ, "api": cfg.api, "url": cfg.url, "stream_interval": cfg.stream_interval,
        "corpus": {"seed": cfg.seed, "vocab_size": vocab, "token_range": [low, high if high is not None else vocab],
                   "avoided_ids": len(avoid), "workers": cfg.workers},
        "load": {**cfg.load.__dict__, "request_rate": str(cfg.load.request_rate), "slo": cfg.slo},
        "client_shares": [{"client": k, "requests": len(shares[k]), "concurrency": concs[k]}
                          for k in range(cfg.clients)],
        "hash_covers": ("sha256 of the output token IDs (int32 LE)" if cfg.api == "native"
                        else "sha256 of the concatenated UTF-8 text deltas"),
        "server_info": server_info, "work_dir": str(work), "cpu": cpu,
    }
    result.summary, result.row, result.record = summ, row, record
    if cfg.record:
        stamp = _dt.datetime.now(_dt.UTC).strftime("%Y%m%dT%H%M%S")
        stem = f"bench-{cfg.scenario_name()}-c{cfg.concurrency}-k{cfg.clients}-{stamp}"
        result.record_path = write_record(record, cfg.results_dir or settings.records_dir(), stem)
    return result


def _wait_clients(cfg: BenchConfig, procs: list[subprocess.Popen[bytes]], outs: list[Path]) -> None:
    deadline = time.monotonic() + cfg.timeout_s + 60.0 * (1 + cfg.requests // max(1, cfg.concurrency))

    def done() -> int:
        return sum(_count_lines(o) for o in outs)

    def alive() -> bool:
        return any(p.poll() is None for p in procs)

    if cfg.progress:
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

        with Progress(TextColumn("[bold]bench[/] {task.description}"), BarColumn(), MofNCompleteColumn(),
                      TimeElapsedColumn(), transient=False) as progress:
            task = progress.add_task(f"C={cfg.concurrency} K={cfg.clients}", total=cfg.requests)
            while alive() and time.monotonic() < deadline:
                progress.update(task, completed=done())
                time.sleep(0.25)
            progress.update(task, completed=done())
    else:
        while alive() and time.monotonic() < deadline:
            time.sleep(0.1)
    if alive():
        raise BenchError(f"clients still running after {deadline:.0f} s; killed")


def print_summary(result: BenchResult) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console()
    s = result.summary
    assert s is not None
    cfg = result.config
    t = Table(title=f"netra bench serve — {cfg.scenario_name()}  C={cfg.concurrency} K={cfg.clients} "
                    f"R={cfg.requests} I={cfg.input_len} O={cfg.output_len}")
    t.add_column("metric")
    t.add_column("value", justify="right")
    t.add_row("window (s)", f"{s['window_s']:.3f}")
    t.add_row("output tok/s", f"{s['output_tok_s']:.2f}")
    t.add_row("total tok/s", f"{s['total_tok_s']:.2f}")
    t.add_row("requests/s", f"{s['req_s']:.3f}")
    bpt = s["bytes_per_output_token"]
    t.add_row("bytes / output token", f"{bpt:.1f}" if bpt is not None else "-")
    tpe = s["tokens_per_event"]
    t.add_row("tokens / event", f"{tpe:.2f}" if tpe is not None else "-")
    cpu = result.record["cpu"] if result.record else None
    if cpu:
        busy = ", ".join(f"{c['busy']:.2f}" for c in cpu["clients"] if c["busy"] is not None)
        t.add_row("client CPU busy (cores)", busy or "-")
        if cpu["host_busy"] is not None:
            t.add_row(f"host CPU busy (of {cpu['host_cores']} cores)", f"{cpu['host_busy']:.2f}")
        if cpu["upstream_busy"] is not None:
            t.add_row("upstream CPU busy (cores)", f"{cpu['upstream_busy']:.2f}")
    good = s.get("goodput")
    if good:
        t.add_row(f"goodput req/s ({', '.join(f'{k}<={v:g}' for k, v in good['slo'].items())})",
                  f"{good['goodput_req_s']:.3f} ({100 * good['good_fraction']:.1f}% of requests)")
    console.print(t)
    lat = Table(title="latency (ms)")
    cols = ("mean", "std", "p50", "p90", "p95", "p99", "max")
    for col in ("", *cols):
        lat.add_column(col, justify="right")
    for name in ("ttft_ms", "tpot_ms", "itl_ms", "e2e_ms", "queue_ms"):
        d = s[name]
        if d["mean"] is None and name == "queue_ms":
            continue  # closed loop: no arrival schedule
        lat.add_row(name.removesuffix("_ms").upper(), *("-" if d[k] is None else f"{d[k]:.2f}" for k in cols))
    console.print(lat)
    c = result.checks
    console.print(f"[green]exact checks passed[/]: {c['requests_completed']}/{c['requests_expected']} requests, "
                  f"{c['prompt_tokens_total']} prompt and {c['completion_tokens_total']} completion tokens, "
                  f"{c['cached_tokens_total']} cached")
    if result.record_path:
        console.print(f"record: {result.record_path}")


def print_failures(result: BenchResult) -> None:
    from rich.console import Console

    console = Console(stderr=True, soft_wrap=True)  # never wrap: each failure stays one greppable line
    console.print(f"[bold red]BENCH FAILED[/]: {len(result.failures)} exact-check failure(s); "
                  f"raw records in {result.work_dir}")
    for line in result.failures[:50]:
        console.print(f"  {line}", style="red", markup=False, highlight=False)
    if len(result.failures) > 50:
        console.print(f"  ... and {len(result.failures) - 50} more")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--url", required=True, help="base URL of a worker, response layer or the nginx front")
    add_load_arguments(p)


def add_load_arguments(p: argparse.ArgumentParser, sweep: bool = False) -> None:
    """The load's arguments, shared by `bench serve`, `bench sweep` and `bench compare`."""
    d = BenchConfig(url="")
    p.add_argument("--api", choices=("native", "openai", "chat"), default=d.api,
                   help="native: token IDs to /generate; openai: token-ID prompts to /v1/completions; "
                        "chat: text prompts to /v1/chat/completions")
    p.add_argument("--clients", "-K", type=int, default=d.clients, help="client processes")
    if not sweep:
        p.add_argument("--concurrency", "-C", type=int, default=d.concurrency, help="global concurrent requests")
    p.add_argument("--requests", "-R", type=int, default=d.requests, help="measured requests in total (over all clients)")
    p.add_argument("--input-len", "-I", type=int, default=d.input_len, help="prompt tokens per request")
    p.add_argument("--output-len", "-O", type=int, default=d.output_len,
                   help="output tokens per request (ignore_eos: exact)")
    p.add_argument("--stream-interval", type=int, default=None,
                   help="the server's stream interval: recorded, and no event may carry more tokens")
    p.add_argument("--workers", "-W", type=int, default=d.workers,
                   help="workers behind a round-robin front (corpus interleaving); R must be a multiple")
    p.add_argument("--seed", type=int, default=d.seed, help="corpus seed (the prompts are a function of it)")
    p.add_argument("--vocab-size", type=int, default=None, help="default: /model_info's vocab_size")
    p.add_argument("--info-url", default=None, help="where to GET /model_info (default --url; a front "
                                                    "without /model_info needs a worker URL or --vocab-size)")
    p.add_argument("--token-range", default=None, help="LOW:HIGH token IDs to draw from (default 0:vocab)")
    p.add_argument("--avoid-ids", default="", help="comma-separated IDs never drawn (EOS etc. are added "
                                                    "from /model_info when it reports them)")
    p.add_argument("--temperature", type=float, default=d.temperature, help="sampling temperature (0: greedy)")
    p.add_argument("--model", default=None, help="openai API model name (default: first of /v1/models)")
    p.add_argument("--no-continuous-usage", action="store_true",
                   help="openai API: do not ask for usage on every event (count one token per event)")
    p.add_argument("--timeout-s", type=float, default=d.timeout_s, help="per-request timeout")
    p.add_argument("--warmup", type=int, default=d.warmup, help="unmeasured requests sent first")
    p.add_argument("--scenario", default=None, help="record family (default API-iI-oO)")
    p.add_argument("--target", default=d.target, help="record target: cpu, sm90, gfx950")
    p.add_argument("--results-dir", type=Path, default=None,
                   help="record directory (default: $NETRA_RUN_DIR/records; results/serving to keep it)")
    p.add_argument("--no-record", action="store_true", help="do not write a result record")
    p.add_argument("--work-dir", type=Path, default=None, help="raw per-request records (default: $NETRA_RUN_DIR/bench/ID)")
    p.add_argument("--warm-path", default=d.warm_path, help="GET path used to open connections before the barrier")
    p.add_argument("--client-cpus", default="", help="comma-separated CPUs; client k is pinned to CPU k mod n "
                                                      "(keep clients off the workers' CPU sets on a GPU node)")
    p.add_argument("--no-progress", action="store_true", help="no progress line while the run goes")
    datasets.add_arguments(p)


def config_from_args(args: argparse.Namespace, url: str | None = None,
                     concurrency: int | None = None) -> BenchConfig:
    try:
        avoid = [int(x) for x in args.avoid_ids.split(",") if x.strip()]
    except ValueError as exc:
        raise BenchError(f"--avoid-ids {args.avoid_ids!r}: expected comma-separated integers") from exc
    try:
        cpus = [int(x) for x in args.client_cpus.split(",") if x.strip()]
    except ValueError as exc:
        raise BenchError(f"--client-cpus {args.client_cpus!r}: expected comma-separated CPU numbers") from exc
    allowed = os.sched_getaffinity(0)
    if any(c not in allowed for c in cpus):
        raise BenchError(f"--client-cpus {args.client_cpus!r}: CPUs {sorted(set(cpus) - allowed)} are not "
                         f"available here (allowed: {sorted(allowed)})")
    return BenchConfig(
        url=(url or args.url).rstrip("/"), api=args.api, clients=args.clients,
        concurrency=args.concurrency if concurrency is None else concurrency, info_url=args.info_url,
        requests=args.requests, input_len=args.input_len, output_len=args.output_len,
        stream_interval=args.stream_interval, workers=args.workers, seed=args.seed, vocab_size=args.vocab_size,
        token_range=args.token_range, avoid_ids=avoid, temperature=args.temperature, model=args.model,
        continuous_usage=not args.no_continuous_usage, timeout_s=args.timeout_s, warmup=args.warmup,
        scenario=args.scenario, target=args.target, record=not args.no_record, results_dir=args.results_dir,
        work_dir=args.work_dir, warm_path=args.warm_path, client_cpus=cpus, progress=not args.no_progress,
        load=datasets.spec_from_args(args), slo=datasets.parse_slo(args.slo))


def main(args: argparse.Namespace) -> int:
    try:
        cfg = config_from_args(args)
        result = run_bench(cfg)
    except (BenchError, barrier.BarrierError, datasets.DatasetError) as exc:
        print(f"netra bench serve: {exc}", file=sys.stderr)
        return 2
    if not result.passed:
        print_failures(result)
        return 1
    print_summary(result)
    return 0


