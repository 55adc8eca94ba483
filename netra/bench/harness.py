"""One harness for every kernel family's GPU run: check, time, record (issue 34).

A family is a `Spec` in ``netra/bench/specs/<name>.py`` (``SPEC = Spec(...)``): the cases it runs and how
to build each, and nothing else. The harness does the rest the same way for all of them:

- **check** each case first (`Case.check`: the family's assertions, its outputs judged by
  `netra.validate.compare` under the contract's declared policy, eager == graph replay, outputs
  poisoned before the run); an exception is a failed check, recorded with its traceback;
- **time** the case's providers side by side (`netra.bench.timing`: rotated inputs past the L2, CUDA
  graph replay, interleaved samples, median/p10/p90), with the copy rate measured in the same run as
  the ceiling (``floor_fraction``);
- **record** (RESULTS.md): rows, checks, and the one promotion rule (`netra.validate.promotion`) per
  contract; ``targets`` from the spec's issue thresholds beside it; the code objects measured (source
  sha256, as the lock pins them).

Each spec also has a **smoke path** (``--smoke``): small cases on the CPU with Triton's interpreter
(`netra.ops._interp`), checks only, no timing; CI runs every spec's (tests/bench/test_harness.py), so the
harness and each spec's checks run without a GPU. A smoke record (``status: "smoke"``) times and
promotes nothing; it is printed, and written only when ``--out`` is given.

    python -m netra.bench.harness --list
    python -m netra.bench.harness norm_fp8 --out $OUT/norm_fp8 [--deadline 150] [--samples 20]
    python -m netra.bench.harness --all --smoke
"""

from __future__ import annotations

import argparse
import hashlib
import importlib
import json
import os
import pkgutil
import sys
import time
import traceback
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from netra.settings import REPO_ROOT


@dataclass
class Case:
    """One shape of a spec: what to check there and what to time.

    ``providers`` maps a provider name to ``fn(i)`` over input set ``i`` (``n_inputs`` rotated sets, sized
    by the spec past the L2); ``ours`` names the provider that runs ``contract``'s tactic (the promotion
    rule compares it with every other provider of the case). ``check`` returns ``{"ok": bool, ...}``.
    ``key`` identifies the shape in the record (unique within a run)."""

    key: str
    op: str
    shape: Mapping[str, Any]
    dtype: str
    providers: Mapping[str, Callable[[int], Any]] = field(default_factory=dict)
    check: Callable[[], Mapping[str, Any]] | None = None
    contract: str | None = None
    ours: str = "netra"
    n_inputs: int = 1
    floor_bytes: float | None = None
    hold: Any = None
    graph: bool = True
    min_calls: int = 32


CaseBuilder = Callable[[], Case]


@dataclass
class Spec:
    """A family's GPU run as data: ``cases(opts)`` yields case builders (built one at a time, so a run
    holds one case's tensors); ``smoke()`` yields the smoke path's cases (CPU, interpreter; only their
    checks run). ``setup`` runs once before the cases (dispatch reset, a peer's loading);
    ``targets(record)`` returns the issue's thresholds judged on the record (reported, not deciding);
    ``contracts`` are the contracts whose code objects the record pins."""

    name: str
    family: str
    doc: str
    cases: Callable[[argparse.Namespace], Iterable[CaseBuilder]]
    smoke: Callable[[], Iterable[CaseBuilder]]
    contracts: Sequence[str] = ()
    setup: Callable[[argparse.Namespace], Mapping[str, Any] | None] | None = None
    targets: Callable[[dict[str, Any]], Mapping[str, Any]] | None = None
    add_arguments: Callable[[argparse.ArgumentParser], None] | None = None
    target: str = "sm90"
    samples: int = 20


def specs() -> dict[str, Spec]:
    """Every spec under netra/bench/specs, by name."""
    import netra.bench.specs as pkg

    out: dict[str, Spec] = {}
    for m in pkgutil.iter_modules(pkg.__path__):
        spec = getattr(importlib.import_module(f"netra.bench.specs.{m.name}"), "SPEC", None)
        if isinstance(spec, Spec):
            out[spec.name] = spec
    return out


def entry(contract: str) -> tuple[Callable[..., Any], dict[str, Any]]:
    """A contract's Triton entry bound to its launch (``fn(**op_args)``), and the contract's document: the
    tactic called directly, compiled on a GPU or under the interpreter (the smoke paths; dispatch on a CPU
    picks the reference)."""
    from netra.catalog import contract_doc
    from netra.ops._triton import load_source

    doc = contract_doc(contract)
    fn = getattr(load_source(doc["kernel"]["source"]), doc["kernel"]["symbol"])
    return (lambda **kw: fn(doc["launch"], **kw)), doc


