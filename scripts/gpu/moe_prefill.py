"""H200: the prefill MoE block tactic (contract ``moe_block_prefill``, kernels/sm90/moe/moe_prefill.py) against its
oracle, then timed beside SGLang 0.5.23's block at prefill token counts.

    timeout 240 python scripts/gpu/moe_prefill.py --out $OUT/moe_prefill    (carry .sglang_peer; about 60-90 s)

Sets NETRA_TACTIC_MIN_MATURITY=experiment, whatever the environment says (the contract is an experiment) and calls the op as the engine does
(`netra.ops.moe.moe`: dispatch must pick moe_block_prefill, recorded per case). Layer: the seeded full Qwen3.6 preset's
MoE block (256 experts top-8, hidden 2048, width 512, E4M3 with 128 x 128 block scales, the gated shared expert).

Checks (per the contract's own numerics policy, `netra.validate.oracle.judge`, against `moe_ref` on the GPU): fresh
random chunks at 256, 1024 and 4096 tokens; at 1024 also adversarial chunks (zero rows mixed in, 1e-3 and 300x
magnitudes, an outlier group, router ties: router rows 2j and 2j+1 equal); outputs poisoned (NaN) before each
call; run to run bitwise; the routing judged apart (`routing_agreement` on the reference's BF16 logits: near-ties
allowed, errors not). A CUDA-graph capture is tried once (prefill is eager: the contract does not claim capture;
the record says whether it would work).

Timing (`netra.bench.timing`, graph replay when the capture works, else eager; 2 rotated inputs: the 805 MB of
expert weights are far past the 50 MB L2): ours (`moe`) and SGLang's `block` (its fused_experts pipeline with its
tuned H200 configs, the shared expert through its block-FP8 linear, its fused gate) at 1024 and 4096 tokens
(and 256 / 8192 if time is left). Floor = (every expert's and the shared expert's weights + scales + router once,
x in, out) / the copy rate measured in the run. Writes ``<out>/moe_prefill.json`` (RESULTS.md) and prints a table.

Prediction (kernels/sm90/moe/moe_prefill.py docstring): 1K tokens ~330 us, 4K tokens ~650 us; SGLang within +-20 %.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import traceback
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
os.environ["NETRA_TACTIC_MIN_MATURITY"] = "experiment"  # the contract is an experiment (overrides a session's setting)

import torch  # noqa: E402

from netra.bench.kernels_moe import (  # noqa: E402
    EXPERT_BYTES,
    ROUTER_BYTES,
    inputs,
    locked_objects,
    moe_layer,
    with_router_ties,
)
from netra.bench.timing import Provider, capture, copy_bandwidth, interleave, row  # noqa: E402
from netra.catalog import Catalog  # noqa: E402
from netra.ops._common import route  # noqa: E402
from netra.ops.linear import linear_ref  # noqa: E402
from netra.ops.moe import _block_call, moe, moe_ref, moe_route_ref, routing_agreement  # noqa: E402
from netra.validate.oracle import judge, poison_next  # noqa: E402

CONTRACT = "moe_block_prefill"
CHECK_TOKENS = (256, 1024, 4096)
ADVERSARIAL_AT = 1024
TIME_TOKENS = (1024, 4096)
EXTRA_TOKENS = (256, 8192)  # timed only while the deadline allows
DEADLINE_S = 80.0
T0 = time.monotonic()


def log(msg: str) -> None:
    print(f"[{time.monotonic() - T0:6.1f}s] {msg}", flush=True)


def chunk(m: int, seed: int, kind: str) -> torch.Tensor:
    if kind == "mixed":  # zero rows, tiny and large rows in one chunk
        x = inputs(m, seed).float()
        x[0::5] = 0.0
        x[1::5] *= 1e-3
        x[2::5] *= 300.0
        return x.bfloat16()
    return inputs(m, seed, "normal" if kind == "ties" else kind)


def selected(x: torch.Tensor, w: Any) -> str:
    op, tensors, dims, quant = _block_call(x, w)
    hit = route(op, tensors, dims, quant=quant, reduction_order="fixed")
    return hit[1].contract.name if hit is not None and hit[1].contract is not None else "fallback"


def check(contract: Any, w: Any, ties: Any) -> dict[str, Any]:
    cases: list[dict[str, Any]] = []
    for m in CHECK_TOKENS:
        kinds = ["normal"] + (["mixed", "tiny", "large", "outlier", "ties"] if m == ADVERSARIAL_AT else [])
        for kind in kinds:
            try:
                layer = ties if kind == "ties" else w
                x = chunk(m, 1000 * m + len(cases), kind)
                poison_next((m, 2048), torch.bfloat16, x.device)
                got = moe(x, layer)
                again = moe(x, layer)
                logits = linear_ref(x, layer.router, torch.bfloat16)
                _, ref_ids = moe_route_ref(logits, layer.top_k, layer.renormalize)
                ref = moe_ref(x, layer)
                torch.cuda.synchronize()
                v = judge(contract, got, ref)
                _, ours_ids = moe_route_ref(_tactic_logits(x, layer)[:, :256], layer.top_k, layer.renormalize)
                agree = routing_agreement(logits.cpu(), ours_ids.cpu(), ref_ids.cpu())
                case = {"tokens": m, "input": kind, "selected": selected(x, layer), **v,
                        "run_to_run_bitwise": bool(torch.equal(got, again)), "routing": agree,
                        "finite": bool(torch.isfinite(got).all())}
                case["ok"] = bool(v["ok"] and case["run_to_run_bitwise"] and agree["errors"] == 0
                                  and case["selected"] == CONTRACT and case["finite"])
            except Exception as exc:  # recorded, the next case runs
                case = {"tokens": m, "input": kind, "ok": False, "error": f"{type(exc).__name__}: {exc}",
                        "trace": traceback.format_exc()[-1500:]}
            cases.append(case)
            log(f"check {m:5d} {kind:8s} ok={case['ok']} rel_l2={case.get('rel_l2', float('nan')):.2e} "
                f"routing={case.get('routing')} {case.get('error', '')}")
    graph: dict[str, Any] = {}
    try:  # through the tactic's entry: dispatch itself never selects a prefill contract under capture
        x = chunk(1024, 77, "normal")
        eager = moe(x, w)
        run = tactic_call(x, w)
        g, out = capture(lambda: run(x, w))
        poison = torch.full_like(out, float("nan"))
        out.copy_(poison)
        g.replay()
        torch.cuda.synchronize()
        graph = {"capturable": True, "eager_equals_replay": bool(torch.equal(eager, out))}
        del g
    except Exception as exc:
        graph = {"capturable": False, "error": f"{type(exc).__name__}: {exc}"}
    log(f"graph: {graph}")
    return {"contract": CONTRACT, "policy": contract.numerics["policy"], "rtol": contract.numerics.get("rtol"),
            "cases": len(cases), "failing": [c for c in cases if not c["ok"]], "all": cases,
            "worst_rel_l2": max((c.get("rel_l2", float("inf")) for c in cases), default=None), "graph": graph,
            "ok": all(c["ok"] for c in cases)}


def tactic_call(x: torch.Tensor, w: Any) -> Any:
    """``f(x, layer)``: the entry of the tactic dispatch selects for this call (eager), with its contract's launch."""
    op, tensors, dims, quant = _block_call(x, w)
    hit = route(op, tensors, dims, quant=quant, reduction_order="fixed")
    if hit is None or hit[1].contract is None or hit[1].contract.name != CONTRACT:
        raise RuntimeError(f"dispatch did not select {CONTRACT} for {x.shape[0]} tokens")
    decision = hit[1]
    return lambda xx, layer: decision.tactic.entry(decision.contract.launch, x=xx, weights=layer)


