"""The block at 2..128 tokens in one launch (moe_block_stream_fold: the route folded into the layer) against the
two-launch plan (moe_block_stream: moe_route -> moe_ml_shared), on the H200, one process (issue 18):

1. bitwise: the same inputs through both plans -> outputs, top-8 ids / weights and the shared gate equal bit for bit
   (normal, router-tie, zero, large, tiny, outlier inputs; odd token counts), run to run and eager == graph replay;
2. time: both plans interleaved under netra.bench.timing (graph replay, rotated inputs), plus the routed layer alone.

    NETRA_TACTIC_MIN_MATURITY=experiment python3 scripts/gpu/moe_fold_ab.py
"""

from __future__ import annotations

import json
import os
import sys
from types import SimpleNamespace
from typing import Any

import torch

from netra.bench.kernels_moe import N_INPUTS, floor_bytes, inputs, moe_layer, routing, with_router_ties
from netra.bench.timing import Provider, capture, copy_bandwidth, interleave
from netra.catalog import Catalog
from netra.ops import moe_sm90
from netra.ops.moe import moe_routed
from netra.runtime import load_tactic


def main() -> int:
    cat = Catalog.load()
    dev = torch.cuda.current_device()
    old = SimpleNamespace(tactic=load_tactic(cat.by_name("moe_block_stream"), dev))
    new = SimpleNamespace(tactic=load_tactic(cat.by_name("moe_block_stream_fold"), dev))
    w = moe_layer()
    ties = with_router_ties(w)
    b = None
    fails: list[str] = []
    n = 0
    for m in (2, 3, 5, 8, 16, 33, 64, 127, 128):
        kinds = ("normal", "ties", "zero", "large", "tiny", "outlier") if m in (8, 128) else ("normal", "ties")
        for kind in kinds:
            layer = ties if kind == "ties" else w
            x = inputs(m, 100 * m + n, "normal" if kind == "ties" else kind)
            n += 1
            o_old = moe_sm90.launch_block(old, x=x, weights=layer)
            b = moe_sm90._bufs(x.device)
            ids_o, tw_o = b.topk_ids[:m].clone(), b.topk_w[:m].clone()
            b.topk_ids.fill_(-7)
            b.topk_w.fill_(float("nan"))
            o_new = moe_sm90.launch_block(new, x=x, weights=layer)
            ids_n, tw_n = b.topk_ids[:m].clone(), b.topk_w[:m].clone()
            again = moe_sm90.launch_block(new, x=x, weights=layer)
            g, rep = capture(lambda x=x, layer=layer: moe_sm90.launch_block(new, x=x, weights=layer))
            g.replay()
            torch.cuda.synchronize()
            ok = {"out": torch.equal(o_old, o_new), "ids": torch.equal(ids_o, ids_n),
                  "w": torch.equal(tw_o.view(torch.int32), tw_n.view(torch.int32)),
                  "run_to_run": torch.equal(o_new, again), "replay": torch.equal(o_new, rep),
                  "finite": bool(torch.isfinite(o_new.float()).all()) or kind in ("large",)}
            if not all(ok.values()):
                fails.append(f"{m} {kind} {ok}")
            del g
    print(f"bitwise fold vs two-launch: {n} cases, {len(fails)} failing", flush=True)
    for f in fails:
        print("  FAIL", f, flush=True)
    copy_bps = copy_bandwidth()
    res: dict[str, Any] = {"cases": n, "failing": fails, "copy_gbps": copy_bps / 1e9, "rows": []}
    for m in [int(t) for t in os.environ.get("AB_TOKENS", "2,8,32,64,128").split(",")]:
        xs = [inputs(m, 7 * i + m) for i in range(N_INPUTS)]
        routes = [routing(w, x) for x in xs]
        provs = [Provider("two_launch", lambda i, xs=xs: moe_sm90.launch_block(old, x=xs[i], weights=w), N_INPUTS, hold=xs),
                 Provider("fold", lambda i, xs=xs: moe_sm90.launch_block(new, x=xs[i], weights=w), N_INPUTS, hold=xs),
                 Provider("routed", lambda i, xs=xs, routes=routes: moe_routed(xs[i], w.w13.data, w.w13.scale_inv, w.w2.data,
                                                         w.w2.scale_inv, *routes[i]), N_INPUTS, hold=routes)]
        st = interleave(provs, samples=int(os.environ.get("AB_SAMPLES", "30")), deadline_s=20.0)
        fb = sum(floor_bytes(ids, m, True) for ids, _ in routes) / N_INPUTS
        floor_us = fb / copy_bps * 1e6
        row = {"tokens": m, "floor_us": floor_us, **{k: v["median_us"] for k, v in st.items()},
               "p90": {k: v["p90_us"] for k, v in st.items()}}
        res["rows"].append(row)
        print(f"{m:4d} tok: two_launch {row['two_launch']:8.2f}  fold {row['fold']:8.2f}  ratio "
              f"{row['fold'] / row['two_launch']:.3f}  routed {row['routed']:8.2f}  block floor {floor_us:7.2f}  "
              f"fold floor fraction {floor_us / row['fold']:.4f} (two-launch {floor_us / row['two_launch']:.4f})",
              flush=True)
    out = os.environ.get("OUT")
    if out:
        with open(os.path.join(out, "moe_fold_ab.json"), "w") as f:
            json.dump(res, f, indent=1)
    return 1 if fails else 0


if __name__ == "__main__":
    sys.exit(main())
