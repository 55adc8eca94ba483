"""The ``argmax`` domain: the all-greedy branch of SGLang 0.5.23's ``Sampler.forward`` -> Netra op ``argmax``.

When every request of the batch is greedy, ``Sampler.forward`` (sglang/srt/layers/sampler.py) does,
for a batch that asks for no logprobs, no sampling mask and no pre-watermark logits, on CUDA without
aiter::

    logits = logits_output.next_token_logits
    maybe_detect_nan(logits, "sampler: next_token_logits")
    logits = self._preprocess_logits(logits, sampling_info)
    batch_next_token_ids = torch.argmax(logits, -1)
    self._sync_token_ids_across_tp(batch_next_token_ids, sampling_info)
    return batch_next_token_ids

(plus ``_trace_e2e_sampler`` prints, off unless ``SGLANG_TRACE_SAMPLER_E2E``). The hook runs the
same steps with SGLang's own methods, ``torch.argmax`` replaced by Netra's tactic (which returns
``torch.argmax``'s indices exactly, int64). Any other batch (a non-greedy request, logprobs, a custom
logit processor, a sampling mask, tracing, ROCm/aiter) calls the original. The logits' shape, dtype
and layout are the contract's (`netra.ops.argmax.signature`); custom logit processors are left to
the original, so the in-place NaN sanitising is the only preprocessing the hooked path sees and the
logits keep the shape, dtype and layout dispatch decided on.
"""

from __future__ import annotations

import inspect
from typing import Any

from netra.plugins.sglang import REQUIRED, bind_call, capturing, recorder

DOMAIN = "argmax"
OP = "argmax"

# Sampler.forward's parameters in the pinned source (``logprob_logits`` is keyword-only there).
PARAMS: tuple[tuple[str, Any], ...] = (
    ("self", REQUIRED), ("logits_output", REQUIRED), ("sampling_info", REQUIRED), ("return_logprob", REQUIRED),
    ("top_logprobs_nums", REQUIRED), ("token_ids_logprobs", REQUIRED), ("positions", REQUIRED),
    ("logprob_logits", None),
)
# What the hook reads (tests/plugins/test_sglang_source.py checks each against the wheel's files).
SAMPLING_INFO_FIELDS = ("is_all_greedy", "sampling_mask_batch_indices", "has_custom_logit_processor")
LOGITS_OUTPUT_FIELDS = ("next_token_logits",)
SAMPLER_METHODS = ("_preprocess_logits", "_sync_token_ids_across_tp")
MODULE_GLOBALS = ("_is_hip", "_use_aiter", "envs", "maybe_detect_nan")
ENV_FLAGS = ("SGLANG_TRACE_SAMPLER_E2E",)

_prepared: dict[Any, str] = {}


def guard(original: Any, call: dict[str, Any]) -> str | None:
    """Why this batch is not the all-greedy argmax case (None when it is); flags only, no values."""
    info = call["sampling_info"]
    if not getattr(info, "is_all_greedy", False):
        return "not every request is greedy"
    if call["return_logprob"]:
        return "logprobs requested"
    if call["logprob_logits"] is not None:
        return "pre-watermark logprob logits given"
    if getattr(info, "sampling_mask_batch_indices", None) is not None:
        return "sampling mask requested"
    if getattr(info, "has_custom_logit_processor", True):
        return "custom logit processor"
    g = inspect.unwrap(original).__globals__
    missing = [name for name in MODULE_GLOBALS if name not in g]
    if missing:
        return f"SGLang's sampler module has no {missing}"
    if g["_is_hip"] or g["_use_aiter"]:
        return "ROCm sampler path"
    for flag in ENV_FLAGS:
        if getattr(g["envs"], flag).get():
            return f"{flag} is set"
    import torch

    logits = getattr(call["logits_output"], "next_token_logits", None)
    if not isinstance(logits, torch.Tensor) or logits.dim() != 2:
        return "next_token_logits is not a [batch, vocab] tensor"
    return None


def hook(original: Any, *args: Any, **kwargs: Any) -> Any:
    """AROUND hook on ``Sampler.forward``: Netra's argmax for an all-greedy batch in contract."""
    from netra import dispatch
    from netra.ops import argmax as argmax_op

    rec = recorder()
    call = bind_call(PARAMS, args, kwargs)
    why = call if isinstance(call, str) else guard(original, call)
    if why is not None:
        rec.miss(DOMAIN, why)
        return original(*args, **kwargs)
    assert isinstance(call, dict)
    logits = call["logits_output"].next_token_logits
    if logits.device not in _prepared:
        if capturing():
            rec.miss(DOMAIN, "tactics not prepared: the first call is inside a CUDA graph capture")
            return original(*args, **kwargs)
        if logits.is_cuda:
            try:
                _prepared[logits.device] = "; ".join(argmax_op.prepare(logits.device))
            except Exception as exc:
                rec.fail(f"argmax prepare failed: {type(exc).__name__}: {exc}")
                raise
        else:
            _prepared[logits.device] = "no tactic on the CPU"
        rec.set_prepared(DOMAIN, _prepared[logits.device])
    decision = dispatch.select(argmax_op.signature(logits))
    if decision.tactic is None:
        rec.miss(DOMAIN, decision.reason)
        return original(*args, **kwargs)
    sampler, info = call["self"], call["sampling_info"]
    g = inspect.unwrap(original).__globals__
    g["maybe_detect_nan"](logits, "sampler: next_token_logits")
    processed = sampler._preprocess_logits(logits, info)
    if processed is not logits:  # not 0.5.23's in-place preprocessing: decide again on what argmax reads
        decision = dispatch.select(argmax_op.signature(processed))
    if decision.tactic is None:
        ids = processed.argmax(-1)  # exactly the original's torch.argmax on the preprocessed logits
        rec.miss(DOMAIN, decision.reason)
    else:
        import torch

        ids = argmax_op.launch(decision.tactic, processed,
                               torch.empty(processed.shape[:-1], dtype=torch.int64, device=processed.device))
        rec.hit(DOMAIN)
    sampler._sync_token_ids_across_tp(ids, info)
    return ids


def reset() -> None:
    _prepared.clear()
