"""One profile + one node topology (+ launch overrides) -> one resolved plan with a canonical hash.

Every identity of a worker derives from the profile, the worker index and the overrides: its GPU,
NUMA node, CPU set and memory node (placement), its engine and response-layer ports, its command
lines, environment, log paths and plugin evidence directory. `Plan.canonical_json()` (sorted keys, compact) and `Plan.sha256()`
identify exactly what `netra launch` starts; the launch record keeps that hash.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from netra import settings
from netra.deploy.profile import Canonical, Profile, ProfileError, _to_plain, netra_model_dir
from netra.deploy.topology import Placement, PlacementError, Topology, format_cpulist, place, read_topology
from netra.plugins.sglang import DOMAINS, enabled

LOOPBACK = "127.0.0.1"
PLAN_VERSION = 1


class PlanError(ValueError):
    """The profile cannot be turned into a plan here; the message names the cause."""


@dataclass(frozen=True)
class Overrides:
    """Launch-time overrides (so that tests and several launches share one host without collisions)."""

    front_port: int | None = None
    front_host: str | None = None
    # Worker i's engine listens on port_base + 2i and its response layer on port_base + 2i + 1.
    port_base: int | None = None
    run_dir: Path | None = None
    workers: int | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"front_port": self.front_port, "front_host": self.front_host, "port_base": self.port_base,
                "run_dir": str(self.run_dir) if self.run_dir else None, "workers": self.workers}


@dataclass(frozen=True)
class WorkerPlan:
    index: int
    gpu: int | None  # index in PCI bus order among the target vendor's GPUs
    gpu_pci: str | None
    numa_node: int | None
    cpus: tuple[int, ...]  # physical cores of the share and all their SMT siblings
    physical_cores: int
    mem_node: int | None  # memory bound to this node (MPOL_BIND) when known
    engine_port: int
    serve_port: int
    engine_argv: tuple[str, ...]
    engine_env: dict[str, str]
    serve_argv: tuple[str, ...]
    serve_env: dict[str, str]
    engine_log: str
    serve_log: str
    # Options the worker must report at GET /server_info (the audit compares them).
    engine_expect: dict[str, Any]
    # SGLang workers: the tactic domains Netra's plugin hooks in this worker (profile engine.tactics)
    # and the directory where each of its processes reports hooks, loaded code objects and hit counts.
    tactics: tuple[str, ...] = ()
    plugin_evidence: str | None = None

    @property
    def cpulist(self) -> str:
        return format_cpulist(self.cpus)

    @property
    def engine_url(self) -> str:
        return f"http://{LOOPBACK}:{self.engine_port}"

    @property
    def serve_url(self) -> str:
        return f"http://{LOOPBACK}:{self.serve_port}"


@dataclass(frozen=True)
class FrontPlan:
    host: str
    port: int
    balance: str
    target_concurrency: int
    worker_processes: int  # the four below derive from target_concurrency (front_sizing)
    worker_connections: int
    keepalive: int
    worker_rlimit_nofile: int
    max_body_bytes: int
    max_fails: int
    fail_timeout_s: int
    read_timeout_s: int
    connect_timeout_s: int
    upstreams: tuple[str, ...]  # host:port of each worker's response layer, in worker order
    conf_path: str
    pid_path: str
    error_log: str
    access_log: str

    @property
    def url(self) -> str:
        host = LOOPBACK if self.host in ("0.0.0.0", "::") else self.host
        return f"http://{host}:{self.port}"


@dataclass(frozen=True)
class Plan(Canonical):
    profile_name: str
    profile_sha256: str
    profile: dict[str, Any]
    overrides: dict[str, Any]
    target: str
    engine_kind: str
    dp: int
    run_dir: str
    record_path: str
    topology: str
    workers: tuple[WorkerPlan, ...]
    front: FrontPlan
    supervisor: dict[str, Any]
    version: int = PLAN_VERSION
    notes: tuple[str, ...] = field(default=())


def front_sizing(target: int, keepalive: int) -> tuple[int, int, int]:
    """(worker_processes, worker_connections, worker_rlimit_nofile) of nginx for `target` requests in
    flight: a process per 1,024 of them (at most 16). Each admitted request holds a client and an
    upstream connection; every client past the target holds its connection until its 503 is written,
    and a burst of them must find one: nginx closes a connection it cannot place (and, out of
    connections, closes idle ones that have not sent their request yet), which the client sees as a
    reset. So connections cover the target twice plus a burst of `max(4 x target, 4096)` refused
    clients, a quarter more for the uneven spread over processes, and each process's keepalive pool;
    one fd per connection, twice over for files and headroom."""
    processes = max(1, min(16, math.ceil(target / 1024)))
    burst = max(4 * target, 4096)
    connections = math.ceil(1.25 * (2 * target + burst) / processes) + keepalive + 64
    return processes, connections, 2 * connections


def serve_limits(profile: Profile) -> list[str]:
    """The response layer's bounds, from the profile: admission capacity (twice the worker's running
    requests, so its queue is never empty, at least one request's choices), the requests that may
    wait (everything the front admits may land on one worker), limits, its probe of its worker, and
    the supervisor's step-stall bound."""
    s, sup = profile.serve, profile.supervisor
    inflight = max(2 * profile.engine.max_running_requests, s.max_choices)
    return ["--max-inflight", str(inflight), "--max-waiting", str(profile.front.target_concurrency),
            "--queue-timeout", f"{s.queue_timeout_s:g}", "--max-choices", str(s.max_choices),
            "--max-body-bytes", str(s.max_body_bytes), "--probe-interval", f"{s.probe_interval_s:g}",
            "--probe-timeout", f"{s.probe_timeout_s:g}", "--probe-misses", str(s.probe_misses),
            "--stall-timeout", f"{sup.stall_s:g}"]


