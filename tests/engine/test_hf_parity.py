"""The engine's model against Hugging Face transformers' own Qwen3.5-MoE implementation.

transformers is a dev dependency: imported plainly, so a missing one fails instead of skipping.

1. BF16: the engine's BF16 variant of the tiny preset (BF16 weights and KV cache) is loaded into
   ``Qwen3_5MoeForCausalLM`` in float32 through the checkpoint names the loader reads, and both
   models' logits over a prompt are compared: this pins the layer layout, the q/gate interleave, the
   Gemma norms, partial RoPE, the GDN projections, convolution, gating and delta rule, and the MoE
   routing and expert layout to the reference implementation.
2. FP8, real vocabulary: the synthesized checkpoint (``qwen36_checkpoint``: Qwen3.6-FP8 layout, 248,320
   rows, block scales that differ from block to block) is read from its safetensors files, not through
   the engine's loader, its E4M3 weights dequantized (weight x its 128x128 block's ``weight_scale_inv``)
   into transformers' model in float32, and compared with the engine built from the same directory, as
   deployed (FP8 weights, FP8 KV cache), over a chat-template prompt encoded with the real tokenizer.
   This adds the FP8 checkpoint's names, the per-expert tensors, the block-scale layout and the
   embedding / ``lm_head`` rows of the real vocabulary. A block scale applied to the wrong block moves
   these logits by less than the FP8 activation noise (the blocks of one projection feed the same
   norms and sums), so every FP8 projection the engine loaded is also checked on its own, exactly:
   the engine's FP8 linear applied to one-hot rows gives the weight the reference dequantized.
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch
import transformers  # noqa: F401  (a dev dependency: its absence is a failure, not a skip)
from safetensors import safe_open
from transformers.models.qwen3_5_moe.configuration_qwen3_5_moe import Qwen3_5MoeTextConfig
from transformers.models.qwen3_5_moe.modeling_qwen3_5_moe import Qwen3_5MoeForCausalLM

from netra.engine.cache import StatePools
from netra.engine.config import ModelConfig, preset
from netra.engine.loader import load_checkpoint, state_dict
from netra.engine.model import Model, prefill_batch
from netra.engine.weights import PREFIX, AttentionWeights, ModelWeights, seeded_weights
from netra.ops.linear import Weight, linear
from netra.tokenizers import HFTokenizer

BLOCK = 128


def _dequantize(q: torch.Tensor, scale_inv: torch.Tensor) -> torch.Tensor:
    """E4M3 ``q [..., n, k]`` times its 128x128 block's scale -> float32."""
    n, k = q.shape[-2:]
    s = scale_inv.float().repeat_interleave(BLOCK, dim=-2).repeat_interleave(BLOCK, dim=-1)[..., :n, :k]
    return q.float() * s


