"""The engine's weights: structured containers, the one tree of checkpoint tensors they are built from,
and seeded initialisation.

The tree (`layer_tree`, `model_tree`) names every tensor once: its checkpoint name, the shape the
engine holds, its `Kind` (how it is drawn, held, stored and read) and the container field it lands
in. Seeding (`seeded_weights`, here), loading and saving (`netra.engine.loader`) are walks over it,
so a tensor added, renamed or reshaped changes all three together.

Seeded weights: every tensor is drawn from its own generator seeded by ``sha256(seed/name)``, so
the same seed gives the same model (per device type) whatever the creation order. Projections the
FP8 checkpoints quantize are E4M3 with 128x128 block scales; router, shared-expert gate, the GDN
``b``/``a`` projections, norms, embeddings and ``lm_head`` stay BF16 (A_log FP32), as in the
checkpoints. Names follow the checkpoint: ``model.language_model.layers.N.*`` and ``lm_head.weight``.
"""

from __future__ import annotations

import enum
import hashlib
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, fields
from typing import Any

import torch

from netra.engine.config import ModelConfig
from netra.ops import fp8
from netra.ops.linear import Weight
from netra.ops.moe import MoEWeights

PREFIX = "model.language_model."
LM_HEAD = "lm_head.weight"
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
        """Every projection: ``lm_head``, then each layer's mixer and MoE block."""
        out = [self.lm_head]
        for layer in self.layers:
            for block in (layer.mixer, layer.moe):
                out += [w for f in fields(block) if isinstance(w := getattr(block, f.name), Weight)]
        return out


# ---- the tree --------------------------------------------------------------------------------------
class Kind(enum.Enum):
    """How a tensor is drawn, held, stored and read."""

    FP8 = "projection: E4M3 with [N/128, K/128] weight_scale_inv in an FP8 model, else BF16"
    BF16 = "projection kept BF16 by every checkpoint (quantization_config.modules_to_not_convert)"
    TENSOR = "BF16 tensor drawn N(mean, std): norms, dt_bias, the embedding"
    CONV = "GDN conv1d: BF16 [C, K] held, [C, 1, K] in the checkpoint"
    A_LOG = "GDN A_log: FP32, log U(1, 16)"

    @property
    def projection(self) -> bool:
        return self in (Kind.FP8, Kind.BF16)


@dataclass(frozen=True)
class Leaf:
    """One container field and the checkpoint tensors it is made of.

    ``field``: where it lands, ``embed`` / ``norm`` / ``lm_head`` of `ModelWeights`, or within a layer
    ``input_layernorm``, ``mixer.q_proj``, ``moe.w13`` ... . ``name``: the checkpoint tensor, after
    the layer's prefix (a projection's ``....weight``, whose FP8 scale is ``name + "_scale_inv"``); for a
    projection stored as row blocks of several modules, the module they sit under. ``shape``: as the
    engine holds it ([N, K] a projection, [E, N, K] stacked experts). ``parts``: those row blocks'
    modules in order, ``name.part.weight`` (per expert ``name.e.part.weight``), each ``N / len(parts)``
    rows. ``fused``: experts may instead be one tensor ``name.fused`` [E, N, K] (transformers v5),
    read when present. ``std``, ``mean``: the seeded draw N(mean, std) (a projection's std defaults
    to ``K ** -0.5``). ``seed``: the name the draw is seeded by where it is not ``name``.
    """

    field: str
    name: str
    kind: Kind
    shape: tuple[int, ...]
    std: float | None = None
    mean: float = 0.0
    parts: tuple[str, ...] = ()
    fused: str = ""
    seed: str = ""

    @property
    def experts(self) -> bool:
        return len(self.shape) == 3

    def blocks(self, prefix: str) -> list[list[tuple[str, int, int]]]:
        """A projection's checkpoint tensors, per expert (one list when not stacked): (``.weight``
        name, first row, end row) in row order."""
        if not self.parts:
            return [[(prefix + self.name, 0, self.shape[-2])]]
        rows = self.shape[-2] // len(self.parts)
        heads = [f"{prefix}{self.name}.{e}." for e in range(self.shape[0])] if self.experts else [
            f"{prefix}{self.name}."]
        return [[(f"{h}{part}.weight", j * rows, (j + 1) * rows) for j, part in enumerate(self.parts)]
                for h in heads]


def layer_prefix(i: int) -> str:
    return f"{PREFIX}layers.{i}."


