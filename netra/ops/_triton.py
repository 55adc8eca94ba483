"""Helpers for Triton tactics: the launcher ops bind, and loading a tactic's entry by its contract (the harness
specs, interpreter tests). The comparison against the oracle is `netra.validate.compare`.

A Triton tactic's contract names its source (``kernels/<target>/<family>/<name>.py``) and one host
entry function (``kernel.symbol``), called as ``entry(launch, **op_args)`` with the contract's
``launch`` object; the entry applies ``launch.grid`` with `netra.runtime.grid_size`.

Nothing here imports torch or triton at module level.
"""

from __future__ import annotations

import importlib.util
import json
import os
import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from netra.settings import REPO_ROOT


def launch_tactic(decision: Any, **op_args: Any) -> Any:
    """The launcher an op binds for its Triton tactic (`netra.ops._common.bind`): the selected
    tactic's ``entry(launch, **op_args)``."""
    return decision.tactic.entry(decision.contract.launch, **op_args)


def read_contract(path: str | Path) -> dict[str, Any]:
    """A contract file's JSON (GPU scripts and tests read ``launch`` and ``numerics`` from it)."""
    p = Path(path)
    doc: dict[str, Any] = json.loads((p if p.is_absolute() else REPO_ROOT / p).read_text())
    return doc


def load_source(source: str) -> Any:
    """Import a Triton tactic's source file (``kernels/...py``, repo-relative) as a module, once.

    Triton reads ``TRITON_INTERPRET`` when kernels are decorated, so the interpreted and the compiled
    variant of one source are distinct modules (the name carries the mode). Dispatch loads tactics
    through `netra.runtime` instead (source pinned by the lock); this is for scripts and tests.
    """
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

