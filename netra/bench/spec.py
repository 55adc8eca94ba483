"""`netra bench spec`: speculative decoding's tokens/s against its acceptance length, in process.

For each concurrency C and block size T, the forced-acceptance oracle (`ForcedAcceptance`) runs the real draft
network (the preset's seeded DFlash drafter, or none with ``--drafter null``) and the real verify forward, and
commits a fixed number of drafts per verify: the acceptance length τ (tokens per verify) is set, not hoped for,
so the curve is the step's cost at each τ. τ = 1 commits no draft: the pure overhead of drafting and verifying
T rows for one token. The same run measures plain decoding at each C (the baseline), interleaved with the
speculative points over ``--repeats`` rounds (medians reported), as the machine's load drifts.

A point is C greedy requests of ``--output-len`` tokens after a ``--input-len``-token prompt; decode tokens/s
counts the tokens of decode (or verify) steps over those steps' wall time, the prefill left out. Exact checks:
every request gets exactly ``--output-len`` tokens, and each verify commits the forced count (the realised
accept length of a point equals its τ, up to the last block of each request, cut at ``--output-len``).

Random weights route the MoE's experts about uniformly, real models do not; a CPU runs every op's reference: the
figures are the engine's own costs on this machine, not a GPU's. Writes one record (netra/records.py).
"""

from __future__ import annotations

import argparse
import os
import shlex
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from netra import settings
from netra.records import git_sha, host_device, utc_now, write_record


def _drafter_dir(preset: str, seed: int, root: Path) -> Path:
    """The preset's seeded DFlash drafter in z-lab's format (written once under ``root``)."""
    from netra.engine.config import preset as target_preset
    from netra.engine.spec.dflash import dflash_preset, save_dflash, seeded_dflash_weights

    path = root / f"dflash-{preset}-seed{seed}"
    if not (path / "config.json").exists():
        cfg = dflash_preset(preset, target_preset(preset))
        save_dflash(path, cfg, seeded_dflash_weights(cfg, seed))
    return path


def _point(args: argparse.Namespace, concurrency: int, steps: int | None, accept: int | None,
           drafter: Path | None) -> dict[str, Any]:
    """One measurement: plain decoding (``steps`` None) or forced acceptance of ``accept`` drafts at T = steps."""
    import random

    import torch

    from netra.engine.engine import build_engine
    from netra.engine.options import EngineOptions
    from netra.engine.request import Request, SamplingParams

    torch.set_num_threads(args.torch_threads)
    spec: dict[str, Any] = {}
    if steps is not None:
        spec = {"speculative_algorithm": "oracle", "speculative_num_draft_tokens": steps,
                "speculative_oracle_accept": (accept,)}
        if drafter is not None:
            spec["speculative_draft_model_path"] = str(drafter)
    e = build_engine(EngineOptions(preset=args.preset, max_running_requests=concurrency,
                                   context_length=args.input_len + args.output_len + 32,
                                   torch_threads=args.torch_threads, **spec))
    rng = random.Random(concurrency)
    params = SamplingParams(max_new_tokens=args.output_len, temperature=0.0, ignore_eos=True)
    counts: dict[str, int] = {}

    def sink(o: Any) -> None:
        counts[o.rid] = o.completion_tokens

    s = e.scheduler
    for i in range(concurrency):
        s.submit(Request(str(i), [rng.randrange(256) for _ in range(args.input_len)], params, sink))
    decode_s, decode_tokens = 0.0, 0
    t_all = time.perf_counter()
    while True:
        s._drain(block=False)
        if not (s.waiting or s.prefilling or s.decoding):
            break
        decoding = not (s.waiting or s.prefilling)
        before, t = s.stats.output_tokens, time.perf_counter()
        s.step()
        if decoding:
            decode_s += time.perf_counter() - t
            decode_tokens += s.stats.output_tokens - before
    wall = time.perf_counter() - t_all
    st = s.stats
    tokens = sum(counts.values())
    verify = st.verify_steps
    return {"concurrency": concurrency, "T": steps, "accept": accept,
            "tau": (decode_tokens / (verify * concurrency)) if verify else 1.0,
            "decode_tok_s": decode_tokens / max(1e-9, decode_s), "output_tok_s": tokens / max(1e-9, wall),
            "decode_steps": st.decode_steps, "verify_steps": verify,
            "ms_per_decode_step": 1e3 * decode_s / max(1, st.decode_steps),
            "exact_tokens": len(counts) == concurrency and all(v == args.output_len for v in counts.values()),
            "accepted_tokens": st.accepted_tokens, "drafts": st.drafts}


