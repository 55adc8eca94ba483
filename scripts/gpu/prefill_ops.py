"""The prefill tactics of issue 20 on one H200: checked against their references, timed beside the reference and the
peer, at the prefill chunk shapes the dp1-h200 profile runs (8 x 1024, 1 x 8192, 64 x 128 tokens, and odd lengths).

    timeout 240 python3 scripts/gpu/prefill_ops.py [--out $OUT/prefill] [--peer-root .sglang_peer]

* ``conv1d_prefill_c8192_w4`` (kernels/sm90/conv/conv1d_prefill.py): output within the contract's tolerance of
  `causal_conv1d_prefill_ref`, the pool bitwise the reference's (hostile values, NaN payloads), other slots untouched;
  timed beside the reference and SGLang 0.5.23's ``causal_conv1d_fn`` (the Triton varlen kernel its GDN backend runs
  at prefill, loaded unchanged from the pinned wheel's files in ``.sglang_peer``).
* ``rmsnorm_gemma_prefill``, ``add_rmsnorm_gemma_prefill``, ``gated_rmsnorm_prefill``: relative L2 within the
  declared tolerance (the worst row beside it), timed beside the reference.
* ``linear_group_bf16_prefill`` (GDN b|a through cuBLAS): relative L2 against linear_group_ref, timed beside it.

Eager timing (prefill runs eagerly): CUDA events around 20 calls after 3 warm-ups, median of 5; inputs poisoned
(outputs of a previous call never reused). Prints a table last; writes prefill_ops.json under --out.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any

os.environ.setdefault("NETRA_TACTIC_MIN_MATURITY", "experiment")

ROOT = Path(__file__).resolve().parents[2]


P90: dict[int, float] = {}  # the last timed() call's p90 (its caller files it beside the median)


def timed(fn: Any, reps: int = 20) -> float:
    import torch

    for _ in range(3):
        fn()
    samples = []
    for _ in range(5):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        for _ in range(reps):
            fn()
        b.record()
        b.synchronize()
        samples.append(a.elapsed_time(b) * 1e3 / reps)
    samples.sort()
    P90[0] = samples[-1]  # of 5 samples the 90th percentile is the largest
    return samples[2]


def bits_equal(a: Any, b: Any) -> bool:
    import torch

    return a.dtype == b.dtype and torch.equal(a.view(torch.int16), b.view(torch.int16))


def record(out: Path, command: str) -> None:
    """The run's result record beside its raw JSON (scripts/gpu/prefill_records.py)."""
    sys.path.insert(0, str(ROOT / "scripts" / "gpu"))
    import torch
    from prefill_records import write

    for p in write(out, os.environ.get("NETRA_GIT_SHA", "unknown"), command, device=torch.cuda.get_device_name()):
        print(f"record: {p}", flush=True)


def conv_entry(doc: dict[str, Any]) -> Any:
    from netra.ops._triton import entry

    return entry(doc)


