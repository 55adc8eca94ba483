"""H200: the dense-projection and norm tactics (kernels/sm90/linear, kernels/sm90/norm) against their oracles,
then timed beside the peers.

    python scripts/gpu/dense.py --out $OUT/dense        (NETRA_TACTIC_MIN_MATURITY=experiment; carry .sglang_peer)
    python scripts/gpu/dense.py --prefill --out $OUT/dense_prefill      (prefill chunks only, < 90 s)

Projections (the model's, rows 1..128): GDN out / attention o 2048 x 4096 (FP8), attention q|gate,k,v 9216 x 2048
(FP8 group 8192 + 512 + 512), GDN qkv|z 12288 x 2048 (FP8 group 8192 + 4096), GDN b|a 64 x 2048 (BF16 group 32 + 32),
lm_head 248320 x 2048 (BF16, FP32 logits).

Checks per shape and row count, through the ops as the engine calls them (dispatch picks the m-bucket's
contract, recorded): fresh random inputs (an outlier group in x), outputs poisoned, the contract's own policy
(netra.validate.oracle), eager == CUDA-graph replay bitwise; adversarial rows (1e30, 1e-30, zero, one-hot) judged
row by row. Timing (netra.bench.timing, graph replay): the weights rotated over enough copies to exceed the L2
(50 MB), so every call reads its weights from HBM; providers: ours; SGLang 0.5.23's block-FP8 linear (its
per-token-group quant + ``w8a8_block_fp8_matmul``: netra.bench.peers.sglang_gemm) and its matmul alone on
pre-quantized x; cuBLAS BF16 (torch.matmul on the dequantized BF16 weight: twice the bytes, for scale). The
floor = weight bytes / the copy rate measured in the run. A launch sweep of our FP8 kernel (meta variants per
m-bucket) runs last, inside the remaining time, to pick the contracts' launch data.

Prediction (kernels/sm90/linear/linear.py docstring): FP8 m <= 16 at 0.5-0.65 of the floor, m = 128 at
0.35-0.55; the SGLang peer slower at every shape (its default tile, no split-K: 96 CTAs at most for qkv|z).
Prefill (``--prefill``: the FP8 shapes at m = 256, 1024, 4096, 8192 rows, contracts linear_fp8_block_prefill /
linear_group_fp8_prefill): the same checks (adversarial rows 0..3 judged one by one, the ordinary rows as one block),
timed beside SGLang's linear and matmul and cuBLAS BF16; each row carries TFLOP/s, the compute floor (2 m n k over
the dense peak: FP8 1979 TFLOP/s, BF16 989 for cuBLAS BF16) and the byte floor (FP8 weight + BF16 x + BF16 out over
the copy rate). Prediction before the H200 run (kernels/sm90/linear/linear.py's GEMM at 128 x 128 x 128 tiles,
8 warps, 3 stages, a wgmma wait per K block for the block scale, ~15 us of quant pre-kernel at m = 8192): ~0.3 of
the FP8 peak at m = 8192 (qkv|z ~650 us = ~630 TFLOP/s, q|gate,k,v ~490 us, o / out ~220 us), ~0.28 at m = 1024
(qkv|z ~90 us = ~570 TFLOP/s, q|gate,k,v ~70 us, o / out ~32 us; +-40 %): about cuBLAS BF16's time (0.6-0.7 of the
BF16 peak) and ahead of SGLang's default 64 x 128 tile, 4 warps.

Outcome: results/sm90/dense_fp8_h200_r1.json, _r2.json and the note beside them (0.22-0.51 at m = 1, 0.13-0.33 at
m = 128; ahead of the peer at m = 1 and for o / out at every m, behind it on the column-heavy groups from m = 4).
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import time
import traceback
from pathlib import Path
from typing import Any

import torch

from netra import dispatch
from netra.bench.timing import Provider, capture, copy_bandwidth, interleave, row
from netra.catalog import Catalog
from netra.ops import fp8, norm
from netra.ops._common import route
from netra.ops.linear import Weight, linear, linear_group, linear_group_ref, linear_ref
from netra.validate.oracle import judge, poison_next

# (label, parts' N, K, fp8, group)
SHAPES = [("o_proj", (2048,), 4096, True, False), ("attn_qgkv", (8192, 512, 512), 2048, True, True),
          ("gdn_qkvz", (8192, 4096), 2048, True, True), ("gdn_ba", (32, 32), 2048, False, True),
          ("lm_head", (248320,), 2048, False, False)]
ROWS = (1, 2, 4, 8, 16, 32, 64, 128)
PREFILL_ROWS = (256, 1024, 4096, 8192)
PEAK_TFLOPS = {"fp8": 1979.0, "bf16": 989.0}  # H200 dense tensor-core peaks (no sparsity)
L2_BYTES = 120 << 20  # rotate weight copies past this (the H200's L2 is 50 MB)
T0 = time.monotonic()
PDL_STATE: dict[str, Any] = {}

NORMS = [("rmsnorm_gemma_rows", lambda x, r, z, w: norm.rmsnorm(x, w, 1e-6), lambda x, r, z, w: norm.rmsnorm_ref(x, w, 1e-6),
          [(1, 2048), (8, 2048), (128, 2048)]),
         ("add_rmsnorm_gemma_rows", lambda x, r, z, w: norm.add_rmsnorm(x, r, w, 1e-6),
          lambda x, r, z, w: norm.add_rmsnorm_ref(x, r, w, 1e-6), [(1, 2048), (8, 2048), (128, 2048)]),
         ("gated_rmsnorm_rows", lambda x, r, z, w: norm.gated_rmsnorm(x, z, w, 1e-6),
          lambda x, r, z, w: norm.gated_rmsnorm_ref(x, z, w, 1e-6), [(32, 128), (256, 128), (4096, 128)])]


def norm_inputs(name: str, rws: int, width: int, seed: int = 0) -> tuple[Any, ...]:
    g = torch.Generator(device="cuda").manual_seed(seed)

    def t(scale: float) -> Any:
        return (torch.randn(rws, width, generator=g, device="cuda") * scale).to(torch.bfloat16)
    return t(3.0), t(5.0), t(2.0), (torch.randn(width, generator=g, device="cuda") * 0.1).to(torch.bfloat16)


def weight(n: int, k: int, fp: bool, seed: int) -> Weight:
    g = torch.Generator(device="cuda").manual_seed(seed)
    w = torch.randn(n, k, generator=g, device="cuda") * k ** -0.5
    return Weight(*fp8.block_quantize_weight(w)) if fp else Weight(w.to(torch.bfloat16))


def x_of(m: int, k: int, seed: int) -> Any:
    g = torch.Generator(device="cuda").manual_seed(seed)
    x = torch.randn(m, k, generator=g, device="cuda")
    x[:, 128:256] *= 50.0  # an outlier group
    return x.to(torch.bfloat16)


def adversarial(m: int, k: int) -> Any:
    x = x_of(m, k, 7).float()
    x[0] *= 1e30
    if m > 1:
        x[1] = 0.0
    if m > 2:
        x[2] *= 1e-30
    if m > 3:
        x[3] = 0.0
        x[3, 5] = 3.0
        x[3, 700] = -1e4
    return x.to(torch.bfloat16)


class Case:
    """One projection shape: weight copies (rotated in timing), the op and the reference as the engine calls them."""

    def __init__(self, label: str, ns: tuple[int, ...], k: int, fp: bool, group: bool) -> None:
        self.label, self.ns, self.k, self.fp, self.group = label, ns, k, fp, group
        self.n = sum(ns)
        self.nbytes = self.n * k * (1 if fp else 2)
        self.copies = max(1, min(8, -(-L2_BYTES // self.nbytes)))
        self.ws = [[weight(n, k, fp, 100 * c + i) for i, n in enumerate(ns)] for c in range(self.copies)]
        self.od = torch.float32 if label == "lm_head" else torch.bfloat16
        self.dtype = "fp8" if fp else "bf16"

    def op(self, x: Any, c: int = 0) -> Any:
        return linear_group(x, self.ws[c], self.od) if self.group else linear(x, self.ws[c][0], self.od)

    def ref(self, x: Any) -> Any:
        return linear_group_ref(x, self.ws[0], self.od) if self.group else linear_ref(x, self.ws[0][0], self.od)

    def decision(self, x: Any) -> Any:
        w0 = self.ws[0][0]
        quant = "fp8_e4m3_block128" if self.fp else "none"
        t = {"x": x, "w": w0.data, **({"w_scale": w0.scale_inv} if self.fp and not self.group else {})}
        if self.group:
            return route("linear_group", t, {"m": x.shape[0], "k": self.k, "n": self.n, "parts": len(self.ns)}, quant)
        return route("linear_fp8_block" if self.fp else "linear_bf16", t, {"m": x.shape[0], "n": self.n, "k": self.k},
                     quant)

    def stacked(self, c: int) -> tuple[Any, Any]:
        ws = self.ws[c]
        if len(ws) == 1:
            return ws[0].data, ws[0].scale_inv
        return (torch.cat([w.data for w in ws]).contiguous(),
                torch.cat([w.scale_inv for w in ws]).contiguous() if self.fp else None)


def as_list(v: Any) -> list[Any]:
    return list(v) if isinstance(v, (list, tuple)) else [v]


def check(cat: Catalog, case: Case, m: int, checks: list[dict[str, Any]]) -> str:
    x = x_of(m, case.k, m)
    hit = case.decision(x)
    cname = hit[1].contract.name if hit is not None else "fallback"
    c = cat.by_name(cname) if hit is not None else None
    poison_next((m, case.n), case.od, x.device)
    got = as_list(case.op(x))
    r = as_list(case.ref(x))
    g, rep = capture(lambda x=x: case.op(x))
    g.replay()
    torch.cuda.synchronize()
    rep = as_list(rep)
    verdicts = [judge(c, a, b) for a, b in zip(got, r, strict=True)] if c is not None else []
    entry: dict[str, Any] = {"shape": case.label, "n": list(case.ns), "k": case.k, "m": m, "contract": cname,
                             "ok": bool(verdicts) and all(v["ok"] for v in verdicts),
                             "rel_l2": max((v["rel_l2"] for v in verdicts), default=None),
                             "eager_equals_replay": all(torch.equal(a, b) for a, b in zip(got, rep, strict=True))}
    del g
    if c is not None and case.fp and case.od != torch.float32:  # the same call with FP32 out: the accumulation alone
        try:
            kw = {"weights": case.ws[0]} if case.group else {"weight": case.ws[0][0]}
            g32 = torch.cat([t.float() for t in as_list(hit[1].tactic.entry(hit[1].contract.launch, x=x,
                                                                             out_dtype=torch.float32, **kw))], -1)
            fn_ref = linear_group_ref if case.group else linear_ref
            r32 = torch.cat([t.float() for t in as_list(fn_ref(x, case.ws[0] if case.group else case.ws[0][0],
                                                                torch.float32))], -1)
            d = (g32 - r32).abs()
            j = int(d.argmax())
            entry["rel_l2_f32out"] = float((g32 - r32).norm() / r32.norm())
            entry["worst_f32out"] = {"row": j // case.n, "col": j % case.n, "got": float(g32.flatten()[j]),
                                     "ref": float(r32.flatten()[j])}
        except Exception:
            entry["f32out_error"] = traceback.format_exc()[-300:]
    if c is not None and case.fp:
        xa = adversarial(m, case.k)
        ga = torch.cat([t.float() for t in as_list(case.op(xa))], dim=-1)
        ra = torch.cat([t.float() for t in as_list(case.ref(xa))], dim=-1)
        bad: list[Any] = []
        for i in range(m if m <= 128 else 4):  # prefill: the adversarial rows 0..3 one by one, the others as a block
            if float(ra[i].abs().max()) == 0.0:
                if float(ga[i].abs().max()) != 0.0:
                    bad.append(i)
            elif not judge(c, ga[i], ra[i])["ok"]:
                bad.append(i)
        if m > 128 and not judge(c, ga[4:], ra[4:])["ok"]:
            bad.append("rows 4..")
        entry["adversarial_bad_rows"] = bad
        entry["ok"] = entry["ok"] and not bad
    checks.append(entry)
    return cname


def providers(case: Case, m: int) -> list[Provider]:
    n_in = case.copies
    xs = [x_of(m, case.k, 100 + i) for i in range(n_in)]
    provs = [Provider("netra", lambda i, xs=xs: case.op(xs[i], i), n_in, hold=xs)]
    stacks = [case.stacked(c) for c in range(n_in)]
    if case.fp:
        try:
            from netra.bench.peers.sglang_gemm import SglangBlockFp8Linear

            root = Path(os.environ.get("NETRA_SGLANG_PEER", ".sglang_peer"))
            peers = [SglangBlockFp8Linear(w, s, root) for w, s in stacks]
            provs.append(Provider("sglang", lambda i, xs=xs, p=peers: p[i].linear(xs[i]), n_in, hold=(xs, peers)))
            q = [fp8.quantize_per_token_group(x) for x in xs]
            provs.append(Provider("sglang_matmul", lambda i, q=q, p=peers: p[i].matmul(*q[i]), n_in, hold=(q, peers)))
        except Exception:
            print("sglang peer unavailable:", traceback.format_exc()[-600:], flush=True)
    if case.label == "lm_head":  # cuBLAS with the engine's FP32 logits (the linear_bf16_cublas_decode tactic)
        provs.append(Provider("cublas_f32out", lambda i, xs=xs, w=stacks: torch.mm(xs[i], w[i][0].t(),
                                                                                   out_dtype=torch.float32),
                              n_in, hold=xs))
    if m in (1, 8, 128) or m > 128 or not case.fp:
        dq = [w if s is None else fp8.block_dequantize_weight(w, s, dtype=torch.bfloat16) for w, s in stacks]
        provs.append(Provider("cublas_bf16", lambda i, xs=xs, dq=dq: torch.matmul(xs[i], dq[i].t()), n_in,
                              hold=(xs, dq)))
    return provs


SWEEP = {  # m -> meta overrides of the m-bucket's contract launch ({"block": ...} sets the warps)
    1: [{"PDL": 0}, {"SWAP": 0, "BLOCK_N": 128}, {"BLOCK_N": 128}, {"num_stages": 6}, {"TARGET_CTAS": 264}],
    16: [{"PDL": 0}, {"SWAP": 0, "BLOCK_N": 128}, {"num_stages": 6}, {"TARGET_CTAS": 264}],
    64: [{"PDL": 0}, {"SWAP": 0, "BLOCK_N": 128}, {"SWAP": 0, "BLOCK_N": 128, "num_stages": 4}, {"SWAP": 0},
         {"num_stages": 4}],
    128: [{"PDL": 0}, {"SWAP": 0, "BLOCK_N": 128, "BLOCK_M": 64}, {"SWAP": 0, "BLOCK_N": 128, "BLOCK_M": 64, "num_stages": 4},
          {"SWAP": 0, "BLOCK_N": 128, "BLOCK_M": 128, "block": 256}, {"BLOCK_M": 64}, {"BLOCK_M": 128}],
    1024: [{"num_stages": 4}, {"num_stages": 2}, {"block": 128}, {"BLOCK_M": 64, "block": 128},
           {"BLOCK_N": 64}],
    8192: [{"num_stages": 4}, {"num_stages": 2}, {"block": 128}, {"BLOCK_M": 64, "block": 128},
           {"BLOCK_N": 64}],
}


def flop_fields(case: Case, m: int, provider: str, median_us: float) -> dict[str, Any]:
    """A prefill row's arithmetic: TFLOP/s, the compute floor at the provider's dense peak and its fraction."""
    flops = 2.0 * m * case.n * case.k
    peak = PEAK_TFLOPS["bf16" if provider == "cublas_bf16" else "fp8"]
    floor_us = flops / (peak * 1e12) * 1e6
    return {"tflops": round(flops / (median_us * 1e-6) / 1e12, 1), "peak_tflops": peak,
            "compute_floor_us": round(floor_us, 2), "compute_fraction": round(floor_us / median_us, 4)}


def pdl_smoke(rows: list[dict[str, Any]]) -> bool:
    """One FP8 call with the contracts' PDL launch; on failure every FP8 contract's launch drops PDL (recorded)."""
    try:
        w = weight(256, 2048, True, 5)
        x = x_of(3, 2048, 5)
        got = linear(x, w)
        torch.cuda.synchronize()
        ok = judge_like(got, linear_ref(x, w))
        if ok:
            return True
        why = "PDL call outside the tolerance"
    except Exception:
        why = traceback.format_exc()[-600:]
    print("PDL smoke failed, FP8 launches without PDL:", why, flush=True)
    for op in ("linear_fp8_block", "linear_group"):
        for c in dispatch.dispatcher().catalog.for_op(op):
            if "PDL" in c.launch.get("meta", {}):
                c.launch["meta"]["PDL"] = 0
    rows.append({"op": "pdl_smoke", "ok": False, "error": why})
    return False


def judge_like(got: Any, ref: Any) -> bool:
    return bool(torch.isfinite(got).all()) and float((got.float() - ref.float()).norm() / ref.float().norm()) < 5e-3


def sweep(case: Case, m: int, rows: list[dict[str, Any]], copy_bps: float) -> None:
    hit = case.decision(x_of(m, case.k, 0))
    if hit is None:
        return
    dec = hit[1]
    entry = dec.tactic.entry
    base = dec.contract.launch
    n_in = case.copies
    xs = [x_of(m, case.k, 200 + i) for i in range(n_in)]
    provs = []
    for j, ov in enumerate(SWEEP.get(m, [])):
        launch = copy.deepcopy(base)
        launch["meta"].update({a: b for a, b in ov.items() if a != "block"})
        if "block" in ov:
            launch["block"] = ov["block"]
        if case.group:
            provs.append(Provider(f"v{j}", lambda i, xs=xs, ln=launch: entry(ln, x=xs[i], weights=case.ws[i],
                                                                              out_dtype=case.od), n_in, hold=xs))
        else:
            provs.append(Provider(f"v{j}", lambda i, xs=xs, ln=launch: entry(ln, x=xs[i], weight=case.ws[i][0],
                                                                              out_dtype=case.od), n_in, hold=xs))
    verdict: dict[str, Any] = {}
    ref0 = torch.cat([t.float() for t in as_list(case.ref(xs[0]))], -1)
    for prov in provs:  # each variant once against the reference (the contract's policy)
        try:
            got = torch.cat([t.float() for t in as_list(prov.fn(0))], -1)
            verdict[prov.name] = judge(dec.contract, got.to(case.od), ref0.to(case.od))
        except Exception:
            verdict[prov.name] = {"ok": False, "error": traceback.format_exc()[-300:]}
    provs.append(Provider("base", lambda i, xs=xs: case.op(xs[i], i), n_in, hold=xs))
    quant = getattr(dec.tactic.module, "quantize_rows", None)
    if quant is not None:  # the pre-kernel alone (its share of the call)
        provs.append(Provider("act_quant", lambda i, xs=xs, q=quant: q(xs[i]), n_in, hold=xs))
    st = interleave(provs, samples=12, deadline_s=2.0)
    for p, s in st.items():
        ov = SWEEP[m][int(p[1:])] if p.startswith("v") else {}
        rows.append(row("sweep_" + case.label, {"n": list(case.ns), "k": case.k, "m": m}, case.dtype, p, s,
                        case.nbytes, copy_bps, contract=dec.contract.name, override=ov,
                        check={a: b for a, b in verdict.get(p, {}).items() if a in ("ok", "rel_l2", "error")},
                        **(flop_fields(case, m, "netra", float(s["median_us"])) if m > 128 else {})))
    print(f"sweep {case.label} m={m}: " + "  ".join(f"{p} {s['median_us']:.2f}" for p, s in st.items()), flush=True)


def write(args: Any, copy_bps: float, rows: list[dict[str, Any]], checks: list[dict[str, Any]]) -> None:
    rec = {"kind": "kernel", "family": "dense", "target": "sm90", "device": torch.cuda.get_device_name(),
           "git_sha": os.environ.get("NETRA_GIT_SHA", ""), "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
           "command": f"python scripts/gpu/dense.py {'--prefill ' if args.prefill else ''}--out <dir>   "
                      "(NETRA_TACTIC_MIN_MATURITY=experiment; carry .sglang_peer)", "status": "measured",
           "copy_bandwidth_gbps": round(copy_bps / 1e9, 1), "rows": rows,
           "checks": {"cases": checks, "mismatches": sum(not c["ok"] for c in checks),
                      "eager_equals_replay": all(c.get("eager_equals_replay", False) for c in checks)},
           "elapsed_s": round(time.monotonic() - T0, 1), "verdict": "info", "pdl": PDL_STATE}
    name = "dense_prefill.json" if args.prefill else "dense.json"
    (args.out / name).write_text(json.dumps(rec, indent=1, default=str) + "\n")


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--rows", default=",".join(map(str, ROWS)))
    p.add_argument("--only", default="", help="comma-separated shape labels (default: all)")
    p.add_argument("--sweep-until", type=float, default=200.0, help="seconds since start: no sweep step after")
    p.add_argument("--no-norms", action="store_true")
    p.add_argument("--prefill", action="store_true", help="the FP8 shapes at prefill rows only (no norms, no PDL "
                   "smoke); --rows defaults to 256,1024,4096,8192; no sweep step starts after 65 s unless "
                   "--sweep-until")
    args = p.parse_args()
    if args.prefill:
        args.no_norms = True
        if args.rows == ",".join(map(str, ROWS)):
            args.rows = ",".join(map(str, PREFILL_ROWS))
        if args.sweep_until == 200.0:
            args.sweep_until = 65.0
    args.out.mkdir(parents=True, exist_ok=True)
    dispatch.reset(dispatch.Dispatcher(min_maturity="experiment"))
    cat = Catalog.load()
    copy_bps = copy_bandwidth()
    rows0: list[dict[str, Any]] = []
    if not args.prefill:  # the prefill contracts launch without PDL
        PDL_STATE.update(ok=pdl_smoke(rows0), smoke=rows0)
    ms = [int(v) for v in args.rows.split(",")]
    checks: list[dict[str, Any]] = []
    rows: list[dict[str, Any]] = []
    cases: list[Case] = []
    for label, ns, k, fp, group in SHAPES:
        if (args.only and label not in args.only.split(",")) or (args.prefill and not fp):
            continue
        try:
            case = Case(label, ns, k, fp, group)
            cases.append(case)
        except Exception:
            checks.append({"shape": label, "ok": False, "error": traceback.format_exc()[-800:]})
            print(checks[-1]["error"], flush=True)
            continue
        for m in ms:
            try:
                cname = check(cat, case, m, checks)
                st = interleave(providers(case, m), samples=20, deadline_s=3.0)
                nb = case.nbytes + (m * case.k * 2 + m * case.n * 2 if args.prefill else 0)
                for prov, s in st.items():
                    extra = flop_fields(case, m, prov, float(s["median_us"])) if args.prefill else {}
                    rows.append(row(case.label, {"n": list(case.ns), "k": case.k, "m": m}, case.dtype, prov, s,
                                    nb, copy_bps, contract=cname if prov == "netra" else None, **extra))
                ck = checks[-1]
                print(f"{case.label} m={m} [{cname}]: " + "  ".join(f"{k2} {v['median_us']:.2f}" for k2, v in st.items())
                      + f"  rel {ck.get('rel_l2')} ok={ck['ok']} replay={ck['eager_equals_replay']}"
                      f" adv={ck.get('adversarial_bad_rows')} f32out {ck.get('rel_l2_f32out')}", flush=True)
            except Exception:
                checks.append({"shape": case.label, "m": m, "ok": False, "error": traceback.format_exc()[-800:]})
                print(checks[-1]["error"], flush=True)
        write(args, copy_bps, rows, checks)
    if not args.no_norms:
        for name, fn, ref, shapes in NORMS:
            c = cat.by_name(name)
            for rws, width in shapes:
                try:
                    args_ = norm_inputs(name, rws, width)
                    got, r = fn(*args_), ref(*args_)
                    g, rep = capture(lambda a=args_, fn=fn: fn(*a))
                    g.replay()
                    torch.cuda.synchronize()
                    gl, rl, pl = (list(got), list(r), list(rep)) if isinstance(got, tuple) else ([got], [r], [rep])
                    verdicts = [judge(c, a, b) for a, b in zip(gl, rl, strict=True)]
                    checks.append({"contract": name, "rows": rws, "width": width, "ok": all(v["ok"] for v in verdicts),
                                   "rel_l2": max(v["rel_l2"] for v in verdicts),
                                   "eager_equals_replay": all(torch.equal(a, b) for a, b in zip(gl, pl, strict=True))})
                    sets = [norm_inputs(name, rws, width, seed=10 + i) for i in range(4)]
                    st = interleave([Provider("netra", lambda i, s=sets, fn=fn: fn(*s[i]), 4, hold=sets),
                                     Provider("torch_ref", lambda i, s=sets, ref=ref: ref(*s[i]), 4, hold=sets)],
                                    samples=20, deadline_s=2.0)
                    nb = sum(t.numel() * t.element_size() for t in args_ if isinstance(t, torch.Tensor)) * 2
                    for prov, s_ in st.items():
                        rows.append(row(name, {"rows": rws, "width": width}, "bf16", prov, s_, nb, copy_bps))
                except Exception:
                    checks.append({"contract": name, "rows": rws, "ok": False, "error": traceback.format_exc()[-800:]})
                    print(checks[-1]["error"], flush=True)
        write(args, copy_bps, rows, checks)
    for case in cases:
        if not case.fp:
            continue
        for m in SWEEP:
            if time.monotonic() - T0 > args.sweep_until or m not in ms:
                continue
            try:
                sweep(case, m, rows, copy_bps)
            except Exception:
                print(f"sweep {case.label} m={m} failed:", traceback.format_exc()[-600:], flush=True)
        write(args, copy_bps, rows, checks)
    write(args, copy_bps, rows, checks)
    print(f"elapsed {time.monotonic() - T0:.0f} s; mismatches {sum(not c['ok'] for c in checks)}")
    for r in rows:
        if r["op"].startswith("sweep_"):
            continue
        tf = (f"  {r['tflops']:7.1f} TFLOP/s  compute {r['compute_fraction']:.3f} of {r['peak_tflops']:.0f}"
              if "tflops" in r else "")
        print(f"{r['op']:22s} m={r['shape'].get('m', r['shape'].get('rows')):<4} {r['provider']:14s} "
              f"{r['median_us']:9.2f} us  floor {r.get('floor_fraction', 0):.3f}{tf}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
