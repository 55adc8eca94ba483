"""The DFlash drafter (z-lab's ``DFlashDraftModel``, PyPI ``dflash`` 0.1.0) in plain PyTorch.

A small Qwen3-style transformer without an embedding or output head of its own: it drafts the block
``[pending, mask × (T−1)]`` in one non-causal forward and reads the draft tokens d1..d(T−1) at block
positions 1..T−1 through the *target's* ``lm_head``. What it knows about the sequence comes from the
target: for every committed token, the outputs of the target decoder layers ``target_layer_ids`` are
concatenated, projected by ``fc`` (``len(ids)·H → H``) and normalised by ``hidden_norm``; each draft
layer turns that row into one more context K/V (``k_proj`` → ``k_norm`` → RoPE at the token's
position, and ``v_proj``), which the block's queries attend to ahead of the block's own K/V. The
context row is *not* passed through the layer's ``input_layernorm``; the block's rows are.

What the reference does, and this module does too (``dflash/model.py``):

* block input = the target's embedding rows of the block tokens (× ``input_embedding_scale``, 1 by
  default), the mask token ``dflash_config.mask_token_id`` at positions 1..T−1;
* output = the drafter's own final ``norm`` (not the target's), then the target's ``lm_head``
  (× ``output_multiplier``, then ``final_logit_softcapping`` when set), greedy argmax;
* RMSNorm is Qwen3's (``x / rms(x)`` in float32, rounded to the activation dtype, times the plain
  weight), unlike the target's Gemma ``1 + w`` norms; q_norm / k_norm per head before RoPE;
* RoPE over the whole head (rotate-half), ``default`` or ``yarn`` (inverse frequencies blended by
  the YaRN ramp, cos/sin scaled by the attention factor ``0.1·ln(factor) + 1``: 1.416 at factor 64);
* attention is non-causal over ``[context ; block]`` for ``full_attention`` layers; a
  ``sliding_attention`` layer is causal unless ``is_causal`` says otherwise, and windowed when
  ``use_sliding_window`` (transformers' ``Qwen3Config`` rules), with the reference's mask.

**Layer-id convention.** ``target_layer_ids`` name decoder layers, 0-based: id ``i`` is the *output*
of target decoder layer ``i`` (the residual stream after its MLP), which is Hugging Face's
``output_hidden_states[i + 1]`` — the reference's ``extract_context_feature`` adds that offset of one
(tests/engine/test_dflash.py pins it against a transformers Qwen3.5-MoE model with hooks on its
layers). Converted copies that store ids already shifted by one (speculators' format, SGLang's "before
layer i" capture points) must be shifted back before they are read here. HF's last hidden state is
the final-normed one, not the last layer's output, so an id naming the target's last layer is refused.

Numerics: weights are BF16; activations are kept in ``dtype`` (BF16 by default) and rounded where the
reference's BF16 forward rounds (each projection, each norm, each residual add); projections
accumulate in the references' accumulator (``netra.ops._common.acc_dtype``: float64 on a CPU, so a
row's result does not depend on its batch), attention in the same accumulator, RoPE in float32 from a
float64 angle. With ``dtype=torch.float32`` the drafter computes in float32 throughout, which is how
the parity test compares it with the reference run in float32 on the same BF16 weight values.

Per-request state is the context K/V of each draft layer, in pools indexed by the engine's slots
(`DFlashDrafter`: `admit` / `extend` / `release`, the `netra.engine.spec.drafter.Drafter` interface);
a draft's own K/V is transient. This is the reference path: a block attends over its slot's whole
pool row (masked at the context length), which keeps shapes fixed and reads nothing on the host, but
costs O(context_length) per draft; nothing here is tuned for a GPU yet.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from netra.engine.config import ConfigError, ModelConfig
from netra.engine.loader import CheckpointError
from netra.engine.weights import BF16, _Init
from netra.ops._common import acc_dtype
from netra.ops.linear import Weight, linear

if TYPE_CHECKING:
    from netra.engine.request import Request

ARCHITECTURE = "DFlashDraftModel"
SAFETENSORS = "model.safetensors"
LAYER_TYPES = ("full_attention", "sliding_attention")


# ---- configuration ---------------------------------------------------------------------------------
@dataclass(frozen=True)
class DFlashConfig:
    """A DFlash drafter's ``config.json``: the Qwen3 keys of the network and ``dflash_config``.

    ``layer_types`` and ``sliding_window`` are stored resolved, as transformers' ``Qwen3Config``
    resolves them (``sliding_window`` is None unless ``use_sliding_window``); ``is_causal`` None
    means "causal exactly on the sliding_attention layers" (the reference's default).
    """

    hidden_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int  # the target's vocabulary (the drafter has no embedding of its own)
    num_target_layers: int
    target_layer_ids: tuple[int, ...]
    mask_token_id: int
    block_size: int = 16
    rms_norm_eps: float = 1e-6
    max_position_embeddings: int = 262144
    rope_theta: float = 10_000_000.0
    rope_type: str = "default"  # "default" | "yarn"
    rope_factor: float = 1.0
    rope_original_max_position_embeddings: int | None = None
    rope_beta_fast: float = 32.0
    rope_beta_slow: float = 1.0
    rope_attention_factor: float | None = None
    rope_mscale: float | None = None
    rope_mscale_all_dim: float | None = None
    rope_truncate: bool = True
    layer_types: tuple[str, ...] = ()  # () = every layer full_attention
    sliding_window: int | None = None
    is_causal: bool | None = None
    input_embedding_scale: float = 1.0
    output_multiplier: float = 1.0
    final_logit_softcapping: float | None = None

    def __post_init__(self) -> None:
        for f in fields(self):
            v = getattr(self, f.name)
            if f.type == "int" and (not isinstance(v, int) or isinstance(v, bool)
                                    or v < (0 if f.name == "mask_token_id" else 1)):
                raise ConfigError(f"drafter config {f.name}={v!r}: expected a positive integer")
        if not self.layer_types:
            object.__setattr__(self, "layer_types", ("full_attention",) * self.num_hidden_layers)
        if len(self.layer_types) != self.num_hidden_layers or any(t not in LAYER_TYPES for t in self.layer_types):
            raise ConfigError(f"drafter config layer_types {list(self.layer_types)}: expected "
                              f"{self.num_hidden_layers} entries of {LAYER_TYPES}")
        if self.num_attention_heads % self.num_key_value_heads:
            raise ConfigError("drafter num_attention_heads must be a multiple of num_key_value_heads")
        if self.head_dim % 2:
            raise ConfigError(f"drafter head_dim {self.head_dim} must be even (rotate-half RoPE)")
        if not self.target_layer_ids:
            raise ConfigError("drafter dflash_config.target_layer_ids is empty")
        bad = [i for i in self.target_layer_ids if not 0 <= i < self.num_target_layers - 1]
        if bad:
            raise ConfigError(
                f"drafter target_layer_ids {list(self.target_layer_ids)}: {bad} outside [0, "
                f"{self.num_target_layers - 1}) — ids name the output of a target decoder layer (HF "
                f"hidden_states[i + 1]); the last layer's is not what HF's last hidden state holds")
        if not 0 <= self.mask_token_id < self.vocab_size:
            raise ConfigError(f"drafter mask_token_id {self.mask_token_id} outside the vocabulary "
                              f"({self.vocab_size} rows)")
        if self.block_size < 2:
            raise ConfigError(f"drafter block_size {self.block_size}: at least 2 (a pending token and a draft)")
        if self.rope_type not in ("default", "yarn"):
            raise ConfigError(f"drafter rope_type {self.rope_type!r}: only 'default' and 'yarn' are supported")
        if self.rope_type == "yarn" and self.rope_original_max_position_embeddings is None:
            raise ConfigError("drafter yarn RoPE needs original_max_position_embeddings")
        if self.sliding_window is not None and self.sliding_window <= 0:
            raise ConfigError(f"drafter sliding_window {self.sliding_window}: expected a positive integer")

    @property
    def feature_size(self) -> int:
        """Width of one committed token's captured target features (``fc``'s input)."""
        return len(self.target_layer_ids) * self.hidden_size

    def layer_causal(self, layer: int) -> bool:
        kind = self.layer_types[layer]
        return kind == "sliding_attention" if self.is_causal is None else self.is_causal

    def layer_window(self, layer: int) -> int | None:
        return self.sliding_window if self.layer_types[layer] == "sliding_attention" else None

    def check_target(self, target: ModelConfig) -> None:
        """Refuse a target this drafter cannot read: ``fc`` takes ``len(ids)`` rows of the target's width."""
        if target.hidden_size != self.hidden_size:
            raise ConfigError(f"drafter hidden_size {self.hidden_size} != target hidden_size {target.hidden_size}")
        if target.num_hidden_layers != self.num_target_layers:
            raise ConfigError(f"drafter num_target_layers {self.num_target_layers} != the target's "
                              f"{target.num_hidden_layers} layers")
        if self.mask_token_id >= target.vocab_size:
            raise ConfigError(f"drafter mask_token_id {self.mask_token_id} outside the target's vocabulary "
                              f"({target.vocab_size} rows)")

    # ---- config.json ------------------------------------------------------------------------------
    def to_hf(self) -> dict[str, Any]:
        """``config.json`` as z-lab publishes it: Qwen3 keys (``model_type`` qwen3, the architecture
        ``DFlashDraftModel``), ``rope_theta`` + ``rope_scaling``, and ``dflash_config``."""
        out: dict[str, Any] = {
            "architectures": [ARCHITECTURE], "model_type": "qwen3", "dtype": "bfloat16",
            "hidden_size": self.hidden_size, "intermediate_size": self.intermediate_size,
            "num_hidden_layers": self.num_hidden_layers, "num_attention_heads": self.num_attention_heads,
            "num_key_value_heads": self.num_key_value_heads, "head_dim": self.head_dim,
            "hidden_act": "silu", "attention_bias": False, "attention_dropout": 0.0,
            "rms_norm_eps": self.rms_norm_eps, "max_position_embeddings": self.max_position_embeddings,
            "rope_theta": self.rope_theta, "vocab_size": self.vocab_size, "tie_word_embeddings": False,
            "num_target_layers": self.num_target_layers, "block_size": self.block_size,
            "layer_types": list(self.layer_types), "use_sliding_window": self.sliding_window is not None,
            "sliding_window": self.sliding_window, "max_window_layers": 0,
            "dflash_config": {"block_size": self.block_size, "mask_token_id": self.mask_token_id,
                              "target_layer_ids": list(self.target_layer_ids)},
        }
        if self.rope_type == "yarn":
            rope: dict[str, Any] = {"rope_type": "yarn", "factor": self.rope_factor,
                                    "original_max_position_embeddings": self.rope_original_max_position_embeddings,
                                    "beta_fast": self.rope_beta_fast, "beta_slow": self.rope_beta_slow}
            for key, v in (("attention_factor", self.rope_attention_factor), ("mscale", self.rope_mscale),
                           ("mscale_all_dim", self.rope_mscale_all_dim)):
                if v is not None:
                    rope[key] = v
            if not self.rope_truncate:
                rope["truncate"] = False
            out["rope_scaling"] = rope
        if self.is_causal is not None:
            out["is_causal"] = self.is_causal
        extra = {"input_embedding_scale": (self.input_embedding_scale, 1.0),
                 "output_multiplier": (self.output_multiplier, 1.0),
                 "final_logit_softcapping": (self.final_logit_softcapping, None)}
        for key, (v, default) in extra.items():
            if v != default:
                out["dflash_config"][key] = v
        return out

    @classmethod
    def from_hf(cls, raw: dict[str, Any]) -> DFlashConfig:
        """Read a drafter ``config.json``; a missing key or an unsupported variant is an error naming it.

        ``dflash_config`` entries win over top-level keys of the same name (the reference's
        ``_draft_value``); RoPE comes from ``rope_parameters`` (transformers 5) or ``rope_theta`` +
        ``rope_scaling`` (transformers 4)."""
        arch = raw.get("architectures") or [ARCHITECTURE]
        if arch != [ARCHITECTURE]:
            raise ConfigError(f"drafter architectures {arch}: only {ARCHITECTURE} is supported")
        draft = dict(raw.get("dflash_config") or {})

        def value(name: str, default: Any = None) -> Any:
            return draft.get(name, raw.get(name, default))

        if value("attention_bias", False):
            raise ConfigError("drafter attention_bias: projections with biases are not supported")
        if raw.get("hidden_act", "silu") != "silu":
            raise ConfigError(f"drafter hidden_act {raw.get('hidden_act')!r}: only silu is supported")
        required = ("hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
                    "intermediate_size", "vocab_size")
        missing = [k for k in required if k not in raw]
        if "mask_token_id" not in draft and "mask_token_id" not in raw:
            missing.append("dflash_config.mask_token_id")
        if "target_layer_ids" not in draft and "target_layer_ids" not in raw:
            missing.append("dflash_config.target_layer_ids")
        if missing:
            raise ConfigError(f"drafter config.json misses required keys {missing}")
        n_layers = int(raw["num_hidden_layers"])
        ids = tuple(int(i) for i in value("target_layer_ids"))
        rope = dict(raw.get("rope_parameters") or raw.get("rope_scaling") or {})
        rope_type = rope.get("rope_type", rope.get("type", "default"))
        theta = float(rope.get("rope_theta", raw.get("rope_theta", 10_000.0)))
        if float(rope.get("partial_rotary_factor", raw.get("partial_rotary_factor", 1.0))) != 1.0:
            raise ConfigError("drafter partial_rotary_factor: only whole-head RoPE is supported")
        window = raw.get("sliding_window") if raw.get("use_sliding_window", False) else None
        layer_types = raw.get("layer_types")
        if layer_types is None:  # Qwen3Config's default
            first = int(raw.get("max_window_layers", 28))
            layer_types = ["sliding_attention" if window is not None and i >= first else "full_attention"
                           for i in range(n_layers)]
        causal = value("is_causal")
        softcap = value("final_logit_softcapping")
        original = rope.get("original_max_position_embeddings")
        return cls(
            hidden_size=int(raw["hidden_size"]), num_hidden_layers=n_layers,
            num_attention_heads=int(raw["num_attention_heads"]),
            num_key_value_heads=int(raw["num_key_value_heads"]),
            head_dim=int(raw.get("head_dim") or int(raw["hidden_size"]) // int(raw["num_attention_heads"])),
            intermediate_size=int(raw["intermediate_size"]), vocab_size=int(raw["vocab_size"]),
            num_target_layers=int(value("num_target_layers", max(ids) + 2)), target_layer_ids=ids,
            mask_token_id=int(value("mask_token_id")), block_size=int(value("block_size", 16)),
            rms_norm_eps=float(raw.get("rms_norm_eps", 1e-6)),
            max_position_embeddings=int(raw.get("max_position_embeddings", 262144)),
            rope_theta=theta, rope_type=str(rope_type),
            rope_factor=float(rope.get("factor") or 1.0),
            rope_original_max_position_embeddings=None if original is None else int(original),
            rope_beta_fast=float(rope.get("beta_fast") or 32.0), rope_beta_slow=float(rope.get("beta_slow") or 1.0),
            rope_attention_factor=_opt_float(rope.get("attention_factor")),
            rope_mscale=_opt_float(rope.get("mscale")), rope_mscale_all_dim=_opt_float(rope.get("mscale_all_dim")),
            rope_truncate=bool(rope.get("truncate", True)),
            layer_types=tuple(layer_types), sliding_window=None if window is None else int(window),
            is_causal=None if causal is None else bool(causal),
            input_embedding_scale=float(value("input_embedding_scale", 1.0)),
            output_multiplier=float(value("output_multiplier", 1.0)),
            final_logit_softcapping=None if softcap is None or float(softcap) <= 0 else float(softcap),
        )

    @classmethod
    def from_dir(cls, path: Path) -> DFlashConfig:
        cfg = path / "config.json"
        if not cfg.is_file():
            raise ConfigError(f"{path}: no config.json")
        try:
            return cls.from_hf(json.loads(cfg.read_text()))
        except json.JSONDecodeError as exc:
            raise ConfigError(f"{cfg}: invalid JSON ({exc})") from exc


def _opt_float(v: Any) -> float | None:
    return None if v is None else float(v)


# The published drafter's shapes (z-lab/Qwen3.6-35B-A3B-DFlash), and the tiny preset's scaled to the tiny
# target: its hidden width, its 3 layers (ids 0 and 1: the outputs of the two GDN layers; the last layer's
# output is not an HF hidden state), and <|reserved_3|> of the byte tokenizer as the mask token.
DFLASH_PRESETS: dict[str, DFlashConfig] = {
    "tiny": DFlashConfig(
        hidden_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=32,
        intermediate_size=256, vocab_size=264, num_target_layers=3, target_layer_ids=(0, 1),
        mask_token_id=263, block_size=16, max_position_embeddings=65536, rope_theta=10_000_000.0,
        rope_type="yarn", rope_factor=64.0, rope_original_max_position_embeddings=4096),
    "qwen36-35b-a3b": DFlashConfig(
        hidden_size=2048, num_hidden_layers=8, num_attention_heads=32, num_key_value_heads=4, head_dim=128,
        intermediate_size=6144, vocab_size=248320, num_target_layers=40, target_layer_ids=(1, 10, 19, 28, 37),
        mask_token_id=248070, block_size=16, max_position_embeddings=262144, rope_theta=10_000_000.0,
        rope_type="yarn", rope_factor=64.0, rope_original_max_position_embeddings=4096),
}


def dflash_preset(name: str, target: ModelConfig | None = None, mask_token_id: int | None = None) -> DFlashConfig:
    """The drafter of target preset ``name``; with ``target``, at that target's vocabulary (and
    ``mask_token_id`` when given: the synthesized checkpoint's real vocabulary uses 248070)."""
    try:
        cfg = DFLASH_PRESETS[name]
    except KeyError as exc:
        raise ConfigError(f"no DFlash drafter for preset {name!r}; known: {sorted(DFLASH_PRESETS)}") from exc
    if target is not None:
        cfg = replace(cfg, vocab_size=target.vocab_size,
                      mask_token_id=cfg.mask_token_id if mask_token_id is None else mask_token_id)
        cfg.check_target(target)
    return cfg


# ---- weights -----------------------------------------------------------------------------------------
@dataclass
class DFlashLayerWeights:
    input_layernorm: torch.Tensor  # [H] plain (Qwen3) RMSNorm weights
    post_attention_layernorm: torch.Tensor
    q_proj: Weight  # [Hq·D, H]
    k_proj: Weight  # [Hkv·D, H]
    v_proj: Weight
    o_proj: Weight  # [H, Hq·D]
    q_norm: torch.Tensor  # [D]
    k_norm: torch.Tensor
    gate_proj: Weight  # [I, H]
    up_proj: Weight
    down_proj: Weight  # [H, I]


@dataclass
class DFlashWeights:
    fc: Weight  # [H, len(ids)·H]
    hidden_norm: torch.Tensor  # [H]
    norm: torch.Tensor  # [H] the drafter's final norm (before the target's lm_head)
    layers: list[DFlashLayerWeights] = field(default_factory=list)


_NORMS = ("input_layernorm", "post_attention_layernorm", "self_attn.q_norm", "self_attn.k_norm")
_PROJS = ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
          "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj")