def default_run_dir(profile: Profile) -> Path:
    return Path(settings.get("NETRA_RUN_DIR")) / profile.name


def _netra_engine_argv(profile: Profile, port: int, index: int) -> tuple[list[str], dict[str, Any]]:
    """`netra engine` flags, spelled as SGLang spells them where SGLang has them."""
    e = profile.engine
    assert e.preset is not None  # profile cross-checks
    argv = ["netra", "engine", "--preset", e.preset, "--host", LOOPBACK, "--port", str(port),
            "--max-running-requests", str(e.max_running_requests), "--context-length", str(e.context_length),
            "--chunked-prefill-size", str(e.chunked_prefill_size)]
    if e.cuda_graph_bs:
        argv += ["--cuda-graph-bs", *[str(b) for b in e.cuda_graph_bs]]
    argv += ["--stream-interval", str(e.stream_interval)]
    if e.incremental_streaming_output:
        argv.append("--incremental-streaming-output")
    argv += ["--kv-cache-dtype", e.kv_cache_dtype]
    if e.mamba_ssm_dtype is not None:
        argv += ["--mamba-ssm-dtype", e.mamba_ssm_dtype]
    argv += ["--device", e.device, "--seed", str(e.seed)]
    if e.mem_fraction_static is not None:
        argv += ["--mem-fraction-static", f"{e.mem_fraction_static:g}"]
    if e.mixed_chunk is not None:
        argv += ["--mixed-chunk", e.mixed_chunk]
    if e.decode_overlap:
        argv.append("--decode-overlap")
    if e.reasoning_parser is not None:
        argv += ["--reasoning-parser", e.reasoning_parser]
    model_dir = netra_model_dir(e)
    if model_dir is not None:
        argv += ["--model-path", str(model_dir)]
    argv += ["--served-model-name", profile.serve.model_name, "--worker-id", str(index)]
    if e.enable_metrics:
        argv.append("--enable-metrics")
    expect: dict[str, Any] = {
        "preset": e.preset, "port": port, "max_running_requests": e.max_running_requests,
        "context_length": e.context_length, "chunked_prefill_size": e.chunked_prefill_size,
        "stream_interval": e.stream_interval, "incremental_streaming_output": e.incremental_streaming_output,
        "kv_cache_dtype": e.kv_cache_dtype, "device": e.device, "seed": e.seed,
        "enable_metrics": e.enable_metrics, "served_model_name": profile.serve.model_name,
    }
    if e.cuda_graph_bs:
        expect["cuda_graph_bs"] = list(e.cuda_graph_bs)
    if e.mamba_ssm_dtype is not None:
        expect["mamba_ssm_dtype"] = e.mamba_ssm_dtype
    if e.mem_fraction_static is not None:
        expect["mem_fraction_static"] = e.mem_fraction_static
    if e.mixed_chunk is not None:
        expect["mixed_chunk"] = e.mixed_chunk
    if e.decode_overlap:
        expect["decode_overlap"] = True
    if e.reasoning_parser is not None:
        expect["reasoning_parser"] = e.reasoning_parser
    return argv, expect


