"""The comparison a contract declares, applied: its ``numerics`` drive every family's oracle check.

``numerics.oracle`` names the plain-PyTorch reference (``module:function``); ``numerics.policy`` is
``bitwise`` (every element equal, NaN-aware) or ``tolerance`` (relative L2 error <= ``rtol``, and max
absolute error <= ``atol`` where the contract declares one). Nothing here restates a family's
tolerance: it is read from the contract, which declared it before anything was measured.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

from netra.contract import Contract


def oracle(contract: Contract) -> Callable[..., Any]:
    """The reference function the contract names."""
    mod, _, fn = str(contract.numerics["oracle"]).partition(":")
    return getattr(importlib.import_module(mod), fn)  # type: ignore[no-any-return]


def errors(got: Any, ref: Any) -> dict[str, float]:
    """rel-L2, max-abs and cosine of ``got`` against ``ref`` (FP64); NaN anywhere in ``got`` is infinite error."""
    import torch

    g, r = got.double(), ref.double()
    if not bool(torch.isfinite(g).all()):
        return {"rel_l2": float("inf"), "max_abs": float("inf"), "cosine": float("nan"), "nonfinite": True}
    diff = g - r
    rn = float(r.norm())
    rel = float(diff.norm()) / rn if rn > 0 else (0.0 if float(g.norm()) == 0 else float("inf"))
    gn = float(g.norm())
    cos = float((g * r).sum()) / (gn * rn) if gn > 0 and rn > 0 else (1.0 if gn == rn else 0.0)
    return {"rel_l2": rel, "max_abs": float(diff.abs().max()) if diff.numel() else 0.0, "cosine": cos,
            "nonfinite": False}


def judge(contract: Contract, got: Any, ref: Any) -> dict[str, Any]:
    """Compare per the contract's policy: ``{"ok": bool, "policy": ..., errors...}``."""
    import torch

    num = contract.numerics
    if num["policy"] == "bitwise":
        same = got.shape == ref.shape and got.dtype == ref.dtype and bool(
            torch.equal(got.view(torch.uint8) if got.dtype.itemsize == 1 else got, ref.view(torch.uint8)
                        if ref.dtype.itemsize == 1 else ref))
        return {"ok": same, "policy": "bitwise", **errors(got, ref)}
    e = errors(got, ref)
    ok = e["rel_l2"] <= float(num["rtol"]) and ("atol" not in num or e["max_abs"] <= float(num["atol"]))
    return {"ok": bool(ok), "policy": "tolerance", "rtol": num["rtol"], **e}


def poison_next(shape: tuple[int, ...], dtype: Any, device: Any) -> None:
    """Leave a NaN-filled block of this size in PyTorch's caching allocator, so that the next ``torch.empty``
    of the same size (an op's output) starts poisoned: an element the kernel does not write stays NaN."""
    import torch

    t = torch.full(shape, float("nan"), dtype=dtype, device=device)
    del t
