"""A Hugging Face checkpoint in Qwen3.6-35B-A3B-FP8's layout at a preset's dimensions, with seeded weights
and the real vocabulary: what every path that reads a checkpoint (loader, tokenizer, chat template,
stop tokens, structured output, the response layer) can meet on a machine without the real weights.

The directory holds what the released checkpoint's text side holds:

* ``config.json``: ``Qwen3_5MoeForConditionalGeneration``, the text config under ``text_config``
  (vocabulary of 248,320 rows, ``eos_token_id`` 248044 ``<|endoftext|>``), the FP8 block-scaled
  ``quantization_config`` with the BF16 modules in ``modules_to_not_convert``;
* ``model-0000N-of-0000M.safetensors`` + index: ``netra.engine.loader.save_checkpoint`` of
  ``netra.engine.weights.seeded_weights`` (per-expert tensors, E4M3 with 128x128 ``weight_scale_inv``,
  block magnitudes spread so that the scales differ from block to block);
* ``generation_config.json``: the stop ids ``[<|im_end|>, <|endoftext|>]`` and the sampling defaults;
* ``tokenizer.json`` (`netra.checkpoint.tokenizer`), ``tokenizer_config.json`` and
  ``chat_template.jinja`` (Netra's fixture ``models/qwen3_6/chat_template.jinja``).

With ``drafter``, `synthesize` also writes the preset's seeded DFlash drafter in z-lab's format
(`synthesize_drafter`: ``config.json`` with ``dflash_config`` + ``model.safetensors``, the shapes of
``netra.engine.spec.dflash.DFLASH_PRESETS`` at the real vocabulary, mask token 248070), as
``z-lab/Qwen3.6-35B-A3B-DFlash`` sits beside the target.

`cached_checkpoint` makes one per machine under ``$NETRA_CACHE_DIR/checkpoints``, keyed by every
input (the preset, the seed, the tokenizer source, the template and the code that writes the
weights), written to a temporary directory and renamed into place, so concurrent callers share it.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import shutil
import tempfile
from dataclasses import replace
from pathlib import Path
from typing import Any

from netra.engine.config import ModelConfig, preset

# Bumped whenever the directory's contents change in a way the key below does not see.
SYNTH_VERSION = 1

# The embedding / lm_head rows of Qwen3.5/3.6 (248,077 ids used: 248,044 ranks + 33 added tokens).
VOCAB_ROWS = 248320
ENDOFTEXT, IM_START, IM_END = 248044, 248045, 248046
# z-lab/Qwen3.6-35B-A3B-DFlash's dflash_config.mask_token_id (a token of the real vocabulary).
DFLASH_MASK = 248070
# Qwen3.6-35B-A3B's generation_config.json.
GENERATION_CONFIG: dict[str, Any] = {
    "bos_token_id": ENDOFTEXT, "do_sample": True, "eos_token_id": [IM_END, ENDOFTEXT], "pad_token_id": ENDOFTEXT,
    "temperature": 1.0, "top_k": 20, "top_p": 0.95,
}
TEMPLATE = ("models", "qwen3_6", "chat_template.jinja")
# Block magnitudes of the FP8 projections spread over [1/2, 2] (seeded_weights' block_spread): a
# released checkpoint's block scales differ from block to block, and so do these, so a scale applied
# to the wrong block is visible in the logits (tests/engine/test_hf_parity.py).
BLOCK_SPREAD = math.log(2.0)


def synth_config(preset_name: str) -> ModelConfig:
    """The preset's dimensions with the real vocabulary and the text config's stop id."""
    return replace(preset(preset_name), vocab_size=VOCAB_ROWS, eos_token_id=(ENDOFTEXT,), tie_word_embeddings=False)


def chat_template() -> str:
    from netra.resources import require_data

    return require_data(*TEMPLATE).read_text()


def tokenizer_config(added: list[tuple[int, str, bool]], model_max_length: int) -> dict[str, Any]:
    """``tokenizer_config.json``: the added tokens with their special flags, ChatML's end of turn as EOS."""
    return {
        "add_prefix_space": False,
        "added_tokens_decoder": {str(tid): {"content": content, "lstrip": False, "normalized": False, "rstrip": False,
                                            "single_word": False, "special": special}
                                 for tid, content, special in added},
        "bos_token": None,
        "clean_up_tokenization_spaces": False,
        "eos_token": "<|im_end|>",
        "errors": "replace",
        "model_max_length": model_max_length,
        "pad_token": "<|endoftext|>",
        "split_special_tokens": False,
        "tokenizer_class": "Qwen2Tokenizer",
        "unk_token": None,
    }


