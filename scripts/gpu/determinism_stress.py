"""Which op of the full-shape decode step is not bitwise repeatable (issue 19: eager != replay at B >= 64, now and then).

    timeout 90 python3 scripts/gpu/determinism_stress.py [--batches 64,128] [--n 500] [--ssm-dtype float32]

(NETRA_TACTIC_MIN_MATURITY defaults to ``experiment`` here, as the step record ran; NETRA_NO_PDL=1 is honoured.)

1. One eager decode step of netra.bench.step's engine per batch records the inputs of the first call of every
   distinct op signature (GDN layer 0's projections, conv, GDN, gated norm; attention layer's projections,
   q/k norm + RoPE + KV store, attention decode; the MoE block; the norms; the lm_head): the step's real tensors,
   with the in-place ops' state (conv / GDN pools) cloned before the call.
2. Per op: ``--n`` calls back to back on those inputs with no copy between them (the in-place ops: one restore copy
   of the state before each call), every output kept; then the same calls captured in one CUDA graph, replayed
   twice. Counts the runs whose output differs bitwise from the first eager run, the distinct outputs, and for the
   in-place ops a pass that also hashes the written state (the state's bits summed) after each call.
3. The conv update twice: the tree's kernel and the pre-fix variant (the same source without the
   ``tl.debug_barrier()`` between its state loads and in-place stores), to confirm or clear that race.
4. The whole step, no instrumentation: ``--steps`` eager steps from the same snapshot compared with the first,
   and as many graph replays (eager == replay, as netra.bench.step checks); then eager steps that hold every op's
   output by reference (no copy kernel between ops, unlike step_determinism.py: only the allocator's reuse
   changes), which name the first op whose output moved. All again with the pre-fix conv.

The table comes last: batch, op, variant, runs, runs differing from the first eager run, distinct outputs.
Stops starting new parts after ``--budget`` seconds (rows not run say so). Expected: ~40-70 s on one H200.
"""

from __future__ import annotations

import argparse
import linecache
import os
import sys
import time
import traceback
import types
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(Path(__file__).resolve().parent))

CONV_SOURCE = REPO / "kernels" / "sm90" / "conv" / "conv1d_update.py"
IN_PLACE = {"conv.causal_conv1d_update": 2, "gdn.gdn_decode_fused": 7}  # op -> the state pool's argument index
OUT_BYTES_CAP = 6 << 30  # outputs kept per op and pass (the lm_head at B = 128 is 127 MB a call)
T0 = time.monotonic()


def tensors_of(out: Any) -> list[torch.Tensor]:
    """An op's tensor outputs, flattened (a tensor, or a tuple / list of them)."""
    if isinstance(out, torch.Tensor):
        return [out]
    if isinstance(out, (tuple, list)):
        return [t for o in out for t in tensors_of(o)]
    return []


