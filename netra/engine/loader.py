"""Hugging Face-format checkpoints: ``config.json`` + ``*.safetensors``, text weights under
``model.language_model.layers.N.*`` (the ``Qwen3_5MoeForConditionalGeneration`` layout), FP8 E4M3
projections with ``weight_scale_inv`` 128x128 block scales.

`load_checkpoint` builds the engine's `ModelWeights` (experts stacked per layer, gate and up
concatenated); `save_checkpoint` writes the same layout (per-expert tensors), which is how the
tests make a small checkpoint and how seeded weights can be exported. Both walk the weight tree of
`netra.engine.weights` (`layer_tree`, `model_tree`): what each tensor is called, its shape and kind.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch

from netra.engine.config import ConfigError, ModelConfig
from netra.engine.weights import LM_HEAD, Kind, Leaf, ModelWeights, build_weights, tree_values
from netra.ops import fp8
from netra.ops.linear import Weight


class CheckpointError(ValueError):
    pass


IGNORED_SUFFIXES = (".k_scale", ".v_scale", ".input_scale")


# ---- save ------------------------------------------------------------------------------------------
def _put(out: dict[str, torch.Tensor], name: str, w: Weight) -> None:
    out[name] = w.data.contiguous()
    if w.scale_inv is not None:
        out[name + "_scale_inv"] = w.scale_inv.contiguous()


def _rows(w: Weight, lo: int, hi: int, e: int | None = None) -> Weight:
    """Rows [lo, hi) of a projection (of expert e), with the matching block-scale rows."""
    data = w.data if e is None else w.data[e]
    scale = None
    if w.scale_inv is not None:
        s = w.scale_inv if e is None else w.scale_inv[e]
        scale = s[lo // w.block[0]:-(-hi // w.block[0])]
    return Weight(data[lo:hi], scale)


def state_dict(cfg: ModelConfig, w: ModelWeights) -> dict[str, torch.Tensor]:
    """``w`` under the checkpoint's names (per-expert tensors, gate and up apart, conv1d ``[C, 1, K]``)."""
    out: dict[str, torch.Tensor] = {}
    for leaf, prefix, value in tree_values(cfg, w):
        if leaf.kind is Kind.CONV:
            out[prefix + leaf.name] = value[:, None, :].contiguous()
        elif not leaf.kind.projection:
            out[prefix + leaf.name] = value
        else:
            for e, blocks in enumerate(leaf.blocks(prefix)):
                for name, lo, hi in blocks:
                    _put(out, name, _rows(value, lo, hi, e if leaf.experts else None))
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

    def weight(self, name: str, shape: tuple[int, ...], scale: str = "") -> Weight:
        """The projection ``name`` (``[..., N, K]``): BF16 (from BF16, FP16 or FP32), or E4M3 with its
        ``[..., N/128, K/128]`` block scales ``scale`` (default ``name + "_scale_inv"``)."""
        data = self.get(name, shape)
        if data.dtype == fp8.E4M3:
            *lead, n, k = shape
            blocks = (*lead, -(-n // fp8.BLOCK), -(-k // fp8.BLOCK))
            return Weight(data, self.get(scale or name + "_scale_inv", blocks).float())
        if data.dtype not in (torch.bfloat16, torch.float16, torch.float32):
            raise CheckpointError(f"tensor {name!r}: unsupported dtype {data.dtype}")
        return Weight(data.to(torch.bfloat16))

    def projection(self, leaf: Leaf, prefix: str) -> Weight:
        """A projection of the tree: one tensor, or its row blocks concatenated (per expert, then
        stacked), or the experts' fused tensor (transformers v5: ``gate_up_proj [E, 2I, H]``, gate rows
        first; ``down_proj [E, H, I]``; scales ``name_scale_inv`` or ``name.weight_scale_inv``)."""
        fused = f"{prefix}{leaf.name}.{leaf.fused}"
        if leaf.fused and self.has(fused):
            return self.weight(fused, leaf.shape, fused + "_scale_inv" if self.has(fused + "_scale_inv")
                               else fused + ".weight_scale_inv")
        k = leaf.shape[-1]
        per = [[self.weight(name, (hi - lo, k)) for name, lo, hi in row] for row in leaf.blocks(prefix)]
        if len(per) == 1 and len(per[0]) == 1:
            return per[0][0]
        if any(w.is_fp8 != per[0][0].is_fp8 for row in per for w in row):
            raise CheckpointError(f"the tensors of {prefix + leaf.name!r} mix FP8 and BF16 weights")
        data = [torch.cat([w.data for w in row]) for row in per]
        scale = [torch.cat([w.scale_inv for w in row if w.scale_inv is not None]) for row in per] \
            if per[0][0].is_fp8 else None
        if not leaf.experts:
            return Weight(data[0], None if scale is None else scale[0])
        return Weight(torch.stack(data), None if scale is None else torch.stack(scale))

    def leaf(self, leaf: Leaf, prefix: str) -> torch.Tensor | Weight:
        """A leaf of the tree as the engine holds it (`build_weights`' ``make``): shapes checked, the
        tensors marked used, BF16 but ``A_log`` (FP32)."""
        name = prefix + leaf.name
        if leaf.kind.projection:
            return self.projection(leaf, prefix)
        if leaf.kind is Kind.CONV:
            return self.get(name, (leaf.shape[0], 1, *leaf.shape[1:]))[:, 0].to(torch.bfloat16)
        t = self.get(name, leaf.shape)
        return t.float() if leaf.kind is Kind.A_LOG else t.to(torch.bfloat16)


def load_checkpoint(path: Path, device: torch.device | str = "cpu") -> tuple[ModelConfig, ModelWeights]:
    """Read a checkpoint directory; a missing tensor, a wrong shape or an unused tensor is an error."""
    try:
        cfg = ModelConfig.from_dir(path)
    except ConfigError as exc:
        raise CheckpointError(str(exc)) from exc
    r = _Reader(path, torch.device(device))
    weights = build_weights(cfg, cfg.tie_word_embeddings or not r.has(LM_HEAD), r.leaf)
    # Vision tower, MTP head and rotary buffers are not part of the text model; static activation /
    # KV scales are not used (dynamic activation quantization, KV scale 1.0), as SGLang skips them.
    unused = sorted(k for k in r._where if k not in r.used and not k.startswith(("model.visual.", "mtp.", "visual."))
                    and "rotary_emb" not in k and not k.endswith(IGNORED_SUFFIXES))
    if unused:
        raise CheckpointError(f"checkpoint has {len(unused)} tensors the model does not use, e.g. {unused[:3]}")
    return cfg, weights
