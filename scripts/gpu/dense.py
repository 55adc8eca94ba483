"""H200: the dense-projection and norm tactics (kernels/sm90/linear, kernels/sm90/norm) against their oracles,
then timed beside the peers.

    python scripts/gpu/dense.py --out $OUT/dense        (NETRA_TACTIC_MIN_MATURITY=experiment)

Checks per contract and shape: fresh random inputs (large outlier groups in x), outputs poisoned, the contract's
own policy (netra.validate.oracle), eager == CUDA-graph replay bitwise. Timing (netra.bench.timing, graph replay,
rotated inputs): ours; the BF16 lm_head also as cuBLAS (torch.matmul in BF16); the floor = weight bytes / copy rate.
"""

from __future__ import annotations

import argparse
import json
import time
import traceback
from pathlib import Path
from typing import Any

import torch

from netra import dispatch
from netra.bench.timing import Provider, capture, copy_bandwidth, interleave, row
from netra.catalog import Catalog
from netra.ops import fp8, norm
from netra.ops.linear import Weight, linear, linear_group, linear_group_ref, linear_ref
from netra.validate.oracle import judge, poison_next

SHAPES = {"linear_fp8_block_decode": [(2048, 4096)], "linear_group_fp8_decode": [((8192, 512, 512), 2048),
                                                                                  ((8192, 4096), 2048)],
          "linear_bf16_decode": [(248320, 2048)]}
ROWS = (1, 8, 64, 128)


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


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--out", type=Path, required=True)
    args = p.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    dispatch.reset(dispatch.Dispatcher(min_maturity="experiment"))
    cat = Catalog.load()
    copy_bps = copy_bandwidth()
    checks: list[dict[str, Any]] = []
    rows: list[dict[str, Any]] = []
    for name, shapes in SHAPES.items():
        c = cat.by_name(name)
        for shape in shapes:
            try:
                if name == "linear_group_fp8_decode":
                    ns, k = shape
                    ws = [weight(n, k, True, i) for i, n in enumerate(ns)]
                    nbytes = sum(n * k for n in ns)

                    def fn(x: Any, ws: Any = ws) -> Any:
                        return linear_group(x, ws)

                    def ref(x: Any, ws: Any = ws) -> Any:
                        return linear_group_ref(x, ws)
                    label = {"n": list(ns), "k": k}
                else:
                    n, k = shape
                    fp = name != "linear_bf16_decode"
                    w = weight(n, k, fp, 1)
                    od = torch.bfloat16 if fp else torch.float32
                    nbytes = n * k * (1 if fp else 2)

                    def fn(x: Any, w: Any = w, od: Any = od) -> Any:
                        return linear(x, w, od)

                    def ref(x: Any, w: Any = w, od: Any = od) -> Any:
                        return linear_ref(x, w, od)
                    label = {"n": n, "k": k}
                for m in ROWS:
                    x = x_of(m, k, m)
                    poison_next((m, nbytes // k), torch.float32, x.device)
                    got = fn(x)
                    r = ref(x)
                    g, rep = capture(lambda x=x: fn(x))
                    g.replay()
                    torch.cuda.synchronize()
                    gl, rl, pl = (got, r, rep) if isinstance(got, list) else ([got], [r], [rep])
                    verdicts = [judge(c, a, b) for a, b in zip(gl, rl, strict=True)]
                    checks.append({"contract": name, **label, "m": m, "ok": all(v["ok"] for v in verdicts),
                                   "rel_l2": max(v["rel_l2"] for v in verdicts),
                                   "eager_equals_replay": all(torch.equal(a, b) for a, b in zip(gl, pl, strict=True))})
                    del g
                    xs = [x_of(m, k, 100 + i) for i in range(4)]
                    provs = [Provider("netra", lambda i, xs=xs: fn(xs[i]), 4, hold=xs)]
                    if name == "linear_bf16_decode":
                        wt = w.data
                        provs.append(Provider("cublas_bf16", lambda i, xs=xs, wt=wt: torch.matmul(xs[i], wt.t()), 4,
                                              hold=xs))
                    st = interleave(provs, samples=30, deadline_s=6.0)
                    for prov, s in st.items():
                        rows.append(row(name, {**label, "m": m}, "fp8" if "fp8" in name else "bf16", prov, s,
                                        nbytes, copy_bps))
                    print(f"{name} {label} m={m}: " + "  ".join(f"{k2} {v['median_us']:.2f} us" for k2, v in st.items())
                          + f"  rel {checks[-1]['rel_l2']:.2e} ok={checks[-1]['ok']} replay={checks[-1]['eager_equals_replay']}",
                          flush=True)
            except Exception:
                checks.append({"contract": name, "shape": str(shape), "ok": False, "error": traceback.format_exc()[-800:]})
                print(checks[-1]["error"], flush=True)
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
                                samples=30, deadline_s=4.0)
                nb = sum(t.numel() * t.element_size() for t in args_ if isinstance(t, torch.Tensor)) * 2
                for prov, s_ in st.items():
                    rows.append(row(name, {"rows": rws, "width": width}, "bf16", prov, s_, nb, copy_bps))
                print(f"{name} rows={rws}: " + "  ".join(f"{k2} {v['median_us']:.2f} us" for k2, v in st.items())
                      + f"  rel {checks[-1]['rel_l2']:.2e} ok={checks[-1]['ok']}", flush=True)
            except Exception:
                checks.append({"contract": name, "rows": rws, "ok": False, "error": traceback.format_exc()[-800:]})
                print(checks[-1]["error"], flush=True)
    rec = {"kind": "kernel", "family": "dense", "target": "sm90", "device": torch.cuda.get_device_name(),
           "git_sha": "", "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
           "command": "python scripts/gpu/dense.py --out <dir>", "status": "measured",
           "copy_bandwidth_gbps": round(copy_bps / 1e9, 1), "rows": rows,
           "checks": {"cases": checks, "mismatches": sum(not c["ok"] for c in checks),
                      "eager_equals_replay": all(c.get("eager_equals_replay", False) for c in checks)},
           "verdict": "info"}
    (args.out / "dense.json").write_text(json.dumps(rec, indent=1, default=str) + "\n")
    for r in rows:
        print(f"{r['op']:24s} {json.dumps(r['shape']):40s} {r['provider']:12s} {r['median_us']:9.2f} us  "
              f"floor {r.get('floor_fraction', 0):.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