def tensor_shapes(cfg: DFlashConfig) -> dict[str, tuple[int, ...]]:
    """Every tensor of a z-lab drafter checkpoint (the reference's module names) and its shape."""
    h, d, i = cfg.hidden_size, cfg.head_dim, cfg.intermediate_size
    hq, hkv = cfg.num_attention_heads * d, cfg.num_key_value_heads * d
    out: dict[str, tuple[int, ...]] = {"fc.weight": (h, cfg.feature_size), "hidden_norm.weight": (h,),
                                       "norm.weight": (h,)}
    per = {"input_layernorm": (h,), "post_attention_layernorm": (h,), "self_attn.q_norm": (d,),
           "self_attn.k_norm": (d,), "self_attn.q_proj": (hq, h), "self_attn.k_proj": (hkv, h),
           "self_attn.v_proj": (hkv, h), "self_attn.o_proj": (h, hq), "mlp.gate_proj": (i, h),
           "mlp.up_proj": (i, h), "mlp.down_proj": (h, i)}
    for layer in range(cfg.num_hidden_layers):
        for name, shape in per.items():
            out[f"layers.{layer}.{name}.weight"] = shape
    return out


def state_dict(w: DFlashWeights) -> dict[str, torch.Tensor]:
    """The weights under z-lab's names (BF16)."""
    out = {"fc.weight": w.fc.data, "hidden_norm.weight": w.hidden_norm, "norm.weight": w.norm}
    for n, layer in enumerate(w.layers):
        p = f"layers.{n}."
        for name in _NORMS:
            out[p + name + ".weight"] = getattr(layer, name.split(".")[-1])
        for name in _PROJS:
            out[p + name + ".weight"] = getattr(layer, name.split(".")[-1]).data
    return out