def conv_rows(peer: Any) -> list[dict[str, Any]]:
    import torch

    from netra.catalog import contract_doc
    from netra.ops import conv
    from netra.ops._common import decisions
    from netra.ops._triton import tolerance_report

    doc = contract_doc("conv1d_prefill_c8192_w4")
    rtol, atol = doc["numerics"]["rtol"], doc["numerics"]["atol"]
    rows = []
    for lens in ([1024] * 8, [8192], [128] * 64, [1, 2, 3, 37, 1000, 5]):
        t, c = sum(lens), 8192
        g = torch.Generator(device="cuda").manual_seed(t + len(lens))
        xz = torch.randn(t, c + 4096, generator=g, device="cuda").bfloat16()  # qkv | z: x is a strided view
        x = xz[:, :c]
        w = (torch.randn(c, 4, generator=g, device="cuda") * 0.5).bfloat16()
        pool = torch.randn(len(lens) + 9, c, 3, generator=g, device="cuda").bfloat16()
        x[0, :7] = torch.tensor([float("nan"), float("inf"), -float("inf"), 0.0, -0.0, 3e38, -3e38]).bfloat16()
        payload = torch.tensor([0x7FA1, -0x003F], dtype=torch.int16).view(torch.bfloat16).cuda()
        x[lens[0] - 1, 100:102] = payload
        slots = [2 + 1 + i for i in range(len(lens))][::-1]
        mine, ref = pool.clone(), pool.clone()
        y = conv.causal_conv1d_prefill(x, w, mine, slots, lens)
        chosen = decisions().get("causal_conv1d_prefill", [])
        y_ref = conv.causal_conv1d_prefill_ref(x, w, ref, slots, lens)
        rep = tolerance_report(y, y_ref, rtol, atol)
        others = [s for s in range(pool.shape[0]) if s not in slots]
        ok = rep["ok"] and bits_equal(mine, ref) and bits_equal(mine[others], pool[others])
        row = {"op": "causal_conv1d_prefill", "shape": f"{len(lens)}x{lens[0]}" if len(set(lens)) == 1 else str(lens),
               "tokens": t, "selected": chosen, "ok": ok, "max_abs": rep["max_abs"], "rel_l2": rep["rel_l2"]}
        xz.normal_()  # fresh inputs for the timed calls (the checked ones held hostile values)
        xs = xz[:, :c]
        work = pool.clone()
        row["netra_us"] = timed(lambda: conv.causal_conv1d_prefill(xs, w, work, slots, lens))
        row["netra_p90_us"] = P90[0]
        row["reference_us"] = timed(lambda: conv.causal_conv1d_prefill_ref(xs, w, work, slots, lens), reps=2)
        row["reference_p90_us"] = P90[0]
        if peer is not None:
            qsl = torch.tensor([0] + list(torch.tensor(lens).cumsum(0)), dtype=torch.int32, device="cuda")
            idx = torch.tensor(slots, dtype=torch.int32, device="cuda")
            init = torch.ones(len(lens), dtype=torch.bool, device="cuda")
            try:
                yp = peer(xs.t(), w, None, pool.clone(), qsl, lens, cache_indices=idx, has_initial_state=init,
                          activation="silu")
                mine_y = conv.causal_conv1d_prefill(xs, w, pool.clone(), slots, lens)
                row["sglang_max_abs_vs_netra"] = float((yp.t().float() - mine_y.float()).abs().max())
                row["sglang_us"] = timed(lambda: peer(xs.t(), w, None, work, qsl, lens, cache_indices=idx,
                                                      has_initial_state=init, activation="silu"))
                row["sglang_p90_us"] = P90[0]
            except Exception as exc:  # the peer's failure is recorded, never hidden
                row["sglang_error"] = f"{type(exc).__name__}: {exc}"[:300]
        if lens == [1024] * 8:  # the contract's launch beside its neighbours (the record says which was best)
            base = doc["launch"]
            entry = conv_entry(doc)
            row["variants_us"] = {}
            for bt in (16, 32, 64):
                for bc in (128, 256):
                    for unroll in (0, 1):
                        launch = {**base, "block": 64 if bc == 256 else 32,
                                  "meta": {**base["meta"], "BT": bt, "BC": bc, "UNROLL": unroll}}
                        row["variants_us"][f"BT{bt}_BC{bc}_U{unroll}"] = round(timed(
                            lambda launch=launch: entry(launch, x=xs, weight=w, state_pool=work, seq_slots=slots,
                                                        q_lens=lens)), 1)
        row["bytes"] = 4 * t * c
        row["floor_fraction"] = row["bytes"] / 4.2e12 / (row["netra_us"] * 1e-6)
        rows.append(row)
        print(json.dumps(row), flush=True)
    return rows