def layer_tree(cfg: ModelConfig, i: int) -> tuple[Leaf, ...]:
    """Layer ``i``'s tensors (names after `layer_prefix`): norms, its mixer's (attention or GDN), then its
    MoE block's."""
    h, fp, bf, t = cfg.hidden_size, Kind.FP8, Kind.BF16, Kind.TENSOR
    norms = (Leaf("input_layernorm", "input_layernorm.weight", t, (h,), 0.1),
             Leaf("post_attention_layernorm", "post_attention_layernorm.weight", t, (h,), 0.1))
    mixer: tuple[Leaf, ...]
    if cfg.is_full_attention(i):
        d, hq, hkv, a = cfg.head_dim, cfg.num_attention_heads, cfg.num_key_value_heads, "self_attn."
        q_rows = hq * d * (2 if cfg.attn_output_gate else 1)  # per head, D query rows then D gate rows
        mixer = (Leaf("mixer.q_proj", a + "q_proj.weight", fp, (q_rows, h)),
                 Leaf("mixer.k_proj", a + "k_proj.weight", fp, (hkv * d, h)),
                 Leaf("mixer.v_proj", a + "v_proj.weight", fp, (hkv * d, h)),
                 Leaf("mixer.o_proj", a + "o_proj.weight", fp, (h, hq * d)),
                 Leaf("mixer.q_norm", a + "q_norm.weight", t, (d,), 0.1),
                 Leaf("mixer.k_norm", a + "k_norm.weight", t, (d,), 0.1))
    else:
        hv, kk, vd = cfg.linear_num_value_heads, cfg.linear_conv_kernel_dim, cfg.linear_value_dim
        g = "linear_attn."
        mixer = (Leaf("mixer.in_proj_qkv", g + "in_proj_qkv.weight", fp, (cfg.conv_dim, h)),
                 Leaf("mixer.in_proj_z", g + "in_proj_z.weight", fp, (vd, h)),
                 Leaf("mixer.in_proj_b", g + "in_proj_b.weight", bf, (hv, h)),
                 Leaf("mixer.in_proj_a", g + "in_proj_a.weight", bf, (hv, h)),
                 Leaf("mixer.out_proj", g + "out_proj.weight", fp, (h, vd)),
                 Leaf("mixer.conv1d", g + "conv1d.weight", Kind.CONV, (cfg.conv_dim, kk), kk ** -0.5),
                 Leaf("mixer.dt_bias", g + "dt_bias", t, (hv,), 0.5),
                 Leaf("mixer.a_log", g + "A_log", Kind.A_LOG, (hv,)),
                 Leaf("mixer.norm", g + "norm.weight", t, (cfg.linear_value_head_dim,), 0.1, mean=1.0))
    e, inter, sh = cfg.num_experts, cfg.moe_intermediate_size, cfg.shared_expert_intermediate_size
    gate_up = ("gate_proj", "up_proj")
    moe = (Leaf("moe.router", "mlp.gate.weight", bf, (e, h)),
           Leaf("moe.shared_gate", "mlp.shared_expert_gate.weight", bf, (1, h)),
           Leaf("moe.shared_w13", "mlp.shared_expert", fp, (2 * sh, h), parts=gate_up,
                seed="mlp.shared_expert.w13"),
           Leaf("moe.shared_w2", "mlp.shared_expert.down_proj.weight", fp, (h, sh)),
           Leaf("moe.w13", "mlp.experts", fp, (e, 2 * inter, h), parts=gate_up, fused="gate_up_proj",
                seed="mlp.experts.w13"),
           Leaf("moe.w2", "mlp.experts", fp, (e, h, inter), parts=("down_proj",), fused="down_proj",
                seed="mlp.experts.w2"))
    return norms + mixer + moe


def model_tree(cfg: ModelConfig, tied: bool) -> tuple[Leaf, ...]:
    """The tensors outside the layers (full names); no ``lm_head`` when ``tied`` to the embedding."""
    h = cfg.hidden_size
    out = (Leaf("embed", PREFIX + "embed_tokens.weight", Kind.TENSOR, (cfg.vocab_size, h), 1.0),
           Leaf("norm", PREFIX + "norm.weight", Kind.TENSOR, (h,), 0.1))
    return out if tied else (*out, Leaf("lm_head", LM_HEAD, Kind.BF16, (cfg.vocab_size, h), 2.0 * h ** -0.5))


def _under(values: Mapping[str, Any], group: str) -> dict[str, Any]:
    return {k[len(group) + 1:]: v for k, v in values.items() if k.startswith(group + ".")}