def _sglang_expect(profile: Profile, port: int) -> dict[str, Any]:
    """What SGLang's /server_info reports for the options the profile sets (its dest names)."""
    e = profile.engine
    expect: dict[str, Any] = {
        "port": port, "max_running_requests": e.max_running_requests, "context_length": e.context_length,
        "chunked_prefill_size": e.chunked_prefill_size, "stream_interval": e.stream_interval,
        "incremental_streaming_output": e.incremental_streaming_output, "kv_cache_dtype": e.kv_cache_dtype,
        "disable_radix_cache": e.disable_radix_cache, "enable_metrics": e.enable_metrics,
    }
    if e.mem_fraction_static is not None:
        expect["mem_fraction_static"] = e.mem_fraction_static
    if e.cuda_graph_bs:
        expect["cuda_graph_bs_decode"] = list(e.cuda_graph_bs)
    if e.mamba_ssm_dtype is not None:
        expect["mamba_ssm_dtype"] = e.mamba_ssm_dtype
    spec = e.speculative
    if spec is not None:
        # The drafter the worker runs, as locked (and, for DFLASH, the verify block its worker reads; the
        # EAGLE family's handler may rewrite num_draft_tokens, so it is audited for DFLASH only).
        expect["speculative_algorithm"] = spec.algorithm
        expect["speculative_draft_model_path"] = spec.draft_model_path
        if spec.draft_revision:
            expect["speculative_draft_model_revision"] = spec.draft_revision
        if spec.algorithm == "DFLASH":
            expect["speculative_num_draft_tokens"] = spec.num_draft_tokens
        if spec.draft_window_size is not None:
            expect["speculative_draft_window_size"] = spec.draft_window_size
    if e.reasoning_parser is not None:
        expect["reasoning_parser"] = e.reasoning_parser
    if e.tool_call_parser is not None:
        expect["tool_call_parser"] = e.tool_call_parser
    for name in enabled(e.tactics):
        expect.update({dest: value for _, dest, value in DOMAINS[name].sglang_options})
    return expect


def _sglang_module() -> Any:
    try:
        from netra.deploy import sglang
    except ModuleNotFoundError as exc:
        if exc.name != "netra.deploy.sglang":
            raise
        raise PlanError("this profile runs SGLang workers, but SGLang command rendering "
                        "(netra.deploy.sglang) is not available in this checkout") from None
    return sglang


def _engine(profile: Profile, place_: Placement, port: int, index: int, evidence: str | None,
            ) -> tuple[list[str], dict[str, str], dict[str, Any]]:
    env: dict[str, str] = {"OMP_NUM_THREADS": str(max(1, place_.physical_cores))}
    gpus = [place_.gpu.index] if place_.gpu is not None else []
    if profile.engine.kind == "sglang":
        sg = _sglang_module()
        argv = [str(a) for a in sg.render_argv(profile, host=LOOPBACK, port=port)]
        env.update({str(k): str(v) for k, v in sg.worker_env(profile, gpus, evidence_dir=evidence).items()})
        expect = _sglang_expect(profile, port)
    else:
        argv, expect = _netra_engine_argv(profile, port, index)
        if gpus:
            env["CUDA_VISIBLE_DEVICES"] = ",".join(str(g) for g in gpus)
    if profile.engine.tactic_min_maturity is not None:
        env["NETRA_TACTIC_MIN_MATURITY"] = profile.engine.tactic_min_maturity
    if profile.gpu_vendor == "nvidia":
        # GPU indices above are PCI bus order; CUDA's default order is "fastest first".
        env["CUDA_DEVICE_ORDER"] = "PCI_BUS_ID"
    return argv, env, expect


