"""Private helpers shared by the engine's op families: the dispatch hook and the reference's accumulator.

`route` is the one place an op asks Netra dispatch for a tactic. It caches the decision per cheap
call key (op, dtypes, devices, layout, integer dims) so that the per-call cost on the fallback path
is a tuple build and a dict lookup, not a `Signature` construction. A launcher for a tactic is
registered by the kernel side with `bind(op, launcher)`; a tactic selected for an op that has no
bound launcher is an error (a deployment that promotes a tactic must be able to run it), never a
silent fallback.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import torch

from netra import dispatch
from netra.contract import Signature

Launcher = Callable[..., Any]

_decisions: dict[tuple[Any, ...], dispatch.Decision] = {}
_launchers: dict[str, Launcher] = {}


class TacticBindingError(RuntimeError):
    pass


def bind(op: str, launcher: Launcher) -> None:
    """Register how to launch the selected tactic of ``op``: ``launcher(decision, **call_args)``."""
    _launchers[op] = launcher


def _key(op: str, tensors: dict[str, torch.Tensor], params: dict[str, int], quant: str,
         reduction_order: str) -> tuple[Any, ...]:
    parts: list[Any] = [op, quant, reduction_order, tuple(params.items())]
    capturing = False
    for name, t in tensors.items():
        parts.append((name, t.dtype, t.device, t.is_contiguous(), t.data_ptr() % 16 == 0))
        if t.is_cuda:
            capturing = torch.cuda.is_current_stream_capturing()
    parts.append(capturing)
    return tuple(parts)


def route(op: str, tensors: dict[str, torch.Tensor], params: dict[str, int], quant: str = "none",
          reduction_order: str = "any") -> tuple[Launcher, dispatch.Decision] | None:
    """The tactic launcher and decision for this call, or None for the op's reference fallback."""
    key = _key(op, tensors, params, quant, reduction_order)
    decision = _decisions.get(key)
    if decision is None:
        decision = dispatch.select(Signature.of(op=op, tensors=tensors, params=params, quant=quant,
                                                reduction_order=reduction_order))
        _decisions[key] = decision
    if decision.tactic is None:
        return None
    launcher = _launchers.get(op)
    if launcher is None:
        raise TacticBindingError(f"dispatch selected {decision.reason} for op {op!r} but no launcher is "
                                 f"bound (netra.ops._common.bind({op!r}, ...))")
    return launcher, decision


def decisions() -> dict[str, list[str]]:
    """Each op's distinct decisions so far (tactic contract name, or the fallback reason): `/server_info`."""
    out: dict[str, set[str]] = {}
    for key, d in list(_decisions.items()):
        label = d.contract.name if d.tactic is not None and d.contract is not None else f"fallback: {d.reason}"
        out.setdefault(str(key[0]), set()).add(label)
    return {op: sorted(v) for op, v in sorted(out.items())}


def reset_decisions() -> None:
    """Forget cached decisions (after `netra.dispatch.reset`, in tests)."""
    _decisions.clear()


def to_device(v: list[int], device: torch.device) -> torch.Tensor:
    """``v`` as an int64 tensor on ``device``; on CUDA through pinned memory, asynchronously (stream-ordered: a
    pageable copy would synchronise the stream before it starts)."""
    if device.type != "cuda":
        return torch.tensor(v, dtype=torch.int64, device=device)
    return torch.tensor(v, dtype=torch.int64, pin_memory=True).to(device, non_blocking=True)


@functools.lru_cache(maxsize=64)
def device_ints(values: tuple[int, ...], device: torch.device) -> torch.Tensor:
    """``values`` as an int64 tensor on ``device`` (`to_device`), made once per (values, device) and shared
    (callers only read it): a prefill forward's chunk offsets and slots reach the device once for all its layers."""
    return to_device(list(values), device)


def acc_dtype(device: torch.device) -> torch.dtype:
    """Accumulator of the references' reductions.

    On a CPU, BLAS picks a different blocking (gemv vs gemm) depending on the row count, so a float32
    row result depends on the batch it shares; float64 accumulation followed by rounding to the
    model dtype makes every row independent of its batch (the engine's greedy output then does not
    depend on what else is running). On GPUs the references accumulate in float32, like the kernels.
    """
    return torch.float64 if device.type == "cpu" else torch.float32