def from_state_dict(cfg: DFlashConfig, sd: Mapping[str, torch.Tensor], device: torch.device | str = "cpu"
                    ) -> DFlashWeights:
    """Weights from z-lab-named tensors; a missing, misshapen or unexpected tensor is an error naming it.
    Floating-point tensors are stored as BF16 (the published checkpoint's dtype)."""
    shapes = tensor_shapes(cfg)
    for name, shape in shapes.items():
        if name not in sd:
            raise CheckpointError(f"drafter checkpoint misses tensor {name!r}")
        t = sd[name]
        if tuple(t.shape) != shape:
            raise CheckpointError(f"drafter tensor {name!r} has shape {tuple(t.shape)}, expected {shape}")
        if t.dtype not in (torch.bfloat16, torch.float16, torch.float32):
            raise CheckpointError(f"drafter tensor {name!r}: unsupported dtype {t.dtype}")
    extra = sorted(set(sd) - set(shapes))
    if extra:
        raise CheckpointError(f"drafter checkpoint has unexpected tensors {extra[:8]}"
                              f"{' ...' if len(extra) > 8 else ''}")

    def get(name: str) -> torch.Tensor:
        return sd[name].to(device=device, dtype=BF16)

    layers = []
    for n in range(cfg.num_hidden_layers):
        p = f"layers.{n}."
        kw: dict[str, Any] = {name.split(".")[-1]: get(p + name + ".weight") for name in _NORMS}
        kw.update({name.split(".")[-1]: Weight(get(p + name + ".weight")) for name in _PROJS})
        layers.append(DFlashLayerWeights(**kw))
    return DFlashWeights(fc=Weight(get("fc.weight")), hidden_norm=get("hidden_norm.weight"),
                         norm=get("norm.weight"), layers=layers)


