from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from netra.engine.engine import build_engine
from netra.engine.loader import CheckpointError, load_checkpoint, save_checkpoint
from netra.engine.options import EngineOptions
from netra.engine.request import Output, Request, SamplingParams
from netra.engine.weights import seeded_weights


def _generate(opts: EngineOptions, prompts: list[list[int]]) -> list[list[int]]:
    e = build_engine(opts)
    got: dict[str, list[int]] = {}

    def sink(out: Output) -> None:
        got.setdefault(out.rid, []).extend(out.new_ids)

    for i, p in enumerate(prompts):
        e.scheduler.submit(Request(str(i), p, SamplingParams(max_new_tokens=10, temperature=0.0, ignore_eos=True), sink))
    e.scheduler.run_until_idle()
    return [got[str(i)] for i in range(len(prompts))]


def test_checkpoint_reproduces_seeded_model(tmp_path: Path) -> None:
    opts = EngineOptions(preset="tiny", seed=5, context_length=256, max_running_requests=4)
    e = build_engine(opts)
    save_checkpoint(e.config, seeded_weights(e.config, 5), tmp_path, shard_bytes=400_000)
    assert len(list(tmp_path.glob("*.safetensors"))) > 1  # sharded
    cfg = json.loads((tmp_path / "config.json").read_text())
    assert cfg["architectures"] == ["Qwen3_5MoeForConditionalGeneration"]
    assert cfg["quantization_config"]["weight_block_size"] == [128, 128]
    tensors = {}
    for f in tmp_path.glob("*.safetensors"):
        tensors.update(load_file(str(f)))
    w = tensors["model.language_model.layers.0.mlp.experts.3.gate_proj.weight"]
    assert w.dtype == torch.float8_e4m3fn and w.shape == (128, 128)
    assert tensors["model.language_model.layers.0.mlp.experts.3.gate_proj.weight_scale_inv"].shape == (1, 1)
    assert tensors["model.language_model.layers.0.linear_attn.conv1d.weight"].shape == (256, 1, 4)
    assert tensors["model.language_model.layers.2.self_attn.q_proj.weight"].shape == (256, 128)
    prompts = [[1, 2, 3, 4], list(range(60, 100))]
    seeded = _generate(opts, prompts)
    loaded = _generate(EngineOptions(checkpoint=str(tmp_path), seed=999, context_length=256, max_running_requests=4),
                       prompts)
    assert seeded == loaded
    other = _generate(EngineOptions(preset="tiny", seed=6, context_length=256, max_running_requests=4), prompts)
    assert other != seeded


def test_loader_names_missing_and_misshapen_tensors(tmp_path: Path) -> None:
    e = build_engine(EngineOptions(context_length=64, max_running_requests=1))
    save_checkpoint(e.config, seeded_weights(e.config, 0), tmp_path)
    f = next(tmp_path.glob("*.safetensors"))
    tensors = load_file(str(f))
    name = "model.language_model.layers.1.linear_attn.A_log"
    a_log = tensors.pop(name)
    save_file(tensors, str(f))
    with pytest.raises(CheckpointError, match=r"layers\.1\.linear_attn\.A_log"):
        load_checkpoint(tmp_path)
    tensors[name] = torch.cat([a_log, a_log])
    save_file(tensors, str(f))
    with pytest.raises(CheckpointError, match=r"A_log.*shape \(8,\), expected \(4,\)"):
        load_checkpoint(tmp_path)
    tensors[name] = a_log
    tensors["model.language_model.layers.9.mlp.gate.weight"] = a_log.clone()
    save_file(tensors, str(f))
    with pytest.raises(CheckpointError, match="does not use"):
        load_checkpoint(tmp_path)


def test_checkpoint_tokenizer_json_is_used(tmp_path: Path) -> None:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    from netra.tokenizers import HFTokenizer

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=262, special_tokens=["<|endoftext|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(["hello world, the engine says hello"] * 20, trainer)
    e = build_engine(EngineOptions(context_length=64, max_running_requests=1))
    save_checkpoint(e.config, seeded_weights(e.config, 0), tmp_path)
    tok.save(str(tmp_path / "tokenizer.json"))
    loaded = build_engine(EngineOptions(checkpoint=str(tmp_path), context_length=64, max_running_requests=1))
    assert isinstance(loaded.tokenizer, HFTokenizer)
    ids = loaded.tokenizer.encode("hello world")
    assert ids == tok.encode("hello world").ids and all(i < 262 for i in ids)
    assert loaded.tokenizer.decode(ids) == "hello world"
    # an incomplete multi-byte character is held back until it completes
    euro = loaded.tokenizer.encode("€")
    assert len(euro) == 3 and loaded.tokenizer.decode(euro[:2], final=False) == ""
    assert loaded.tokenizer.decode(euro) == "€"


def test_fused_expert_layout_loads_the_same_model(tmp_path: Path) -> None:
    e = build_engine(EngineOptions(context_length=64, max_running_requests=1))
    save_checkpoint(e.config, seeded_weights(e.config, 0), tmp_path)
    f = next(tmp_path.glob("*.safetensors"))
    tensors = load_file(str(f))
    for layer in range(e.config.num_hidden_layers):
        p = f"model.language_model.layers.{layer}.mlp.experts."
        n = e.config.num_experts
        for suffix in ("weight", "weight_scale_inv"):
            gate_up = [torch.cat([tensors.pop(f"{p}{x}.gate_proj.{suffix}"), tensors.pop(f"{p}{x}.up_proj.{suffix}")])
                       for x in range(n)]
            down = [tensors.pop(f"{p}{x}.down_proj.{suffix}") for x in range(n)]
            tail = "" if suffix == "weight" else "_scale_inv"
            tensors[f"{p}gate_up_proj{tail}"] = torch.stack(gate_up)
            tensors[f"{p}down_proj{tail}"] = torch.stack(down)
    save_file(tensors, str(f))
    _, fused = load_checkpoint(tmp_path)
    ref = seeded_weights(e.config, 0)
    for a, b in ((fused.layers[1].moe.w13, ref.layers[1].moe.w13), (fused.layers[2].moe.w2, ref.layers[2].moe.w2)):
        assert torch.equal(a.data.view(torch.uint8), b.data.view(torch.uint8))
        assert torch.equal(a.scale_inv, b.scale_inv)
