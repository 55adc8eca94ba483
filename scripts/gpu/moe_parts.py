"""The MoE block's steps timed apart on the H200 (exploration, issue 18): the route step alone, the block's layer
step alone (9 routes from the tables the route step left), the whole block and the routed layer, interleaved under
netra.bench.timing's protocol (graph replay, rotated inputs), at 1, 8 and 128 tokens. Prints a table; no record.

    NETRA_TACTIC_MIN_MATURITY=experiment python3 scripts/gpu/moe_parts.py
"""

from __future__ import annotations

from typing import Any

import torch

from netra.bench.kernels_moe import N_INPUTS, inputs, moe_layer, routing
from netra.bench.timing import Provider, interleave
from netra.ops import moe_sm90
from netra.ops._common import route
from netra.ops.moe import _block_call, moe, moe_routed


def one(w: Any, m: int) -> None:
    xs = [inputs(m, 7 * i + m) for i in range(N_INPUTS)]
    routes = [routing(w, x) for x in xs]
    op, tensors, dims, quant = _block_call(xs[0], w)
    hit = route(op, tensors, dims, quant=quant, reduction_order="fixed")
    assert hit is not None, "no block tactic"
    moe(xs[0], w)
    steps = moe_sm90._steps(hit[1])
    b = moe_sm90._bufs(xs[0].device)
    out = torch.empty(m, 2048, dtype=torch.bfloat16, device="cuda")

    def stream() -> int:
        return int(torch.cuda.current_stream().cuda_stream)

    provs = [Provider("route", lambda i: moe_sm90.launch_route(steps, b, xs[i], w, stream()), N_INPUTS, hold=xs),
             Provider("block_layer", lambda i: moe_sm90.launch_block_layer(steps, b, xs[i], w, out, stream()),
                      N_INPUTS, hold=xs),
             Provider("block", lambda i: moe(xs[i], w), N_INPUTS, hold=xs),
             Provider("routed", lambda i: moe_routed(xs[i], w.w13.data, w.w13.scale_inv, w.w2.data,
                                                     w.w2.scale_inv, *routes[i]), N_INPUTS, hold=routes)]
    stats = interleave(provs, samples=20, deadline_s=15.0)
    print(f"{m:4d} tokens: " + "  ".join(f"{n} {s['median_us']:.2f}" for n, s in stats.items()), flush=True)


def main() -> None:
    w = moe_layer()
    for m in (1, 8, 128):
        one(w, m)


if __name__ == "__main__":
    main()
