"""Eager exactness + error check of one argmax exploration variant (one process per variant, so an
illegal access in one cannot hide the others): python3 scripts/gpu/argmax_variants.py VARIANT."""
import sys

import torch

from netra import dispatch
from netra.dispatch import Dispatcher
from netra.ops import argmax as op

variant = sys.argv[1]
dispatch.reset(Dispatcher(min_maturity="experiment", disabled=False))
for dtype in (torch.float32, torch.bfloat16):
    for rows in (1, 2, 16, 128):
        x = torch.randn(rows, op.VOCAB, device="cuda").to(dtype)
        x[0, 7] = x[0, 62080] = 9.0
        ref = torch.argmax(x, dim=-1)
        out = torch.full((rows,), -7, dtype=torch.int64, device="cuda")
        t = dispatch.select(op.signature(x)).tactic
        if variant == "contract":
            op.argmax(x, out=out)
        elif variant == "pdl":
            op.launch(t, x, out, pdl=True)
        else:
            sym = {"u16": "netra_argmax_u16_sm90", "u16pdl": "netra_argmax_u16_sm90",
                   "probe": "netra_argmax_probe_sm90"}[variant]
            pdl = variant == "u16pdl"
            op.chunked_variant(t, sym, pdl)
            op.launch(t, x, out, symbol=sym, pdl=pdl)
        torch.cuda.synchronize()
        ok = bool((out == -7).all()) if variant == "probe" else torch.equal(out, ref)
        print(variant, dtype, rows, "ok" if ok else "WRONG", flush=True)
