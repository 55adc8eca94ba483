"""H200: the FP8-output norms (kernels/sm90/norm, the ``*_fp8_*`` contracts) in front of the FP8 projections they
feed, checked and timed as the engine calls them (issue 19, item 5: the activation quantization folded into its
producer).

    python scripts/gpu/norm_fp8.py --out $OUT/norm_fp8      (NETRA_TACTIC_MIN_MATURITY=experiment)

Pairs (the model's): the input norm (residual add + Gemma RMSNorm, rows of 2048) -> the GDN in-projection qkv|z
(FP8 group 8192 + 4096) and -> the attention q|gate,k,v (8192 + 512 + 512); GDN's gated output norm (32 heads of 128
per token) -> the out-projection 2048 x 4096. Rows: 1, 8, 32, 64, 128 (decode buckets) and 1024, 8192 (prefill).

Checks, through `netra.ops` (dispatch picks the contracts, recorded): the fused norm's BF16 rows bitwise the plain
norm's, its E4M3 rows and scales bitwise the projection's own quantization kernel (`quantize_rows`) on those rows,
the projection's output bitwise the unfused pair's; outputs poisoned first; eager == CUDA-graph replay (decode rows).
Timing (netra.bench.timing, graph replay, interleaved): ``unfused`` = plain norm -> quantization kernel -> GEMM (what
the engine ran before), ``fused`` = FP8-output norm -> GEMM; inputs and weights rotated over copies past the L2. The
floor: the pair's bytes (weights + the norm's reads and writes) over the copy rate measured in the run.

Prediction (kernels/sm90/norm/norm.py): one launch (~1.9 us at one row) less per pair at decode rows, so the pair at
one row ~2 us faster; at 128 rows ~1.5-3 us; at prefill rows the quantization kernel's ~20 us (8192 rows) less.
"""

from __future__ import annotations

import argparse
import json
import os
import time
import traceback
from pathlib import Path
from typing import Any

import torch

from netra import dispatch
from netra.bench.timing import Provider, capture, copy_bandwidth, interleave, row
from netra.ops import _common, fp8, norm
from netra.ops._triton import load_source
from netra.ops.linear import Weight, linear, linear_group
from netra.validate.oracle import poison_next

# (label, producer, FP8 projection parts' N, K)
PAIRS = [("gdn_in", "add", (8192, 4096), 2048), ("attn_in", "add", (8192, 512, 512), 2048),
         ("gdn_out", "gated", (2048,), 4096)]
ROWS = (1, 8, 32, 64, 128, 1024, 8192)
L2_BYTES = 120 << 20


def weights(ns: tuple[int, ...], k: int, seed: int) -> list[Weight]:
    g = torch.Generator(device="cuda").manual_seed(seed)
    return [Weight(*fp8.block_quantize_weight(torch.randn(n, k, generator=g, device="cuda") * k ** -0.5))
            for n in ns]