def code_objects(contracts: Iterable[str]) -> dict[str, Any]:
    """The code objects measured, as kernels/lock.json pins them (a record is evidence for exactly these bytes):
    object name -> {contract, source, sha256}, every object of a plan contract included; the sha256 is the lock's
    (the cubin's for a CUDA object, the source's for a Triton one: what the runtime verifies before it loads one),
    the source's own where the lock has no entry."""
    from netra.catalog import Catalog
    from netra.kernel_lock import read_lock

    lock = {e["name"]: e for e in read_lock()["code_objects"]}
    cat = Catalog.load()
    out: dict[str, Any] = {}
    for name in contracts:
        for obj in cat.by_name(name).objects:
            src = obj.kernel["source"]
            e = lock.get(obj.name)
            out[obj.name] = {"contract": name, "source": src, "kind": e["kind"] if e else None,
                             "sha256": e["sha256"] if e else hashlib.sha256((REPO_ROOT / src).read_bytes()).hexdigest()}
    return out


def run_check(case: Case) -> dict[str, Any]:
    """The case's check, an exception recorded as a failure (so one broken case does not end the run)."""
    if case.check is None:
        return {"ok": False, "error": "no check: an unchecked case is not evidence"}
    try:
        res = dict(case.check())
    except Exception:
        res = {"ok": False, "error": traceback.format_exc()[-1500:]}
    res["ok"] = bool(res.get("ok"))
    return res


def _describe(build: CaseBuilder, i: int) -> str:
    """A case builder not run, readably: its name, or its bound arguments (a lambda's defaults, a partial's args)."""
    name = getattr(build, "__name__", "")
    args = getattr(build, "__defaults__", None) or getattr(build, "args", None)
    label = f"case {i}" + (f" {name}" if name and name != "<lambda>" else "")
    return (label + (f" {args!r}" if args else ""))[:200]


def _json(v: Any) -> Any:
    return json.loads(json.dumps(v, default=str))


def _finish(record: dict[str, Any], checks: dict[str, Any], contracts: Mapping[str, str],
            timings: Mapping[str, dict[str, dict[str, float]]], ours: Mapping[str, str]) -> None:
    from netra.validate.promotion import judge, promote

    failed = [k for k, c in checks.items() if not c["ok"]]
    record["checks"] = {"cases": len(checks), "mismatches": len(failed), "failed": failed,
                        "eager_equals_replay": all(c.get("eager_equals_replay") is not False for c in checks.values())
                        and bool(checks), "by_case": _json(checks)}
    by_contract: dict[str, Any] = {}
    cut = record.get("skipped_past_deadline")
    for name in sorted(set(contracts.values())):
        mine = [c for k, c in checks.items() if contracts.get(k) == name]
        by_contract[name] = promote(mine, timings.get(name, {}), ours.get(name, "netra"))
        if cut and by_contract[name]["pass"]:  # a skipped case may have been this contract's: not evidence
            by_contract[name] = {**by_contract[name], "pass": False, "cut": f"{len(cut)} cases skipped past the deadline"}
    record.update(judge(by_contract))


def run(spec: Spec, opts: argparse.Namespace) -> dict[str, Any]:
    """Check and time every case of ``spec`` (GPU), or only check its smoke cases (``opts.smoke``)."""
    from netra.bench.timing import Provider, copy_bandwidth, interleave, row

    t0 = time.monotonic()
    smoke = bool(getattr(opts, "smoke", False))
    record: dict[str, Any] = {
        "kind": "kernel", "family": spec.family, "target": spec.target, "spec": spec.name,
        "git_sha": getattr(opts, "git_sha", "") or os.environ.get("NETRA_GIT_SHA", ""),
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "command": f"python -m netra.bench.harness {spec.name} --out <dir>" + (" --smoke" if smoke else ""),
        "status": "measured", "rows": [], "verdict": "info"}
    if smoke:
        record.update(status="smoke", device="cpu (Triton interpreter)")
    else:
        import torch

        record["device"] = torch.cuda.get_device_name()
    if spec.setup is not None:
        record["setup"] = _json(spec.setup(opts) or {})
    copy_bps = None if smoke else copy_bandwidth()
    if copy_bps:
        record["copy_bandwidth_gbps"] = round(copy_bps / 1e9, 1)
    checks: dict[str, Any] = {}
    contracts: dict[str, str] = {}
    timings: dict[str, dict[str, dict[str, float]]] = {}
    ours: dict[str, str] = {}
    skipped: list[str] = []
    deadline = float(getattr(opts, "deadline", 0) or 0)
    for i, build in enumerate(spec.smoke() if smoke else spec.cases(opts)):
        if deadline and time.monotonic() - t0 > deadline:
            skipped.append(_describe(build, i))
            continue
        try:
            case = build()
        except Exception:
            checks[f"case {i}"] = {"ok": False, "error": traceback.format_exc()[-1500:]}
            print(checks[f"case {i}"]["error"], flush=True)
            continue
        res = run_check(case)
        checks[case.key] = res
        if case.contract:
            contracts[case.key] = case.contract
        line = f"{spec.name} {case.key}: check {'ok' if res['ok'] else 'FAILED'}"
        if not res["ok"] and "error" in res:
            line += "\n" + res["error"]
        if not smoke and case.providers:
            try:
                provs = [Provider(n, fn, case.n_inputs, case.min_calls, graph=case.graph, hold=case.hold)
                         for n, fn in case.providers.items()]
                stats = interleave(provs, samples=int(getattr(opts, "samples", 0) or spec.samples), deadline_s=3.0)
            except Exception:
                checks[case.key] = {**res, "ok": False, "timing_error": traceback.format_exc()[-1500:]}
                print(f"{line}\n{checks[case.key]['timing_error']}", flush=True)
                continue
            for prov, st in stats.items():
                record["rows"].append(row(case.op, dict(case.shape), case.dtype, prov, st, case.floor_bytes, copy_bps,
                                          **({"contract": case.contract} if case.contract and prov == case.ours
                                             else {})))
            if case.contract:
                timings.setdefault(case.contract, {})[case.key] = {p: float(s["median_us"]) for p, s in stats.items()}
                ours[case.contract] = case.ours
            line += "  " + "  ".join(f"{p} {float(s['median_us']):.2f} us" for p, s in stats.items())
        print(line, flush=True)
        del case
    if skipped:
        record["skipped_past_deadline"] = skipped
    _finish(record, checks, contracts, timings, ours)
    if smoke:
        record["verdict"] = "info"  # a smoke run times nothing: it promotes nothing
        record.pop("promotion", None)
        record.pop("not_promoted", None)
    else:
        record["code_objects"] = code_objects(spec.contracts)
        if spec.targets is not None:
            record["targets"] = _json(spec.targets(record))
    record["elapsed_s"] = round(time.monotonic() - t0, 1)
    return record


