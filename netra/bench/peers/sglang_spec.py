"""SGLang 0.5.23's GDN speculative-verify kernels and its accepted-state copy, loaded unchanged from the pinned
wheel's files (the peers of the gdn_replay spec, netra/bench/specs/gdn_replay.py).

What SGLang runs for a DFlash / EAGLE target verify of a hybrid GDN model on CUDA with its defaults
(``--linear-attn-backend triton``, no ReplaySSM flags): ``GDNAttnBackend.forward_extend`` in target-verify mode
(sglang/srt/layers/attention/linear/gdn_backend.py) calls, per GDN layer,

1. ``causal_conv1d_update`` (sglang/kernels/ops/mamba/causal_conv1d_triton.py; loaded by `sglang_gdn`) on the
   block ``[B, C, T]`` with ``intermediate_conv_window`` (the pool's deduplicated sliding-window view
   ``[layers, slots, T, C, K-1]``) and ``intermediate_state_indices``: the conv window is not written, every step's
   window is;
2. ``TritonGDNKernel.target_verify`` = ``fused_sigmoid_gating_delta_rule_update`` (sglang/kernels/ops/attention/
   linear/fused_sigmoid_gating_recurrent.py) with ``disable_state_update=True``, ``intermediate_states_buffer``
   ``[slots, T, Hv, V, K]`` and ``cache_steps = T``: gating + L2 norm + T delta-rule steps, writing every step's
   state.

After acceptance (``DFlashWorkerV2`` / ``spec_utils`` → ``HybridLinearAttnBackend.update_mamba_state_after_mtp_
verify``) it copies the accepted step's state and window of every layer: ``scatter_mamba_states_after_mtp_verify``
(sglang/kernels/ops/mamba/mamba_state_scatter_triton.py) = ``fused_mamba_state_scatter_with_mask`` (all layers'
SSM states, one launch) and ``fused_conv_window_scatter_multi`` (all layers' conv windows, one launch).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from netra.bench.peers.sglang_loader import Manifest

MODULES = {
    "sglang.kernels.ops.attention.linear.fused_sigmoid_gating_recurrent":
        "sglang/kernels/ops/attention/linear/fused_sigmoid_gating_recurrent.py",
    "sglang.kernels.ops.mamba.mamba_state_scatter_triton": "sglang/kernels/ops/mamba/mamba_state_scatter_triton.py",
    "sglang.kernels.ops.memory.ptr_table": "sglang/kernels/ops/memory/ptr_table.py",
}
FILES = list(MODULES.values())

MANIFEST = Manifest("spec", tuple(MODULES))


def load(root: Path) -> dict[str, Any]:
    """Import the peers from ``root`` (the folder holding ``sglang/``) through the shared loader:
    ``{"conv": causal_conv1d_update, "verify": fused_sigmoid_gating_delta_rule_update, "scatter_ssm":
    fused_mamba_state_scatter_with_mask, "scatter_conv": fused_conv_window_scatter_multi, "scatter_all":
    scatter_mamba_states_after_mtp_verify}``."""
    import importlib

    from netra.bench.peers.sglang_loader import install

    install(root)
    cc: Any = importlib.import_module("sglang.kernels.ops.mamba.causal_conv1d_triton")
    fs: Any = importlib.import_module("sglang.kernels.ops.attention.linear.fused_sigmoid_gating_recurrent")
    sc: Any = importlib.import_module("sglang.kernels.ops.mamba.mamba_state_scatter_triton")
    return {"conv": cc.causal_conv1d_update, "verify": fs.fused_sigmoid_gating_delta_rule_update,
            "scatter_ssm": sc.fused_mamba_state_scatter_with_mask, "scatter_conv": sc.fused_conv_window_scatter_multi,
            "scatter_all": sc.scatter_mamba_states_after_mtp_verify}
