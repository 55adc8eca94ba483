"""`netra engine`: start the embedded engine's worker server. Torch-free at registration."""

from __future__ import annotations

import argparse
from dataclasses import fields
from typing import Any

from netra import logs
from netra.engine.config import PRESETS
from netra.engine.options import (
    MIXED_CHUNK,
    REASONING_PARSERS,
    SPECULATIVE_ALGORITHMS,
    EngineOptions,
    OptionsError,
)

_D = {f.name: f.default for f in fields(EngineOptions)}


def _int_list(values: list[str], flag: str) -> tuple[int, ...]:
    out: list[int] = []
    for v in values:
        for part in v.split(","):
            if part.strip():
                try:
                    out.append(int(part))
                except ValueError as exc:
                    raise argparse.ArgumentTypeError(f"{flag}: {part!r} is not an integer") from exc
    return tuple(out)


def _bs_list(values: list[str]) -> tuple[int, ...]:
    return _int_list(values, "--cuda-graph-bs")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--preset", default=_D["preset"], choices=sorted(PRESETS), help="model shapes (default tiny)")
    p.add_argument("--checkpoint", "--model-path", dest="checkpoint", default=None,
                   help="HF-format checkpoint directory (config.json + safetensors) instead of seeded weights")
    p.add_argument("--host", default=_D["host"], help="address to listen on")
    p.add_argument("--port", type=int, default=_D["port"], help="0 picks a free port (printed at start)")
    p.add_argument("--seed", "--random-seed", dest="seed", type=int, default=_D["seed"],
                   help="seed of the seeded weights and default per-request sampling seeds")
    p.add_argument("--device", default=_D["device"], help="cpu | cuda | cuda:N")
    p.add_argument("--max-running-requests", type=int, default=_D["max_running_requests"],
                   help="requests decoded together (request slots)")
    p.add_argument("--context-length", type=int, default=_D["context_length"],
                   help="longest prompt + output of one request, in tokens")
    p.add_argument("--chunked-prefill-size", type=int, default=_D["chunked_prefill_size"],
                   help="prompt tokens per prefill step")
    p.add_argument("--cuda-graph-bs", "--cuda-graph-bs-decode", dest="cuda_graph_bs", nargs="+",
                   default=None, help="decode batch buckets: '1 2 4 8' or '1,2,4,8'")
    p.add_argument("--stream-interval", type=int, default=_D["stream_interval"], help="decode steps per streamed event")
    p.add_argument("--incremental-streaming-output", action="store_true",
                   help="stream only the new tokens of each event (never the cumulative output)")
    p.add_argument("--kv-cache-dtype", default=_D["kv_cache_dtype"], choices=["fp8_e4m3", "bfloat16", "bf16", "auto"],
                   help="KV cache dtype (auto: the preset's)")
    p.add_argument("--mamba-ssm-dtype", default=None, choices=["float32", "bfloat16"],
                   help="recurrent (GDN) state dtype (default: the preset's)")
    p.add_argument("--torch-threads", type=int, default=_D["torch_threads"],
                   help="torch intra-op threads of this process (workers share a few cores)")
    p.add_argument("--disable-cuda-graph", action="store_true",
                   help="on a CUDA device, run decode eagerly instead of replaying per-bucket graphs")
    p.add_argument("--enable-metrics", action="store_true",
                   help="serve GET /metrics (Prometheus, SGLang's metric names where the meaning is the same)")
    p.add_argument("--served-model-name", default=None,
                   help="model_name label of the metrics (default: netra-PRESET, or the checkpoint's name)")
    p.add_argument("--worker-id", default=_D["worker_id"],
                   help="worker label of the metrics and log lines (the launcher passes the worker index)")
    p.add_argument("--mem-fraction-static", type=float, default=None,
                   help="CUDA: share of the device memory for weights + KV/state pools; the pools get what the "
                        "weights leave of it, in request slots (default 0.90)")
    p.add_argument("--pool-memory-gib", type=float, default=None,
                   help="memory for the KV/state pools, in GiB (overrides the free-memory rule; on a CPU the "
                        "only way to size the pools by memory)")
    p.add_argument("--mixed-chunk", default=_D["mixed_chunk"], choices=list(MIXED_CHUNK),
                   help="prompts arriving while requests decode: split (default: the decode graph and a prefill "
                        "forward in one step), fused (one forward carrying both), off (prefill steps stall decode)")
    p.add_argument("--load-log-interval", dest="load_log_interval_s", type=float,
                   default=_D["load_log_interval_s"],
                   help="seconds between the 'running / queued / throughput' log lines while busy (0: off)")
    p.add_argument("--decode-overlap", action="store_true",
                   help="chain greedy decode steps on the device: launch step N+1 from step N's tokens before the "
                        "host reads them (overlaps the host's output work with the device)")
    p.add_argument("--no-warmup", dest="warmup", action="store_false",
                   help="CUDA: serve at once, without compiling the prefill path and capturing every decode bucket "
                        "first (the first requests then wait for both)")
    p.add_argument("--reasoning-parser", default=None, choices=[r for r in REASONING_PARSERS if r],
                   help="SGLang's flag: requests with require_reasoning get their grammar only after </think>")
    p.add_argument("--speculative-algorithm", type=str.lower, default=None,
                   choices=[a for a in SPECULATIVE_ALGORITHMS if a],
                   help="speculative decoding: dflash (a DFlash drafter), or oracle (forced acceptance: cost curves "
                        "without trained weights; the output is not the model's)")
    p.add_argument("--speculative-draft-model-path", default=None,
                   help="the DFlash drafter's directory (z-lab's format: config.json + safetensors)")
    p.add_argument("--speculative-num-draft-tokens", type=int, default=None,
                   help="tokens per verified block: the pending token and T-1 drafts (default: the drafter's block "
                        "size; 4 for the oracle without a drafter)")
    p.add_argument("--speculative-oracle-accept", nargs="+", default=None,
                   help="oracle: drafts committed per verify, drawn per request and verify from these values "
                        "(default: all)")
    logs.add_arguments(p)
    p.add_argument("--max-new-tokens-limit", type=int, default=None,
                   help="reject larger max_new_tokens (default: the context length)")


def options_from_args(args: argparse.Namespace) -> EngineOptions:
    kw: dict[str, Any] = {f.name: getattr(args, f.name) for f in fields(EngineOptions) if hasattr(args, f.name)}
    if args.cuda_graph_bs is None:
        kw.pop("cuda_graph_bs")
    else:
        kw["cuda_graph_bs"] = _bs_list(args.cuda_graph_bs)
    if getattr(args, "speculative_oracle_accept", None) is not None:
        kw["speculative_oracle_accept"] = _int_list(args.speculative_oracle_accept, "--speculative-oracle-accept")
    return EngineOptions(**kw)


def main(args: argparse.Namespace) -> int:
    import sys

    try:
        options = options_from_args(args)
    except (OptionsError, argparse.ArgumentTypeError) as exc:
        print(f"netra engine: {exc}", file=sys.stderr)
        return 2
    logs.configure(args.log_level, args.log_format)
    from netra.engine.server import serve

    return serve(options)


def register(sub: Any) -> None:
    from netra.cli import add_verb

    p = add_verb(sub, "engine")
    add_arguments(p)
    p.set_defaults(func=main)
