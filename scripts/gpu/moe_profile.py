"""Runs the sm90 MoE sequence (align -> gate_up -> down) for a few batch sizes so that ncu can profile
each kernel (see scripts/gpu/moe_h200.sh --profile). No timing here: ncu reports the durations."""

from __future__ import annotations

import os
import sys

import torch

from netra.bench.kernels_moe import make_routing, make_weights
from netra.ops.moe_fp8 import MoeSm90

# MOE_VARIANT=v1 (default) | v3 | v3-unfused
_v = os.environ.get("MOE_VARIANT", "v1")
ours = MoeSm90(0) if _v == "v1" else MoeSm90(0, variant="v3", fuse_act=(_v == "v3"))
w = make_weights()
for m in [int(a) for a in sys.argv[1:]] or [1, 128]:
    x, ids, wts, _ = make_routing(m, seed=5)
    for _ in range(2):
        ours.align(x, ids, wts, None)
        ours.experts(x, w["w13"], w["s13"], w["w2"], w["s2"], False)
    torch.cuda.synchronize()
print("done")
