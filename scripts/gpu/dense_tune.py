"""H200: launch-data sweep of the FP8 decode GEMM (kernels/sm90/linear) beside SGLang's block-FP8 linear, then PDL.

    python scripts/gpu/dense_tune.py --out $OUT/tune      (NETRA_SGLANG_PEER=<.sglang_peer>; carry .sglang_peer)

Phase A (m = 64, 128; o / out 2048 x 4096, attention q|gate,k,v 9216 x 2048, GDN qkv|z 12288 x 2048): candidate
launches (meta overrides of the m-bucket's contract launch: tiles, stages, orientation SWAP, row-tile-first CTA
order MFAST, split target) each checked once -- the contract's policy against the reference on fresh inputs with an
outlier group, adversarial rows (1e30, 1e-30, zero, one-hot) judged row by row, two eager calls bitwise equal, a
graph replay bitwise equal to eager -- then timed in one interleaved graph-replay run with SGLang's linear (its quant
+ matmul), its matmul alone and our quantization pre-kernel alone (netra.bench.timing; weights rotated past the L2).
The contract's winner per m-bucket = the checked candidate with the least summed time over the bucket's shapes.

Timing note: run 1 (results/sm90/dense_fp8_h200_tune1.json) timed the groups through ``call`` (a torch.cat of the
column views after the GEMM, an extra kernel: ~1.7 us at m = 1 to ~5 us at m = 128 by comparison with r1/r2's rows of
the same launch); the ranking inside a shape stands (every candidate paid the same cat), the group-vs-SGLang gap did
not. Providers now time ``op`` (the views, as the engine gets them).

Phase B (m = 1, 8, 64, 128): on the bucket's winner (m <= 16: the contract's launch), PDL 1 (the GEMM launched as the
quantization kernel's programmatic dependent), PREFETCH 1 (the CTA's weight slice prefetched into L2 at entry, before
the PDL wait), both; each checked bitwise against the plain launch (eager and replay) and timed beside it.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import sys
import time
import traceback
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import dense as D

from netra import dispatch
from netra.bench.timing import Provider, capture, copy_bandwidth, interleave, row
from netra.validate.oracle import judge

T0 = time.monotonic()
SHAPES = [s for s in D.SHAPES if s[0] in ("o_proj", "attn_qgkv", "gdn_qkvz")]
CANDS = {  # m -> meta overrides of the m-bucket's contract launch ("block" sets the threads); c0 = the contract's
    128: [{}, {"MFAST": 1},
          {"SWAP": 0, "BLOCK_M": 64, "BLOCK_N": 128, "num_stages": 3, "MFAST": 1},  # SGLang's default tile
          {"SWAP": 0, "BLOCK_M": 64, "BLOCK_N": 64, "num_stages": 4, "MFAST": 1},   # its tuned N=7168,K=2048 tile
          {"SWAP": 1, "BLOCK_M": 64, "BLOCK_N": 64, "num_stages": 4, "MFAST": 1},
          {"SWAP": 1, "BLOCK_M": 64, "BLOCK_N": 128, "num_stages": 3, "MFAST": 1},
          {"SWAP": 0, "BLOCK_M": 128, "BLOCK_N": 64, "num_stages": 3}],
    64: [{}, {"SWAP": 0, "BLOCK_N": 128, "num_stages": 3, "TARGET_CTAS": 96},
         {"SWAP": 0, "BLOCK_N": 128, "num_stages": 3},
         {"SWAP": 0, "BLOCK_N": 64, "num_stages": 4},
         {"num_stages": 3},
         {"SWAP": 1, "BLOCK_N": 128, "num_stages": 3, "TARGET_CTAS": 96}],
}
PDL_VARIANTS = [("plain", {"PDL": 0, "PREFETCH": 0}), ("pdl", {"PDL": 1, "PREFETCH": 0}),
                ("prefetch", {"PDL": 0, "PREFETCH": 1}), ("pdl_prefetch", {"PDL": 1, "PREFETCH": 1})]


def launch_of(base: dict[str, Any], ov: dict[str, Any]) -> dict[str, Any]:
    ln = copy.deepcopy(base)
    ln["meta"].update({a: b for a, b in ov.items() if a != "block"})
    if "block" in ov:
        ln["block"] = ov["block"]
    return ln


def op(case: Any, entry: Any, ln: dict[str, Any], x: Any, c: int = 0) -> Any:
    """The tactic's entry as the engine calls it (a group returns its column views: what is timed)."""
    kw = {"weights": case.ws[c]} if case.group else {"weight": case.ws[c][0]}
    return entry(ln, x=x, out_dtype=case.od, **kw)