def write(record: dict[str, Any], out: Path, stem: str) -> Path:
    from netra.records import validate

    if record["status"] != "smoke":
        validate(record)
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"{stem}.json"
    path.write_text(json.dumps(record, indent=1, sort_keys=True, default=str) + "\n")
    return path


def summary(record: Mapping[str, Any]) -> str:
    c = record["checks"]
    lines = [f"{record['spec']}: {c['cases']} cases, {c['mismatches']} failed"
             + (f" ({', '.join(c['failed'])})" if c["failed"] else "")]
    for name, g in record.get("promotion", {}).items():
        lines.append(f"  promote {name}: PASS over {len(g['shapes'])} shapes")
    for name, g in record.get("not_promoted", {}).items():
        why = ("oracle" if not g["oracle"] else g["cut"] if "cut" in g
               else f"slower at {[x['shape'] for x in g['lost']]}" if g["lost"] else "not timed")
        lines.append(f"  not promoted {name}: {why}")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if "--smoke" in argv:  # before anything imports triton: the interpreter is chosen at decoration
        from netra.ops import _interp

        _interp.enable()
        _interp.interpreter_fixes()
    p = argparse.ArgumentParser(prog="python -m netra.bench.harness", description=__doc__.split("\n")[0])
    p.add_argument("spec", nargs="*", help="spec names (see --list)")
    p.add_argument("--all", action="store_true", help="every spec")
    p.add_argument("--list", action="store_true", help="list the specs and exit")
    p.add_argument("--smoke", action="store_true", help="CPU: the smoke cases' checks under Triton's interpreter")
    p.add_argument("--out", type=Path, default=None, help="record directory (<spec>.json in it)")
    p.add_argument("--deadline", type=float, default=0.0, help="seconds per spec: no new case after (0: none)")
    p.add_argument("--samples", type=int, default=0, help="timed samples per provider (0: the spec's default)")
    p.add_argument("--git-sha", default="", help="commit measured, when the tree has no .git (device copies)")
    known = specs()
    for s in known.values():
        if s.add_arguments is not None:
            s.add_arguments(p)
    opts = p.parse_args(argv)
    if opts.list:
        for name, s in sorted(known.items()):
            print(f"{name:16s} {s.family:10s} {s.doc}")
        return 0
    names = sorted(known) if opts.all else opts.spec
    unknown = [n for n in names if n not in known]
    if unknown or not names:
        p.error(f"unknown spec(s) {unknown}; choose from {sorted(known)}" if unknown else "name a spec or --all")
    if not opts.smoke:
        import torch

        if not torch.cuda.is_available():
            print("no CUDA device: the timed run needs a GPU (--smoke runs the checks on the CPU)", file=sys.stderr)
            return 2
    rc = 0
    for name in names:
        record = run(known[name], opts)
        if opts.out is not None:
            print("record:", write(record, opts.out, name))
        print(summary(record), flush=True)
        rc |= 0 if record["checks"]["mismatches"] == 0 and record["checks"]["cases"] > 0 else 1
    return rc


if __name__ == "__main__":  # run the imported module's main, so that specs' `Spec` is this one's class
    from netra.bench import harness as _self

    raise SystemExit(_self.main())
