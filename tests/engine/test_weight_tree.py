"""The one weight tree (`netra.engine.weights.layer_tree` / `model_tree`) that seeding, loading and saving
derive from: seeded weights bit-identical to those drawn before the tree existed (digests captured
from the code at a8ac34a, the three hand-written walks), the saved state dict the same tensors, and a
save -> load round trip that gives back every tensor exactly."""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import fields, is_dataclass, replace
from pathlib import Path
from typing import Any

import pytest
import torch

from netra.engine.config import ModelConfig, preset
from netra.engine.loader import CheckpointError, load_checkpoint, save_checkpoint, state_dict
from netra.engine.weights import seeded_moe, seeded_weights

TINY = preset("tiny")
# name: (config, seed, block_spread)
CASES: dict[str, tuple[ModelConfig, int, float]] = {
    "fp8_s0": (TINY, 0, 0.0),
    "fp8_s5": (TINY, 5, 0.0),
    "fp8_s0_spread": (TINY, 0, math.log(2.0)),  # netra.checkpoint.synth.BLOCK_SPREAD
    "bf16_s0": (replace(TINY, fp8_weights=False), 0, 0.0),
    "tied_s5": (replace(TINY, tie_word_embeddings=True), 5, 0.0),
}
# sha256 of `_digest(seeded_weights(...))` and of `_digest(sorted state_dict(...))`, captured at a8ac34a.
WEIGHTS = {
    "fp8_s0": "500c13a4d60e2e0bce26fba340c879c361658e3ab6e50875ab5ed701b4dc2aad",
    "fp8_s5": "1765f5cd42d1427a8d5119213b4e667b789aa58088d9910e00931e9f1a4511d4",
    "fp8_s0_spread": "9a17ba28d6d684dd8339da3a2347ea46efe962f7d6fe1b622994c611647d091d",
    "bf16_s0": "d81a271981917bb734d65cd890f99113ce6e6aa5dde91e02e7506c6ccfb5474f",
    "tied_s5": "615cb9d6292e4459f3671b3da53bdae42e584de15b2eb3b6d7d66690312f9575",
}
STATE = {
    "fp8_s0": "e17eee5e3de1bc3efea4052289f11388d71cc8083ea803922d107bb4eba18464",
    "fp8_s5": "66bc4f98b34a79b412d29f1c2ac9c319484fa4b8f56dda164057cf8a8d457226",
    "fp8_s0_spread": "68512218d0b85ac70a155996e1e10767d86bdfa989d8de90df79fd7b78c8427c",
    "bf16_s0": "d10c5fb5d445731a448034520282d1b5392dfe02807c77529d4c5916239ec8eb",
    "tied_s5": "23c8d328d6c400dbc7b5bb5947a810b419e293ee7efbe46e077a0dce0a5b6772",
}
SEEDED_MOE_L1 = "09b09c52444362ad73a6e79aa389e868d78f14de6452e2171966ba8790c9e18f"


def _walk(h: Any, path: str, obj: object) -> None:
    if isinstance(obj, torch.Tensor):
        t = obj.detach().cpu().contiguous()
        h.update(f"{path}|{t.dtype}|{tuple(t.shape)}\n".encode())
        h.update(t.view(-1).view(torch.uint8).numpy().tobytes())
    elif is_dataclass(obj):
        h.update(f"{path}|{type(obj).__name__}\n".encode())
        for f in fields(obj):
            if not f.name.startswith("_"):  # Weight._dequant: a cache, not the weight
                _walk(h, f"{path}.{f.name}", getattr(obj, f.name))
    elif isinstance(obj, (list, tuple)):
        for i, x in enumerate(obj):
            _walk(h, f"{path}[{i}]", x)
    elif isinstance(obj, dict):
        for k, v in obj.items():
            _walk(h, f"{path}[{k}]", v)
    else:
        h.update(f"{path}={obj!r}\n".encode())


def _digest(obj: object) -> str:
    """Every tensor's place, dtype, shape and bytes (and every other field's value), in order."""
    h = hashlib.sha256()
    _walk(h, "", obj)
    return h.hexdigest()


@pytest.mark.parametrize("case", sorted(CASES))
def test_seeded_weights_and_state_dict_are_bit_identical_to_before(case: str) -> None:
    cfg, seed, spread = CASES[case]
    w = seeded_weights(cfg, seed, "cpu", spread)
    assert _digest(w) == WEIGHTS[case]
    assert _digest(dict(sorted(state_dict(cfg, w).items()))) == STATE[case]


def test_seeded_moe_is_the_layers_block() -> None:
    moe = seeded_moe(TINY, 0, "cpu", layer=1)
    assert _digest(moe) == SEEDED_MOE_L1
    assert _digest(moe) == _digest(seeded_weights(TINY, 0).layers[1].moe)


@pytest.mark.parametrize("case", ["fp8_s0_spread", "bf16_s0", "tied_s5"])
def test_save_load_round_trip_is_exact(case: str, tmp_path: Path) -> None:
    cfg, seed, spread = CASES[case]
    w = seeded_weights(cfg, seed, "cpu", spread)
    save_checkpoint(cfg, w, tmp_path, shard_bytes=300_000)
    got_cfg, got = load_checkpoint(tmp_path)
    assert got_cfg == cfg
    assert _digest(got) == _digest(w)
    quant = json.loads((tmp_path / "config.json").read_text()).get("quantization_config")
    if not cfg.fp8_weights:
        assert quant is None
        return
    per_layer = ["mlp.gate", "mlp.shared_expert_gate"]
    gdn = ["linear_attn.in_proj_a", "linear_attn.in_proj_b"]
    want = {"model.language_model.embed_tokens"} | {
        f"model.language_model.layers.{i}.{m}" for i in range(cfg.num_hidden_layers)
        for m in per_layer + ([] if cfg.is_full_attention(i) else gdn)}
    assert set(quant["modules_to_not_convert"]) == want | (set() if cfg.tie_word_embeddings else {"lm_head"})


def test_loader_names_a_misshapen_scale_and_experts_that_mix_fp8_and_bf16(tmp_path: Path) -> None:
    from safetensors.torch import load_file, save_file

    save_checkpoint(TINY, seeded_weights(TINY, 0), tmp_path)
    f = next(tmp_path.glob("*.safetensors"))
    tensors = load_file(str(f))
    p = "model.language_model.layers.0.mlp."
    good = tensors[p + "shared_expert.up_proj.weight_scale_inv"]
    tensors[p + "shared_expert.up_proj.weight_scale_inv"] = torch.cat([good, good])
    save_file(tensors, str(f))
    with pytest.raises(CheckpointError,
                       match=r"shared_expert\.up_proj\.weight_scale_inv.*shape \(2, 1\), expected \(1, 1\)"):
        load_checkpoint(tmp_path)
    tensors[p + "shared_expert.up_proj.weight_scale_inv"] = good
    tensors[p + "experts.2.up_proj.weight"] = tensors[p + "experts.2.up_proj.weight"].to(torch.bfloat16)
    del tensors[p + "experts.2.up_proj.weight_scale_inv"]
    save_file(tensors, str(f))
    with pytest.raises(CheckpointError, match=r"mix FP8 and BF16"):
        load_checkpoint(tmp_path)
