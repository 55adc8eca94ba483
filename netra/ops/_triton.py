"""Helpers for Triton tactics: the launch grid evaluator and loading a tactic's source by its contract.

A Triton tactic's contract names its source (``kernels/<target>/<family>/<name>.py``) and one host
entry function (``kernel.symbol``), called as ``entry(launch, **op_args)`` with the contract's
``launch`` object: ``block`` (threads = 32 * num_warps), ``grid`` (up to 3 axis expressions over
the call's dims and ``launch.meta`` names), ``smem_bytes`` (0) and ``meta`` (constexpr values and
``num_stages``).

`grid_size` evaluates one grid: names, integers, ``+ - * //`` and the functions ``cdiv``, ``min``,
``max``; anything else is an error naming the expression. It is the runtime's contract
(``netra.runtime.grid_size``); this module's copy serves until the runtime's lands, and the
kernel sources prefer the runtime's when it exists.

Nothing here imports torch or triton at module level.
"""

from __future__ import annotations

import ast
import importlib.util
import json
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from netra.settings import REPO_ROOT

_FUNCS: dict[str, Callable[..., int]] = {
    "cdiv": lambda a, b: -(-a // b),
    "min": min,
    "max": max,
}


class GridError(ValueError):
    """A grid expression uses something outside the grid language, or names an unknown value."""


def _eval(node: ast.AST, env: Mapping[str, int], text: str) -> int:
    if isinstance(node, ast.Expression):
        return _eval(node.body, env, text)
    if isinstance(node, ast.Constant) and type(node.value) is int:
        return node.value
    if isinstance(node, ast.Name):
        if node.id not in env:
            raise GridError(f"grid {text!r}: unknown name {node.id!r} (known: {sorted(env)})")
        return int(env[node.id])
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        return -_eval(node.operand, env, text)
    if isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Add, ast.Sub, ast.Mult, ast.FloorDiv)):
        lhs, rhs = _eval(node.left, env, text), _eval(node.right, env, text)
        if isinstance(node.op, ast.Add):
            return lhs + rhs
        if isinstance(node.op, ast.Sub):
            return lhs - rhs
        if isinstance(node.op, ast.Mult):
            return lhs * rhs
        if rhs == 0:
            raise GridError(f"grid {text!r}: division by zero")
        return lhs // rhs
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in _FUNCS \
            and not node.keywords:
        args = [_eval(a, env, text) for a in node.args]
        if node.func.id == "cdiv" and (len(args) != 2 or args[1] == 0):
            raise GridError(f"grid {text!r}: cdiv takes two arguments, the second nonzero")
        if node.func.id != "cdiv" and not args:
            raise GridError(f"grid {text!r}: {node.func.id} needs arguments")
        return int(_FUNCS[node.func.id](*args))
    raise GridError(f"grid {text!r}: {type(node).__name__} is not part of the grid language "
                    "(names, integers, + - * //, cdiv/min/max)")


_parsed: dict[str, ast.Expression] = {}


def grid_size(grid: Sequence[str | int], env: Mapping[str, int]) -> list[int]:
    """``launch["grid"]`` evaluated over ``env`` (the call's dims and the launch's meta): 1-3 axes."""
    if isinstance(grid, str) or not 1 <= len(grid) <= 3:
        raise GridError(f"grid must be a list of 1-3 axis expressions, got {grid!r}")
    out = []
    for axis in grid:
        if isinstance(axis, int):
            out.append(axis)
            continue
        tree = _parsed.get(axis)
        if tree is None:
            try:
                tree = ast.parse(axis, mode="eval")
            except SyntaxError as exc:
                raise GridError(f"grid {axis!r}: {exc.msg}") from None
            _parsed[axis] = tree
        out.append(_eval(tree, env, axis))
    return out


def read_contract(path: str | Path) -> dict[str, Any]:
    """A contract file's JSON (the GPU scripts and tests read ``launch`` and ``numerics`` from it)."""
    p = Path(path)
    if not p.is_absolute():
        p = REPO_ROOT / p
    doc: dict[str, Any] = json.loads(p.read_text())
    return doc


def load_source(source: str) -> Any:
    """Import a Triton tactic's source file (``kernels/...py``, repo-relative) as a module, once.

    Triton reads ``TRITON_INTERPRET`` when the kernels are decorated, so the interpreter and the
    compiled variant of one source are distinct modules (the name carries the mode).
    """
    import os

    interp = os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")
    name = "netra_tactic_" + source.removesuffix(".py").replace("/", "_") + ("_interp" if interp else "")
    mod = sys.modules.get(name)
    if mod is not None:
        return mod
    spec = importlib.util.spec_from_file_location(name, REPO_ROOT / source)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot load Triton tactic source {source}")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    try:
        spec.loader.exec_module(mod)
    except BaseException:
        del sys.modules[name]
        raise
    return mod


def entry(contract_doc: Mapping[str, Any]) -> Callable[..., Any]:
    """The host entry function a contract names (``kernel.source`` + ``kernel.symbol``)."""
    kernel = contract_doc["kernel"]
    fn: Callable[..., Any] = getattr(load_source(kernel["source"]), kernel["symbol"])
    return fn


def launch_tactic(decision: Any, **op_args: Any) -> Any:
    """The launcher an op binds for its Triton tactic (`netra.ops._common.bind`): the selected
    tactic's ``entry(launch, **op_args)``."""
    return decision.tactic.entry(decision.contract.launch, **op_args)


def tolerance_report(got: Any, ref: Any, rtol: float, atol: float) -> dict[str, Any]:
    """A tactic's output against its oracle under a ``tolerance`` policy, both upcast to FP32: every
    element within ``atol * max(1, max|ref|) + rtol * |ref|`` (an absolute floor scaled to the
    tensor, so that inputs of any magnitude are judged alike), and NaN/Inf exactly where the
    reference has them. Returns ``ok``, the count of elements outside, max abs and relative-L2 error."""
    import torch

    g, r = got.float(), ref.float()
    finite = torch.isfinite(r)
    scale = max(1.0, float(r[finite].abs().max())) if bool(finite.any()) else 1.0
    err = torch.where(finite, (g - r).abs(), 0.0)
    bad = (err > atol * scale + rtol * r.abs()) & finite
    bad |= finite & ~torch.isfinite(g)
    bad |= ~finite & ~((g == r) | (g.isnan() & r.isnan()))
    diff = torch.where(finite, g - r, 0.0)
    denom = float(torch.where(finite, r, 0.0).norm())
    return {"ok": not bool(bad.any()), "outside": int(bad.sum()), "max_abs": float(err.max()) if err.numel() else 0.0,
            "rel_l2": float(diff.norm()) / denom if denom > 0 else float(diff.norm()), "elements": int(r.numel())}
