"""The engine's weights: structured containers, seeded initialisation, and the HF-name mapping.

Seeded weights: every tensor is drawn from its own generator seeded by ``sha256(seed/name)``, so
the same seed gives the same model (per device type) whatever the creation order. Projections the
FP8 checkpoints quantize are E4M3 with 128x128 block scales; router, shared-expert gate, the GDN
``b``/``a`` projections, norms, embeddings and ``lm_head`` stay BF16 (A_log FP32), as in the
checkpoints. Names follow the checkpoint: ``model.language_model.layers.N.*`` and ``lm_head.weight``.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

import torch

from netra.engine.config import ModelConfig
from netra.ops import fp8
from netra.ops.linear import Weight
from netra.ops.moe import MoEWeights

PREFIX = "model.language_model."
BF16 = torch.bfloat16


@dataclass
class AttentionWeights:
    q_proj: Weight  # [Hq * 2D, H]: per head, D query rows then D gate rows
    k_proj: Weight
    v_proj: Weight
    o_proj: Weight
    q_norm: torch.Tensor  # [D] Gemma offset
    k_norm: torch.Tensor


@dataclass
class GDNWeights:
    in_proj_qkv: Weight  # [2*Kd + Vd, H]: q, k, v
    in_proj_z: Weight  # [Vd, H]
    in_proj_b: Weight  # [Hv, H]
    in_proj_a: Weight  # [Hv, H]
    conv1d: torch.Tensor  # [conv_dim, K]
    dt_bias: torch.Tensor  # [Hv]
    a_log: torch.Tensor  # [Hv] FP32
    norm: torch.Tensor  # [Dv] plain weight
    out_proj: Weight  # [H, Vd]


@dataclass
class LayerWeights:
    input_layernorm: torch.Tensor
    post_attention_layernorm: torch.Tensor
    mixer: AttentionWeights | GDNWeights
    moe: MoEWeights


@dataclass
class ModelWeights:
    embed: torch.Tensor  # [V, H]
    layers: list[LayerWeights]
    norm: torch.Tensor
    lm_head: Weight  # [V, H] BF16

    def all_weights(self) -> list[Weight]:
        out = [self.lm_head]
        for layer in self.layers:
            m = layer.mixer
            if isinstance(m, AttentionWeights):
                out += [m.q_proj, m.k_proj, m.v_proj, m.o_proj]
            else:
                out += [m.in_proj_qkv, m.in_proj_z, m.in_proj_b, m.in_proj_a, m.out_proj]
            e = layer.moe
            out += [e.router, e.w13, e.w2, e.shared_w13, e.shared_w2, e.shared_gate]
        return out


def _seed_of(seed: int, name: str) -> int:
    return int.from_bytes(hashlib.sha256(f"{seed}/{name}".encode()).digest()[:8], "little") & ((1 << 63) - 1)


class _Init:
    def __init__(self, seed: int, device: torch.device, block_spread: float = 0.0) -> None:
        self.seed, self.device, self.block_spread = seed, device, block_spread

    def randn(self, name: str, shape: tuple[int, ...], std: float) -> torch.Tensor:
        g = torch.Generator(device=self.device)
        g.manual_seed(_seed_of(self.seed, name))
        return torch.randn(shape, generator=g, device=self.device, dtype=torch.float32) * std

    def uniform(self, name: str, shape: tuple[int, ...], lo: float, hi: float) -> torch.Tensor:
        g = torch.Generator(device=self.device)
        g.manual_seed(_seed_of(self.seed, name))
        return torch.rand(shape, generator=g, device=self.device, dtype=torch.float32) * (hi - lo) + lo

    def proj(self, name: str, out_f: int, in_f: int, quantize: bool, lead: tuple[int, ...] = (),
             std: float | None = None) -> Weight:
        w = self.randn(name, (*lead, out_f, in_f), std if std is not None else in_f ** -0.5)
        if quantize:
            if self.block_spread:
                # each 128x128 block at its own magnitude, so the block scales differ as a real
                # checkpoint's do and a misplaced scale changes the model
                nb, kb = -(-out_f // fp8.BLOCK), -(-in_f // fp8.BLOCK)
                f = self.uniform(name + "/blocks", (*lead, nb, kb), -self.block_spread, self.block_spread).exp()
                w = w * fp8.expand_block_scale(f, out_f, in_f)
            q, s = fp8.block_quantize_weight(w)
            return Weight(q, s)
        return Weight(w.to(BF16))


def seeded_weights(cfg: ModelConfig, seed: int, device: torch.device | str = "cpu",
                   block_spread: float = 0.0) -> ModelWeights:
    """Random weights at the config's shapes; deterministic in (seed, tensor name, device type).

    ``block_spread`` > 0 scales each 128x128 block of an FP8 projection by ``exp(U(-spread, spread))``
    before quantization (0: every block drawn alike, so their scales nearly agree)."""
    dev = torch.device(device)
    init = _Init(seed, dev, block_spread)
    q8 = cfg.fp8_weights
    h = cfg.hidden_size
    layers = []
    for i in range(cfg.num_hidden_layers):
        p = f"{PREFIX}layers.{i}."
        mixer: AttentionWeights | GDNWeights
        if cfg.is_full_attention(i):
            d, hq, hkv = cfg.head_dim, cfg.num_attention_heads, cfg.num_key_value_heads
            mixer = AttentionWeights(
                q_proj=init.proj(p + "self_attn.q_proj.weight", hq * d * (2 if cfg.attn_output_gate else 1), h, q8),
                k_proj=init.proj(p + "self_attn.k_proj.weight", hkv * d, h, q8),
                v_proj=init.proj(p + "self_attn.v_proj.weight", hkv * d, h, q8),
                o_proj=init.proj(p + "self_attn.o_proj.weight", h, hq * d, q8),
                q_norm=init.randn(p + "self_attn.q_norm.weight", (d,), 0.1).to(BF16),
                k_norm=init.randn(p + "self_attn.k_norm.weight", (d,), 0.1).to(BF16),
            )
        else:
            hv = cfg.linear_num_value_heads
            mixer = GDNWeights(
                in_proj_qkv=init.proj(p + "linear_attn.in_proj_qkv.weight", cfg.conv_dim, h, q8),
                in_proj_z=init.proj(p + "linear_attn.in_proj_z.weight", cfg.linear_value_dim, h, q8),
                in_proj_b=init.proj(p + "linear_attn.in_proj_b.weight", hv, h, False),
                in_proj_a=init.proj(p + "linear_attn.in_proj_a.weight", hv, h, False),
                conv1d=init.randn(p + "linear_attn.conv1d.weight", (cfg.conv_dim, cfg.linear_conv_kernel_dim),
                                  cfg.linear_conv_kernel_dim ** -0.5).to(BF16),
                dt_bias=init.randn(p + "linear_attn.dt_bias", (hv,), 0.5).to(BF16),
                a_log=torch.log(init.uniform(p + "linear_attn.A_log", (hv,), 1.0, 16.0)),
                norm=(1.0 + init.randn(p + "linear_attn.norm.weight", (cfg.linear_value_head_dim,), 0.1)).to(BF16),
                out_proj=init.proj(p + "linear_attn.out_proj.weight", h, cfg.linear_value_dim, q8),
            )
        layers.append(LayerWeights(
            input_layernorm=init.randn(p + "input_layernorm.weight", (h,), 0.1).to(BF16),
            post_attention_layernorm=init.randn(p + "post_attention_layernorm.weight", (h,), 0.1).to(BF16),
            mixer=mixer, moe=_seeded_moe(init, cfg, p)))
    embed = init.randn(PREFIX + "embed_tokens.weight", (cfg.vocab_size, h), 1.0).to(BF16)
    lm_head = Weight(embed) if cfg.tie_word_embeddings else init.proj("lm_head.weight", cfg.vocab_size, h, False,
                                                                      std=2.0 * h ** -0.5)
    return ModelWeights(embed=embed, layers=layers,
                        norm=init.randn(PREFIX + "norm.weight", (h,), 0.1).to(BF16), lm_head=lm_head)


def _seeded_moe(init: _Init, cfg: ModelConfig, p: str) -> MoEWeights:
    e, h, inter, sh = cfg.num_experts, cfg.hidden_size, cfg.moe_intermediate_size, cfg.shared_expert_intermediate_size
    q8 = cfg.fp8_weights
    return MoEWeights(
        router=init.proj(p + "mlp.gate.weight", e, h, False),
        w13=init.proj(p + "mlp.experts.w13", 2 * inter, h, q8, lead=(e,)),
        w2=init.proj(p + "mlp.experts.w2", h, inter, q8, lead=(e,)),
        shared_w13=init.proj(p + "mlp.shared_expert.w13", 2 * sh, h, q8),
        shared_w2=init.proj(p + "mlp.shared_expert.down_proj.weight", h, sh, q8),
        shared_gate=init.proj(p + "mlp.shared_expert_gate.weight", 1, h, False),
        top_k=cfg.num_experts_per_tok, renormalize=cfg.norm_topk_prob,
    )


def seeded_moe(cfg: ModelConfig, seed: int, device: torch.device | str, layer: int = 0) -> MoEWeights:
    """Layer ``layer``'s MoE block exactly as `seeded_weights` makes it (the kernel benchmarks' weights)."""
    return _seeded_moe(_Init(seed, torch.device(device)), cfg, f"{PREFIX}layers.{layer}.")


def weights_to(w: ModelWeights, device: torch.device | str) -> ModelWeights:
    """A copy of ``w`` on ``device`` (seeded weights differ between CPU and CUDA generators; this
    puts one device's model on another)."""
    import copy

    def move(obj: object) -> object:
        if isinstance(obj, torch.Tensor):
            return obj.to(device)
        if isinstance(obj, Weight):
            return Weight(obj.data.to(device), None if obj.scale_inv is None else obj.scale_inv.to(device), obj.block)
        if isinstance(obj, list):
            return [move(x) for x in obj]
        if hasattr(obj, "__dataclass_fields__"):
            new = copy.copy(obj)
            for name in obj.__dataclass_fields__:
                setattr(new, name, move(getattr(obj, name)))
            return new
        return obj

    out = move(w)
    assert isinstance(out, ModelWeights)
    return out
