"""Op modules: one per op family, each with ``<op>_ref`` (the plain-PyTorch oracle), the dispatching
entry point, its fallback, and ``explain_signatures()`` for `netra explain`.

`OPS` is the list of the ops the engine calls (op name -> module). Tactics themselves are registered only by
their contract files (netra/catalog.py); this list exists so `netra explain` can show ops whose
every call is on the fallback (no contract at all) too. Adding an op family adds one line here.
"""

from __future__ import annotations

OPS: dict[str, str] = {
    "argmax": "netra.ops.argmax",
    "moe_fp8_block": "netra.ops.moe",
    "moe_fp8_routed": "netra.ops.moe",
    "moe_bf16": "netra.ops.moe",
    "linear_fp8_block": "netra.ops.linear",
    "linear_bf16": "netra.ops.linear",
    "linear_group": "netra.ops.linear",
    "rmsnorm_gemma": "netra.ops.norm",
    "add_rmsnorm_gemma": "netra.ops.norm",
    "gated_rmsnorm": "netra.ops.norm",
    "rope_neox_partial": "netra.ops.rope",
    "kv_store": "netra.ops.attention",
    "attention_prefill": "netra.ops.attention",
    "attention_decode": "netra.ops.attention",
    "attention_decode_gated": "netra.ops.attention",
    "qk_norm_rope_store": "netra.ops.attention",
    "attention_output_gate": "netra.ops.attention",
    "causal_conv1d_prefill": "netra.ops.conv",
    "causal_conv1d_update": "netra.ops.conv",
    "gdn_gating": "netra.ops.gdn",
    "gdn_prefill": "netra.ops.gdn",
    "gdn_decode": "netra.ops.gdn",
    "gdn_decode_fused": "netra.ops.gdn",
    "gdn_verify": "netra.ops.gdn",
    "gdn_commit": "netra.ops.gdn",
}