def _hf_state(cfg: ModelConfig, sd: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """A checkpoint's state dict (engine names) in transformers' ``Qwen3_5MoeForCausalLM`` names, float32:
    ``model.language_model.`` -> ``model.``, FP8 weights dequantized, per-expert tensors fused into
    ``gate_up_proj [E, 2I, H]`` (gate rows first) and ``down_proj [E, H, I]``."""
    out: dict[str, torch.Tensor] = {}
    experts: dict[tuple[int, str], dict[int, torch.Tensor]] = {}
    for name, t in sd.items():
        if name.endswith("_scale_inv"):
            continue
        scale = sd.get(name + "_scale_inv")
        t = _dequantize(t, scale) if scale is not None else t.float()
        name = name.replace(PREFIX, "model.")
        if ".mlp.experts." in name:
            head, rest = name.split(".mlp.experts.")
            layer = int(head.split(".")[-1])
            e, proj, _ = rest.split(".", 2)
            experts.setdefault((layer, proj), {})[int(e)] = t
            continue
        out[name] = t
    for layer in range(cfg.num_hidden_layers):
        p = f"model.layers.{layer}.mlp.experts."
        n = cfg.num_experts
        gate = [experts[(layer, "gate_proj")][e] for e in range(n)]
        up = [experts[(layer, "up_proj")][e] for e in range(n)]
        out[p + "gate_up_proj"] = torch.stack([torch.cat([g, u]) for g, u in zip(gate, up, strict=True)])
        out[p + "down_proj"] = torch.stack([experts[(layer, "down_proj")][e] for e in range(n)])
    return out


def _reference(cfg: ModelConfig, sd: dict[str, torch.Tensor]) -> Qwen3_5MoeForCausalLM:
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
    missing, unexpected = hf.load_state_dict(_hf_state(cfg, sd), strict=False)
    assert not unexpected, unexpected
    assert not [k for k in missing if "rotary" not in k], missing
    return hf


def _logits(hf: Qwen3_5MoeForCausalLM, prompt: list[int]) -> torch.Tensor:
    with torch.no_grad():
        return hf(input_ids=torch.tensor([prompt]), use_cache=False).logits[0].double()


def _engine_logits(ours: Model, prompt: list[int]) -> torch.Tensor:
    fb = prefill_batch(torch.device("cpu"), [(1, prompt, 0, True)])
    fb.logits_rows = torch.arange(len(prompt))  # every position's logits
    return ours.forward(fb).double()


def _both(cfg: ModelConfig, sd: dict[str, torch.Tensor], ours: Model, prompt: list[int]
          ) -> tuple[torch.Tensor, torch.Tensor]:
    """(engine, reference) logits of every prompt position, float64 ``[T, V]``."""
    return _engine_logits(ours, prompt), _logits(_reference(cfg, sd), prompt)


def test_logits_match_transformers_reference() -> None:
    cfg = replace(preset("tiny"), fp8_weights=False)
    weights = seeded_weights(cfg, 0)
    prompt = [(i * 37 + 11) % 256 for i in range(70)]
    dev = torch.device("cpu")
    got, ref = _both(cfg, state_dict(cfg, weights), Model(cfg, weights, StatePools(cfg, 2, 256, dev, "bfloat16"), dev),
                     prompt)
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


def _read_checkpoint(path: Path) -> dict[str, torch.Tensor]:
    out: dict[str, torch.Tensor] = {}
    for f in sorted(path.glob("*.safetensors")):
        with safe_open(str(f), framework="pt") as h:
            for name in h.keys():  # noqa: SIM118 (safe_open handles are not dicts)
                out[name] = h.get_tensor(name)
    return out


def _chat_prompt(path: Path, tok: HFTokenizer) -> list[int]:
    import jinja2

    env = jinja2.Environment(trim_blocks=True, lstrip_blocks=True)
    env.filters["tojson"] = lambda v, **kw: json.dumps(v, ensure_ascii=False)

    def raise_exception(msg: str) -> Any:
        raise jinja2.TemplateError(msg)

    env.globals["raise_exception"] = raise_exception
    text = env.from_string((path / "chat_template.jinja").read_text()).render(
        messages=[{"role": "system", "content": "You are a concise assistant."},
                  {"role": "user", "content": "Qu'est-ce que 2 + 2 ? 答えは何ですか。Answer in one word, please."}],
        add_generation_prompt=True)
    return tok.encode(text)


def _compare(got: torch.Tensor, ref: torch.Tensor, what: str) -> tuple[torch.Tensor, float]:
    """Per position: median |logit difference| over the vocabulary / std of the reference logits; and
    the argmax agreement. Prints the figures."""
    diff = (got - ref).abs()
    rel = diff.median(-1).values / ref.std(-1)
    per_pos = diff.max(-1).values
    agree = float((got.argmax(-1) == ref.argmax(-1)).double().mean())
    print(f"{what}: {len(got)} positions; |logit difference| median {float(diff.median()):.4f}, per-position max: "
          f"median {float(per_pos.median()):.4f}, max {float(per_pos.max()):.4f} (logit std {float(ref.std()):.3f}, "
          f"max |logit| {float(ref.abs().max()):.2f}); rel median {float(rel.median()):.4f}, max "
          f"{float(rel.max()):.4f}; argmax agreement {agree:.3f}")
    return rel, agree


def _engine_projections(cfg: ModelConfig, weights: ModelWeights, hf: Qwen3_5MoeForCausalLM
                        ) -> list[tuple[str, Weight, torch.Tensor]]:
    """(name, the engine's FP8 weight, the reference's float32 weight) for every FP8 projection, experts one by one."""
    out: list[tuple[str, Weight, torch.Tensor]] = []
    for i, layer in enumerate(weights.layers):
        ref = hf.model.layers[i]
        m = layer.mixer
        names = ("q_proj", "k_proj", "v_proj", "o_proj") if isinstance(m, AttentionWeights) else \
            ("in_proj_qkv", "in_proj_z", "out_proj")
        mixer = ref.self_attn if isinstance(m, AttentionWeights) else ref.linear_attn
        out += [(f"layers.{i}.{n}", getattr(m, n), getattr(mixer, n).weight) for n in names]
        moe, mlp = layer.moe, ref.mlp
        out.append((f"layers.{i}.shared_expert.gate_up", moe.shared_w13,
                    torch.cat([mlp.shared_expert.gate_proj.weight, mlp.shared_expert.up_proj.weight])))
        out.append((f"layers.{i}.shared_expert.down", moe.shared_w2, mlp.shared_expert.down_proj.weight))
        for e in range(cfg.num_experts):
            for n, w, r in (("gate_up", moe.w13, mlp.experts.gate_up_proj), ("down", moe.w2, mlp.experts.down_proj)):
                assert w.scale_inv is not None
                out.append((f"layers.{i}.experts.{e}.{n}", Weight(w.data[e], w.scale_inv[e]), r[e]))
    return out


def test_fp8_checkpoint_with_the_real_vocabulary_matches_transformers(qwen36_checkpoint: Path) -> None:
    """Tolerances, set before measuring, and why.

    Both models hold the same weights exactly (the reference gets the dequantized E4M3 values). What
    differs is the engine's arithmetic as deployed: every FP8 projection quantizes its input
    activations to E4M3 per 128-element group, dynamically (3 mantissa bits: a few percent relative
    error per projection), the KV cache is E4M3, and activations are BF16 between ops; the reference is
    float32 throughout. Expected: logits within several percent of the logit scale, and some positions
    further off where a token's top-k experts nearly tie and the noise routes it differently. Over
    248,320 logits the top two are close, so argmax agreement is well below the BF16 test's.

    With ``rel`` = a position's median |logit difference| over the vocabulary / the std of its
    reference logits:

    * median ``rel`` over positions <= 0.15, and at least 2/3 of positions with ``rel`` <= 0.3;
    * argmax agreement >= 0.5.

    A layout error (gate and up swapped, a wrong row order of the embedding or lm_head, a misnamed
    tensor) gives logits unrelated to the reference's: ``rel`` near 1 at every position it touches and
    an argmax agreement near 0 (1 in 248,320 by chance). A block scale applied to the wrong block
    (their magnitudes differ by up to 4x here) moves ``rel`` by a few hundredths only, within the
    FP8 noise: the per-projection check below is what holds the scale layout, to BF16 rounding
    (relative 2^-8), where such an error is off by a factor of up to 4.
    """
    cfg, weights = load_checkpoint(qwen36_checkpoint)
    assert cfg.vocab_size == 248320 and cfg.fp8_weights
    tok = HFTokenizer(qwen36_checkpoint / "tokenizer.json")
    prompt = _chat_prompt(qwen36_checkpoint, tok)
    assert prompt[0] == 248045 and prompt[-2:] == tok.encode("<think>\n") and len(prompt) >= 40
    dev = torch.device("cpu")
    got = _engine_logits(Model(cfg, weights, StatePools(cfg, 2, 256, dev, "fp8_e4m3"), dev), prompt)
    sd = _read_checkpoint(qwen36_checkpoint)
    hf = _reference(cfg, sd)
    rel, agree = _compare(got, _logits(hf, prompt), "engine (FP8) vs float32 reference")
    assert float(rel.median()) <= 0.15
    assert float((rel <= 0.3).double().mean()) >= 2 / 3
    assert agree >= 0.5
    # Each FP8 projection on its own: one-hot rows quantize exactly (E4M3 holds 448), so the engine's
    # linear returns its weight's columns, rounded to BF16 only.
    projections = _engine_projections(cfg, weights, hf)
    assert len(projections) == 4 + 2 * 3 + 3 * (2 + 2 * cfg.num_experts)
    for name, w, ref_w in projections:
        assert w.is_fp8, name
        want = ref_w.detach()
        cols = linear(torch.eye(w.in_features, dtype=torch.bfloat16), w).float().t()
        assert torch.allclose(cols, want, rtol=2 ** -8, atol=1e-6 * float(want.abs().max())), name


def test_captured_layer_outputs_are_hf_hidden_states_shifted_by_one() -> None:
    """`Model.run(capture=...)` gives the output of decoder layer i, Hugging Face's ``hidden_states[i + 1]`` (the
    drafter's convention): layer i's capture is nearest to hidden_states[i + 1] of every index, within BF16 noise
    (HF's last entry is final-normed, so the last layer is checked otherwise: its capture through the final norm
    and lm_head is the forward's logits, bitwise)."""
    from netra.ops import norm

    cfg = replace(preset("tiny"), fp8_weights=False)
    weights = seeded_weights(cfg, 0)
    prompt = [(i * 37 + 11) % 256 for i in range(40)]
    dev = torch.device("cpu")
    ours = Model(cfg, weights, StatePools(cfg, 2, 256, dev, "bfloat16"), dev)
    layers = tuple(range(cfg.num_hidden_layers))
    fb = prefill_batch(dev, [(1, prompt, 0, True)])
    fb.logits_rows = torch.arange(len(prompt))
    out = ours.run(fb, capture=layers)
    assert out.features is not None
    feats = out.features.double().view(len(prompt), len(layers), cfg.hidden_size)
    with torch.no_grad():
        hs = _reference(cfg, state_dict(cfg, weights))(input_ids=torch.tensor([prompt]), use_cache=False,
                                                       output_hidden_states=True).hidden_states
    for i in layers[:-1]:  # HF's last hidden state is the final-normed one, not the last layer's output
        dist = [float((feats[:, i] - h[0].double()).norm() / h[0].double().norm()) for h in hs[:-1]]
        assert min(range(len(dist)), key=dist.__getitem__) == i + 1, (i, dist)
        assert dist[i + 1] < 0.05, (i, dist)
    last, _ = norm.add_rmsnorm(out.features[:, -cfg.hidden_size:], torch.zeros_like(out.features[:, :cfg.hidden_size]),
                               weights.norm, cfg.rms_norm_eps)
    assert torch.equal(linear(last, weights.lm_head, torch.float32), out.logits)