def seeded_dflash_weights(cfg: DFlashConfig, seed: int, device: torch.device | str = "cpu") -> DFlashWeights:
    """Random BF16 weights at the config's shapes, deterministic in (seed, tensor name, device type) as
    `netra.engine.weights.seeded_weights` draws them: projections N(0, 1/fan_in), norm weights
    ``1 + N(0, 0.1)`` (plain RMSNorm weights, whose neutral value is 1). Names are prefixed ``dflash/``
    so a drafter and its target drawn from one seed do not share streams."""
    init = _Init(seed, torch.device(device))
    sd: dict[str, torch.Tensor] = {}
    for name, shape in tensor_shapes(cfg).items():
        key = "dflash/" + name
        if len(shape) == 1:
            sd[name] = (1.0 + init.randn(key, shape, 0.1)).to(BF16)
        else:
            sd[name] = init.proj(key, shape[0], shape[1], False).data
    return from_state_dict(cfg, sd, device)


def save_dflash(path: Path, cfg: DFlashConfig, w: DFlashWeights) -> Path:
    """Write a z-lab-format drafter directory: ``config.json`` and ``model.safetensors``."""
    from safetensors.torch import save_file

    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps(cfg.to_hf(), indent=2) + "\n")
    save_file({k: v.contiguous().cpu() for k, v in state_dict(w).items()}, str(path / SAFETENSORS),
              metadata={"format": "pt"})
    return path


