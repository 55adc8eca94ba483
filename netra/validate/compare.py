"""The one comparison of a kernel's output against its reference (issue 34: one policy, one function).

A contract's ``numerics.policy`` names one of three and its thresholds:

- ``bitwise``: same shape, same dtype, every element's bits equal (so NaN equals NaN of the same payload,
  and -0.0 differs from 0.0): what a tactic promises when it repeats the reference's arithmetic.
- ``rel_l2``: relative L2 error ``||got - ref|| / ||ref||`` (FP64) at most ``rtol``; where the contract
  also declares ``atol``, the largest absolute error at most ``atol``. Any non-finite element in ``got``
  fails it. A reduction done in another order lands here.
- ``elementwise``: every element within ``atol * max(1, max|ref|) + rtol * |ref|`` (an absolute floor
  scaled to the tensor, so inputs of any magnitude are judged alike), and NaN/Inf exactly where the
  reference has them. Used where one element must not hide behind a large norm (a recurrent state).
  The floor scales with the tensor's largest finite value: a tensor that holds extreme values on purpose
  (an adversarial channel at 3e38) must be judged in blocks, the extreme ones apart, or the floor
  covers any error elsewhere (the GDN/conv specs judge such channels one by one).

`compare` returns ``{"ok", "policy", ...errors}`` with the same error fields under every policy
(``rel_l2``, ``max_abs``, ``cosine``, ``outside``, ``elements``), so a record reads alike whatever the
contract declared. Every oracle test, GPU spec (netra.bench.harness) and promotion reads it from here;
nothing else defines ``rel_l2``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

POLICIES = ("bitwise", "rel_l2", "elementwise")


def rel_l2(got: Any, ref: Any) -> float:
    """``||got - ref||_2 / ||ref||_2`` in FP64; 0 when both are zero, inf when only ``ref`` is, or when
    ``got`` has a non-finite element."""
    import torch

    g, r = got.double(), ref.double()
    if not bool(torch.isfinite(g).all()):
        return float("inf")
    rn = float(r.norm())
    dn = float((g - r).norm())
    if rn > 0:
        return dn / rn
    return 0.0 if dn == 0 else float("inf")


def errors(got: Any, ref: Any) -> dict[str, Any]:
    """rel-L2, max-abs and cosine of ``got`` against ``ref`` (FP64, over the elements where ``ref`` is
    finite), and whether ``got`` has a non-finite element where ``ref`` has none."""
    import torch

    g, r = got.double(), ref.double()
    finite = torch.isfinite(r)
    bad = bool((finite & ~torch.isfinite(g)).any())
    gz, rz = torch.where(finite, g, 0.0), torch.where(finite, r, 0.0)
    if bad:
        rel, max_abs = float("inf"), float("inf")
    else:
        diff = gz - rz
        rn = float(rz.norm())
        rel = float(diff.norm()) / rn if rn > 0 else (0.0 if float(diff.norm()) == 0 else float("inf"))
        max_abs = float(diff.abs().max()) if diff.numel() else 0.0
    gn, rn2 = float(gz.norm()), float(rz.norm())
    cos = float((gz * rz).sum()) / (gn * rn2) if gn > 0 and rn2 > 0 else (1.0 if gn == rn2 else 0.0)
    return {"rel_l2": rel, "max_abs": max_abs, "cosine": cos, "nonfinite": bad, "elements": int(r.numel())}


def _bits(t: Any) -> Any:
    import torch

    width = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[t.element_size()]
    return t.contiguous().view(width) if t.is_floating_point() else t


def _outside(got: Any, ref: Any, rtol: float, atol: float) -> int:
    """How many elements break the elementwise bound (and the non-finite agreement)."""
    import torch

    g, r = got.double(), ref.double()
    finite = torch.isfinite(r)
    scale = max(1.0, float(r[finite].abs().max())) if bool(finite.any()) else 1.0
    err = torch.where(finite, (g - r).abs(), 0.0)
    bad = (err > atol * scale + rtol * r.abs()) & finite
    bad |= finite & ~torch.isfinite(g)
    bad |= ~finite & ~((g == r) | (g.isnan() & r.isnan()))
    return int(bad.sum())


def compare(numerics: Mapping[str, Any], got: Any, ref: Any) -> dict[str, Any]:
    """``got`` against ``ref`` under the policy ``numerics`` declares (a contract's ``numerics``, or a
    mapping of the same keys): ``{"ok": bool, "policy": ..., "rel_l2", "max_abs", "cosine", "outside",
    "elements", ...the thresholds}``. A shape mismatch fails every policy."""
    import torch

    policy = numerics["policy"]
    if policy not in POLICIES:
        raise ValueError(f"numerics.policy {policy!r}: expected one of {', '.join(POLICIES)}")
    if tuple(got.shape) != tuple(ref.shape):
        return {"ok": False, "policy": policy, "shape": [list(got.shape), list(ref.shape)]}
    e = errors(got, ref)
    if policy == "bitwise":
        same = got.dtype == ref.dtype and bool(torch.equal(_bits(got), _bits(ref)))
        outside = 0 if same else int((_bits(got) != _bits(ref)).sum()) if got.dtype == ref.dtype else e["elements"]
        return {"ok": same, "policy": policy, **e, "outside": outside}
    rtol = float(numerics["rtol"])
    atol = numerics.get("atol")
    if policy == "rel_l2":
        ok = e["rel_l2"] <= rtol and (atol is None or e["max_abs"] <= float(atol))
        return {"ok": bool(ok), "policy": policy, "rtol": rtol, **({"atol": atol} if atol is not None else {}), **e,
                "outside": None}
    outside = _outside(got, ref, rtol, float(atol or 0.0))
    return {"ok": outside == 0, "policy": policy, "rtol": rtol, "atol": float(atol or 0.0), **e, "outside": outside}


def compare_all(numerics: Mapping[str, Any], pairs: Mapping[str, tuple[Any, Any]]) -> dict[str, Any]:
    """Several named outputs under one policy: ``{"ok": all ok, name: compare(...)}``."""
    out: dict[str, Any] = {name: compare(numerics, g, r) for name, (g, r) in pairs.items()}
    out["ok"] = all(v["ok"] for v in out.values())
    return out
