"""Row argmax over the vocabulary (kernels/sm90/argmax, issue 2): every sm90 argmax contract checked and timed
against ``torch.argmax`` (the fallback) under the one harness.

Cases: float32 and bfloat16 at rows 1, 2, 4, 8, 16, 128, 256 (timed) and the other graph buckets of
`netra.validate.argmax_cases.BUCKETS` (checked only), vocab 248,320. The contract of a case is the one dispatch
picks there (`netra.ops.argmax.contract_for`).

Check (`check`, the same code on the GPU and in the smoke path; the device and the provider are parameters): every
adversarial scenario of `netra.validate.argmax_cases` at the case's row count (ties across the kernel's chunk
boundaries, signed zeros, infinities, NaNs first / middle / last, subnormals, monotone rows), the output poisoned
first (-7), judged by `netra.validate.compare` under the contract's numerics (bitwise) against the oracle
(``argmax_ref``) and against the key emulation of the contract's chunk split (`emulate_two_stage`, bitwise); on the
GPU also against the CPU oracle at <= 8 rows, dispatch selecting the case's contract, and eager == CUDA-graph
replay on fresh data written into the captured input.

Providers (timed): ``netra`` (the tactic dispatch picks, launched directly), ``torch.argmax``, and every other
sm90 contract's tactic (not rejected) that can run the shape (``netra:<contract>``): the promotion rule
(`netra.validate.promotion`) wants ours at or below each of them at every timed shape. Inputs rotate over 180 MB
(three times the L2). The issue's targets (`TARGETS`: fp32 [16] >= 3x torch.argmax, fp32 [128] >= 0.80 of the
copy floor, bf16 [128] >= 0.70) are reported in ``targets`` and do not decide.

Exploration (``--argmax-explore pdl,u16,u16pdl,probe,tb<N>``; off by default): extra cases with no contract
(never promoted) timing the chunked tactic with programmatic dependent launch, its 16-loads-per-thread entry
(with / without PDL), the fold-free read probe (its output must stay poisoned) and other launch widths, each
checked exact against ``torch.argmax`` first.

Smoke (CPU, ``--smoke``): the same `check`, every scenario at full vocab on float32 rows 3 and bfloat16 rows 2, with
the provider the CPU can run: the key emulation of the contract's chunk split (the CUDA kernel's reduction,
key by key), judged against the oracle. It covers the harness, the adversarial inputs, the chunk split and key design against
``torch.argmax``, and the comparison; only the GPU run covers the CUDA code objects themselves, dispatch's choice,
graph replay, the CPU-oracle cross-check and the timing.
"""

from __future__ import annotations

import argparse
import functools
from collections.abc import Callable, Iterator
from typing import Any

from netra.bench.harness import Case, CaseBuilder, Spec

DTYPES = ("float32", "bfloat16")
ROWS = (1, 2, 4, 8, 16, 128, 256)
L2_ROTATE_BYTES = 180 * 2**20  # three times the H200's L2
# The targets: (dtype, rows, metric, threshold); reported beside the promotion rule, not deciding it.
TARGETS = (("float32", 16, "speedup", 3.0), ("float32", 128, "floor_fraction", 0.80),
           ("bfloat16", 128, "floor_fraction", 0.70))
SMOKE = (("float32", 3), ("bfloat16", 2))
EXPLORE = ("pdl", "u16", "u16pdl", "probe")
REPLAY_SCENARIOS = (("random", 2000), ("several_nans", 3000), ("tie_far", 4000))

Run = Callable[[Any, Any], Any]  # (x, out) -> indices (written into out)


def contract_name(rows: int, dtype: str) -> str:
    from netra.ops import argmax as op

    return str(op.contract_for(rows, dtype).name)


def emulation(rows: int, dtype: str) -> Run:
    """The kernel's reduction emulated in PyTorch on ``x``'s device (the contract's chunk split, its 64-bit keys)."""
    from netra.ops import argmax as op
    from netra.validate.argmax_cases import emulate_two_stage

    _, chunks = op.contract_launch_shape(rows, dtype)
    vec = op.vec_elems(dtype)
    return lambda x, out: out.copy_(emulate_two_stage(x, chunks, vec))


