"""Where a full-shape decode step stops being bitwise repeatable: every op output of one step, recorded in
order, for two eager runs and one CUDA-graph replay from the same state snapshot; prints the first op whose
output differs between the runs (and how many differ), per batch size.

    python3 scripts/gpu/step_determinism.py --batches 128 [--ssm-dtype float32] [--out DIR]

Uses netra.bench.step's engine, state and batch builders (the same step the record measures)."""

from __future__ import annotations

import argparse
import json
import os
import sys
import types
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import netra.engine.model as model_mod
from netra.bench import step
from netra.bench.timing import capture

WRAPPED_FUNCS = ("linear", "linear_group", "moe")
WRAPPED_MODULES = ("attention", "conv", "gdn", "norm")


class Recorder:
    def __init__(self) -> None:
        self.on = True
        self.calls: list[tuple[str, list[torch.Tensor]]] = []

    def wrap(self, name: str, fn: Any) -> Any:
        def run(*args: Any, **kwargs: Any) -> Any:
            out = fn(*args, **kwargs)
            if self.on:
                outs = out if isinstance(out, (tuple, list)) else (out,)
                self.calls.append((name, [o.clone() for o in outs if isinstance(o, torch.Tensor)]))
            return out
        return run


def install(rec: Recorder) -> dict[str, Any]:
    saved: dict[str, Any] = {}
    for n in WRAPPED_FUNCS:
        saved[n] = getattr(model_mod, n)
        setattr(model_mod, n, rec.wrap(n, saved[n]))
    for n in WRAPPED_MODULES:
        mod = getattr(model_mod, n)
        saved[n] = mod
        proxy = types.SimpleNamespace(**{a: (rec.wrap(f"{n}.{a}", getattr(mod, a)) if callable(getattr(mod, a))
                                             and not a.startswith("_") else getattr(mod, a)) for a in dir(mod)
                                         if not a.startswith("__")})
        setattr(model_mod, n, proxy)
    return saved


def first_diff(a: list[tuple[str, list[torch.Tensor]]], b: list[tuple[str, list[torch.Tensor]]]) -> dict[str, Any]:
    if len(a) != len(b):
        return {"error": f"op counts differ: {len(a)} vs {len(b)}"}
    diffs = []
    for i, ((na, ta), (nb, tb)) in enumerate(zip(a, b, strict=True)):
        assert na == nb, (i, na, nb)
        same = all(torch.equal(x, y) for x, y in zip(ta, tb, strict=True))
        if not same:
            d = max(float((x.float() - y.float()).abs().max()) for x, y in zip(ta, tb, strict=True))
            diffs.append({"index": i, "op": na, "max_abs": d})
    return {"ops": len(a), "differing": len(diffs), "first": diffs[:6]}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--batches", default="128")
    ap.add_argument("--ssm-dtype", default="float32", choices=("float32", "bfloat16"))
    ap.add_argument("--context", type=int, default=2048)
    ap.add_argument("--eager-runs", type=int, default=2, help="eager runs per batch, each compared with the first")
    ap.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", ".")))
    args = ap.parse_args()
    batches = [int(b) for b in args.batches.split(",")]
    engine = step.build(args.context, max(batches), args.ssm_dtype)
    rec = Recorder()
    install(rec)
    result: dict[str, Any] = {"ssm_dtype": args.ssm_dtype, "rows": []}
    for b in batches:
        lens = [args.context // 2 + (i * 7919) % (args.context // 2) for i in range(b)]
        step.fill_state(engine, b, seed=b)
        fb = step.decode_batch(engine, b, lens, seed=b)
        snap = step.snapshot(engine, b)
        runs = []
        for _ in range(args.eager_runs):
            step.restore(engine, b, snap)
            rec.calls = []
            engine.model.forward(fb)
            torch.cuda.synchronize()
            runs.append(rec.calls)
        step.restore(engine, b, snap)
        rec.calls = []
        graph, _ = capture(lambda fb=fb: engine.model.forward(fb))
        n_ops = len(runs[0])
        captured = rec.calls[-n_ops:]  # the warm-up run's records come first
        step.restore(engine, b, snap)
        graph.replay()
        torch.cuda.synchronize()
        row = {"batch": b, "eager_vs_eager": [first_diff(runs[0], r) for r in runs[1:]],
               "eager_vs_replay": first_diff(runs[0], captured)}
        result["rows"].append(row)
        print(json.dumps(row), flush=True)
        del graph, captured, runs
        torch.cuda.empty_cache()
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"step_determinism_{args.ssm_dtype}.json").write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
