"""`netra checkpoint synth --drafter`: the preset's seeded DFlash drafter in z-lab's format beside the
synthesized target, readable by our loader and by the reference (PyPI ``dflash``), and fitting the target."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from dflash.model import DFlashDraftModel

from netra import cli
from netra.checkpoint.synth import DFLASH_MASK, synth_config
from netra.checkpoint.tokenizer import added_tokens
from netra.engine.config import ModelConfig
from netra.engine.loader import load_checkpoint
from netra.engine.spec.dflash import (
    DFlashDrafter,
    dflash_preset,
    load_dflash,
    seeded_dflash_weights,
    state_dict,
)


def test_cli_writes_the_drafter_beside_the_target(tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    out = tmp_path / "ck"
    assert cli.main(["checkpoint", "synth", "--out", str(out), "--seed", "3", "--drafter"]) == 0
    assert f"wrote {out / 'drafter'}" in capsys.readouterr().out
    drafter = out / "drafter"
    assert sorted(p.name for p in drafter.iterdir()) == ["config.json", "model.safetensors"]
    raw = json.loads((drafter / "config.json").read_text())
    assert raw["architectures"] == ["DFlashDraftModel"] and raw["dflash_config"] == {
        "block_size": 16, "mask_token_id": 248070, "target_layer_ids": [0, 1]}
    assert (248070, "<|audio_start|>", True) in added_tokens() and DFLASH_MASK == 248070

    cfg, weights = load_dflash(drafter)
    assert cfg == dflash_preset("tiny", synth_config("tiny"), mask_token_id=DFLASH_MASK)
    assert cfg.vocab_size == 248320 and cfg.hidden_size == 128
    cfg.check_target(ModelConfig.from_dir(out))
    want = state_dict(seeded_dflash_weights(cfg, 3))
    got = state_dict(weights)
    assert set(got) == set(want) and all(torch.equal(got[k], want[k]) for k in want)
    ref = DFlashDraftModel.from_pretrained(str(drafter), dtype=torch.float32)
    assert ref.target_layer_ids == [0, 1] and ref.mask_token_id == DFLASH_MASK

    # it drafts over the synthesized target's embedding and lm_head
    tcfg, tw = load_checkpoint(out)
    d = DFlashDrafter(cfg, weights, tw.embed, tw.lm_head, num_slots=2, context_length=32)
    d.admit(1)
    d.extend(torch.tensor([1]), torch.randn(1, 5, cfg.feature_size).to(torch.bfloat16), torch.tensor([5]))
    drafts = d.propose(torch.tensor([1]), torch.tensor([1000]), 16)
    assert drafts.shape == (1, 15) and int(drafts.min()) >= 0 and int(drafts.max()) < tcfg.vocab_size


def test_cli_refuses_a_non_empty_drafter_directory(tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "keep").write_text("")
    args = ["checkpoint", "synth", "--out", str(tmp_path / "ck"), "--drafter", str(tmp_path / "d")]
    assert cli.main(args) == 2
    assert f"{tmp_path / 'd'} exists and is not an empty directory" in capsys.readouterr().out
    assert not (tmp_path / "ck").exists()
