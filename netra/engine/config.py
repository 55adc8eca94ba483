"""Model configuration from a Hugging Face ``config.json`` (``Qwen3_5MoeForConditionalGeneration`` /
``qwen3_5_moe_text`` keys) and the named presets.

Nothing here imports torch: the CLI reads presets at registration time.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import MISSING, asdict, dataclass, fields, replace
from pathlib import Path
from typing import Any


class ConfigError(ValueError):
    pass


@dataclass(frozen=True)
class ModelConfig:
    hidden_size: int
    num_hidden_layers: int
    full_attention_interval: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    attn_output_gate: bool
    partial_rotary_factor: float
    rope_theta: float
    linear_num_key_heads: int
    linear_num_value_heads: int
    linear_key_head_dim: int
    linear_value_head_dim: int
    linear_conv_kernel_dim: int
    num_experts: int
    num_experts_per_tok: int
    moe_intermediate_size: int
    shared_expert_intermediate_size: int
    norm_topk_prob: bool
    rms_norm_eps: float
    vocab_size: int
    eos_token_id: tuple[int, ...]
    # Checkpoint storage of the GDN state ("float32" in Qwen3.5/3.6 checkpoints).
    mamba_ssm_dtype: str = "float32"
    tie_word_embeddings: bool = False
    max_position_embeddings: int = 262144
    # FP8 E4M3 128x128 block-scaled projections (attention, GDN qkv/z/out, experts, shared expert).
    fp8_weights: bool = True

    def __post_init__(self) -> None:
        for f in fields(self):
            v = getattr(self, f.name)
            if f.type == "int" and (not isinstance(v, int) or isinstance(v, bool) or v <= 0):
                raise ConfigError(f"config {f.name}={v!r}: expected a positive integer")
        if self.num_attention_heads % self.num_key_value_heads:
            raise ConfigError("num_attention_heads must be a multiple of num_key_value_heads")
        if self.linear_num_value_heads % self.linear_num_key_heads:
            raise ConfigError("linear_num_value_heads must be a multiple of linear_num_key_heads")
        if self.num_experts_per_tok > self.num_experts:
            raise ConfigError("num_experts_per_tok exceeds num_experts")
        if self.rotary_dim % 2 or not 0 < self.rotary_dim <= self.head_dim:
            raise ConfigError(f"partial_rotary_factor {self.partial_rotary_factor} gives rotary dim "
                              f"{self.rotary_dim}; it must be even and within head_dim {self.head_dim}")
        if self.fp8_weights and (self.moe_intermediate_size % 128 or self.shared_expert_intermediate_size % 128):
            raise ConfigError("FP8 expert weights need moe_intermediate_size and shared_expert_intermediate_size "
                              "to be multiples of 128 (gate and up are whole 128-row scale blocks)")
        if self.mamba_ssm_dtype not in ("float32", "bfloat16"):
            raise ConfigError(f"mamba_ssm_dtype {self.mamba_ssm_dtype!r}: expected float32 or bfloat16")
        if not self.eos_token_id:
            raise ConfigError("eos_token_id is empty")

    def is_full_attention(self, layer: int) -> bool:
        return (layer + 1) % self.full_attention_interval == 0

    @property
    def rotary_dim(self) -> int:
        return int(self.head_dim * self.partial_rotary_factor)

    @property
    def attention_layers(self) -> list[int]:
        return [i for i in range(self.num_hidden_layers) if self.is_full_attention(i)]

    @property
    def gdn_layers(self) -> list[int]:
        return [i for i in range(self.num_hidden_layers) if not self.is_full_attention(i)]

    @property
    def linear_key_dim(self) -> int:
        return self.linear_num_key_heads * self.linear_key_head_dim

    @property
    def linear_value_dim(self) -> int:
        return self.linear_num_value_heads * self.linear_value_head_dim

    @property
    def conv_dim(self) -> int:
        return 2 * self.linear_key_dim + self.linear_value_dim

    def to_hf(self, modules_to_not_convert: Sequence[str] = ()) -> dict[str, Any]:
        """A ``config.json`` in the checkpoint's nested layout (text config under ``text_config``).

        ``modules_to_not_convert``: the modules an FP8 checkpoint keeps in BF16 (its
        ``quantization_config`` lists them so that loaders leave them unquantized)."""
        text = asdict(self)
        text.pop("fp8_weights")
        text["eos_token_id"] = list(self.eos_token_id) if len(self.eos_token_id) > 1 else self.eos_token_id[0]
        text["model_type"] = "qwen3_5_moe_text"
        text["layer_types"] = ["full_attention" if self.is_full_attention(i) else "linear_attention"
                               for i in range(self.num_hidden_layers)]
        text["hidden_act"] = "silu"
        out: dict[str, Any] = {"architectures": ["Qwen3_5MoeForConditionalGeneration"],
                               "model_type": "qwen3_5_moe", "text_config": text,
                               "tie_word_embeddings": self.tie_word_embeddings}
        if self.fp8_weights:
            out["quantization_config"] = {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic",
                                          "weight_block_size": [128, 128],
                                          "modules_to_not_convert": list(modules_to_not_convert)}
        return out

    @classmethod
    def from_hf(cls, raw: dict[str, Any]) -> ModelConfig:
        """Read a Hugging Face config (top-level or nested ``text_config``); unknown keys are ignored,
        a missing required key is an error that names it."""
        text = dict(raw.get("text_config") or raw)
        rope = text.get("rope_parameters") or text.get("rope_scaling") or {}
        for key in ("rope_theta", "partial_rotary_factor"):
            if key not in text and key in rope:
                text[key] = rope[key]
        text.setdefault("attn_output_gate", True)
        text.setdefault("norm_topk_prob", True)
        text.setdefault("partial_rotary_factor", 1.0)
        if "tie_word_embeddings" not in text and "tie_word_embeddings" in raw:
            text["tie_word_embeddings"] = raw["tie_word_embeddings"]
        eos = text.get("eos_token_id", raw.get("eos_token_id"))
        text["eos_token_id"] = tuple(eos) if isinstance(eos, list) else (eos,) if eos is not None else ()
        quant = raw.get("quantization_config") or text.get("quantization_config")
        text["fp8_weights"] = bool(quant and quant.get("quant_method") == "fp8")
        if quant and quant.get("weight_block_size") not in (None, [128, 128]):
            raise ConfigError(f"weight_block_size {quant.get('weight_block_size')}: only [128, 128] is supported")
        known = {f.name for f in fields(cls)}
        required = [f.name for f in fields(cls) if f.default is MISSING]
        missing = [k for k in required if k not in text]
        if missing:
            raise ConfigError(f"config.json misses required keys {missing}")
        return cls(**{k: v for k, v in text.items() if k in known})

    @classmethod
    def from_dir(cls, path: Path) -> ModelConfig:
        """A checkpoint directory's config. The stop ids are the union of ``config.json``'s
        ``eos_token_id`` and ``generation_config.json``'s (config's first, then the others, each once):
        Qwen3.5/3.6's text config names only ``<|endoftext|>``, while a chat turn ends with
        ``<|im_end|>``, which only the generation config names; SGLang and transformers stop on both."""
        cfg = path / "config.json"
        if not cfg.is_file():
            raise ConfigError(f"{path}: no config.json")
        try:
            out = cls.from_hf(json.loads(cfg.read_text()))
        except json.JSONDecodeError as exc:
            raise ConfigError(f"{cfg}: invalid JSON ({exc})") from exc
        gen = path / "generation_config.json"
        if not gen.is_file():
            return out
        try:
            eos = json.loads(gen.read_text()).get("eos_token_id")
        except (json.JSONDecodeError, AttributeError) as exc:
            raise ConfigError(f"{gen}: not a JSON object ({exc})") from exc
        extra = eos if isinstance(eos, list) else [] if eos is None else [eos]
        if any(not isinstance(t, int) or isinstance(t, bool) or t < 0 for t in extra):
            raise ConfigError(f"{gen}: eos_token_id {eos!r}: expected a token id or a list of them")
        return replace(out, eos_token_id=tuple(dict.fromkeys([*out.eos_token_id, *extra])))


# The byte tokenizer's layout (tiny): 256 byte tokens, then the specials (netra/tokenizers.py).
TINY_VOCAB = 264
TINY_EOS = 257

PRESETS: dict[str, ModelConfig] = {
    # Every component, small widths, the fewest layers that keep two GDN layers and an attention
    # layer (GDN, GDN, attention): decodes fast on 2 cores.
    "tiny": ModelConfig(
        hidden_size=128, num_hidden_layers=3, full_attention_interval=3,
        num_attention_heads=4, num_key_value_heads=2, head_dim=32, attn_output_gate=True,
        partial_rotary_factor=0.25, rope_theta=10_000_000.0,
        linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=32, linear_value_head_dim=32,
        linear_conv_kernel_dim=4, num_experts=8, num_experts_per_tok=2, moe_intermediate_size=128,
        shared_expert_intermediate_size=128, norm_topk_prob=True, rms_norm_eps=1e-6,
        vocab_size=TINY_VOCAB, eos_token_id=(TINY_EOS,), max_position_embeddings=65536,
    ),
    # Qwen3.6-35B-A3B(-FP8) text model.
    "qwen36-35b-a3b": ModelConfig(
        hidden_size=2048, num_hidden_layers=40, full_attention_interval=4,
        num_attention_heads=16, num_key_value_heads=2, head_dim=256, attn_output_gate=True,
        partial_rotary_factor=0.25, rope_theta=10_000_000.0,
        linear_num_key_heads=16, linear_num_value_heads=32, linear_key_head_dim=128, linear_value_head_dim=128,
        linear_conv_kernel_dim=4, num_experts=256, num_experts_per_tok=8, moe_intermediate_size=512,
        shared_expert_intermediate_size=512, norm_topk_prob=True, rms_norm_eps=1e-6,
        vocab_size=248320, eos_token_id=(248044,), max_position_embeddings=262144,
    ),
}


def preset(name: str) -> ModelConfig:
    try:
        return PRESETS[name]
    except KeyError as exc:
        raise ConfigError(f"unknown preset {name!r}; known: {sorted(PRESETS)}") from exc
