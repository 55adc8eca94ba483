from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest


def _require_interpreter() -> None:
    pytest.importorskip("triton", reason="triton is not installed: the Triton interpreter tests need it")
    import triton.language as tl
    from triton.runtime.interpreter import InterpretedFunction

    if not isinstance(tl.sum, InterpretedFunction):
        pytest.skip("triton was imported without TRITON_INTERPRET=1 (a CUDA machine, or imported before "
                    "tests/ops/conftest.py): the interpreter tests need it set before triton's import")


@pytest.fixture
def interp_entry() -> Callable[[str], tuple[Any, dict[str, Any]]]:
    """``interp_entry(contract_name)`` -> (the Triton tactic's entry under Triton's CPU interpreter,
    the contract's JSON). Skips with the reason when triton is not importable or not interpreting."""
    _require_interpreter()
    from netra.catalog import contract_doc
    from netra.ops import _triton

    def load(path: str) -> tuple[Any, dict[str, Any]]:
        doc = contract_doc(path)
        return _triton.entry(doc), doc

    return load


@pytest.fixture(scope="module")
def interp_source() -> Iterator[Callable[[str], Any]]:
    """``interp_source("kernels/.../x.py")`` -> the Triton source module under the interpreter, with
    `interpreter_fixes` applied for the test module (undone after it)."""
    _require_interpreter()
    from netra.ops import _interp, _triton

    undo = _interp.interpreter_fixes()
    try:
        yield _triton.load_source
    finally:
        undo()



SM90_PRELUDE = """
import importlib.util, json, re, subprocess, tempfile
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from netra.catalog import contract_doc, contract_docs


def load_module(path):
    spec = importlib.util.spec_from_file_location(path.replace("/", "_").removesuffix(".py"), path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def compile_kernel(fn, types, consts, num_warps, num_stages=None, divisible=None, values=None, **options):
    # Triton -> PTX -> cubin for sm_90a: arguments not in consts are typed by `types` (default i32); `divisible`
    # (default: the pointers) get the 16-divisibility the JIT specializes at the engine's calls. `values`: integer
    # arguments at a call's values, specialized as the JIT does (1 becomes a constant, a multiple of 16 divisible):
    # without them the address arithmetic cannot be vectorized and ptxas' registers and spills are not the call's
    consts = dict(consts)
    div = [n for n in fn.arg_names if n.endswith("_ptr")] if divisible is None else list(divisible)
    for n, v in (values or {}).items():
        if v == 1:
            consts[n] = 1
        elif v % 16 == 0:
            div.append(n)
    div = [n for n in div if n not in consts]
    sig = {n: ("constexpr" if n in consts else types.get(n, "i32")) for n in fn.arg_names}
    attrs = {(fn.arg_names.index(n),): [["tt.divisibility", 16]] for n in div}
    opts = {"num_warps": num_warps, **({"num_stages": num_stages} if num_stages is not None else {}), **options}
    return triton.compile(ASTSource(fn=fn, signature=sig, constexprs=consts, attrs=attrs),
                          target=GPUTarget("cuda", 90, 32), options=opts)


def ptxas_report(k):
    # ptxas' resource report of the compiled PTX for sm_90a: registers and spilled bytes (stores + loads)
    with tempfile.NamedTemporaryFile("w", suffix=".ptx", delete=False) as f:
        f.write(k.asm["ptx"])
    rep = subprocess.run([triton.knobs.nvidia.ptxas.path, "-arch=sm_90a", "-v", f.name, "-o", "/dev/null"],
                         capture_output=True, text=True).stderr
    return {"registers": int(re.search(r"Used (\\d+) registers", rep).group(1)),
            "spills": sum(int(x) for x in re.findall(r"(\\d+) bytes spill (?:stores|loads)", rep))}
"""


@pytest.fixture
def compile_sm90(tmp_path: Any) -> Callable[[str], Any]:
    """``compile_sm90(script)``: run a Triton-for-sm90 compile script in a fresh process (an interpreted process
    cannot compile: this one turned the interpreter on before triton's import), from the repository root with its
    own Triton cache; returns the JSON its last stdout line prints. The script runs after `SM90_PRELUDE`
    (``load_module(path)``, ``compile_kernel(fn, types, consts, num_warps, ...)``, ``ptxas_report(kernel)``, json and
    triton imported)."""
    import json
    import os
    import subprocess
    import sys
    from pathlib import Path

    pytest.importorskip("triton")

    def run(script: str) -> Any:
        path = Path(tmp_path) / "compile.py"
        path.write_text(SM90_PRELUDE + script)
        env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
        env["TRITON_CACHE_DIR"] = str(Path(tmp_path) / "cache")
        proc = subprocess.run([sys.executable, str(path)], cwd=Path(__file__).resolve().parents[2],
                              capture_output=True, text=True, env=env, timeout=900)
        assert proc.returncode == 0, proc.stderr[-3000:]
        return json.loads(proc.stdout.strip().splitlines()[-1])

    return run