def sig_key(name: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[Any, ...]:
    """An op call's signature: its name and the shapes / dtypes of its tensors and of its weights' data."""
    def one(a: Any) -> Any:
        if isinstance(a, torch.Tensor):
            return (tuple(a.shape), str(a.dtype))
        if isinstance(a, (list, tuple)):
            return tuple(one(x) for x in a)
        data = getattr(a, "data", None)
        if isinstance(data, torch.Tensor):  # a Weight (or MoEWeights' first tensor field)
            return ("w", tuple(data.shape), str(data.dtype))
        if hasattr(a, "__dataclass_fields__"):
            return (type(a).__name__,)
        return None
    return (name, tuple(one(a) for a in args), tuple(sorted((k, one(v)) for k, v in kwargs.items())))


def as_bits(t: torch.Tensor) -> torch.Tensor:
    """The tensor's bit patterns (an integer view of the same element size): NaN payloads and signed zeros compare
    as bits, and torch.equal's NaN != NaN cannot count a NaN output as a difference."""
    return t.view({1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[t.element_size()])


def same(a: list[torch.Tensor], b: list[torch.Tensor]) -> bool:
    return len(a) == len(b) and all(x.shape == y.shape and x.dtype == y.dtype and torch.equal(as_bits(x), as_bits(y))
                                    for x, y in zip(a, b, strict=True))


def tally(runs: list[list[torch.Tensor]], ref: list[torch.Tensor] | None = None, reps_cap: int = 8
          ) -> tuple[int, int]:
    """(runs whose tensors differ bitwise from ``ref`` -- default the first run --, distinct outputs among ``ref``
    and the runs, counted up to ``reps_cap``)."""
    ref = runs[0] if ref is None else ref
    differ = sum(0 if same(r, ref) else 1 for r in runs)
    reps: list[list[torch.Tensor]] = [ref]
    for r in runs:
        if len(reps) >= reps_cap:
            break
        if not any(same(r, p) for p in reps):
            reps.append(r)
    return differ, len(reps)


def label_of(name: str, args: tuple[Any, ...]) -> str:
    """A row label: the op, and a linear's weight shape(s) (N x K, or the group's N parts)."""
    if name.startswith("linear") and len(args) > 1:
        ws = args[1] if isinstance(args[1], (list, tuple)) else [args[1]]
        shapes = [tuple(w.data.shape) for w in ws if isinstance(getattr(w, "data", None), torch.Tensor)]
        if shapes:
            return f"{name} {'+'.join(str(s[0]) for s in shapes)}x{shapes[0][1]}"
    return name


def pre_fix_conv_module() -> Any:
    """The conv update's module as it was before issue 19's fix: the same source without the CTA barrier between
    the state loads and the in-place stores (one ``tl.debug_barrier()`` line)."""
    text = CONV_SOURCE.read_text()
    lines = text.splitlines(True)
    kept = [ln for ln in lines if ln.strip() != "tl.debug_barrier()"]
    if len(kept) != len(lines) - 1:
        raise RuntimeError(f"{CONV_SOURCE}: expected exactly one tl.debug_barrier() line")
    src = "".join(kept)
    fname = str(CONV_SOURCE.with_name("conv1d_update_pre_fix.py"))  # a name of its own for Triton's source lookup
    linecache.cache[fname] = (len(src), None, kept, fname)
    mod = types.ModuleType("netra_stress_conv_pre_fix")
    mod.__file__ = fname
    sys.modules[mod.__name__] = mod
    exec(compile(src, fname, "exec"), mod.__dict__)
    return mod


class Recorder:
    """Wraps the model's ops (step_determinism.install's protocol): records the first call of every signature."""

    def __init__(self) -> None:
        self.on = False
        self.calls: dict[tuple[Any, ...], tuple[str, Any, tuple[Any, ...], dict[str, Any], torch.Tensor | None]] = {}
        self.held: list[tuple[str, list[torch.Tensor]]] | None = None  # every op output, by reference (no copy)

    def wrap(self, name: str, fn: Any) -> Any:
        def run(*args: Any, **kwargs: Any) -> Any:
            if self.on:
                key = sig_key(name, args, kwargs)
                if key not in self.calls:
                    idx = IN_PLACE.get(name)
                    snap = args[idx].clone() if idx is not None else None
                    self.calls[key] = (name, fn, args, kwargs, snap)
            out = fn(*args, **kwargs)
            if self.held is not None:
                self.held.append((name, tensors_of(out)))
            return out
        return run


def first_diff(a: list[tuple[str, list[torch.Tensor]]], b: list[tuple[str, list[torch.Tensor]]]) -> str:
    """The first op whose held output differs between two steps (index and name), or ''."""
    for i, ((na, ta), (_, tb)) in enumerate(zip(a, b, strict=True)):
        if not same(ta, tb):
            return f"op {i} {na}"
    return ""


def stress_op(name: str, fn: Any, args: tuple[Any, ...], kwargs: dict[str, Any], snap: torch.Tensor | None,
              n: int) -> list[dict[str, Any]]:
    """The op's rows: eager back to back, eager with the state hashed (in-place ops), one graph replayed twice."""
    pool = args[IN_PLACE[name]] if snap is not None else None

    def call(hash_state: bool = False) -> list[torch.Tensor]:
        if pool is not None:
            pool.copy_(snap)
        outs = tensors_of(fn(*args, **kwargs))
        if hash_state and pool is not None:
            outs.append(torch.sum(as_bits(pool), dtype=torch.int64))
        return outs

    first = call()
    torch.cuda.synchronize()
    per_call = sum(t.numel() * t.element_size() for t in first)
    n = max(2, min(n, OUT_BYTES_CAP // max(per_call, 1)))
    rows = []
    runs = [call() for _ in range(n)]
    torch.cuda.synchronize()
    d, k = tally(runs, first)
    rows.append({"variant": "eager", "runs": n, "differ": d, "distinct": k})
    del runs
    if pool is not None:
        ref_state = call(hash_state=True)
        runs = [call(hash_state=True) for _ in range(n)]
        torch.cuda.synchronize()
        d, k = tally(runs, ref_state)
        rows.append({"variant": "eager+state", "runs": n, "differ": d, "distinct": k})
        del runs
    g = torch.cuda.CUDAGraph()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        call()
    torch.cuda.current_stream().wait_stream(side)
    with torch.cuda.graph(g):
        gruns = [call() for _ in range(n)]
    d_all = k_max = 0
    for _ in range(2):
        g.replay()
        torch.cuda.synchronize()
        d, k = tally(gruns, first)
        d_all, k_max = d_all + d, max(k_max, k)
    rows.append({"variant": "graph x2", "runs": 2 * n, "differ": d_all, "distinct": k_max})
    del g, gruns
    return rows


def conv_tactic_module() -> Any:
    """The conv update tactic's module as the runtime loaded it (sys.modules netra_tactics.sm90.conv.*)."""
    return next((m for n, m in sys.modules.items() if n.startswith("netra_tactics.sm90.conv.")), None)


def step_rows(engine: Any, b: int, fb: Any, snap: list[Any], steps: int, label: str, rec: Recorder
              ) -> list[dict[str, Any]]:
    """The whole step, uninstrumented: eager from the snapshot ``steps`` times, then a graph replayed ``steps``
    times, each compared with the first eager step's logits; then eager steps holding every op's output by
    reference (no copy kernel between ops, unlike step_determinism.py), which names the first differing op."""
    from netra.bench import step
    from netra.bench.timing import capture

    eager = []
    for _ in range(steps):
        step.restore(engine, b, snap)
        eager.append([engine.model.forward(fb).clone()])
    torch.cuda.synchronize()
    d, k = tally(eager)
    rows = [{"op": "step", "variant": f"eager{label}", "runs": steps, "differ": d, "distinct": k}]
    step.restore(engine, b, snap)
    graph, out = capture(lambda: engine.model.forward(fb))
    reps = []
    for _ in range(steps):
        step.restore(engine, b, snap)
        graph.replay()
        reps.append([out.clone()])
    torch.cuda.synchronize()
    d, k = tally(reps, eager[0])
    rows.append({"op": "step", "variant": f"graph{label}", "runs": steps, "differ": d, "distinct": k})
    del graph, out, reps
    held = []
    try:
        for _ in range(steps):
            step.restore(engine, b, snap)
            cur: list[tuple[str, list[torch.Tensor]]] = []
            rec.held = cur
            logits = engine.model.forward(fb)
            held.append([*cur, ("logits", [logits])])
    finally:
        rec.held = None
    torch.cuda.synchronize()
    d, k = tally([[t for _, ts in h for t in ts] for h in held])
    firsts = sorted({f for f in (first_diff(held[0], h) for h in held[1:]) if f})
    rows.append({"op": "step", "variant": f"eager held{label}", "runs": steps, "differ": d, "distinct": k,
                 "first": "; ".join(firsts)[:120]})
    del held
    step.restore(engine, b, snap)
    return rows


def run(args: argparse.Namespace, table: list[dict[str, Any]]) -> None:
    from step_determinism import install

    from netra.bench import step
    from netra.ops import _common

    batches = [int(x) for x in args.batches.split(",")]
    engine = step.build(args.context, max(batches), args.ssm_dtype)
    print(f"engine built at {time.monotonic() - T0:.1f} s; ssm {engine.pools.ssm.dtype}; "
          f"NETRA_NO_PDL={os.environ.get('NETRA_NO_PDL', '')}", flush=True)
    rec = Recorder()
    install(rec)  # type: ignore[arg-type]  # its wrap(name, fn) protocol
    pre_fix = pre_fix_conv_module()
    for b in batches:
        lens = [args.context // 2 + (i * 7919) % (args.context // 2) for i in range(b)]
        step.fill_state(engine, b, seed=b)
        fb = step.decode_batch(engine, b, lens, seed=b)
        snap = step.snapshot(engine, b)
        rec.calls, rec.on = {}, True
        engine.model.forward(fb)
        torch.cuda.synchronize()
        rec.on = False
        print(f"B={b}: {len(rec.calls)} op signatures; decisions {_common.decisions()}", flush=True)
        conv_mod = conv_tactic_module()
        for name, fn, a, kw, st in rec.calls.values():
            label = label_of(name, a)
            if time.monotonic() - T0 > args.budget:
                table.append({"batch": b, "op": label, "variant": "-", "note": "skipped (time budget)"})
                continue
            try:
                for r in stress_op(name, fn, a, kw, st, args.n):
                    table.append({"batch": b, "op": label, **r})
                if name == "conv.causal_conv1d_update" and conv_mod is not None:
                    fixed = conv_mod._conv1d_update_kernel
                    conv_mod._conv1d_update_kernel = pre_fix._conv1d_update_kernel
                    try:
                        for r in stress_op(name, fn, a, kw, st, args.n):
                            table.append({"batch": b, "op": label + " PRE-FIX", **r})
                    finally:
                        conv_mod._conv1d_update_kernel = fixed
            except Exception as exc:  # one op's failure must not lose the others' rows
                traceback.print_exc()
                table.append({"batch": b, "op": label, "variant": "-", "note": f"{type(exc).__name__}: {exc}"[:80]})
            torch.cuda.empty_cache()
        step.restore(engine, b, snap)
        for pre in ((False, True) if conv_mod is not None else (False,)):
            if time.monotonic() - T0 > args.budget:
                table.append({"batch": b, "op": "step", "variant": "-", "note": "skipped (time budget)"})
                continue
            fixed = conv_mod._conv1d_update_kernel if conv_mod is not None else None
            if pre and conv_mod is not None:
                conv_mod._conv1d_update_kernel = pre_fix._conv1d_update_kernel
            try:
                for r in step_rows(engine, b, fb, snap, args.steps, " PRE-FIX conv" if pre else "", rec):
                    table.append({"batch": b, **r})
            except Exception as exc:
                traceback.print_exc()
                table.append({"batch": b, "op": "step", "variant": "-", "note": f"{type(exc).__name__}: {exc}"[:80]})
            finally:
                if conv_mod is not None:
                    conv_mod._conv1d_update_kernel = fixed
        del snap, fb
        torch.cuda.empty_cache()


def print_table(table: list[dict[str, Any]]) -> None:
    print(f"\n{'B':>4s} {'op':44s} {'variant':22s} {'runs':>5s} {'differ':>6s} {'distinct':>8s}")
    for r in table:
        if "note" in r:
            print(f"{r['batch']:4d} {r['op'][:44]:44s} {r['variant']:22s} {r['note']}")
            continue
        flag = "  <-- NOT REPEATABLE" if r["differ"] else ""
        if r.get("first"):
            flag += f" (first: {r['first']})"
        print(f"{r['batch']:4d} {r['op'][:44]:44s} {r['variant']:22s} {r['runs']:5d} {r['differ']:6d} "
              f"{r['distinct']:8d}{flag}")
    print(f"wall {time.monotonic() - T0:.1f} s", flush=True)


def main(argv: list[str] | None = None, entry: Callable[[argparse.Namespace, list[dict[str, Any]]], None] = run
         ) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--batches", default="64,128")
    ap.add_argument("--n", type=int, default=500, help="calls per op and pass (default: %(default)s)")
    ap.add_argument("--steps", type=int, default=6, help="whole steps per arm (default: %(default)s)")
    ap.add_argument("--ssm-dtype", default="float32", choices=("float32", "bfloat16"))
    ap.add_argument("--context", type=int, default=2048)
    ap.add_argument("--budget", type=float, default=70.0, help="seconds after which no new part starts")
    args = ap.parse_args(argv)
    if entry is run:
        if not torch.cuda.is_available():
            print("determinism_stress: needs a CUDA GPU")
            return 2
        os.environ.setdefault("NETRA_TACTIC_MIN_MATURITY", "experiment")  # as the step record ran
    table: list[dict[str, Any]] = []
    try:
        entry(args, table)
    except Exception:  # the table of what ran is still printed last
        traceback.print_exc()
    print_table(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