def _tactic_logits(x: torch.Tensor, w: Any) -> torch.Tensor:
    """The tactic's own router logits (its `_router_kernel`), for the routing agreement."""
    from netra.catalog import contract_doc
    from netra.ops import _triton

    doc = contract_doc(CONTRACT)
    mod = _triton.load_source(doc["kernel"]["source"])
    out = torch.empty(x.shape[0], 257, dtype=torch.bfloat16, device=x.device)
    mod._router_kernel[(5, -(-x.shape[0] // 64))](x, w.router.data, w.shared_gate.data, out, x.shape[0], 256, 2048,
                                                   BLOCK_M=64, BLOCK_N=64, BLOCK_K=64, num_warps=4)
    return out


def floor_bytes(m: int) -> int:
    return 257 * EXPERT_BYTES + ROUTER_BYTES + 2 * m * 2048 * 2


def bench(w: Any, peer: Any, tokens: tuple[int, ...], copy_bps: float, graph_ok: bool) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    for m in tokens:
        if m not in TIME_TOKENS and time.monotonic() - T0 > DEADLINE_S - 15:
            log(f"time: {m} tokens skipped (deadline)")
            continue
        try:
            xs = [inputs(m, 7 * i + m) for i in range(2)]
            ours = tactic_call(xs[0], w)
            provs = [Provider("netra", lambda i, f=ours, xs=xs: f(xs[i], w), 2, min_calls=4, graph=graph_ok, hold=xs)]
            if peer is not None:
                provs.append(Provider("sglang", lambda i, xs=xs: peer.block(xs[i]), 2, min_calls=4, hold=xs))
            stats = interleave(provs, samples=15, deadline_s=6.0)
            for name, st in stats.items():
                rows.append(row("moe_fp8_block", {"tokens": m}, "fp8_e4m3_block128", name, st, floor_bytes(m),
                                copy_bps, tokens=m))
            log(f"time {m:5d}: " + "  ".join(f"{n} {s['median_us']:.1f} us ({s['mode']})" for n, s in stats.items()))
        except Exception as exc:
            rows.append({"tokens": m, "error": f"{type(exc).__name__}: {exc}", "trace": traceback.format_exc()[-1500:]})
            log(f"time {m}: {type(exc).__name__}: {exc}")
    return rows


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--sglang-root", default=None, help="carried peer tree (default: the peer's, .sglang_peer)")
    p.add_argument("--git-sha", default="", help="main commit measured (device copies have no .git)")
    args = p.parse_args(argv)
    if not torch.cuda.is_available():
        print("moe_prefill.py needs a CUDA GPU")
        return 2
    record: dict[str, Any] = {"kind": "kernel", "family": "moe", "target": "sm90",
                              "device": torch.cuda.get_device_name(), "git_sha": args.git_sha,
                              "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                              "command": "timeout 240 python scripts/gpu/moe_prefill.py --out $OUT/moe_prefill",
                              "status": "measured", "rows": [], "checks": {}, "verdict": "info"}
    args.out.mkdir(parents=True, exist_ok=True)

    def save() -> None:
        record["wall_s"] = round(time.monotonic() - T0, 1)
        (args.out / "moe_prefill.json").write_text(json.dumps(record, indent=1, default=str) + "\n")

    try:
        contract = next(c for c in Catalog.load().contracts if c.name == CONTRACT)
        w = moe_layer()
        ties = with_router_ties(w)
        record["code_objects"] = {k: v for k, v in locked_objects().items() if k == CONTRACT}
    except Exception as exc:
        record.update(status="not_run", reason=f"setup: {type(exc).__name__}: {exc}", trace=traceback.format_exc())
        save()
        print(record["reason"])
        return 1
    try:
        record["checks"] = check(contract, w, ties)
    except Exception as exc:
        record["checks"] = {"ok": False, "error": f"{type(exc).__name__}: {exc}", "trace": traceback.format_exc()}
    save()
    peer = None
    try:
        from netra.bench.peers.sglang_moe import SglangMoePeer

        peer = SglangMoePeer.from_moe_weights(w, args.sglang_root)
        record["peer"] = "sglang 0.5.23 block (netra.bench.peers.sglang_moe.SglangMoePeer.block)"
        record["peer_configs"] = {str(m): peer.configs(m) for m in TIME_TOKENS}
    except Exception as exc:
        record["peer"] = f"not run: {type(exc).__name__}: {exc}"
        log(record["peer"])
    try:
        copy_bps = copy_bandwidth()
        record["copy_bandwidth_gbps"] = round(copy_bps / 1e9, 1)
        graph_ok = bool(record["checks"].get("graph", {}).get("capturable"))
        record["rows"] = bench(w, peer, TIME_TOKENS + EXTRA_TOKENS, copy_bps, graph_ok)
    except Exception as exc:
        record["bench_error"] = f"{type(exc).__name__}: {exc}"
        record["bench_trace"] = traceback.format_exc()
    sp: dict[str, Any] = {}
    by = {(r.get("tokens"), r.get("provider")): r for r in record["rows"] if "median_us" in r}
    for m in sorted({k[0] for k in by}):
        if (m, "netra") in by and (m, "sglang") in by:
            sp[f"block_{m}"] = round(by[(m, "sglang")]["median_us"] / by[(m, "netra")]["median_us"], 3)
    record["speedups"] = sp
    record["prediction_us"] = {"1024": 330, "4096": 650}
    save()
    print(f"\n{'tokens':>6s} {'provider':>8s} {'median us':>10s} {'floor us':>9s} {'floor frac':>10s}")
    for r in record["rows"]:
        if "median_us" in r:
            print(f"{r['tokens']:6d} {r['provider']:>8s} {r['median_us']:10.1f} {r.get('floor_us', 0):9.1f} "
                  f"{r.get('floor_fraction', 0):10.3f}")
    print(f"checks ok={record['checks'].get('ok')} cases={record['checks'].get('cases')} "
          f"worst rel-L2={record['checks'].get('worst_rel_l2')}; speedups (sglang/netra) {sp}; "
          f"wall {record['wall_s']} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