def norm_rows() -> list[dict[str, Any]]:
    import torch

    from netra.ops import norm
    from netra.ops._common import decisions

    rows = []
    for name, rws, width in (("rmsnorm_gemma", 8192, 2048), ("add_rmsnorm_gemma", 8320, 2048),
                             ("gated_rmsnorm", 262144, 128)):
        g = torch.Generator(device="cuda").manual_seed(rws)

        def t(scale: float, rr: int = rws, ww: int = width) -> Any:
            return (torch.randn(rr, ww, generator=g, device="cuda") * scale).bfloat16()
        x, r, w = t(3.0), t(5.0), (torch.randn(width, generator=g, device="cuda") * 0.1).bfloat16()
        x[0] *= 1e4
        z = t(2.0, rws, 2 * width)[:, :width]  # a strided view, as the engine's slice of the in-projection
        if name == "gated_rmsnorm":
            run, ref = (lambda: norm.gated_rmsnorm(x, z, w, 1e-6)), (lambda: norm.gated_rmsnorm_ref(x, z, w, 1e-6))
        elif name == "add_rmsnorm_gemma":
            run, ref = (lambda: norm.add_rmsnorm(x, r, w, 1e-6)[0]), (lambda: norm.add_rmsnorm_ref(x, r, w, 1e-6)[0])
        else:
            run, ref = (lambda: norm.rmsnorm(x, w, 1e-6)), (lambda: norm.rmsnorm_ref(x, w, 1e-6))
        got, want = run(), ref()
        err = ((got.double() - want.double()).norm(dim=-1) / want.double().norm(dim=-1).clamp(min=1e-300))
        rel = float((got.double() - want.double()).norm() / want.double().norm())
        # the contracts declare relative L2 over the output (2e-3); the worst single row is reported beside it
        row = {"op": name, "rows": rws, "width": width, "selected": decisions().get(name, []), "rel_l2": rel,
               "worst_row_rel_l2": float(err.max()), "ok": rel <= 2e-3, "netra_us": timed(run)}
        row["netra_p90_us"] = P90[0]
        row["reference_us"] = timed(ref, reps=5)
        row["reference_p90_us"] = P90[0]
        rows.append(row)
        print(json.dumps(row), flush=True)
    return rows


def linear_rows() -> list[dict[str, Any]]:
    """``linear_group_bf16_prefill`` (GDN b|a through cuBLAS) against linear_group_ref at prefill rows."""
    import torch

    from netra.ops._common import decisions
    from netra.ops.linear import Weight, linear_group, linear_group_ref

    rows = []
    for m in (8192, 8320, 1151):
        g = torch.Generator(device="cuda").manual_seed(m)
        x = (torch.randn(m, 2048, generator=g, device="cuda") * 2).bfloat16()
        ws = [Weight((torch.randn(32, 2048, generator=g, device="cuda") * 2048 ** -0.5).bfloat16()) for _ in range(2)]
        got, want = linear_group(x, ws), linear_group_ref(x, ws)
        rel = max(float((a.double() - b.double()).norm() / b.double().norm()) for a, b in zip(got, want, strict=True))
        row = {"op": "linear_group", "shape": f"{m}x2048->32+32", "selected": decisions().get("linear_group", []),
               "rel_l2": rel, "ok": rel <= 2e-3, "netra_us": timed(lambda: linear_group(x, ws))}
        row["netra_p90_us"] = P90[0]
        row["reference_us"] = timed(lambda: linear_group_ref(x, ws), reps=5)
        row["reference_p90_us"] = P90[0]
        rows.append(row)
        print(json.dumps(row), flush=True)
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", ".")) / "prefill")
    ap.add_argument("--peer-root", default=str(ROOT / ".sglang_peer"))
    args = ap.parse_args()
    import importlib

    peer = None
    try:
        from netra.bench.peers.sglang_loader import install

        install(Path(args.peer_root))
        peer = importlib.import_module("sglang.kernels.ops.mamba.causal_conv1d_triton").causal_conv1d_fn
    except Exception as exc:
        print(f"SGLang conv peer not loaded: {type(exc).__name__}: {exc}", flush=True)
    rows = conv_rows(peer) + norm_rows() + linear_rows()
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "prefill_ops.json").write_text(json.dumps(rows, indent=1))
    record(args.out, "python3 scripts/gpu/prefill_ops.py")
    print(f"{'op':<24} {'shape':<18} {'ok':<5} {'netra us':>9} {'ref us':>10} {'sglang us':>10}  selected")
    for r in rows:
        shape = r.get("shape", f"{r.get('rows')}x{r.get('width')}")
        print(f"{r['op']:<24} {shape[:18]:<18} {str(r['ok']):<5} {r['netra_us']:>9.1f} {r['reference_us']:>10.1f} "
              f"{r.get('sglang_us', float('nan')):>10.1f}  {','.join(r['selected'])[:60]}")
    return 0 if all(r["ok"] for r in rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())
