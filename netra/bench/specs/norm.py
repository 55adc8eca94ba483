"""The BF16 norms at decode rows (kernels/sm90/norm: ``rmsnorm_gemma_rows``, ``add_rmsnorm_gemma_rows``,
``gated_rmsnorm_rows``) beside the reference they replace (issue 19, item 5).

Shapes: Gemma RMSNorm and residual add + Gemma RMSNorm over rows of 2048 at 1, 8, 128 rows; GDN's gated RMSNorm
over heads of 128 at 32, 256, 4096 rows (1, 8, 128 tokens of 32 heads).

Check, through the op (dispatch at maturity ``experiment``; the case checks it chose the contract). The output is
poisoned first, every output (the residual too) is judged by `compare` under the contract's numerics against the
reference, and eager must equal CUDA-graph replay bitwise. Providers: ``netra`` and ``fallback`` (the reference, as
the op runs without the contract). The floor is the inputs read once plus the outputs written once.

Smoke (CPU, interpreter): the same check through the contracts' entries at a few rows.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Iterator
from functools import partial
from typing import Any

from netra.bench.harness import Case, CaseBuilder, Spec, entry

EPS = 1e-6
# contract -> (op name, the widths' row counts)
NORMS = {"rmsnorm_gemma_rows": ("rmsnorm_gemma", 2048, (1, 8, 128)),
         "add_rmsnorm_gemma_rows": ("add_rmsnorm_gemma", 2048, (1, 8, 128)),
         "gated_rmsnorm_rows": ("gated_rmsnorm", 128, (32, 256, 4096))}
SMOKE_ROWS = {"rmsnorm_gemma_rows": 3, "add_rmsnorm_gemma_rows": 5, "gated_rmsnorm_rows": 37}
CONTRACTS = tuple(NORMS)


def inputs(rows: int, width: int, seed: int, device: str) -> tuple[Any, Any, Any, Any]:
    """x, residual, z (BF16) and the weight; row 0 of x large, so one row's scale differs from the rest."""
    import torch

    g = torch.Generator(device=device).manual_seed(seed)

    def t(scale: float) -> Any:
        return (torch.randn(rows, width, generator=g, device=device) * scale).to(torch.bfloat16)

    x = t(3.0)
    x[0] *= 1e3
    return x, t(5.0), t(2.0), (torch.randn(width, generator=g, device=device) * 0.1).to(torch.bfloat16)


def calls(name: str) -> tuple[Callable[..., Any], Callable[..., Any], Callable[..., dict[str, Any]]]:
    """(the op through dispatch, the reference, the entry's keyword arguments) of a contract, over (x, r, z, w)."""
    from netra.ops import norm

    if name == "rmsnorm_gemma_rows":
        return (lambda x, r, z, w: norm.rmsnorm(x, w, EPS), lambda x, r, z, w: norm.rmsnorm_ref(x, w, EPS),
                lambda x, r, z, w: {"x": x, "weight": w, "eps": EPS})
    if name == "add_rmsnorm_gemma_rows":
        return (lambda x, r, z, w: norm.add_rmsnorm(x, r, w, EPS), lambda x, r, z, w: norm.add_rmsnorm_ref(x, r, w, EPS),
                lambda x, r, z, w: {"x": x, "residual": r, "weight": w, "eps": EPS})
    return (lambda x, r, z, w: norm.gated_rmsnorm(x, z, w, EPS), lambda x, r, z, w: norm.gated_rmsnorm_ref(x, z, w, EPS),
            lambda x, r, z, w: {"x": x, "z": z, "weight": w, "eps": EPS})


def as_list(v: Any) -> list[Any]:
    return list(v) if isinstance(v, (list, tuple)) else [v]


def check(name: str, rows: int, device: str) -> dict[str, Any]:
    """Every output against the reference under the contract's numerics; on a GPU: dispatch chose the contract,
    the output poisoned first, eager == replay."""
    import torch

    from netra.bench.timing import capture
    from netra.catalog import contract_doc
    from netra.ops import _common
    from netra.validate.compare import compare
    from netra.validate.oracle import poison_next

    op_name, width, _ = NORMS[name]
    args = inputs(rows, width, rows, device)
    op, ref, kw = calls(name)
    gpu = device != "cpu"
    if gpu:
        _common.reset_decisions()
        poison_next((rows, width), torch.bfloat16, device)
        run: Callable[[], Any] = lambda: op(*args)  # noqa: E731
    else:
        fn = entry(name)[0]
        run = lambda: fn(**kw(*args))  # noqa: E731
    got = as_list(run())
    num = contract_doc(name)["numerics"]
    out: dict[str, Any] = {"outputs": [compare(num, a, b) for a, b in zip(got, as_list(ref(*args)), strict=True)]}
    ok = all(v["ok"] for v in out["outputs"])
    if gpu:
        out["chosen"] = _common.decisions().get(op_name, [])
        g, rep = capture(run)
        g.replay()
        torch.cuda.synchronize()
        out["eager_equals_replay"] = all(torch.equal(a, b) for a, b in zip(got, as_list(rep), strict=True))
        ok = ok and name in out["chosen"] and out["eager_equals_replay"]
        del g
    return {**out, "ok": bool(ok)}


def gpu_case(name: str, rows: int) -> Case:
    op_name, width, _ = NORMS[name]
    op, ref, _ = calls(name)
    sets = [inputs(rows, width, 10 + i, "cuda") for i in range(4)]
    n_out = 2 if name.startswith("add_") else 1
    n_in = {"rmsnorm_gemma_rows": 1, "add_rmsnorm_gemma_rows": 2, "gated_rmsnorm_rows": 2}[name]
    return Case(key=f"{name} rows={rows}", op=op_name, shape={"rows": rows, "width": width}, dtype="bf16",
                providers={"netra": lambda i: op(*sets[i]), "fallback": lambda i: ref(*sets[i])},
                check=partial(check, name, rows, "cuda"), contract=name, n_inputs=len(sets),
                floor_bytes=rows * width * 2 * (n_in + n_out) + width * 2, hold=sets)


def cases(opts: argparse.Namespace) -> Iterator[CaseBuilder]:
    for name, (_, _, rows) in NORMS.items():
        for r in rows:
            yield partial(gpu_case, name, r)


def smoke() -> Iterator[CaseBuilder]:
    for name, rows in SMOKE_ROWS.items():
        op_name, width, _ = NORMS[name]
        yield partial(Case, key=f"{name} rows={rows}", op=op_name, shape={"rows": rows, "width": width}, dtype="bf16",
                      check=partial(check, name, rows, "cpu"), contract=name)


def setup(opts: argparse.Namespace) -> dict[str, Any]:
    from netra import dispatch

    if not getattr(opts, "smoke", False):
        dispatch.reset(dispatch.Dispatcher(min_maturity="experiment"))
    return {"min_maturity": "experiment"}


SPEC = Spec(name="norm", family="norm", doc="BF16 Gemma RMSNorm, residual add + RMSNorm, gated RMSNorm (decode rows)",
            cases=cases, smoke=smoke, contracts=CONTRACTS, setup=setup)
