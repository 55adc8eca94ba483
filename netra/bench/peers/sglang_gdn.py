"""SGLang 0.5.23's GDN decode and conv1d-update kernels, loaded unchanged from the pinned wheel's files.

SGLang's decode path for Qwen3-Next-class models on CUDA (``GDNAttnBackend.forward_decode``) runs
``causal_conv1d_update`` (sglang/kernels/ops/mamba/causal_conv1d_triton.py, with PDL on sm90) and
then ``TritonGDNKernel.packed_decode`` =
``fused_recurrent_gated_delta_rule_packed_decode`` (sglang/kernels/ops/attention/fla/
fused_recurrent.py): gating + L2 norm + delta rule + output in one Triton kernel reading q/k/v from
the packed conv output, state pool ``[slot, Hv, V, K]`` (K contiguous) updated in place. Those are
the peers, called as SGLang calls them.

The files are imported through the shared peer loader (`netra.bench.peers.sglang_loader`: every other
``sglang.*`` module is a stub); `MANIFEST` lists them, and ``make sglang-peer`` stages them with the MoE
peer's into the folder the H200 run carries (``.sglang_peer/``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from netra.bench.peers.sglang_loader import Manifest

MODULES = {
    "sglang.kernels.ops.attention.fla.utils": "sglang/kernels/ops/attention/fla/utils.py",
    "sglang.kernels.ops.attention.fla.op": "sglang/kernels/ops/attention/fla/op.py",
    "sglang.kernels.ops.attention.fla.fused_recurrent": "sglang/kernels/ops/attention/fla/fused_recurrent.py",
    "sglang.kernels.ops.mamba.causal_conv1d_triton": "sglang/kernels/ops/mamba/causal_conv1d_triton.py",
}
FILES = list(MODULES.values())


MANIFEST = Manifest("gdn", tuple(MODULES))


def load(root: Path) -> dict[str, Any]:
    """Import the two peer kernels from ``root`` (the folder holding ``sglang/``) through the shared SGLang
    peer loader (with the MoE peer's manifest: one carried folder): ``{"decode": packed decode, "conv":
    causal_conv1d_update}``."""
    import importlib

    from netra.bench.peers.sglang_loader import install

    install(root)
    fr: Any = importlib.import_module("sglang.kernels.ops.attention.fla.fused_recurrent")
    cc: Any = importlib.import_module("sglang.kernels.ops.mamba.causal_conv1d_triton")
    return {"decode": fr.fused_recurrent_gated_delta_rule_packed_decode, "conv": cc.causal_conv1d_update}


def stage(dest: Path) -> dict[str, Any]:
    """Stage every peer's files (this one's and the MoE peer's) into ``dest``: the shared loader's staging."""
    from netra.bench.peers.sglang_loader import stage as stage_all

    return stage_all(dest)


if __name__ == "__main__":
    from netra.bench.peers.sglang_loader import main

    raise SystemExit(main())