def call(case: Any, entry: Any, ln: dict[str, Any], x: Any, c: int = 0) -> Any:
    """``op`` with a group's outputs concatenated (for the checks only: the cat is a kernel of its own)."""
    out = op(case, entry, ln, x, c)
    return torch.cat(list(out), -1) if isinstance(out, (list, tuple)) else out


def check(case: Any, dec: Any, ln: dict[str, Any], m: int, base_out: Any = None) -> dict[str, Any]:
    """The contract's policy on fresh inputs, adversarial rows one by one, run-to-run and eager == replay bitwise;
    ``base_out``: also bitwise equal to the plain launch's output."""
    try:
        x = D.x_of(m, case.k, 11)
        ref = torch.cat([t for t in D.as_list(case.ref(x))], -1)
        a = call(case, dec.tactic.entry, ln, x)
        b = call(case, dec.tactic.entry, ln, x)
        g, rep = capture(lambda: call(case, dec.tactic.entry, ln, x))
        g.replay()
        torch.cuda.synchronize()
        vs = [judge(dec.contract, ga, ra) for ga, ra in zip(a.split(list(case.ns), -1), ref.split(list(case.ns), -1),
                                                             strict=True)]
        res: dict[str, Any] = {"ok": all(bool(v["ok"]) for v in vs), "rel_l2": max(v["rel_l2"] for v in vs),
                               "run_to_run": bool(torch.equal(a, b)),
                               "replay": bool(torch.equal(a, rep))}
        del g
        xa = D.adversarial(m, case.k)
        ga = call(case, dec.tactic.entry, ln, xa).float()
        ra = torch.cat([t.float() for t in D.as_list(case.ref(xa))], -1)
        bad = []
        for i in range(m):
            if float(ra[i].abs().max()) == 0.0:
                if float(ga[i].abs().max()) != 0.0:
                    bad.append(i)
            elif not judge(dec.contract, ga[i], ra[i])["ok"]:
                bad.append(i)
        res["adversarial_bad_rows"] = bad
        if base_out is not None:
            res["equals_plain"] = bool(torch.equal(a, base_out))
        res["pass"] = res["ok"] and res["run_to_run"] and res["replay"] and not bad and res.get("equals_plain", True)
        res["out"] = a
        return res
    except Exception:
        return {"pass": False, "error": traceback.format_exc()[-500:]}


def peers(case: Any, m: int, xs: list[Any]) -> list[Provider]:
    import os

    from netra.bench.peers.sglang_gemm import SglangBlockFp8Linear
    from netra.ops import fp8
    try:
        root = Path(os.environ.get("NETRA_SGLANG_PEER", ".sglang_peer"))
        st = [case.stacked(c) for c in range(case.copies)]
        ps = [SglangBlockFp8Linear(w, s, root) for w, s in st]
        q = [fp8.quantize_per_token_group(x) for x in xs]
        return [Provider("sglang", lambda i, p=ps: p[i].linear(xs[i]), case.copies, hold=(xs, ps)),
                Provider("sglang_matmul", lambda i, p=ps, q=q: p[i].matmul(*q[i]), case.copies, hold=(q, ps))]
    except Exception:
        print("sglang peer unavailable:", traceback.format_exc()[-400:], flush=True)
        return []