def make_plan(profile: Profile, topology_dir: str | Path | None = None, overrides: Overrides | None = None,
              *, topology: Topology | None = None) -> Plan:
    """Resolve a profile into a plan; raises PlanError / PlacementError naming the cause."""
    ov = overrides or Overrides()
    dp = ov.workers if ov.workers is not None else profile.dp
    if dp < 1:
        raise PlanError(f"--workers {dp}: at least one worker is needed")
    topo = topology if topology is not None else read_topology(topology_dir)
    placements = place(topo, profile.gpu_vendor, dp)
    run_dir = Path(ov.run_dir if ov.run_dir is not None else default_run_dir(profile)).absolute()
    for name, port in (("--front-port", ov.front_port), ("--port-base", ov.port_base)):
        if port is not None and not 1 <= port <= 65535:
            raise PlanError(f"{name} {port}: not a TCP port")
    if ov.port_base is not None and ov.port_base + 2 * dp - 1 > 65535:
        raise PlanError(f"--port-base {ov.port_base}: {2 * dp} ports do not fit below 65536")
    workers: list[WorkerPlan] = []
    for i, pl in enumerate(placements):
        if ov.port_base is not None:
            engine_port, serve_port = ov.port_base + 2 * i, ov.port_base + 2 * i + 1
        else:
            engine_port, serve_port = profile.ports.engine_base + i, profile.ports.serve_base + i
        tactics = enabled(profile.engine.tactics)
        evidence = str(run_dir / f"worker{i}.plugin") if tactics else None
        argv, env, expect = _engine(profile, pl, engine_port, i, evidence)
        serve_argv = ["netra", "serve", "--upstream", f"http://{LOOPBACK}:{engine_port}", "--host", LOOPBACK,
                      "--port", str(serve_port), "--stream-interval", str(profile.engine.stream_interval),
                      "--model-name", profile.serve.model_name,
                      "--engine", "sglang" if profile.engine.kind == "sglang" else "embedded", "--worker-id", str(i),
                      *serve_limits(profile)]
        if profile.serve.api_key_env:
            # The key's name, never its value: plans and launch records are written to disk.
            serve_argv += ["--api-key-env", profile.serve.api_key_env]
        workers.append(WorkerPlan(
            index=i, gpu=pl.gpu.index if pl.gpu else None, gpu_pci=pl.gpu.pci if pl.gpu else None,
            numa_node=pl.numa_node, cpus=pl.cpus, physical_cores=pl.physical_cores, mem_node=pl.mem_node,
            engine_port=engine_port, serve_port=serve_port, engine_argv=tuple(argv),
            engine_env=dict(sorted(env.items())), serve_argv=tuple(serve_argv), serve_env={},
            engine_log=str(run_dir / f"worker{i}.engine.log"), serve_log=str(run_dir / f"worker{i}.serve.log"),
            engine_expect=expect, tactics=tactics, plugin_evidence=evidence))
    f = profile.front
    front_port = ov.front_port if ov.front_port is not None else f.port
    ports = [front_port] + [p for w in workers for p in (w.engine_port, w.serve_port)]
    if len(set(ports)) != len(ports):
        raise PlanError(f"port collision in the plan: {sorted(ports)}")
    processes, connections, nofile = front_sizing(f.target_concurrency, f.keepalive)
    front = FrontPlan(
        host=ov.front_host or f.host, port=front_port, balance=f.balance, target_concurrency=f.target_concurrency,
        worker_processes=processes, worker_connections=connections, keepalive=f.keepalive,
        worker_rlimit_nofile=nofile, max_body_bytes=profile.serve.max_body_bytes, max_fails=f.max_fails,
        fail_timeout_s=f.fail_timeout_s,
        read_timeout_s=f.read_timeout_s, connect_timeout_s=f.connect_timeout_s,
        upstreams=tuple(f"{LOOPBACK}:{w.serve_port}" for w in workers),
        conf_path=str(run_dir / "nginx.conf"), pid_path=str(run_dir / "nginx.pid"),
        error_log=str(run_dir / "nginx.error.log"), access_log=str(run_dir / "nginx.access.log"))
    notes = []
    if profile.uses_gpus and not topo.has_numa:
        notes.append(f"{topo.source} has no NUMA information: workers share all cores, memory unbound")
    return Plan(
        profile_name=profile.name, profile_sha256=profile.sha256(), profile=profile.to_dict(),
        overrides=ov.to_dict(), target=profile.target, engine_kind=profile.engine.kind, dp=dp,
        run_dir=str(run_dir), record_path=str(run_dir / "launch.json"), topology=topo.describe(),
        workers=tuple(workers), front=front, supervisor=_to_plain(profile.supervisor), notes=tuple(notes))


__all__ = ["Overrides", "PlacementError", "Plan", "PlanError", "ProfileError", "WorkerPlan", "make_plan"]
