"""Graph-replay diagnosis of one argmax launch variant (one process each): a graph of 32 calls over
rotated inputs, replayed and synchronised 40 times, interleaved with a torch.argmax graph.
python3 scripts/gpu/argmax_graph_diag.py VARIANT   (contract | pdl | u16 | u16pdl | probe)"""
import sys

import torch

from netra import dispatch
from netra.dispatch import Dispatcher
from netra.ops import argmax as op

variant = sys.argv[1]
rows = int(sys.argv[2]) if len(sys.argv) > 2 else 1
dispatch.reset(Dispatcher(min_maturity="experiment", disabled=False))
xs = [torch.randn(rows, op.VOCAB, device="cuda") for _ in range(8)]
outs = [torch.full((rows,), -7, dtype=torch.int64, device="cuda") for _ in xs]
t = dispatch.select(op.signature(xs[0])).tactic
sym = {"u16": "netra_argmax_u16_sm90", "u16pdl": "netra_argmax_u16_sm90", "probe": "netra_argmax_probe_sm90"}.get(variant)
pdl = variant in ("pdl", "u16pdl")
if sym:
    op.chunked_variant(t, sym, pdl)


def call(x, o):
    if variant == "contract":
        op.launch(t, x, o)
    elif variant == "pdl":
        op.launch(t, x, o, pdl=True)
    else:
        op.launch(t, x, o, symbol=sym, pdl=pdl)


for x, o in zip(xs, outs, strict=True):
    call(x, o)
torch.cuda.synchronize()
print("eager ok", flush=True)
g = torch.cuda.CUDAGraph()
with torch.cuda.graph(g):
    for _ in range(4):
        for x, o in zip(xs, outs, strict=True):
            call(x, o)
t_outs = [torch.empty_like(o) for o in outs]
g2 = torch.cuda.CUDAGraph()
with torch.cuda.graph(g2):
    for x, o in zip(xs, t_outs, strict=True):
        torch.argmax(x, dim=-1, out=o)
for _ in range(40):
    g.replay()
    torch.cuda.synchronize()
    g2.replay()
    torch.cuda.synchronize()
ok = all(bool((o == -7).all()) for o in outs) if variant == "probe" else \
    all(torch.equal(o, r) for o, r in zip(outs, t_outs, strict=True))
print(variant, rows, "graph ok" if ok else "graph WRONG", flush=True)