def run(args: argparse.Namespace) -> dict[str, Any]:
    drafter = None if args.drafter == "null" else _drafter_dir(args.preset, args.drafter_seed,
                                                               Path(settings.get("NETRA_CACHE_DIR")) / "drafters")
    grid: list[tuple[int, int | None, int | None]] = []
    for c in args.concurrency:
        grid.append((c, None, None))
        for t in args.steps:
            accepts = sorted({a for a in args.accept if a < t} | {t - 1}) if args.accept else \
                sorted({0, t // 2 - 1, t - 1})
            grid += [(c, t, a) for a in accepts]
    samples: dict[tuple[int, int | None, int | None], list[dict[str, Any]]] = {g: [] for g in grid}
    for r in range(args.repeats):
        for g in grid if r % 2 == 0 else list(reversed(grid)):
            samples[g].append(_point(args, *g, drafter))
            last = samples[g][-1]
            print(f"  round {r + 1}: C={g[0]} T={g[1] or '-'} accept={g[2] if g[2] is not None else '-'}: "
                  f"{last['decode_tok_s']:.1f} decode tok/s", flush=True)
    rows = []
    for (c, t, a), pts in samples.items():
        base = statistics.median(p["decode_tok_s"] for p in samples[(c, None, None)])
        tok_s = statistics.median(p["decode_tok_s"] for p in pts)
        rows.append({"scenario": "spec-forced-acceptance" if t else "plain-decode", "preset": args.preset,
                     "concurrency": c, "T": t, "accept": a, "tau": statistics.median(p["tau"] for p in pts),
                     "decode_tok_s": tok_s, "decode_tok_s_samples": [p["decode_tok_s"] for p in pts],
                     "output_tok_s": statistics.median(p["output_tok_s"] for p in pts),
                     "ms_per_decode_step": statistics.median(p["ms_per_decode_step"] for p in pts),
                     "speedup_vs_plain": tok_s / base, "input_len": args.input_len, "output_len": args.output_len,
                     "drafter": args.drafter if t else None})
    def forced_tau(a: int) -> float:  # every request's decode tokens over its verifies, the last block cut
        n = args.output_len - 1
        return n / -(-n // (a + 1))

    checks = {"exact_tokens": all(p["exact_tokens"] for pts in samples.values() for p in pts),
              "tau_matches_forced": all(p["tau"] == forced_tau(a) for (_, t, a), pts in samples.items()
                                        if t is not None and a is not None for p in pts)}
    return {"rows": rows, "checks": checks}


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--preset", default="tiny", help="model preset (seeded weights; default tiny)")
    p.add_argument("--concurrency", type=int, nargs="+", default=[1, 8], help="requests decoded together")
    p.add_argument("--steps", "-T", type=int, nargs="+", default=[4, 8], help="block sizes T (tokens per verify)")
    p.add_argument("--accept", type=int, nargs="+", default=None,
                   help="drafts committed per verify (default: 0, T/2 - 1 and T - 1: tau 1, T/2 and T)")
    p.add_argument("--drafter", choices=["dflash", "null"], default="dflash",
                   help="draft network run at every verify: the preset's seeded DFlash drafter, or none")
    p.add_argument("--drafter-seed", type=int, default=1, help="seed of the DFlash drafter's weights")
    p.add_argument("--input-len", type=int, default=16, help="prompt tokens per request")
    p.add_argument("--output-len", type=int, default=33, help="output tokens per request")
    p.add_argument("--repeats", type=int, default=1, help="rounds over the grid (alternating order; medians)")
    p.add_argument("--torch-threads", type=int, default=1, help="torch intra-op threads")
    p.add_argument("--out", type=Path, default=None,
                   help="record directory (default: $NETRA_RUN_DIR/records; results/serving to keep it)")
    p.add_argument("--stem", default="spec-tiny-cpu", help="record file name (without .json)")
    p.add_argument("--no-record", action="store_true", help="print only; write no record")


def cli(args: argparse.Namespace) -> int:
    result = run(args)
    print(f"{'C':>3} {'T':>3} {'accept':>6} {'tau':>5} {'decode tok/s':>12} {'ms/step':>8} {'vs plain':>8}")
    for r in result["rows"]:
        print(f"{r['concurrency']:>3} {r['T'] or '-':>3} {r['accept'] if r['accept'] is not None else '-':>6} "
              f"{r['tau']:5.2f} {r['decode_tok_s']:12.1f} {r['ms_per_decode_step']:8.1f} {r['speedup_vs_plain']:8.2f}")
    print("checks:", result["checks"])
    if args.no_record:
        return 0
    record = {"kind": "serving", "family": "spec-" + args.preset, "target": "cpu", "device": host_device(),
              "cpu_count": os.cpu_count(), "torch_threads": args.torch_threads, "git_sha": git_sha(),
              "date": utc_now(),
              "command": shlex.join(["netra", *sys.argv[1:]]) if sys.argv[1:3] == ["bench", "spec"]
              else "netra bench spec (programmatic)",
              "status": "measured", "rows": result["rows"], "checks": result["checks"],
              "verdict": "info" if all(result["checks"].values()) else "rejected",
              "notes": "forced acceptance: the drafts committed per verify are set (tau), the draft and verify "
                       "networks run for real; random weights route experts about uniformly (real models do not); "
                       "every op runs its CPU reference; decode tok/s = tokens of decode/verify steps over their "
                       "wall time; speedup_vs_plain against plain decoding at the same concurrency, same run"}
    path = write_record(record, args.out or settings.records_dir(), args.stem)
    print("record:", path)
    return 0


def main(argv: list[str] | None = None) -> int:
    from netra.cli import run_module

    return run_module("netra bench spec", __doc__, add_arguments, cli, argv)


if __name__ == "__main__":
    sys.exit(main())