def _moe(cfg: ModelConfig, values: Mapping[str, Any]) -> MoEWeights:
    return MoEWeights(**_under(values, "moe"), top_k=cfg.num_experts_per_tok, renormalize=cfg.norm_topk_prob)


def build_weights(cfg: ModelConfig, tied: bool, make: Callable[[Leaf, str], Any]) -> ModelWeights:
    """The containers, each leaf's value ``make(leaf, prefix)`` (a tied ``lm_head`` is the embedding)."""
    layers = []
    for i in range(cfg.num_hidden_layers):
        v = {leaf.field: make(leaf, layer_prefix(i)) for leaf in layer_tree(cfg, i)}
        mixer = (AttentionWeights if cfg.is_full_attention(i) else GDNWeights)(**_under(v, "mixer"))
        layers.append(LayerWeights(input_layernorm=v["input_layernorm"],
                                   post_attention_layernorm=v["post_attention_layernorm"], mixer=mixer,
                                   moe=_moe(cfg, v)))
    m = {leaf.field: make(leaf, "") for leaf in model_tree(cfg, tied)}
    lm_head = m["lm_head"] if "lm_head" in m else Weight(m["embed"])
    return ModelWeights(embed=m["embed"], layers=layers, norm=m["norm"], lm_head=lm_head)


def tree_values(cfg: ModelConfig, w: ModelWeights) -> Iterator[tuple[Leaf, str, Any]]:
    """Every leaf with its prefix and the value ``w`` holds there: the model's, then each layer's."""
    def at(obj: object, field: str) -> Any:
        for attr in field.split("."):
            obj = getattr(obj, attr)
        return obj

    for leaf in model_tree(cfg, cfg.tie_word_embeddings):
        yield leaf, "", at(w, leaf.field)
    for i, layer in enumerate(w.layers):
        for leaf in layer_tree(cfg, i):
            yield leaf, layer_prefix(i), at(layer, leaf.field)


# ---- seeded initialisation ---------------------------------------------------------------------------
def _seed_of(seed: int, name: str) -> int:
    return int.from_bytes(hashlib.sha256(f"{seed}/{name}".encode()).digest()[:8], "little") & ((1 << 63) - 1)


class _Init:
    """Seeded draws (`netra.engine.spec.dflash` draws with it too); with ``fp8_weights``, `draw`
    quantizes the `Kind.FP8` leaves."""

    def __init__(self, seed: int, device: torch.device, block_spread: float = 0.0,
                 fp8_weights: bool = False) -> None:
        self.seed, self.device, self.block_spread, self.fp8_weights = seed, device, block_spread, fp8_weights

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

    def draw(self, leaf: Leaf, prefix: str) -> torch.Tensor | Weight:
        name = prefix + (leaf.seed or leaf.name)
        if leaf.kind.projection:
            quantize = leaf.kind is Kind.FP8 and self.fp8_weights
            *lead, n, k = leaf.shape
            return self.proj(name, n, k, quantize, tuple(lead), leaf.std)
        if leaf.kind is Kind.A_LOG:
            return torch.log(self.uniform(name, leaf.shape, 1.0, 16.0))
        assert leaf.std is not None, leaf
        x = self.randn(name, leaf.shape, leaf.std)
        return (leaf.mean + x if leaf.mean else x).to(BF16)


def seeded_weights(cfg: ModelConfig, seed: int, device: torch.device | str = "cpu",
                   block_spread: float = 0.0) -> ModelWeights:
    """Random weights at the config's shapes; deterministic in (seed, tensor name, device type).

    ``block_spread`` > 0 scales each 128x128 block of an FP8 projection by ``exp(U(-spread, spread))``
    before quantization (0: every block drawn alike, so their scales nearly agree)."""
    init = _Init(seed, torch.device(device), block_spread, cfg.fp8_weights)
    return build_weights(cfg, cfg.tie_word_embeddings, init.draw)


def seeded_moe(cfg: ModelConfig, seed: int, device: torch.device | str, layer: int = 0) -> MoEWeights:
    """Layer ``layer``'s MoE block exactly as `seeded_weights` makes it (the kernel benchmarks' weights)."""
    init = _Init(seed, torch.device(device), fp8_weights=cfg.fp8_weights)
    return _moe(cfg, {leaf.field: init.draw(leaf, layer_prefix(layer)) for leaf in layer_tree(cfg, layer)
                      if leaf.field.startswith("moe.")})


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
