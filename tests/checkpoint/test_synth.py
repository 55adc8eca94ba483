"""The synthesized checkpoint: Qwen3.6-35B-A3B-FP8's files and facts, the real vocabulary, and weights
the engine's loader reads back exactly as they were drawn."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors import safe_open

from netra import cli
from netra.checkpoint.synth import BLOCK_SPREAD, GENERATION_CONFIG, VOCAB_ROWS, synth_config
from netra.engine.loader import load_checkpoint, state_dict
from netra.engine.weights import seeded_weights
from netra.ops import fp8
from netra.resources import data_path


def test_config_and_side_files(qwen36_checkpoint: Path) -> None:
    cfg = json.loads((qwen36_checkpoint / "config.json").read_text())
    assert cfg["architectures"] == ["Qwen3_5MoeForConditionalGeneration"] and cfg["model_type"] == "qwen3_5_moe"
    text = cfg["text_config"]
    assert text["vocab_size"] == VOCAB_ROWS == 248320 and text["eos_token_id"] == 248044
    assert text["model_type"] == "qwen3_5_moe_text"
    q = cfg["quantization_config"]
    assert {k: q[k] for k in ("quant_method", "fmt", "activation_scheme", "weight_block_size")} == {
        "quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic", "weight_block_size": [128, 128]}
    gen = json.loads((qwen36_checkpoint / "generation_config.json").read_text())
    assert gen == GENERATION_CONFIG and gen["eos_token_id"] == [248046, 248044]
    tc = json.loads((qwen36_checkpoint / "tokenizer_config.json").read_text())
    assert tc["eos_token"] == "<|im_end|>" and tc["pad_token"] == "<|endoftext|>" and tc["bos_token"] is None
    assert tc["tokenizer_class"] == "Qwen2Tokenizer"
    tok = json.loads((qwen36_checkpoint / "tokenizer.json").read_text())
    assert {str(t["id"]): (t["content"], t["special"]) for t in tok["added_tokens"]} == {
        k: (v["content"], v["special"]) for k, v in tc["added_tokens_decoder"].items()}
    assert len(tc["added_tokens_decoder"]) == 33 and tc["added_tokens_decoder"]["248068"]["special"] is False
    assert (qwen36_checkpoint / "chat_template.jinja").read_text() == \
        data_path("models", "qwen3_6", "chat_template.jinja").read_text()


def test_modules_to_not_convert_are_exactly_the_bf16_matrices(qwen36_checkpoint: Path) -> None:
    listed = set(json.loads((qwen36_checkpoint / "config.json").read_text())
                 ["quantization_config"]["modules_to_not_convert"])
    bf16, fp8_modules = set(), set()
    for f in qwen36_checkpoint.glob("*.safetensors"):
        with safe_open(str(f), framework="pt") as h:
            for name in h.keys():  # noqa: SIM118
                t = h.get_slice(name)
                if name.endswith(".weight") and len(t.get_shape()) == 2:
                    (fp8_modules if t.get_dtype() == "F8_E4M3" else bf16).add(name[:-len(".weight")])
    assert listed == bf16
    assert {"lm_head", "model.language_model.embed_tokens", "model.language_model.layers.0.mlp.gate",
            "model.language_model.layers.0.mlp.shared_expert_gate", "model.language_model.layers.0.linear_attn.in_proj_a",
            "model.language_model.layers.0.linear_attn.in_proj_b"} <= listed
    assert "model.language_model.layers.0.linear_attn.in_proj_qkv" in fp8_modules
    assert "model.language_model.layers.2.mlp.experts.7.down_proj" in fp8_modules


def test_loader_reads_back_the_seeded_weights(qwen36_checkpoint: Path) -> None:
    cfg, weights = load_checkpoint(qwen36_checkpoint)
    assert cfg.vocab_size == 248320 and cfg.fp8_weights
    want = state_dict(synth_config("tiny"), seeded_weights(synth_config("tiny"), 0, "cpu", BLOCK_SPREAD))
    got = state_dict(cfg, weights)
    assert set(got) == set(want)
    scales = torch.cat([t.flatten() for n, t in got.items() if n.startswith("model.language_model.layers.0.mlp.experts.")
                        and n.endswith("_scale_inv")])
    assert len(scales) == 24 and float(scales.max() / scales.min()) > 2  # the blocks' scales differ
    for name, t in want.items():
        a, b = got[name], t
        if a.dtype == fp8.E4M3:
            a, b = a.view(torch.uint8), b.view(torch.uint8)
        assert torch.equal(a.float(), b.float()), name


def test_cli_writes_a_directory_and_refuses_a_non_empty_one(tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    (tmp_path / "x").mkdir()
    (tmp_path / "x" / "keep").write_text("")
    assert cli.main(["checkpoint", "synth", "--out", str(tmp_path / "x")]) == 2
    assert "not an empty directory" in capsys.readouterr().out
