"""Row argmax over the last dim (greedy sampling over the vocabulary).

``argmax(x)`` returns ``torch.argmax(x, dim=-1)`` exactly: NaN beats every number and the first
NaN wins; equal values give the lowest index; +0.0 equals -0.0; infinities keep their order.

Contract (kernels/sm90/argmax/*.contract.json): sm90, float32 or bfloat16 ``x`` of shape
[rows, 248320], rows 1..256, contiguous with a 16-byte-aligned base, eager or graph capture.
Anything else (CPU tensors, other shapes/dtypes/layouts, NETRA_DISABLE_TACTICS=1) runs the fallback,
``torch.argmax``, with the reason logged once.
"""

from __future__ import annotations

from typing import Any

from netra.contract import Signature

OP = "argmax"
VOCAB = 248320


def argmax_ref(x: Any) -> Any:
    """The oracle: plain PyTorch on an fp32 upcast (exact for bf16), int64 indices."""
    import torch

    return torch.argmax(x.to(torch.float32), dim=-1)


def signature(x: Any) -> Signature:
    rows = 1
    for d in x.shape[:-1]:
        rows *= int(d)
    params = {"rows": rows, "vocab": int(x.shape[-1]) if x.dim() else 0}
    return Signature.of(op=OP, tensors={"x": x}, params=params)


def explain_signatures() -> list[tuple[str, Signature]]:
    """An in-contract and out-of-contract example per case `netra explain` shows."""
    def sig(target: str, rows: int, vocab: int, dtype: str, layout: str = "contiguous_align16",
            phase: str = "eager") -> Signature:
        return Signature(target=target, op=OP, dims=(("rows", rows), ("vocab", vocab)),
                         dtypes=(("x", dtype),), layouts=(("x", layout),), graph_phase=phase)

    return [
        ("in-contract fp32 decode batch", sig("sm90", 16, VOCAB, "float32", phase="capture")),
        ("in-contract bf16", sig("sm90", 128, VOCAB, "bfloat16")),
        ("out: other vocab", sig("sm90", 16, 151936, "float32")),
        ("out: fp16", sig("sm90", 16, VOCAB, "float16")),
        ("out: 512 rows", sig("sm90", 512, VOCAB, "float32")),
        ("out: strided", sig("sm90", 16, VOCAB, "float32", layout="strided")),
        ("out: cpu", sig("cpu", 16, VOCAB, "float32")),
        ("gfx950", sig("gfx950", 16, VOCAB, "float32")),
    ]
