"""MoE kernels on the H200: oracle checks of every MoE contract, then the side-by-side record against SGLang.

`netra bench kernels --family moe` (or ``python -m netra.bench.kernels_moe``) on a GPU machine:

1. **Checks** (per contract of the family, read from the catalog): the full Qwen3.6 MoE layer (seeded with the
   engine's initialiser) at every token count of the contract's domain that the record measures, plus
   adversarial inputs (router ties, zero rows, large / tiny / outlier activations); each compared with the
   contract's own oracle and policy (`netra.validate.oracle`); outputs poisoned with NaN before each run; eager
   equals CUDA-graph replay and run to run, bitwise.
2. **Record**: the block (router + routed + shared + combine) and the routed part alone, ours and SGLang 0.5.23's
   (`netra.bench.peers.sglang_moe`), interleaved in one process under the one timing protocol
   (`netra.bench.timing`: graph replay over rotated inputs), at 1..128 tokens, with the byte floor of each call
   (the weights of the experts the call's routing actually selects, the shared expert, the router, x and out)
   over the copy rate measured in the same run.

The gates of issue 18 are evaluated from the rows (`gates`); the record goes to ``--out``.
"""

from __future__ import annotations

import argparse
import functools
import importlib
import json
import time
from pathlib import Path
from typing import Any

TOKENS = (1, 2, 4, 8, 16, 32, 64, 128)
N_INPUTS = 8  # rotated input sets per provider (their experts' weights exceed the L2 together)
EXPERT_BYTES = 1024 * 2048 + 8 * 16 * 4 + 2048 * 512 + 16 * 4 * 4  # w13 + w2 + their scales
ROUTER_BYTES = 256 * 2048 * 2 + 2048 * 2
GATES = {"block_1": 1.8, "block_8": 1.15, "block_floor_128": 0.93, "routed_1": 1.9, "routed_floor_128": 0.95}


def _torch() -> Any:
    import torch

    return torch


def moe_layer(seed: int = 0, device: str = "cuda") -> Any:
    """Layer 0's MoE block of the seeded full Qwen3.6 preset (the engine's own initialiser)."""
    from netra.engine.config import preset
    from netra.engine.weights import seeded_moe

    return seeded_moe(preset("qwen36-35b-a3b"), seed, device)


def inputs(m: int, seed: int, kind: str = "normal", device: str = "cuda") -> Any:
    torch = _torch()
    g = torch.Generator(device=device).manual_seed(seed)
    x = torch.randn(m, 2048, generator=g, device=device)
    if kind == "zero":
        x.zero_()
    elif kind == "large":
        x *= 300.0
    elif kind == "tiny":
        x *= 1e-3
    elif kind == "outlier":
        x[:, ::128] *= 1000.0
    return x.to(torch.bfloat16)


def with_router_ties(w: Any) -> Any:
    """The same layer with router rows 2j and 2j + 1 equal for j < 64: exact logit ties everywhere."""
    import dataclasses

    from netra.ops.linear import Weight

    r = w.router.data.clone()
    r[1:128:2] = r[0:128:2]
    return dataclasses.replace(w, router=Weight(r))


def routing(w: Any, x: Any) -> tuple[Any, Any]:
    """The reference's top-8 (ids int32, renormalised FP32 weights) for x."""
    from netra.ops.linear import linear_ref
    from netra.ops.moe import moe_route_ref

    torch = _torch()
    wts, ids = moe_route_ref(linear_ref(x, w.router, torch.bfloat16), w.top_k, w.renormalize)
    return ids.to(torch.int32).contiguous(), wts.float().contiguous()


def tactic_routing(x: Any) -> tuple[Any, Any]:
    """The top-8 the block tactic's route kernel wrote for its last call on x's device (ids, weights; its 9th route,
    the shared expert's gate, is judged through the output against the oracle's own gate)."""
    from netra.ops import moe_sm90

    b = moe_sm90._bufs(x.device)
    m = x.shape[0]
    return b.topk_ids[:m, :8].clone(), b.topk_w[:m, :8].clone()


def floor_bytes(ids: Any, m: int, shared: bool) -> int:
    """Bytes a call must move: each selected expert's weights once, the shared expert and router (block),
    x in and out."""
    n = int(ids.unique().numel())
    return n * EXPERT_BYTES + (EXPERT_BYTES + ROUTER_BYTES if shared else 0) + 2 * m * 2048 * 2


CHECK_TOKENS = (1, 2, 3, 5, 8, 16, 33, 64, 127, 128)  # odd counts too: half-filled warps, passes and chunks
ADVERSARIAL_AT = (1, 8, 128)  # every adversarial input kind at these counts, fresh random inputs at all