def check(rows: int, dtype: str, device: str, run: Run, scenarios: tuple[str, ...] | None = None,
          replay: bool = False, expect: str | None = None, vs_emulation: bool = True) -> dict[str, Any]:
    """``run`` on every adversarial scenario at ``rows`` x ``dtype``: bitwise the oracle and the key emulation
    (`netra.validate.compare`, the contract's numerics), the output poisoned first; on the GPU (``replay``) also
    the CPU oracle at <= 8 rows and eager == graph replay; ``expect``: the contract dispatch must pick.
    ``vs_emulation`` False where ``run`` is the emulation itself (the smoke path)."""
    import torch

    from netra.catalog import contract_doc
    from netra.ops import argmax as op
    from netra.validate import argmax_cases as ac
    from netra.validate.compare import compare

    name = contract_name(rows, dtype)
    numerics = contract_doc(name)["numerics"]
    vocab = op.VOCAB
    _, chunks = op.contract_launch_shape(rows, dtype)
    vec = op.vec_elems(dtype)
    bounds = ac.chunk_bounds(vocab, vec, chunks)
    emulate = emulation(rows, dtype)
    out: dict[str, Any] = {"contract": name, "policy": numerics["policy"], "chunks": chunks}
    if expect is not None:
        x = torch.empty(rows, vocab, dtype=getattr(torch, dtype), device=device)
        t = op.dispatch.select(op.signature(x)).tactic
        out["selected"] = t.contract.name if t is not None else "fallback"
    failures: list[str] = []
    n = 0
    for i, s in enumerate(scenarios or ac.SCENARIOS):
        x = ac.build(ac.Case(s, rows, dtype, 7919 * rows + i), vocab, device, bounds)
        got = run(x, torch.full((rows,), -7, dtype=torch.int64, device=device))
        judged = {"oracle": compare(numerics, got, op.argmax_ref(x))}
        if vs_emulation:
            judged["emulation"] = compare(numerics, got, emulate(x, torch.empty(rows, dtype=torch.int64,
                                                                                device=device)))
        if replay and rows <= 8:
            judged["cpu_oracle"] = compare(numerics, got.cpu(), op.argmax_ref(x.cpu()))
        n += 1
        bad = [k for k, v in judged.items() if not v["ok"]]
        if bad:
            failures.append(f"{s}: {bad} got {got[:4].tolist()} want {op.argmax_ref(x)[:4].tolist()}")
    out.update(scenarios=n, mismatches=len(failures), failures=failures[:10])
    if replay:
        out["eager_equals_replay"] = eager_equals_replay(rows, dtype, device, run, bounds)
    ok = not failures and out.get("eager_equals_replay", True) is True and out.get("selected", expect) == expect
    return {**out, "ok": ok}


def eager_equals_replay(rows: int, dtype: str, device: str, run: Run, bounds: list[tuple[int, int]]) -> bool:
    """``run`` captured once, replayed on fresh data written into the captured input (so the workspace resets
    between replays), bitwise the eager result and the oracle, the output poisoned before each replay."""
    import torch

    from netra.ops import argmax as op
    from netra.validate import argmax_cases as ac

    x = ac.build(ac.Case("tie_boundary", rows, dtype, 1000 + rows), op.VOCAB, device, bounds)
    out_g = torch.full((rows,), -7, dtype=torch.int64, device=device)
    run(x, out_g)  # eager warm-up: loads the tactic before capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        run(x, out_g)
    ok = True
    for scenario, seed in REPLAY_SCENARIOS:
        x.copy_(ac.build(ac.Case(scenario, rows, dtype, seed + rows), op.VOCAB, device, bounds))
        eager = run(x, torch.full((rows,), -5, dtype=torch.int64, device=device)).clone()
        out_g.fill_(-7)
        graph.replay()
        torch.cuda.synchronize()
        ok = ok and torch.equal(eager, out_g) and torch.equal(eager, op.argmax_ref(x))
    return ok


# ---- the GPU run -------------------------------------------------------------------------------------------


