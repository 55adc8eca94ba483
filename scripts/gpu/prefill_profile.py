"""Where a prefill chunk's time goes at the full Qwen3.6 shape on one H200 (issue 20: in the first 1K/1K C128 run
through nginx the mixed steps took ~0.6 s of host time per 8K-token chunk, against ~0.1-0.3 s that the FLOPs allow).

    timeout 300 python3 scripts/gpu/prefill_profile.py [--seqs 8] [--len 1024] [--out $OUT/prefill]

(NETRA_TACTIC_MIN_MATURITY defaults to ``experiment`` here, as the serving run selected.) For each chunk shape:

1. the engine's own prefill forward (`Model.forward` on a `prefill_batch` of ``seqs`` prompts of ``len`` tokens on slots
   1..seqs, as the scheduler builds it), twice to warm up (Triton compiles, fla autotuning), then timed: wall clock
   of the call (host) against CUDA events (device), so a host-bound forward shows apart from a device-bound one;
2. the host-device synchronisations one forward makes (torch's sync debug mode counts them);
3. one forward under the profiler: µs per kernel family (netra.bench.step's patterns) and the top kernels;
4. the achieved rate against the chunk's FLOPs (2 x active parameters per token; attention scores apart).

Prints a table last and writes prefill_profile.json under --out. About 60-120 s on one H200 (the first forward
compiles).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import warnings
from pathlib import Path
from typing import Any

os.environ.setdefault("NETRA_TACTIC_MIN_MATURITY", "experiment")


def active_params(cfg: Any) -> float:
    """Parameters one token multiplies through (routed top-k + shared experts, dense projections; lm_head apart)."""
    h = cfg.hidden_size
    moe = (cfg.num_experts_per_tok * 3 * h * cfg.moe_intermediate_size
           + 3 * h * cfg.shared_expert_intermediate_size + h * cfg.num_experts)
    n_attn, n_gdn = len(cfg.attention_layers), len(cfg.gdn_layers)
    attn = h * (cfg.num_attention_heads * cfg.head_dim * 2 + 2 * cfg.num_key_value_heads * cfg.head_dim) \
        + cfg.num_attention_heads * cfg.head_dim * h
    gdn = h * (2 * cfg.linear_key_dim + 2 * cfg.linear_num_value_heads * cfg.linear_value_head_dim
               + 2 * cfg.linear_num_value_heads) + cfg.linear_num_value_heads * cfg.linear_value_head_dim * h
    return float(cfg.num_hidden_layers * moe + n_attn * attn + n_gdn * gdn)


def host_profile(forward: Any, top: int = 25) -> list[dict[str, Any]]:
    """Where the host spends one forward (cProfile, the device drained first): the functions with the most own
    time, as ``file:line func`` with own and cumulative ms and calls. A wait for the device shows as own time in
    the call that synchronises."""
    import cProfile
    import pstats

    import torch

    torch.cuda.synchronize()
    prof = cProfile.Profile()
    prof.enable()
    forward()
    torch.cuda.synchronize()
    prof.disable()
    stats = pstats.Stats(prof)
    rows = []
    for (path, line, func), (_cc, calls, tot, cum, _callers) in stats.stats.items():  # type: ignore[attr-defined]
        rows.append({"where": f"{Path(path).name}:{line} {func}", "own_ms": round(1e3 * tot, 2),
                     "cum_ms": round(1e3 * cum, 2), "calls": calls})
    return sorted(rows, key=lambda r: -r["own_ms"])[:top]


def one(engine: Any, seqs: int, length: int, repeats: int) -> dict[str, Any]:
    import torch

    from netra.bench.step import breakdown
    from netra.engine.model import prefill_batch

    g = torch.Generator().manual_seed(seqs * 7919 + length)
    vocab = engine.config.vocab_size
    chunks = [(s + 1, torch.randint(0, vocab, (length,), generator=g).tolist(), 0, True) for s in range(seqs)]

    def forward() -> None:
        engine.model.forward(prefill_batch(engine.model.device, chunks))

    t0 = time.perf_counter()
    forward()
    torch.cuda.synchronize()
    first_s = time.perf_counter() - t0
    forward()
    torch.cuda.synchronize()
    walls, devs, hosts = [], [], []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        t = time.perf_counter()
        start.record()
        forward()
        end.record()
        host = time.perf_counter() - t
        hosts.append(host)
        end.synchronize()
        walls.append(time.perf_counter() - t)
        devs.append(start.elapsed_time(end) / 1e3)
        walls[-1] = max(walls[-1], host)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            forward()
        finally:
            torch.cuda.set_sync_debug_mode("default")
        torch.cuda.synchronize()
    syncs: dict[str, int] = {}
    for w in caught:
        key = f"{Path(w.filename).name}:{w.lineno}"
        syncs[key] = syncs.get(key, 0) + 1
    families, top = breakdown(forward, top=20)
    host_top = host_profile(forward)
    tokens = seqs * length
    dev = sorted(devs)[len(devs) // 2]
    flops = 2 * active_params(engine.config) * tokens
    return {"seqs": seqs, "len": length, "tokens": tokens, "first_call_s": round(first_s, 2),
            "wall_ms": round(1e3 * sorted(walls)[len(walls) // 2], 2), "device_ms": round(1e3 * dev, 2),
            "host_ms": round(1e3 * sorted(hosts)[len(hosts) // 2], 2),
            "tokens_per_s": round(tokens / dev), "tflops": round(flops / dev / 1e12, 1),
            "syncs": dict(sorted(syncs.items(), key=lambda kv: -kv[1])), "breakdown_us": families,
            "top_kernels_us": top, "host_top": host_top}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shapes", default="8x1024,1x8192,64x128", help="SEQSxLEN chunk shapes")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", ".")) / "prefill")
    args = ap.parse_args()
    from netra.engine.engine import build_engine
    from netra.engine.options import EngineOptions

    shapes = [tuple(int(v) for v in s.split("x")) for s in args.shapes.split(",")]
    longest = max(n for _, n in shapes)
    engine = build_engine(EngineOptions(preset="qwen36-35b-a3b", device="cuda", context_length=max(2048, longest + 1),
                                        max_running_requests=max(s for s, _ in shapes), cuda_graph_bs=(1,)))
    rows = []
    for seqs, length in shapes:
        try:
            rows.append(one(engine, seqs, length, args.repeats))
        except Exception as exc:  # one shape's failure must not lose the others
            rows.append({"seqs": seqs, "len": length, "error": f"{type(exc).__name__}: {exc}"})
        print(json.dumps(rows[-1])[:3000], flush=True)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "prefill_profile.json").write_text(json.dumps(rows, indent=1))
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import torch
    from prefill_records import write  # the result record beside the raw JSON

    for p in write(args.out, os.environ.get("NETRA_GIT_SHA", "unknown"), "python3 scripts/gpu/prefill_profile.py",
                   device=torch.cuda.get_device_name()):
        print(f"record: {p}", flush=True)
    for r in rows:
        for h in r.get("host_top", [])[:12]:
            print(f"  {r['seqs']}x{r['len']} host {h['own_ms']:>8} ms own {h['cum_ms']:>8} cum {h['calls']:>6} x  {h['where']}")
    print(f"{'chunk':>10} {'first s':>8} {'host ms':>8} {'wall ms':>9} {'device ms':>10} {'tok/s':>9} {'TFLOP/s':>8} {'syncs':>6}  top families (us)")
    for r in rows:
        if "error" in r:
            print(f"{r['seqs']}x{r['len']:>6}  {r['error'][:100]}")
            continue
        fam = ", ".join(f"{k} {v:.0f}" for k, v in list(r["breakdown_us"].items())[:6])
        print(f"{r['seqs']:>3}x{r['len']:<6} {r['first_call_s']:>8} {r['host_ms']:>8} {r['wall_ms']:>9} {r['device_ms']:>10} "
              f"{r['tokens_per_s']:>9} {r['tflops']:>8} {sum(r['syncs'].values()):>6}  {fam}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