def check_contract(contract: Any, w: Any, ties: Any, tokens: tuple[int, ...] = CHECK_TOKENS) -> dict[str, Any]:
    """Every token count of the contract's domain we record, plus adversarial inputs, per its own policy."""
    from netra.bench.timing import capture
    from netra.ops.linear import linear_ref
    from netra.ops.moe import moe, moe_routed, routing_agreement
    from netra.validate.oracle import judge, oracle, poison_next

    torch = _torch()
    ref_fn = oracle(contract)
    rng = contract.dims["tokens"]
    cases: list[dict[str, Any]] = []
    block = contract.op == "moe_fp8_block"
    for m in [t for t in tokens if rng.contains(t)]:
        kinds = (("normal", w), ("ties", ties), ("zero", w), ("large", w), ("tiny", w), ("outlier", w))
        for kind, layer in kinds if m in ADVERSARIAL_AT else kinds[:1]:
            x = inputs(m, 1000 * m + len(cases), "normal" if kind == "ties" else kind)
            route_note: dict[str, int] | None = None
            if block:
                run = functools.partial(moe, x, layer)
                run()
                ids, tw = tactic_routing(x)
                route_note = routing_agreement(linear_ref(x, layer.router, torch.bfloat16), ids, routing(layer, x)[0])
                # the experts' arithmetic judged on the tactic's own routing (near-ties judged above)
                ref = ref_fn(x, layer, routing=(tw, ids))
            else:
                ids, tw = routing(layer, x)
                run = functools.partial(moe_routed, x, layer.w13.data, layer.w13.scale_inv, layer.w2.data,
                                        layer.w2.scale_inv, ids, tw)
                ref = ref_fn(x, ids, tw, layer.w13.data, layer.w13.scale_inv, layer.w2.data, layer.w2.scale_inv)
            poison_next((m, 2048), torch.bfloat16, x.device)
            got = run()
            again = run()
            g, replay_out = capture(run)
            g.replay()
            torch.cuda.synchronize()
            verdict = judge(contract, got, ref)
            cases.append({"tokens": m, "input": kind, **verdict,
                          "run_to_run_bitwise": bool(torch.equal(got, again)),
                          "eager_equals_replay": bool(torch.equal(got, replay_out)),
                          **({"routing": route_note} if route_note else {})})
            if route_note and route_note["errors"]:
                cases[-1]["ok"] = False
            del g
    ok = all(c["ok"] and c["run_to_run_bitwise"] and c["eager_equals_replay"] for c in cases)
    near = sum(c.get("routing", {}).get("near_ties", 0) for c in cases)
    return {"routing_near_ties": near, "contract": contract.name, "policy": contract.numerics["policy"], "rtol": contract.numerics.get("rtol"),
            "cases": len(cases), "failing": [c for c in cases if not (c["ok"] and c["run_to_run_bitwise"]
                                                                         and c["eager_equals_replay"])],
            "worst_rel_l2": max(c["rel_l2"] for c in cases), "min_cosine": min(c["cosine"] for c in cases),
            "ok": ok}


def providers(w: Any, peer: Any, xs: list[Any], routes: list[tuple[Any, Any]]) -> list[Any]:
    """Ours (block, routed) and, when it runs, SGLang's, over the same rotated inputs."""
    from netra.bench.timing import Provider
    from netra.ops.moe import moe, moe_routed

    w13, s13, w2, s2 = w.w13.data, w.w13.scale_inv, w.w2.data, w.w2.scale_inv
    provs = [Provider("netra/block", lambda i: moe(xs[i], w), N_INPUTS, hold=xs),
             Provider("netra/routed", lambda i: moe_routed(xs[i], w13, s13, w2, s2, *routes[i]), N_INPUTS,
                      hold=routes)]
    if peer is not None:
        provs += [Provider("sglang/block", lambda i: peer.block(xs[i]), N_INPUTS, hold=xs),
                  Provider("sglang/routed", lambda i: peer.routed(xs[i], *routes[i]), N_INPUTS, hold=routes)]
    return provs


def bench(w: Any, peer: Any, tokens: tuple[int, ...], samples: int, copy_bps: float,
          log: Any) -> list[dict[str, Any]]:
    """Rows: block and routed, ours and the peer's, per token count (one interleaved run per count)."""
    from netra.bench.timing import interleave, row

    rows: list[dict[str, Any]] = []
    for m in tokens:
        xs = [inputs(m, 7 * i + m) for i in range(N_INPUTS)]
        routes = [routing(w, x) for x in xs]
        stats = interleave(providers(w, peer, xs, routes), samples=samples, deadline_s=20.0)
        for name, st in stats.items():
            part = name.split("/")[1]
            fb = sum(floor_bytes(ids, m, part == "block") for ids, _ in routes) / N_INPUTS
            rows.append(row(f"moe_{part}", {"tokens": m}, "fp8_e4m3_block128", name.split("/")[0], st, fb, copy_bps,
                            section=part, tokens=m))
        log(f"  {m:4d} tokens: " + "  ".join(f"{n} {s['median_us']:.2f}" for n, s in stats.items()))
    return rows


