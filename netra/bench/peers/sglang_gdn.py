"""SGLang 0.5.23's GDN decode and conv1d-update kernels, loaded unchanged from the pinned wheel's files.

SGLang's decode path for Qwen3-Next-class models on CUDA (``GDNAttnBackend.forward_decode``) runs
``causal_conv1d_update`` (sglang/kernels/ops/mamba/causal_conv1d_triton.py, with PDL on sm90) and
then ``TritonGDNKernel.packed_decode`` =
``fused_recurrent_gated_delta_rule_packed_decode`` (sglang/kernels/ops/attention/fla/
fused_recurrent.py): gating + L2 norm + delta rule + output in one Triton kernel reading q/k/v from
the packed conv output, state pool ``[slot, Hv, V, K]`` (K contiguous) updated in place. Those are
the peers, called as SGLang calls them.

The files are imported through `netra.bench.peers.sglang_moe`'s stub finder (every other
``sglang.*`` module is a stub); this module adds its files and the few values SGLang reads at import.
``stage`` copies them (with the MoE peer's) into the folder the H200 run carries (``.sglang_peer/``).
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

MODULES = {
    "sglang.kernels.ops.attention.fla.utils": "sglang/kernels/ops/attention/fla/utils.py",
    "sglang.kernels.ops.attention.fla.op": "sglang/kernels/ops/attention/fla/op.py",
    "sglang.kernels.ops.attention.fla.fused_recurrent": "sglang/kernels/ops/attention/fla/fused_recurrent.py",
    "sglang.kernels.ops.mamba.causal_conv1d_triton": "sglang/kernels/ops/mamba/causal_conv1d_triton.py",
}
FILES = list(MODULES.values())


def _torch_release() -> tuple[int, ...]:
    import torch

    return tuple(int(p) for p in torch.__version__.split("+")[0].split(".")[:3] if p.isdigit())


def load(root: Path) -> dict[str, Any]:
    """Import the two peer kernels from ``root`` (the folder holding ``sglang/``): ``{"decode": packed
    decode, "conv": causal_conv1d_update}``."""
    from netra.bench.peers import sglang_moe

    missing = [f for f in FILES if not (root / f).is_file()]
    if missing:
        raise FileNotFoundError(f"SGLang GDN peer files missing under {root}: {missing}")
    sglang_moe.REAL_MODULES.update(MODULES)
    sglang_moe._EXPLICIT.setdefault("sglang.srt.utils.common", {})["torch_release"] = _torch_release()
    if not any(isinstance(f, sglang_moe._Finder) for f in sys.meta_path):
        if any(m == "sglang" or m.startswith("sglang.") for m in sys.modules):
            raise RuntimeError("a real or stubbed sglang is already imported in this process; load the peer first")
        sys.meta_path.insert(0, sglang_moe._Finder(root))
    import importlib

    fr: Any = importlib.import_module("sglang.kernels.ops.attention.fla.fused_recurrent")
    cc: Any = importlib.import_module("sglang.kernels.ops.mamba.causal_conv1d_triton")
    return {"decode": fr.fused_recurrent_gated_delta_rule_packed_decode, "conv": cc.causal_conv1d_update}


def stage(dest: Path) -> list[Path]:
    """Copy the peer's files (and the MoE peer's, one carried folder) out of the installed ``sglang``
    distribution into ``dest``, through the MoE peer's staging."""
    from netra.bench.peers import sglang_moe

    sglang_moe.PEER_FILES.extend(f for f in FILES if f not in sglang_moe.PEER_FILES)
    return sglang_moe.stage(dest)


if __name__ == "__main__":
    import argparse

    ap = argparse.ArgumentParser(description="stage SGLang's GDN decode / conv1d-update files for the H200 peer run")
    ap.add_argument("dest", type=Path, nargs="?", default=Path(".sglang_peer"))
    for p in stage(ap.parse_args().dest):
        print(p)
