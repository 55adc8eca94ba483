"""Plain-Python oracles shared by tests at several layers (no torch, no engine code)."""

from __future__ import annotations

import math

from netra.engine.request import SamplingParams


def penalized(logits: list[float], history: list[int], p: SamplingParams, eos: int) -> list[float]:
    """The logits a request samples from, as SGLang 0.5.23 orders the steps, one token at a time:
    frequency and presence over the generated tokens, stop tokens banned before min_new_tokens,
    the repetition penalty on generated tokens, then logit_bias."""
    out = []
    bias = dict(p.logit_bias)
    stops = {eos, *p.stop_token_ids}
    for t, x in enumerate(logits):
        n = history.count(t)
        x = x - p.frequency_penalty * n - p.presence_penalty * (1 if n else 0)
        if len(history) < p.min_new_tokens and t in stops:
            x = -math.inf
        if n:
            x = x * p.repetition_penalty if x < 0 else x / p.repetition_penalty
        out.append(x + bias.get(t, 0.0))
    return out