def load_dflash(path: Path, device: torch.device | str = "cpu") -> tuple[DFlashConfig, DFlashWeights]:
    """Read a z-lab drafter directory (``config.json`` + every ``*.safetensors`` in it)."""
    from safetensors.torch import load_file

    try:
        cfg = DFlashConfig.from_dir(path)
    except ConfigError as exc:
        raise CheckpointError(str(exc)) from exc
    files = sorted(path.glob("*.safetensors"))
    if not files:
        raise CheckpointError(f"{path}: no *.safetensors files")
    sd: dict[str, torch.Tensor] = {}
    for f in files:
        sd.update(load_file(str(f), device="cpu"))
    return cfg, from_state_dict(cfg, sd, device)


# ---- the network ---------------------------------------------------------------------------------------
def rope_parameters(cfg: DFlashConfig) -> tuple[torch.Tensor, float]:
    """``(inv_freq [D/2] float64, attention_scaling)`` as transformers' ``default`` / ``yarn`` RoPE
    initialisers compute them (the same formulas, in float64)."""
    d, base = cfg.head_dim, cfg.rope_theta
    inv = 1.0 / (base ** (torch.arange(0, d, 2, dtype=torch.float64) / d))
    if cfg.rope_type == "default":
        return inv, 1.0
    factor = cfg.rope_factor
    original = cfg.rope_original_max_position_embeddings
    assert original is not None

    def mscale(scale: float, m: float = 1.0) -> float:
        return 1.0 if scale <= 1 else 0.1 * m * math.log(scale) + 1.0

    if cfg.rope_attention_factor is not None:
        attn = cfg.rope_attention_factor
    elif cfg.rope_mscale and cfg.rope_mscale_all_dim:
        attn = mscale(factor, cfg.rope_mscale) / mscale(factor, cfg.rope_mscale_all_dim)
    else:
        attn = mscale(factor)

    def correction_dim(rotations: float) -> float:
        return d * math.log(original / (rotations * 2 * math.pi)) / (2 * math.log(base))

    low, high = correction_dim(cfg.rope_beta_fast), correction_dim(cfg.rope_beta_slow)
    if cfg.rope_truncate:
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, d - 1)
    if low == high:
        high += 0.001
    ramp = ((torch.arange(d // 2, dtype=torch.float64) - low) / (high - low)).clamp(0, 1)
    extrapolation = 1 - ramp  # weight of the unscaled frequency
    inv = (inv / factor) * (1 - extrapolation) + inv * extrapolation
    return inv, float(attn)


def _rmsnorm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """Qwen3 RMSNorm as the reference computes it: normalise in float32, round, times the weight."""
    xf = x.float()
    y = (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype)
    return weight.to(x.dtype) * y


def context_feature(layer_outputs: Mapping[int, torch.Tensor] | Sequence[torch.Tensor],
                    target_layer_ids: Sequence[int]) -> torch.Tensor:
    """One token row per committed token: the outputs of target decoder layers ``target_layer_ids``
    (``layer_outputs[i]`` = the output of decoder layer ``i``), concatenated in id order along the
    last dimension — the reference's ``extract_context_feature`` over HF's ``hidden_states``, whose
    entry ``i + 1`` is that output."""
    return torch.cat([layer_outputs[i] for i in target_layer_ids], dim=-1)


class DFlashDrafter:
    """The DFlash drafter over per-slot context K/V pools (the `netra.engine.spec.drafter.Drafter` interface).

    ``embed`` ``[V, H]`` and ``lm_head`` are the target's (its token embedding and output projection);
    ``dtype`` is the activation and context dtype (BF16 as deployed; float32 for the parity test). The
    pools are ``[num_slots, context_length, Hkv, D]`` per draft layer, indexed by the engine's request
    slots (`netra.engine.cache.StatePools` numbering: slot `PAD_SLOT` = 0 is padding, and the rows a
    block carries past its count are written there, never read), with the context length per slot in
    ``lengths`` on the device. `extend` and `propose` read no device value on the host and have fixed
    shapes per batch: a block's queries attend over the slot's whole pool row, masked at its length.
    A context row's position is its index: a slot's context starts at position 0 on `admit`.
    """

    def __init__(self, cfg: DFlashConfig, weights: DFlashWeights, embed: torch.Tensor, lm_head: Weight,
                 num_slots: int, context_length: int, dtype: torch.dtype = BF16,
                 device: torch.device | str | None = None) -> None:
        self.cfg, self.w, self.dtype = cfg, weights, dtype
        self.device = torch.device(device) if device is not None else weights.fc.data.device
        if embed.shape[1] != cfg.hidden_size or lm_head.in_features != cfg.hidden_size:
            raise ConfigError(f"target embedding {tuple(embed.shape)} / lm_head {tuple(lm_head.data.shape)} do "
                              f"not match the drafter's hidden size {cfg.hidden_size}")
        if cfg.mask_token_id >= embed.shape[0]:
            raise ConfigError(f"drafter mask_token_id {cfg.mask_token_id} outside the target's embedding "
                              f"({embed.shape[0]} rows)")
        if num_slots < 2 or context_length < 1:
            raise ValueError(f"drafter pools of {num_slots} slots x {context_length} rows: need a padding slot, "
                             f"one request slot and one row")
        self.embed, self.lm_head = embed, lm_head
        # Decoder layers whose outputs `extend` takes, concatenated in this order (module docstring).
        self.capture_layers: tuple[int, ...] = cfg.target_layer_ids
        self.block_size = cfg.block_size
        self.num_slots, self.context_length = num_slots, context_length
        self.acc = acc_dtype(self.device)
        inv_freq, self.rope_scale = rope_parameters(cfg)
        self.inv_freq = inv_freq.to(self.device)
        self.sm_scale = cfg.head_dim ** -0.5
        shape = (num_slots, context_length, cfg.num_key_value_heads, cfg.head_dim)
        self.k = [torch.zeros(shape, dtype=dtype, device=self.device) for _ in range(cfg.num_hidden_layers)]
        self.v = [torch.zeros(shape, dtype=dtype, device=self.device) for _ in range(cfg.num_hidden_layers)]
        self.lengths = torch.zeros(num_slots, dtype=torch.int64, device=self.device)

    def nbytes(self) -> int:
        """Bytes of the context pools."""
        return sum(t.numel() * t.element_size() for t in (*self.k, *self.v))

    # ---- the drafter interface --------------------------------------------------------------------------
    def admit(self, slot: int, request: Request | None = None) -> None:
        """``slot``'s context starts empty (rows of its previous owner stay in the pool, past the length)."""
        self._check_slot(slot)
        self.lengths[slot] = 0

    def release(self, slot: int) -> None:
        self._check_slot(slot)
        self.lengths[slot] = 0

    def extend(self, slots: torch.Tensor, features: torch.Tensor, counts: torch.Tensor) -> None:
        """Append committed tokens: ``features [B, L, F]`` (`context_feature` rows, F = len(ids)·H) of
        which the first ``counts[b]`` are the next tokens of the request on ``slots[b]``.

        fc → hidden_norm → per layer k/v projection → k_norm → RoPE at each row's position (the slot's
        length + its index); every row of the batch goes through the projections (a row's result does
        not depend on the others), the rows past a block's count land on the padding slot."""
        c = self.cfg
        b, n = features.shape[0], features.shape[1]
        if features.dim() != 3 or features.shape[2] != c.feature_size:
            raise ValueError(f"extend: features {tuple(features.shape)}, expected [B, L, {c.feature_size}]")
        if slots.shape != (b,) or counts.shape != (b,):
            raise ValueError(f"extend: slots {tuple(slots.shape)} and counts {tuple(counts.shape)} for {b} blocks")
        if b == 0 or n == 0:
            return
        slots, counts = slots.to(self.device), counts.to(self.device)
        pos = self.lengths.index_select(0, slots)[:, None] + torch.arange(n, device=self.device)[None, :]
        keep = (torch.arange(n, device=self.device)[None, :] < counts[:, None]) & (pos < self.context_length)
        dest_slot = torch.where(keep, slots[:, None], 0).reshape(-1)
        dest_pos = torch.where(keep, pos, 0).reshape(-1)
        x = features.reshape(b * n, c.feature_size).to(device=self.device, dtype=self.dtype)
        hidden = _rmsnorm(linear(x, self.w.fc), self.w.hidden_norm, c.rms_norm_eps)
        cos, sin = self._rope(pos.reshape(-1))
        for li, layer in enumerate(self.w.layers):
            k = linear(hidden, layer.k_proj).view(b * n, c.num_key_value_heads, c.head_dim)
            v = linear(hidden, layer.v_proj).view(b * n, c.num_key_value_heads, c.head_dim)
            k = self._rotate(_rmsnorm(k, layer.k_norm, c.rms_norm_eps), cos, sin)
            self.k[li].index_put_((dest_slot, dest_pos), k)
            self.v[li].index_put_((dest_slot, dest_pos), v)
        self.lengths.index_add_(0, slots, keep.sum(dim=1))
        self.lengths[0] = 0

    def propose(self, slots: torch.Tensor, pending: torch.Tensor, steps: int) -> torch.Tensor:
        """Greedy drafts ``[B, steps − 1]`` int64 (block positions 1..steps−1) for each slot's block
        ``[pending, mask × (steps − 1)]`` at the slot's next position."""
        if steps == 1:
            return torch.empty((slots.shape[0], 0), dtype=torch.int64, device=self.device)
        return self.block_logits(slots, pending, steps).argmax(dim=-1)

    # ---- the forward, in parts (the parity test reads them) -----------------------------------------------
    def block_logits(self, slots: torch.Tensor, pending: torch.Tensor, steps: int) -> torch.Tensor:
        """FP32 logits ``[B, steps−1, V]`` of block positions 1..steps−1: the target's ``lm_head`` on the
        drafter's normed hidden states, times ``output_multiplier``, soft-capped when the config says so."""
        h = self.block_hidden(slots, pending, steps)[:, 1:]
        b = h.shape[0]
        logits = linear(h.reshape(-1, h.shape[-1]), self.lm_head, torch.float32).view(b, steps - 1, -1)
        if self.cfg.output_multiplier != 1.0:
            logits = logits * self.cfg.output_multiplier
        cap = self.cfg.final_logit_softcapping
        if cap is not None:
            logits = torch.tanh(logits / cap) * cap
        return logits

    def block_hidden(self, slots: torch.Tensor, pending: torch.Tensor, steps: int) -> torch.Tensor:
        """The drafter's output ``[B, steps, H]`` (after its final norm) for each slot's block, all positions."""
        c, t = self.cfg, steps
        if not 1 <= t <= c.block_size:
            raise ValueError(f"propose: a block of {t} tokens; the drafter takes 1..{c.block_size}")
        b = slots.shape[0]
        if pending.shape != (b,):
            raise ValueError(f"propose: {b} slots but pending {tuple(pending.shape)}")
        slots = slots.to(self.device)
        lengths = self.lengths.index_select(0, slots)
        ids = torch.full((b, t), c.mask_token_id, dtype=torch.int64, device=self.device)
        ids[:, 0] = pending.to(self.device)
        h = self.embed.index_select(0, ids.reshape(-1)).to(self.dtype)
        if c.input_embedding_scale != 1.0:
            h = h * c.input_embedding_scale
        pos = lengths[:, None] + torch.arange(t, device=self.device)[None, :]  # [B, T]
        cos, sin = self._rope(pos.reshape(-1))
        masks = self._masks(lengths, t)
        hq, hkv, d = c.num_attention_heads, c.num_key_value_heads, c.head_dim
        for li, layer in enumerate(self.w.layers):
            residual = h
            x = _rmsnorm(h, layer.input_layernorm, c.rms_norm_eps)
            q = _rmsnorm(linear(x, layer.q_proj).view(b * t, hq, d), layer.q_norm, c.rms_norm_eps)
            k = _rmsnorm(linear(x, layer.k_proj).view(b * t, hkv, d), layer.k_norm, c.rms_norm_eps)
            v = linear(x, layer.v_proj).view(b * t, hkv, d)
            q, k = self._rotate(q, cos, sin), self._rotate(k, cos, sin)
            o = self._attend(q.view(b, t, hq, d), self.k[li].index_select(0, slots),
                             self.v[li].index_select(0, slots), k.view(b, t, hkv, d), v.view(b, t, hkv, d),
                             masks[(c.layer_causal(li), c.layer_window(li))])
            h = residual + linear(o.reshape(b * t, hq * d), layer.o_proj)
            residual = h
            x = _rmsnorm(h, layer.post_attention_layernorm, c.rms_norm_eps)
            g, u = linear(x, layer.gate_proj).float(), linear(x, layer.up_proj).float()
            h = residual + linear((torch.nn.functional.silu(g) * u).to(self.dtype), layer.down_proj)
        return _rmsnorm(h, self.w.norm, c.rms_norm_eps).view(b, t, c.hidden_size)

    # ---- internals ----------------------------------------------------------------------------------------
    def _check_slot(self, slot: int) -> None:
        if not 0 < slot < self.num_slots:
            raise ValueError(f"drafter slot {slot} outside 1..{self.num_slots - 1} (0 is the padding slot)")

    def _rope(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """cos, sin ``[N, 1, D]`` float32 (rotate-half layout, times YaRN's attention factor)."""
        ang = positions.to(torch.float64)[:, None] * self.inv_freq[None, :]
        ang = torch.cat([ang, ang], dim=-1)
        return ((ang.cos() * self.rope_scale).to(torch.float32)[:, None, :],
                (ang.sin() * self.rope_scale).to(torch.float32)[:, None, :])

    def _rotate(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        xf = x.float()
        half = xf.shape[-1] // 2
        rot = torch.cat([-xf[..., half:], xf[..., :half]], dim=-1)
        return (xf * cos + rot * sin).to(x.dtype)

    def _masks(self, lengths: torch.Tensor, t: int) -> dict[tuple[bool, int | None], torch.Tensor]:
        """Per (causal, window) of the layers: which keys each block query sees, ``[B, T, C + T]`` bool over
        ``[pool row ; block]``. Pool row j (position j) is context while j < length; block key m sits at
        position length + m. Full attention: all of the context and the block (the reference's no-mask
        case); a causal or windowed layer: the reference's `_attention_mask` rule on positions."""
        cap, dev = self.context_length, self.device
        key_pos = torch.cat([torch.arange(cap, device=dev)[None, :].expand(lengths.shape[0], cap),
                             lengths[:, None] + torch.arange(t, device=dev)[None, :]], dim=1)  # [B, C + T]
        is_key = torch.cat([torch.arange(cap, device=dev)[None, :] < lengths[:, None],
                            torch.ones((lengths.shape[0], t), dtype=torch.bool, device=dev)], dim=1)
        q_pos = lengths[:, None] + torch.arange(t, device=dev)[None, :]  # [B, T]
        out = {}
        for li in range(self.cfg.num_hidden_layers):
            kind = (self.cfg.layer_causal(li), self.cfg.layer_window(li))
            if kind in out:
                continue
            causal, window = kind
            visible = is_key[:, None, :].expand(-1, t, -1).clone()
            qp, kp = q_pos[:, :, None], key_pos[:, None, :]
            if causal:
                visible &= kp <= qp
            if window is not None:
                visible &= qp - kp < window
                if not causal:
                    visible &= kp - qp < window
            out[kind] = visible
        return out

    def _attend(self, q: torch.Tensor, k_ctx: torch.Tensor, v_ctx: torch.Tensor, k_blk: torch.Tensor,
                v_blk: torch.Tensor, visible: torch.Tensor) -> torch.Tensor:
        """Block queries ``[B, T, Hq, D]`` over ``[pool row ; block]`` K/V (``[B, C, Hkv, D]``,
        ``[B, T, Hkv, D]``) where ``visible [B, T, C + T]``, in the accumulator dtype."""
        c = self.cfg
        b, t = q.shape[0], q.shape[1]
        groups = c.num_attention_heads // c.num_key_value_heads
        k = torch.cat([k_ctx, k_blk], dim=1).to(self.acc)
        v = torch.cat([v_ctx, v_blk], dim=1).to(self.acc)
        qa = q.to(self.acc).view(b, t, c.num_key_value_heads, groups, c.head_dim)
        s = torch.einsum("bthgd,bnhd->bhgtn", qa, k) * self.sm_scale
        s = s.masked_fill(~visible[:, None, None], float("-inf"))
        p = torch.softmax(s, dim=-1)
        o = torch.einsum("bhgtn,bnhd->bthgd", p, v)
        return o.reshape(b, t, c.num_attention_heads, c.head_dim).to(self.dtype)


if TYPE_CHECKING:
    from netra.engine.spec.drafter import Drafter

    def _is_a_drafter(d: DFlashDrafter) -> Drafter:  # mypy checks the class against the interface
        return d
