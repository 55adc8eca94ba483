"""Hugging Face-format checkpoints: ``config.json`` + ``*.safetensors``, text weights under
``model.language_model.layers.N.*`` (the ``Qwen3_5MoeForConditionalGeneration`` layout), FP8 E4M3
projections with ``weight_scale_inv`` 128x128 block scales.

`load_checkpoint` builds the engine's `ModelWeights` (experts stacked per layer, gate and up
concatenated); `save_checkpoint` writes the same layout (per-expert tensors), which is how the
tests make a small checkpoint and how seeded weights can be exported.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch

from netra.engine.config import ConfigError, ModelConfig
from netra.engine.weights import PREFIX, AttentionWeights, GDNWeights, LayerWeights, ModelWeights
from netra.ops import fp8
from netra.ops.linear import Weight
from netra.ops.moe import MoEWeights


class CheckpointError(ValueError):
    pass


IGNORED_SUFFIXES = (".k_scale", ".v_scale", ".input_scale")


# ---- save ------------------------------------------------------------------------------------------
def _put(out: dict[str, torch.Tensor], name: str, w: Weight) -> None:
    out[name + ".weight"] = w.data.contiguous()
    if w.scale_inv is not None:
        out[name + ".weight_scale_inv"] = w.scale_inv.contiguous()


def _rows(w: Weight, lo: int, hi: int, e: int | None = None) -> Weight:
    """Rows [lo, hi) of a projection (of expert e), with the matching block-scale rows."""
    data = w.data if e is None else w.data[e]
    scale = None
    if w.scale_inv is not None:
        s = w.scale_inv if e is None else w.scale_inv[e]
        scale = s[lo // w.block[0]:-(-hi // w.block[0])]
    return Weight(data[lo:hi], scale)


def _expert(w: Weight, e: int) -> Weight:
    return Weight(w.data[e], None if w.scale_inv is None else w.scale_inv[e])


def state_dict(cfg: ModelConfig, w: ModelWeights) -> dict[str, torch.Tensor]:
    out: dict[str, torch.Tensor] = {PREFIX + "embed_tokens.weight": w.embed, PREFIX + "norm.weight": w.norm}
    if not cfg.tie_word_embeddings:
        _put(out, "lm_head", w.lm_head)
    for i, layer in enumerate(w.layers):
        p = f"{PREFIX}layers.{i}."
        out[p + "input_layernorm.weight"] = layer.input_layernorm
        out[p + "post_attention_layernorm.weight"] = layer.post_attention_layernorm
        m = layer.mixer
        if isinstance(m, AttentionWeights):
            for n in ("q_proj", "k_proj", "v_proj", "o_proj"):
                _put(out, p + "self_attn." + n, getattr(m, n))
            out[p + "self_attn.q_norm.weight"] = m.q_norm
            out[p + "self_attn.k_norm.weight"] = m.k_norm
        else:
            for n in ("in_proj_qkv", "in_proj_z", "in_proj_b", "in_proj_a", "out_proj"):
                _put(out, p + "linear_attn." + n, getattr(m, n))
            out[p + "linear_attn.conv1d.weight"] = m.conv1d[:, None, :].contiguous()
            out[p + "linear_attn.dt_bias"] = m.dt_bias
            out[p + "linear_attn.A_log"] = m.a_log
            out[p + "linear_attn.norm.weight"] = m.norm
        e = layer.moe
        inter, sh = cfg.moe_intermediate_size, cfg.shared_expert_intermediate_size
        _put(out, p + "mlp.gate", e.router)
        _put(out, p + "mlp.shared_expert_gate", e.shared_gate)
        _put(out, p + "mlp.shared_expert.gate_proj", _rows(e.shared_w13, 0, sh))
        _put(out, p + "mlp.shared_expert.up_proj", _rows(e.shared_w13, sh, 2 * sh))
        _put(out, p + "mlp.shared_expert.down_proj", e.shared_w2)
        for x in range(cfg.num_experts):
            q = f"{p}mlp.experts.{x}."
            _put(out, q + "gate_proj", _rows(e.w13, 0, inter, x))
            _put(out, q + "up_proj", _rows(e.w13, inter, 2 * inter, x))
            _put(out, q + "down_proj", _expert(e.w2, x))
    return out


def unquantized_modules(sd: dict[str, torch.Tensor]) -> list[str]:
    """The modules of a state dict whose matrix is not FP8: a 2-D ``.weight`` without a
    ``.weight_scale_inv`` (embeddings, ``lm_head``, router, shared-expert gate, GDN ``b``/``a``);
    norms, convolutions and per-expert tensors of an FP8 checkpoint are not modules a quantizer replaces."""
    return [name[:-len(".weight")] for name, t in sd.items()
            if name.endswith(".weight") and t.dim() == 2 and t.dtype != fp8.E4M3
            and name + "_scale_inv" not in sd]


def save_checkpoint(cfg: ModelConfig, w: ModelWeights, path: Path, shard_bytes: int = 2 << 30) -> None:
    """Write ``config.json`` and ``model-0000N-of-0000M.safetensors`` shards plus the index (an FP8
    config lists the BF16 modules in ``quantization_config.modules_to_not_convert``)."""
    from safetensors.torch import save_file

    path.mkdir(parents=True, exist_ok=True)
    sd = state_dict(cfg, w)
    (path / "config.json").write_text(json.dumps(cfg.to_hf(unquantized_modules(sd)), indent=2) + "\n")
    tensors = {k: v.detach().to("cpu").contiguous() for k, v in sd.items()}
    shards: list[dict[str, torch.Tensor]] = [{}]
    size = 0
    for name, t in tensors.items():
        nbytes = t.numel() * t.element_size()
        if shards[-1] and size + nbytes > shard_bytes:
            shards.append({})
            size = 0
        shards[-1][name] = t
        size += nbytes
    index: dict[str, str] = {}
    for i, shard in enumerate(shards):
        fname = f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
        save_file(shard, str(path / fname), metadata={"format": "pt"})
        index.update({k: fname for k in shard})
    (path / "model.safetensors.index.json").write_text(json.dumps({"weight_map": index}, indent=1) + "\n")


# ---- load ------------------------------------------------------------------------------------------
class _Reader:
    def __init__(self, path: Path, device: torch.device) -> None:
        from safetensors import safe_open

        files = sorted(path.glob("*.safetensors"))
        if not files:
            raise CheckpointError(f"{path}: no *.safetensors files")
        self.device = device
        self._handles: list[Any] = [safe_open(str(f), framework="pt", device="cpu") for f in files]
        self._where: dict[str, Any] = {}
        for h in self._handles:
            for k in h.keys():  # noqa: SIM118 (safe_open handles are not dicts)
                self._where[k] = h
        self.used: set[str] = set()

    def has(self, name: str) -> bool:
        return name in self._where

    def get(self, name: str, shape: tuple[int, ...] | None = None) -> torch.Tensor:
        h = self._where.get(name)
        if h is None:
            raise CheckpointError(f"checkpoint misses tensor {name!r}")
        t = h.get_tensor(name)
        if shape is not None and tuple(t.shape) != shape:
            raise CheckpointError(f"tensor {name!r} has shape {tuple(t.shape)}, expected {shape}")
        self.used.add(name)
        return t.to(self.device)

    def weight(self, name: str, out_f: int, in_f: int) -> Weight:
        data = self.get(name + ".weight", (out_f, in_f))
        if data.dtype == fp8.E4M3:
            nb, kb = -(-out_f // fp8.BLOCK), -(-in_f // fp8.BLOCK)
            return Weight(data, self.get(name + ".weight_scale_inv", (nb, kb)).float())
        if data.dtype not in (torch.bfloat16, torch.float16, torch.float32):
            raise CheckpointError(f"tensor {name!r}: unsupported dtype {data.dtype}")
        return Weight(data.to(torch.bfloat16))

    def fused(self, name: str, shape: tuple[int, int, int]) -> Weight:
        """Experts stored as one 3-D tensor (transformers v5 layout: ``gate_up_proj [E, 2I, H]``, gate
        rows first; ``down_proj [E, H, I]``), with ``[E, rows/128, cols/128]`` scales when FP8."""
        data = self.get(name, shape)
        if data.dtype == fp8.E4M3:
            e, n, k = shape
            scale = name + "_scale_inv" if self.has(name + "_scale_inv") else name + ".weight_scale_inv"
            return Weight(data, self.get(scale, (e, -(-n // fp8.BLOCK), -(-k // fp8.BLOCK))).float())
        return Weight(data.to(torch.bfloat16))

    def stacked(self, names: list[list[str]], shapes: list[tuple[int, int]]) -> Weight:
        """Experts: for each expert, concatenate the row blocks of ``names[e]`` (e.g. gate, up), then stack."""
        per = [[self.weight(n, *s) for n, s in zip(row, shapes, strict=True)] for row in names]
        if per[0][0].is_fp8 != all(w.is_fp8 for row in per for w in row):
            raise CheckpointError(f"experts mix FP8 and BF16 weights near {names[0][0]!r}")
        data = torch.stack([torch.cat([w.data for w in row]) for row in per])
        if not per[0][0].is_fp8:
            return Weight(data)
        scale = torch.stack([torch.cat([w.scale_inv for w in row if w.scale_inv is not None]) for row in per])
        return Weight(data, scale)


def load_checkpoint(path: Path, device: torch.device | str = "cpu") -> tuple[ModelConfig, ModelWeights]:
    """Read a checkpoint directory; a missing tensor, a wrong shape or an unused tensor is an error."""
    try:
        cfg = ModelConfig.from_dir(path)
    except ConfigError as exc:
        raise CheckpointError(str(exc)) from exc
    r = _Reader(path, torch.device(device))
    h = cfg.hidden_size
    layers = []
    for i in range(cfg.num_hidden_layers):
        p = f"{PREFIX}layers.{i}."
        mixer: AttentionWeights | GDNWeights
        if cfg.is_full_attention(i):
            d, hq, hkv = cfg.head_dim, cfg.num_attention_heads, cfg.num_key_value_heads
            mixer = AttentionWeights(
                q_proj=r.weight(p + "self_attn.q_proj", hq * d * (2 if cfg.attn_output_gate else 1), h),
                k_proj=r.weight(p + "self_attn.k_proj", hkv * d, h),
                v_proj=r.weight(p + "self_attn.v_proj", hkv * d, h),
                o_proj=r.weight(p + "self_attn.o_proj", h, hq * d),
                q_norm=r.get(p + "self_attn.q_norm.weight", (d,)).to(torch.bfloat16),
                k_norm=r.get(p + "self_attn.k_norm.weight", (d,)).to(torch.bfloat16))
        else:
            hv, kk = cfg.linear_num_value_heads, cfg.linear_conv_kernel_dim
            mixer = GDNWeights(
                in_proj_qkv=r.weight(p + "linear_attn.in_proj_qkv", cfg.conv_dim, h),
                in_proj_z=r.weight(p + "linear_attn.in_proj_z", cfg.linear_value_dim, h),
                in_proj_b=r.weight(p + "linear_attn.in_proj_b", hv, h),
                in_proj_a=r.weight(p + "linear_attn.in_proj_a", hv, h),
                conv1d=r.get(p + "linear_attn.conv1d.weight", (cfg.conv_dim, 1, kk))[:, 0].to(torch.bfloat16),
                dt_bias=r.get(p + "linear_attn.dt_bias", (hv,)).to(torch.bfloat16),
                a_log=r.get(p + "linear_attn.A_log", (hv,)).float(),
                norm=r.get(p + "linear_attn.norm.weight", (cfg.linear_value_head_dim,)).to(torch.bfloat16),
                out_proj=r.weight(p + "linear_attn.out_proj", h, cfg.linear_value_dim))
        inter, sh = cfg.moe_intermediate_size, cfg.shared_expert_intermediate_size
        ex = [f"{p}mlp.experts.{e}." for e in range(cfg.num_experts)]
        shared_gate_up = [r.weight(p + "mlp.shared_expert.gate_proj", sh, h),
                          r.weight(p + "mlp.shared_expert.up_proj", sh, h)]
        shared_w13 = Weight(torch.cat([w.data for w in shared_gate_up]),
                            None if shared_gate_up[0].scale_inv is None else
                            torch.cat([w.scale_inv for w in shared_gate_up if w.scale_inv is not None]))
        moe = MoEWeights(
            router=r.weight(p + "mlp.gate", cfg.num_experts, h),
            w13=r.fused(p + "mlp.experts.gate_up_proj", (cfg.num_experts, 2 * inter, h))
            if r.has(p + "mlp.experts.gate_up_proj") else
            r.stacked([[x + "gate_proj", x + "up_proj"] for x in ex], [(inter, h), (inter, h)]),
            w2=r.fused(p + "mlp.experts.down_proj", (cfg.num_experts, h, inter))
            if r.has(p + "mlp.experts.down_proj") else r.stacked([[x + "down_proj"] for x in ex], [(h, inter)]),
            shared_w13=shared_w13,
            shared_w2=r.weight(p + "mlp.shared_expert.down_proj", h, sh),
            shared_gate=r.weight(p + "mlp.shared_expert_gate", 1, h),
            top_k=cfg.num_experts_per_tok, renormalize=cfg.norm_topk_prob)
        layers.append(LayerWeights(
            input_layernorm=r.get(p + "input_layernorm.weight", (h,)).to(torch.bfloat16),
            post_attention_layernorm=r.get(p + "post_attention_layernorm.weight", (h,)).to(torch.bfloat16),
            mixer=mixer, moe=moe))
    embed = r.get(PREFIX + "embed_tokens.weight", (cfg.vocab_size, h)).to(torch.bfloat16)
    tied = cfg.tie_word_embeddings or not r.has("lm_head.weight")
    lm_head = Weight(embed) if tied else r.weight("lm_head", cfg.vocab_size, h)
    weights = ModelWeights(embed=embed, layers=layers, norm=r.get(PREFIX + "norm.weight", (h,)).to(torch.bfloat16),
                           lm_head=lm_head)
    # Vision tower, MTP head and rotary buffers are not part of the text model; static activation /
    # KV scales are not used (dynamic activation quantization, KV scale 1.0), as SGLang skips them.
    unused = sorted(k for k in r._where if k not in r.used and not k.startswith(("model.visual.", "mtp.", "visual."))
                    and "rotary_emb" not in k and not k.endswith(IGNORED_SUFFIXES))
    if unused:
        raise CheckpointError(f"checkpoint has {len(unused)} tensors the model does not use, e.g. {unused[:3]}")
    return cfg, weights
