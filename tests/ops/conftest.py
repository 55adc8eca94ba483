from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest


@pytest.fixture
def interp_entry() -> Callable[[str], tuple[Any, dict[str, Any]]]:
    """``interp_entry(contract_path)`` -> (the Triton tactic's entry under Triton's CPU interpreter,
    the contract's JSON). Skips with the reason when triton is not importable or not interpreting."""
    pytest.importorskip("triton", reason="triton is not installed: the Triton interpreter tests need it")
    import triton.language as tl
    from triton.runtime.interpreter import InterpretedFunction

    if not isinstance(tl.sum, InterpretedFunction):
        pytest.skip("triton was imported without TRITON_INTERPRET=1 (a CUDA machine, or imported before "
                    "tests/ops/conftest.py): the interpreter tests need it set before triton's import")
    from netra.ops import _triton

    def load(path: str) -> tuple[Any, dict[str, Any]]:
        doc = _triton.read_contract(path)
        return _triton.entry(doc), doc

    return load
