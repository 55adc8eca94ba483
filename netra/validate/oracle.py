"""A contract's oracle: ``numerics.oracle`` names the plain-PyTorch reference (``module:function``), and
`poison_next` leaves NaN where an op's output will be allocated. The comparison the contract declares is
`netra.validate.compare.compare` (one function for every family)."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

from netra.contract import Contract


def oracle(contract: Contract) -> Callable[..., Any]:
    """The reference function the contract names."""
    mod, _, fn = str(contract.numerics["oracle"]).partition(":")
    return getattr(importlib.import_module(mod), fn)  # type: ignore[no-any-return]


def poison_next(shape: tuple[int, ...], dtype: Any, device: Any) -> None:
    """Leave a NaN-filled block of this size in PyTorch's caching allocator, so that the next ``torch.empty``
    of the same size (an op's output) starts poisoned: an element the kernel does not write stays NaN."""
    import torch

    t = torch.full(shape, float("nan"), dtype=dtype, device=device)
    del t