def speedups(rows: list[dict[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for part in ("block", "routed"):
        for m in TOKENS:
            ours = next((r for r in rows if r["section"] == part and r["tokens"] == m and r["provider"] == "netra"), None)
            peer = next((r for r in rows if r["section"] == part and r["tokens"] == m and r["provider"] == "sglang"), None)
            if ours is None:
                continue
            out[f"{part}_{m}"] = {"netra_us": ours["median_us"], "sglang_us": peer["median_us"] if peer else None,
                                  "ratio": round(peer["median_us"] / ours["median_us"], 3) if peer else None,
                                  "floor_fraction": ours.get("floor_fraction")}
    return out


def gates(sp: dict[str, Any], checks_ok: bool) -> dict[str, Any]:
    def g(value: float | None, need: float) -> dict[str, Any]:
        return {"need": need, "value": value, "pass": value is not None and value >= need}

    def get(key: str, field: str) -> float | None:
        v = sp.get(key, {}).get(field)
        return float(v) if v is not None else None

    never = [v["ratio"] for k, v in sp.items() if k.startswith("block_") and v["ratio"] is not None]
    return {"checks": {"pass": checks_ok},
            "block_never_slower": g(min(never) if never else None, 1.0),
            "block_1_token": g(get("block_1", "ratio"), GATES["block_1"]),
            "block_8_tokens": g(get("block_8", "ratio"), GATES["block_8"]),
            "block_floor_128": g(get("block_128", "floor_fraction"), GATES["block_floor_128"]),
            "routed_1_token": g(get("routed_1", "ratio"), GATES["routed_1"]),
            "routed_floor_128": g(get("routed_128", "floor_fraction"), GATES["routed_floor_128"])}


def split_records(record: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The committed records derived from one run's ``moe_kernels.json``: ``moe_block_h200.json`` (the whole run,
    judged by the block gates) and ``moe_routed_h200.json`` (its routed rows and the routed contracts' checks,
    judged by the routed gates). A record's verdict is ``accepted`` when every one of its gates passes."""
    def part(name: str, section: str, gate_keys: tuple[str, ...], contracts: tuple[str, ...],
             objects: tuple[str, ...]) -> dict[str, Any]:
        checks = {k: v for k, v in record["checks"]["contracts"].items() if k in contracts}
        sp = {k: v for k, v in record["speedups"].items() if section == "block" or k.startswith(section + "_")}
        ratios = [v["ratio"] for k, v in sp.items() if k.startswith(section + "_") and v["ratio"] is not None]
        promo: dict[str, Any] = {k: record["gates"][k] for k in gate_keys}
        promo[f"{section}_never_slower"] = {"need": 1.0, "value": min(ratios) if ratios else None,
                                           "pass": bool(ratios) and min(ratios) >= 1.0}
        promo["checks"] = {"pass": bool(checks) and all(c["ok"] for c in checks.values())}
        out = {**record, "rows": [r for r in record["rows"] if section == "block" or r["section"] == section],
               "speedups": sp, "promotion": promo,
               "checks": {"contracts": checks, "mismatches": sum(len(c["failing"]) for c in checks.values()),
                          "eager_equals_replay": all(f["eager_equals_replay"] for c in checks.values()
                                                     for f in c["failing"])},
               "code_objects": {k: v for k, v in record["code_objects"].items() if section == "block" or k in objects},
               "verdict": "accepted" if all(g["pass"] for g in promo.values()) else "info"}
        if section != "block":
            out["derived_from"] = f"{name.replace('routed', 'block')} (the same run: its {section} rows and checks)"
            out.pop("gates", None)
        return out

    return {"moe_block_h200.json": part("moe_block_h200.json", "block", (
                "block_1_token", "block_8_tokens", "block_floor_128"), tuple(record["checks"]["contracts"]), ()),
            "moe_routed_h200.json": part("moe_routed_h200.json", "routed", ("routed_1_token", "routed_floor_128"),
                                         ("moe_routed_t1", "moe_routed_stream"),
                                         ("moe_layer_t1_e256_k8", "moe_layer_stream_e256_k8"))}


def locked_objects() -> dict[str, Any]:
    """The MoE code objects measured: name -> the lock's sha256 (a record is evidence for exactly these)."""
    from netra.kernel_lock import read_lock

    return {e["name"]: {"sha256": e["sha256"]} for e in read_lock()["code_objects"] if e["family"] == "moe"}


def _peer(w: Any, root: str | None, log: Any) -> tuple[Any, str]:
    """SGLang 0.5.23's pipeline on these weights, or None with the reason (the record says which)."""
    try:
        peer_cls = importlib.import_module("netra.bench.peers.sglang_moe").SglangMoePeer
        return peer_cls.from_moe_weights(w, root), "sglang 0.5.23 (netra.bench.peers.sglang_moe)"
    except Exception as exc:  # the record names why the peer did not run; ours are still measured
        log(f"peer unavailable: {type(exc).__name__}: {exc}")
        return None, f"not run: {type(exc).__name__}: {exc}"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="netra bench kernels --family moe", description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, required=True, help="directory for moe_kernels.json")
    p.add_argument("--tokens", default=",".join(map(str, TOKENS)), help="token counts to time (default: %(default)s)")
    p.add_argument("--samples", type=int, default=40, help="interleaved samples per provider (default: %(default)s)")
    p.add_argument("--sglang-root", default=None, help="folder holding the carried sglang files (default: the peer's)")
    p.add_argument("--git-sha", default="", help="commit measured (device copies have no .git)")
    p.add_argument("--no-checks", action="store_true", help="time only")
    p.add_argument("--split", type=Path, default=None,
                   help="no GPU: derive moe_block_h200.json / moe_routed_h200.json from this moe_kernels.json into --out")
    args = p.parse_args(argv)
    if args.split is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        for fname, rec in split_records(json.loads(args.split.read_text())).items():
            (args.out / fname).write_text(json.dumps(rec, indent=1, default=str) + "\n")
            print(f"wrote {args.out / fname}: verdict {rec['verdict']}")
        return 0
    torch = _torch()
    if not torch.cuda.is_available():
        print("netra bench kernels --family moe: needs a CUDA GPU")
        return 2
    from netra.bench.timing import copy_bandwidth
    from netra.catalog import Catalog

    def log(msg: str) -> None:
        print(msg, flush=True)

    t0 = time.monotonic()
    w = moe_layer()
    contracts = [c for c in Catalog.load().contracts if c.family == "moe" and c.target == "sm90"]
    checks: dict[str, Any] = {}
    if not args.no_checks:
        ties = with_router_ties(w)
        for c in contracts:
            if not any(c.dims["tokens"].contains(t) for t in CHECK_TOKENS):
                continue  # moe_block_prefill (129..8192 tokens): scripts/gpu/moe_prefill.py checks it
            checks[c.name] = check_contract(c, w, ties)
            log(f"check {c.name}: {checks[c.name]['cases']} cases, ok={checks[c.name]['ok']}, "
                f"worst rel-L2 {checks[c.name]['worst_rel_l2']:.2e}")
    copy_bps = copy_bandwidth()
    peer, peer_note = _peer(w, args.sglang_root, log)
    rows = bench(w, peer, tuple(int(t) for t in args.tokens.split(",")), args.samples, copy_bps, log)
    sp = speedups(rows)
    checks_ok = all(c["ok"] for c in checks.values()) if checks else False
    record = {"kind": "kernel", "family": "moe", "target": "sm90", "device": torch.cuda.get_device_name(),
              "git_sha": args.git_sha, "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
              "command": "python -m netra.bench.kernels_moe --out <dir>", "status": "measured",
              "copy_bandwidth_gbps": round(copy_bps / 1e9, 1), "peer": peer_note, "rows": rows, "speedups": sp,
              "checks": {"contracts": checks, "mismatches": sum(len(c["failing"]) for c in checks.values()),
                         "eager_equals_replay": all(not any(not f["eager_equals_replay"] for f in c["failing"])
                                                    for c in checks.values()) if checks else None},
              "gates": gates(sp, checks_ok), "code_objects": locked_objects(), "wall_s": round(time.monotonic() - t0, 1),
              "verdict": "info"}
    record["promotion"] = record["gates"]
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "moe_kernels.json").write_text(json.dumps(record, indent=1, default=str) + "\n")
    log(f"{'part':7s} {'tok':>4s} {'netra us':>9s} {'sglang us':>9s} {'ratio':>6s} {'floor':>6s}")
    for k, v in sp.items():
        part, m = k.rsplit("_", 1)
        log(f"{part:7s} {m:>4s} {v['netra_us']:9.2f} {v['sglang_us'] or 0:9.2f} {v['ratio'] or 0:6.3f} "
            f"{v['floor_fraction'] or 0:6.3f}")
    for k, v in record["gates"].items():
        log(f"gate {k}: {v}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
