"""The engine's model against Hugging Face transformers' own Qwen3.5-MoE implementation.

Skipped where `transformers` is not installed (it is not a Netra dependency; the GPU image has it).
The engine's BF16 variant of the tiny preset (BF16 weights and KV cache) is loaded into
``Qwen3_5MoeForCausalLM`` in float32 through the checkpoint names the loader reads, and both
models' logits over a prompt are compared: this pins the layer layout, the q/gate interleave, the
Gemma norms, partial RoPE, the GDN projections, convolution, gating and delta rule, and the MoE
routing and expert layout to the reference implementation.
"""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from netra.engine.cache import StatePools
from netra.engine.config import preset
from netra.engine.loader import state_dict
from netra.engine.model import Model, prefill_batch
from netra.engine.weights import PREFIX, seeded_weights

transformers = pytest.importorskip("transformers")


def _hf_state(cfg, weights) -> dict[str, torch.Tensor]:  # type: ignore[no-untyped-def]
    out: dict[str, torch.Tensor] = {}
    sd = state_dict(cfg, weights)
    experts: dict[tuple[int, str], dict[int, torch.Tensor]] = {}
    for name, t in sd.items():
        name = name.replace(PREFIX, "model.")
        if ".mlp.experts." in name:
            head, rest = name.split(".mlp.experts.")
            layer = int(head.split(".")[-1])
            e, proj, _ = rest.split(".", 2)
            experts.setdefault((layer, proj), {})[int(e)] = t
            continue
        out[name] = t.float()
    for layer in range(cfg.num_hidden_layers):
        p = f"model.layers.{layer}.mlp.experts."
        n = cfg.num_experts
        gate = [experts[(layer, "gate_proj")][e] for e in range(n)]
        up = [experts[(layer, "up_proj")][e] for e in range(n)]
        out[p + "gate_up_proj"] = torch.stack([torch.cat([g, u]) for g, u in zip(gate, up, strict=True)]).float()
        out[p + "down_proj"] = torch.stack([experts[(layer, "down_proj")][e] for e in range(n)]).float()
    return out


def test_logits_match_transformers_reference() -> None:
    from transformers.models.qwen3_5_moe.configuration_qwen3_5_moe import Qwen3_5MoeTextConfig
    from transformers.models.qwen3_5_moe.modeling_qwen3_5_moe import Qwen3_5MoeForCausalLM

    cfg = replace(preset("tiny"), fp8_weights=False)
    weights = seeded_weights(cfg, 0)
    hf_cfg = Qwen3_5MoeTextConfig(
        vocab_size=cfg.vocab_size, hidden_size=cfg.hidden_size, num_hidden_layers=cfg.num_hidden_layers,
        num_attention_heads=cfg.num_attention_heads, num_key_value_heads=cfg.num_key_value_heads,
        head_dim=cfg.head_dim, rms_norm_eps=cfg.rms_norm_eps, linear_conv_kernel_dim=cfg.linear_conv_kernel_dim,
        linear_key_head_dim=cfg.linear_key_head_dim, linear_value_head_dim=cfg.linear_value_head_dim,
        linear_num_key_heads=cfg.linear_num_key_heads, linear_num_value_heads=cfg.linear_num_value_heads,
        moe_intermediate_size=cfg.moe_intermediate_size,
        shared_expert_intermediate_size=cfg.shared_expert_intermediate_size,
        num_experts_per_tok=cfg.num_experts_per_tok, num_experts=cfg.num_experts,
        max_position_embeddings=4096, tie_word_embeddings=False,
        layer_types=["full_attention" if cfg.is_full_attention(i) else "linear_attention"
                     for i in range(cfg.num_hidden_layers)],
        rope_parameters={"rope_type": "default", "rope_theta": cfg.rope_theta,
                         "partial_rotary_factor": cfg.partial_rotary_factor})
    hf_cfg._attn_implementation = "eager"
    hf = Qwen3_5MoeForCausalLM(hf_cfg).float().eval()
    missing, unexpected = hf.load_state_dict(_hf_state(cfg, weights), strict=False)
    assert not unexpected, unexpected
    assert not [k for k in missing if "rotary" not in k], missing
    prompt = [(i * 37 + 11) % 256 for i in range(70)]
    with torch.no_grad():
        ref = hf(input_ids=torch.tensor([prompt]), use_cache=False).logits[0].double()
    dev = torch.device("cpu")
    ours = Model(cfg, weights, StatePools(cfg, 2, 256, dev, "bfloat16"), dev)
    fb = prefill_batch(dev, [(1, prompt, 0, True)])
    fb.logits_rows = torch.arange(len(prompt))  # every position's logits
    got = ours.forward(fb).double()
    per_pos = (got - ref).abs().max(-1).values
    agree = float((got.argmax(-1) == ref.argmax(-1)).double().mean())
    print(f"|logit difference| per position: median {float(per_pos.median()):.4f}, max {float(per_pos.max()):.4f} "
          f"(max |logit| {float(ref.abs().max()):.2f}); argmax agreement {agree:.3f}")
    # The engine keeps BF16 activations between ops (as deployed) and BF16 router logits; the
    # reference runs float32. So most positions differ by BF16 noise, and a position whose top-k
    # experts nearly tie may route differently (a large but local difference). A layout or formula
    # error would move every position by O(1).
    assert float(per_pos.median()) < 0.1
    assert float((per_pos < 0.25).double().mean()) >= 0.85
    assert agree >= 0.9