def _tactics(rows: int, dtype: str) -> tuple[Any, list[tuple[str, Any]]]:
    """The tactic dispatch picks for ``rows`` x ``dtype``, and every other sm90 argmax tactic (not rejected) that
    can run the shape, as (provider name, tactic)."""
    import torch

    from netra.catalog import Catalog
    from netra.ops import argmax as op
    from netra.runtime import load_tactic

    x = torch.empty(rows, op.VOCAB, dtype=getattr(torch, dtype), device="cuda")
    ours = op.dispatch.select(op.signature(x)).tactic
    if ours is None:
        raise RuntimeError(f"argmax {dtype} rows {rows}: dispatch picked no tactic")
    others = []
    for c in Catalog.load().for_op("argmax"):
        if c.target != "sm90" or c.declaration or c.maturity == "rejected" or c.name == ours.contract.name \
                or dtype not in c.dtypes["x"] or not c.dims["rows"].contains(rows):
            continue
        others.append((f"netra:{c.name}", load_tactic(c, torch.cuda.current_device())))
    return ours, others


class Shape:
    """Rotated inputs and outputs at one (dtype, rows) on the GPU (past the L2)."""

    def __init__(self, rows: int, dtype: str) -> None:
        import torch

        from netra.ops import argmax as op

        self.rows, self.dtype = rows, dtype
        self.nbytes = rows * op.VOCAB * getattr(torch, dtype).itemsize
        self.n = max(2, min(512, -(-L2_ROTATE_BYTES // self.nbytes)))
        self.xs = [torch.randn(rows, op.VOCAB, device="cuda").to(getattr(torch, dtype)) for _ in range(self.n)]

    def outs(self) -> list[Any]:
        import torch

        return [torch.full((self.rows,), -7, dtype=torch.int64, device="cuda") for _ in range(self.n)]

    def provider(self, fn: Run) -> Callable[[int], Any]:
        outs = self.outs()
        self.held = [*getattr(self, "held", []), outs]
        return lambda i: fn(self.xs[i], outs[i])


def gpu_case(dtype: str, rows: int, timed: bool) -> Case:
    import torch

    from netra.ops import argmax as op

    ours, others = _tactics(rows, dtype)
    name = ours.contract.name

    def launch(t: Any) -> Run:
        return lambda x, o: op.launch(t, x, o)

    def chk() -> dict[str, Any]:
        return check(rows, dtype, "cuda", lambda x, o: op.argmax(x, out=o), replay=True, expect=name)

    case = Case(key=f"{dtype} rows={rows}", op="argmax", shape={"rows": rows, "vocab": op.VOCAB}, dtype=dtype,
                check=chk, contract=name, ours="netra")
    if timed:
        sh = Shape(rows, dtype)
        case.providers = {"netra": sh.provider(launch(ours)),
                          "torch.argmax": sh.provider(lambda x, o: torch.argmax(x, dim=-1, out=o)),
                          **{p: sh.provider(launch(t)) for p, t in others}}
        case.n_inputs, case.floor_bytes, case.hold = sh.n, sh.nbytes, sh
    return case


def explore_case(dtype: str, rows: int, wanted: list[str]) -> Case:
    """Launch variants of the chunked tactic (no contract: timed beside it, never promoted), each checked first:
    exact against ``torch.argmax``, or, for the read-only probe, its output still poisoned."""
    import torch

    from netra.ops import argmax as op

    ours, _ = _tactics(rows, dtype)
    if op.is_cluster(ours.contract):
        raise RuntimeError(f"{dtype} rows {rows}: the explorations vary the chunked tactic; dispatch picked "
                           f"{ours.contract.name}")
    variants: dict[str, tuple[Run, bool]] = {}
    for v in wanted:
        if v == "pdl":
            variants["netra+pdl"] = (lambda x, o: op.launch(ours, x, o, pdl=True), True)
        elif v in ("u16", "u16pdl", "probe"):
            sym = "netra_argmax_probe_sm90" if v == "probe" else "netra_argmax_u16_sm90"
            pdl = v == "u16pdl"
            op.chunked_variant(ours, sym, pdl)  # resolved eagerly, before any capture
            variants[f"netra:{v}"] = (functools.partial(op.launch, ours, symbol=sym, pdl=pdl), v != "probe")
        elif v.startswith("tb"):
            variants[f"netra@{v}"] = (functools.partial(op.launch, ours, target_blocks=int(v[2:])), True)
        else:
            raise ValueError(f"--argmax-explore {v!r}: choose from {', '.join(EXPLORE)}, tb<N>")
    sh = Shape(rows, dtype)

    def chk() -> dict[str, Any]:
        out: dict[str, Any] = {}
        for name, (fn, exact) in variants.items():
            o = fn(sh.xs[0], torch.full((rows,), -7, dtype=torch.int64, device="cuda"))
            torch.cuda.synchronize()
            out[name] = bool(torch.equal(o, op.argmax_ref(sh.xs[0]))) if exact else bool((o == -7).all())
        return {**out, "ok": all(out.values())}

    provs = {"netra": sh.provider(lambda x, o: op.launch(ours, x, o)),
             "torch.argmax": sh.provider(lambda x, o: torch.argmax(x, dim=-1, out=o)),
             **{n: sh.provider(fn) for n, (fn, _) in variants.items()}}
    return Case(key=f"{dtype} rows={rows} explore", op="argmax_explore", shape={"rows": rows, "vocab": op.VOCAB},
                dtype=dtype, providers=provs, check=chk, n_inputs=sh.n, floor_bytes=sh.nbytes, hold=sh)


def _ints(s: str, default: tuple[int, ...]) -> list[int]:
    return [int(v) for v in s.split(",") if v] if s else list(default)


def cases(opts: argparse.Namespace) -> Iterator[CaseBuilder]:
    from netra.validate.argmax_cases import BUCKETS

    timed = _ints(getattr(opts, "argmax_rows", ""), ROWS)
    dtypes = [d for d in (getattr(opts, "argmax_dtypes", "") or ",".join(DTYPES)).split(",") if d]
    explore = [v for v in getattr(opts, "argmax_explore", "").split(",") if v]
    for dtype in dtypes:
        for rows in timed:
            yield functools.partial(gpu_case, dtype, rows, True)
    for dtype in dtypes:  # the rest of the contract's graph buckets: checked, not timed
        for rows in (r for r in BUCKETS if r not in timed):
            yield functools.partial(gpu_case, dtype, rows, False)
    if explore:
        for rows in _ints(getattr(opts, "argmax_explore_rows", ""), (1, 16)):
            yield functools.partial(explore_case, "float32", rows, explore)


def smoke_case(dtype: str, rows: int) -> Case:
    return Case(key=f"{dtype} rows={rows}", op="argmax", shape={"rows": rows}, dtype=dtype,
                check=functools.partial(check, rows, dtype, "cpu", emulation(rows, dtype), vs_emulation=False),
                contract=contract_name(rows, dtype))


def smoke() -> Iterator[CaseBuilder]:
    for dtype, rows in SMOKE:
        yield functools.partial(smoke_case, dtype, rows)


def targets(record: dict[str, Any]) -> dict[str, Any]:
    """The issue's thresholds on the record's rows: speedup = torch.argmax's median / ours; floor fraction ours."""
    def med(dtype: str, rows: int, provider: str) -> dict[str, Any] | None:
        return next((r for r in record["rows"] if r["dtype"] == dtype and r["provider"] == provider
                     and r["op"] == "argmax" and r["shape"]["rows"] == rows), None)

    out: dict[str, Any] = {}
    for dtype, rows, metric, need in TARGETS:
        ours, ref = med(dtype, rows, "netra"), med(dtype, rows, "torch.argmax")
        if metric == "speedup":
            value = round(ref["median_us"] / ours["median_us"], 3) if ours and ref else None
        else:
            value = ours.get("floor_fraction") if ours else None
        out[f"{dtype}[{rows}] {metric} >= {need}"] = {"need": need, "value": value,
                                                       "pass": value is not None and value >= need}
    return out


def setup(opts: argparse.Namespace) -> dict[str, Any]:
    from netra import dispatch

    if not getattr(opts, "smoke", False):
        dispatch.reset(dispatch.Dispatcher(min_maturity="experiment", disabled=False))
    return {"min_maturity": "experiment"}


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--argmax-rows", default="", help=f"argmax: timed row counts (default {ROWS})")
    p.add_argument("--argmax-dtypes", default="", help="argmax: dtypes (default float32,bfloat16)")
    p.add_argument("--argmax-explore", default="",
                   help=f"argmax: exploration rows, comma-separated from {', '.join(EXPLORE)}, tb<N> (default none)")
    p.add_argument("--argmax-explore-rows", default="", help="argmax: fp32 rows of the explorations (default 1,16)")


SPEC = Spec(name="argmax", family="argmax", doc="row argmax over the vocabulary against torch.argmax",
            cases=cases, smoke=smoke, setup=setup, targets=targets, add_arguments=add_arguments,
            contracts=("argmax_f32_v248320", "argmax_bf16_v248320"))  # the rejected cluster tactic is not run