def synthesize_drafter(out: Path, preset_name: str = "tiny", seed: int = 0) -> Path:
    """Write the preset's seeded DFlash drafter for the synthesized target (module docstring) to ``out``."""
    from netra.engine.spec.dflash import dflash_preset, save_dflash, seeded_dflash_weights

    cfg = dflash_preset(preset_name, synth_config(preset_name), mask_token_id=DFLASH_MASK)
    return save_dflash(out, cfg, seeded_dflash_weights(cfg, seed))


def synthesize(out: Path, preset_name: str = "tiny", seed: int = 0, drafter: Path | None = None) -> Path:
    """Write the checkpoint directory ``out`` (module docstring), and the drafter directory ``drafter``
    when given; returns ``out``."""
    from netra.checkpoint.tokenizer import added_tokens, qwen36_tokenizer_json
    from netra.engine.loader import save_checkpoint
    from netra.engine.weights import seeded_weights

    cfg = synth_config(preset_name)
    tokenizer_json = qwen36_tokenizer_json()
    added = added_tokens()
    out.mkdir(parents=True, exist_ok=True)
    save_checkpoint(cfg, seeded_weights(cfg, seed, "cpu", BLOCK_SPREAD), out)
    (out / "generation_config.json").write_text(json.dumps(GENERATION_CONFIG, indent=2) + "\n")
    shutil.copyfile(tokenizer_json, out / "tokenizer.json")
    (out / "tokenizer_config.json").write_text(
        json.dumps(tokenizer_config(added, cfg.max_position_embeddings), indent=2) + "\n")
    (out / "chat_template.jinja").write_text(chat_template())
    if drafter is not None:
        synthesize_drafter(drafter, preset_name, seed)
    return out


def cache_key(preset_name: str, seed: int) -> str:
    """sha256 over every input of `synthesize`: its version, the config it writes, the seed, the tokenizer
    source and converter, the template, and the sources of the code that draws, quantizes and writes the
    weights."""
    from netra.checkpoint import tokenizer
    from netra.engine import loader, weights
    from netra.ops import fp8

    h = hashlib.sha256()
    h.update(f"synth-v{SYNTH_VERSION}/seed-{seed}/converter-{tokenizer.CONVERTER_VERSION}\n".encode())
    h.update(json.dumps(synth_config(preset_name).to_hf(), sort_keys=True).encode())
    h.update(tokenizer.sha256_file(tokenizer.tiktoken_file()).encode())
    h.update(chat_template().encode())
    for module in (loader, weights, fp8, tokenizer):
        h.update(Path(str(module.__file__)).read_bytes())
    h.update(Path(__file__).read_bytes())
    return h.hexdigest()


def cached_checkpoint(preset_name: str = "tiny", seed: int = 0, cache_dir: Path | None = None) -> Path:
    """The synthesized checkpoint of (preset, seed), made once per machine (module docstring)."""
    from netra.checkpoint.tokenizer import cache_root

    root = cache_dir if cache_dir is not None else cache_root() / "checkpoints"
    final = root / f"qwen36-{preset_name}-s{seed}-{cache_key(preset_name, seed)[:16]}"
    if (final / "config.json").is_file():
        return final
    root.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}-", dir=root))
    tmp.chmod(0o755)  # mkdtemp makes it private; the finished checkpoint is an ordinary directory
    try:
        synthesize(tmp, preset_name, seed)
        try:
            os.rename(tmp, final)
        except OSError:
            if not (final / "config.json").is_file():  # not a concurrent writer's finished copy
                raise
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return final