def timed(case: Any, m: int, named: list[tuple[str, Any, dict[str, Any]]], xs: list[Any], quant: Any,
          copy_bps: float, rows: list[dict[str, Any]], phase: str, checks: dict[str, Any]) -> dict[str, float]:
    provs = [Provider(nm, lambda i, e=e, ln=ln: op(case, e, ln, xs[i], i), case.copies, hold=xs)
             for nm, e, ln in named]
    provs += peers(case, m, xs)
    if quant is not None:  # the quantization pre-kernel alone (its share of the call)
        provs.append(Provider("act_quant", lambda i, q=quant: q(xs[i]), case.copies, hold=xs))
    st = interleave(provs, samples=15, deadline_s=1.5)
    for nm, s in st.items():
        rows.append(row(f"{phase}_{case.label}", {"n": list(case.ns), "k": case.k, "m": m}, "fp8", nm, s,
                        case.nbytes, copy_bps, check={a: b for a, b in checks.get(nm, {}).items() if a != "out"}))
    return {nm: float(s["median_us"]) for nm, s in st.items()}


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--deadline", type=float, default=170.0)
    p.add_argument("--skip-a", action="store_true")
    args = p.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    dispatch.reset(dispatch.Dispatcher(min_maturity="experiment"))
    copy_bps = copy_bandwidth()
    cases = [D.Case(*s) for s in SHAPES]
    rows: list[dict[str, Any]] = []
    table_a: dict[tuple[str, int], dict[str, Any]] = {}
    winners: dict[tuple[str, int], dict[str, Any]] = {}

    def save() -> None:
        (args.out / "tune.json").write_text(json.dumps({
            "kind": "kernel", "family": "linear", "target": "sm90", "status": "measured", "verdict": "info",
            "git_sha": os.environ.get("NETRA_GIT_SHA", ""), "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "command": "python scripts/gpu/dense_tune.py --out <dir>   (NETRA_TACTIC_MIN_MATURITY=experiment; "
                       "NETRA_SGLANG_PEER=<.sglang_peer>)",
            "checks": {"cases": sum(1 for r in rows if r.get("check")),
                       "mismatches": sum(1 for r in rows if r.get("check") and not r["check"].get("pass"))},
            "device": torch.cuda.get_device_name(), "rows": rows,
                                                         "copy_bandwidth_gbps": round(copy_bps / 1e9, 1),
                                                         "winners": {f"{a}|{b}": v for (a, b), v in winners.items()},
                                                         "elapsed_s": round(time.monotonic() - T0, 1)},
                                                        indent=1, default=str) + "\n")

    # phase A: launch candidates at m = 64, 128
    for m in (128, 64):
        if args.skip_a:
            break
        for case in cases:
            if time.monotonic() - T0 > args.deadline * 0.6:
                print(f"phase A: deadline, skipping {case.label} m={m}", flush=True)
                continue
            try:
                dec = case.decision(D.x_of(m, case.k, 0))[1]
                named, checks = [], {}
                for j, ov in enumerate(CANDS[m]):
                    ln = launch_of(dec.contract.launch, ov)
                    checks[f"c{j}"] = check(case, dec, ln, m)
                    if checks[f"c{j}"]["pass"]:
                        named.append((f"c{j}", dec.tactic.entry, ln))
                    else:
                        print(f"  {case.label} m={m} c{j} {ov} FAILED: "
                              f"{ {a: b for a, b in checks[f'c{j}'].items() if a != 'out'} }", flush=True)
                xs = [D.x_of(m, case.k, 300 + i) for i in range(case.copies)]
                med = timed(case, m, named, xs, dec.tactic.module.quantize_rows, copy_bps, rows, "tuneA", checks)
                table_a[(case.label, m)] = {"contract": dec.contract.name, "med": med, "checks": checks}
                print(f"A {case.label} m={m} [{dec.contract.name}]: " + "  ".join(f"{k} {v:.2f}" for k, v in med.items()),
                      flush=True)
            except Exception:
                print(f"A {case.label} m={m} failed:", traceback.format_exc()[-800:], flush=True)
        save()
    # the bucket winners: least summed time over the bucket's shapes among candidates checked on all of them
    buckets: dict[tuple[str, int], list[str]] = {}
    for (label, m), t in table_a.items():
        buckets.setdefault((t["contract"], m), []).append(label)
    for (cname, m), labels in buckets.items():
        js = [j for j in range(len(CANDS[m])) if all(f"c{j}" in table_a[(lb, m)]["med"] for lb in labels)]
        if js:
            best = min(js, key=lambda j: sum(table_a[(lb, m)]["med"][f"c{j}"] for lb in labels))
            winners[(cname, m)] = {"cand": f"c{best}", "override": CANDS[m][best], "shapes": labels,
                                   "sum_us": sum(table_a[(lb, m)]["med"][f"c{best}"] for lb in labels),
                                   "base_sum_us": sum(table_a[(lb, m)]["med"].get("c0", float("nan")) for lb in labels)}
    save()
    # phase B: PDL / PREFETCH at m = 1, 8, 64, 128 on the winners
    table_b: dict[tuple[str, int], dict[str, float]] = {}
    for m in (1, 8, 128, 64):
        for case in cases:
            if time.monotonic() - T0 > args.deadline:
                print(f"phase B: deadline, skipping {case.label} m={m}", flush=True)
                continue
            try:
                dec = case.decision(D.x_of(m, case.k, 0))[1]
                w = winners.get((dec.contract.name, m), {"override": {}})
                base = launch_of(dec.contract.launch, w["override"])
                named, checks = [], {}
                plain = None
                for nm, ov in PDL_VARIANTS:
                    ln = launch_of(base, ov)
                    checks[nm] = check(case, dec, ln, m, plain)
                    if nm == "plain":
                        plain = checks[nm].get("out")
                    if checks[nm]["pass"]:
                        named.append((nm, dec.tactic.entry, ln))
                    else:
                        print(f"  {case.label} m={m} {nm} FAILED: "
                              f"{ {a: b for a, b in checks[nm].items() if a != 'out'} }", flush=True)
                xs = [D.x_of(m, case.k, 500 + i) for i in range(case.copies)]
                med = timed(case, m, named, xs, None, copy_bps, rows, "tuneB", checks)
                table_b[(case.label, m)] = med
                print(f"B {case.label} m={m} [{dec.contract.name} {w['override']}]: "
                      + "  ".join(f"{k} {v:.2f}" for k, v in med.items()), flush=True)
            except Exception:
                print(f"B {case.label} m={m} failed:", traceback.format_exc()[-800:], flush=True)
        save()
    save()
    print(f"elapsed {time.monotonic() - T0:.0f} s  copy {copy_bps / 1e9:.0f} GB/s")
    for (label, m), t in sorted(table_a.items()):
        sg = t["med"].get("sglang", float("nan"))
        for j, ov in enumerate(CANDS[m]):
            c = t["checks"].get(f"c{j}", {})
            us = t["med"].get(f"c{j}")
            print(f"A {label:10s} m={m:<4} c{j:<2} {us if us is None else round(us, 2)!s:>6} us  "
                  f"x{(us or float('nan')) / sg:5.2f} of sglang {sg:.2f}  pass={c.get('pass')} "
                  f"rel={c.get('rel_l2', 0) or 0:.1e}  {json.dumps(ov)}")
        print(f"A {label:10s} m={m:<4} sglang_matmul {t['med'].get('sglang_matmul', float('nan')):.2f}  "
              f"act_quant {t['med'].get('act_quant', float('nan')):.2f}")
    for k, v in winners.items():
        print("WINNER", k, json.dumps(v))
    for (label, m), med in sorted(table_b.items()):
        print(f"B {label:10s} m={m:<4} " + "  ".join(f"{k} {v:.2f}" for k, v in med.items()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