class Pair:
    """One norm -> projection pair at ``m`` tokens: input copies, weight copies, and both ways of running it."""

    def __init__(self, label: str, producer: str, ns: tuple[int, ...], k: int, m: int) -> None:
        self.label, self.producer, self.ns, self.k, self.m = label, producer, ns, k, m
        wbytes = sum(ns) * k
        self.copies = max(2, min(8, -(-L2_BYTES // wbytes)))
        self.ws = [weights(ns, k, 100 * c) for c in range(self.copies)]
        self.ins = [self.inputs(c) for c in range(self.copies)]
        self.floor_bytes = wbytes + sum(t.numel() * t.element_size() for t in self.ins[0]) * 2

    def inputs(self, seed: int) -> tuple[torch.Tensor, ...]:
        g = torch.Generator(device="cuda").manual_seed(1000 + seed)
        m = self.m
        if self.producer == "gated":
            o = torch.randn(m, 32, 128, generator=g, device="cuda") * 2
            o[0] *= 1e3
            proj = torch.randn(m, 2 * 32 * 128, generator=g, device="cuda") * 2
            w = torch.randn(128, generator=g, device="cuda") * 0.1
            return o.bfloat16(), proj.bfloat16(), w.bfloat16()
        x = torch.randn(m, self.k, generator=g, device="cuda") * 3
        x[0] *= 1e4
        if m > 2:
            x[1, :128] *= 300.0
            x[2] = 0.0
        r = torch.randn(m, self.k, generator=g, device="cuda") * 5
        w = torch.randn(self.k, generator=g, device="cuda") * 0.1
        return x.bfloat16(), r.bfloat16(), w.bfloat16()

    def norm(self, i: int, quant: str) -> Any:
        a, b, w = self.ins[i]
        if self.producer == "gated":
            z = b[:, 32 * 128:].reshape(self.m, 32, 128)  # the engine's strided view of the in-projection
            rows = norm.gated_rmsnorm_quant(a, z, w, 1e-6, quant)
            return rows.reshape(self.m, 32 * 128)
        return norm.add_rmsnorm_quant(a, b, w, 1e-6, quant)[0]

    def project(self, rows: Any, i: int) -> list[torch.Tensor]:
        ws = self.ws[i]
        return [linear(rows, ws[0])] if len(ws) == 1 else linear_group(rows, ws)

    def run(self, i: int, fused: bool) -> list[torch.Tensor]:
        return self.project(self.norm(i, fp8.ACT_GROUP128 if fused else "none"), i)


def check(pair: Pair) -> dict[str, Any]:
    quantize_rows = load_source("kernels/sm90/linear/linear.py").quantize_rows
    _common.reset_decisions()
    poison_next((pair.m, pair.k), torch.float8_e4m3fn, torch.device("cuda"))
    rows = pair.norm(0, fp8.ACT_GROUP128)
    out: dict[str, Any] = {"pair": pair.label, "m": pair.m, "fused_selected": isinstance(rows, fp8.GroupQuantized)}
    if not out["fused_selected"]:
        out.update(ok=False, decisions=_common.decisions())
        return out
    got = pair.project(rows, 0)
    out["decisions"] = _common.decisions()  # the FP8-output norm and the projection contract behind it
    plain = pair.norm(0, "none")
    q, s = quantize_rows(plain.reshape(-1, pair.k))
    want = pair.project(plain, 0)
    out.update(rows_bitwise=bool(torch.equal(rows.x, plain)),
               q_bitwise=bool(torch.equal(rows.q.reshape(-1, pair.k).view(torch.uint8), q.view(torch.uint8))),
               scale_bitwise=bool(torch.equal(rows.scale.reshape(-1, pair.k // 128), s)),
               projection_bitwise=all(torch.equal(a, b) for a, b in zip(got, want, strict=True)))
    if pair.m <= 128:
        g, rep = capture(lambda: pair.run(0, True))
        g.replay()
        torch.cuda.synchronize()
        out["eager_equals_replay"] = all(torch.equal(a, b) for a, b in zip(got, rep, strict=True))
        del g
    out["ok"] = all(out[k] for k in ("rows_bitwise", "q_bitwise", "scale_bitwise", "projection_bitwise")) \
        and out.get("eager_equals_replay", True)
    return out


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--rows", default=",".join(map(str, ROWS)))
    p.add_argument("--deadline", type=float, default=150.0, help="seconds: no new pair after")
    args = p.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    dispatch.reset(dispatch.Dispatcher(min_maturity="experiment"))
    copy_bps = copy_bandwidth()
    rows: list[dict[str, Any]] = []
    checks: list[dict[str, Any]] = []
    speedups: dict[str, float] = {}
    for label, producer, ns, k in PAIRS:
        for m in (int(v) for v in args.rows.split(",")):
            if time.monotonic() - t0 > args.deadline:
                break
            try:
                pair = Pair(label, producer, ns, k, m)
                checks.append(check(pair))
                st = interleave([Provider(name, lambda i, f=fused, p=pair: p.run(i, f), pair.copies, hold=pair)
                                 for name, fused in (("unfused", False), ("fused", True))], samples=20, deadline_s=3.0)
                shape = {"n": list(ns), "k": k, "m": m}
                for prov, s_ in st.items():
                    rows.append(row("norm_" + label, shape, "fp8", prov, s_, pair.floor_bytes, copy_bps))
                speedups[f"{label} m={m}"] = round(float(st["unfused"]["median_us"]) / float(st["fused"]["median_us"]),
                                                   4)
                print(f"{label} m={m}: unfused {st['unfused']['median_us']:.2f} us  fused {st['fused']['median_us']:.2f}"
                      f" us  ok={checks[-1]['ok']}", flush=True)
            except Exception:
                checks.append({"pair": label, "m": m, "ok": False, "error": traceback.format_exc()[-800:]})
                print(checks[-1]["error"], flush=True)
    rec = {"kind": "kernel", "family": "norm", "target": "sm90", "device": torch.cuda.get_device_name(),
           "git_sha": os.environ.get("NETRA_GIT_SHA", ""), "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
           "command": "python scripts/gpu/norm_fp8.py --out <dir>   (NETRA_TACTIC_MIN_MATURITY=experiment)",
           "status": "measured", "copy_bandwidth_gbps": round(copy_bps / 1e9, 1), "rows": rows,
           "speedups": speedups, "checks": {"cases": checks, "mismatches": sum(not c["ok"] for c in checks)},
           "verdict": "info", "elapsed_s": round(time.monotonic() - t0, 1)}
    (args.out / "norm_fp8.json").write_text(json.dumps(rec, indent=1, default=str) + "\n")
    print(f"{'pair':10s} {'m':>5s} {'unfused us':>11s} {'fused us':>9s} {'x':>6s} {'floor':>6s}")
    for key, sp in speedups.items():
        label, m = key.split(" m=")
        r = {x["provider"]: x for x in rows if x["op"] == "norm_" + label and x["shape"]["m"] == int(m)}
        print(f"{label:10s} {m:>5s} {r['unfused']['median_us']:11.2f} {r['fused']['median_us']:9.2f} {sp:6.3f} "
              f"{r['fused'].get('floor_fraction', 0):6.3f}")
    return 0 if rec["checks"]["mismatches"] == 0 else 1


if __name__ == "__main__":
    raise SystemExit(main())
