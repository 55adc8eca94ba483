"""`netra explain`: the dispatch decision for an op and signature, or for every registered op.

For each signature it prints the tactic (contract) or the fallback chosen, and why every other
candidate contract was not chosen. Nothing is loaded: this is `netra.dispatch.plan`, which the
runtime's `select` uses too, so it runs on a machine with no GPU.
"""

from __future__ import annotations

import argparse
import importlib
from typing import Any


def register(sub: Any) -> None:
    from netra.cli import add_verb

    p = add_verb(sub, "explain")
    p.add_argument("--op", help="op name (default: every registered op, with its example signatures)")
    p.add_argument("--target", help="target (sm90, gfx950, cpu); default: the op's example")
    p.add_argument("--dim", action="append", default=[], metavar="NAME=INT", help="a dim, e.g. rows=16")
    p.add_argument("--dtype", action="append", default=[], metavar="TENSOR=DTYPE", help="e.g. x=bfloat16")
    p.add_argument("--layout", action="append", default=[], metavar="TENSOR=LAYOUT",
                   help="contiguous_align16 | contiguous | strided")
    p.add_argument("--phase", choices=("eager", "capture"), help="graph phase")
    p.add_argument("--quant", help="the call's quant, e.g. fp8_e4m3_group128 (a norm whose rows feed FP8 projections)")
    p.add_argument("--min-maturity", help="lowest maturity selected (default NETRA_TACTIC_MIN_MATURITY)")
    p.add_argument("--disable-tactics", action="store_true", help="as NETRA_DISABLE_TACTICS=1")
    p.set_defaults(func=main)


def _pairs(items: list[str], what: str, as_int: bool = False) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for item in items:
        name, sep, value = item.partition("=")
        if not sep or not name or not value:
            raise SystemExit(f"netra explain: --{what} {item!r}: expected NAME=VALUE")
        if as_int:
            try:
                out[name] = int(value)
            except ValueError:
                raise SystemExit(f"netra explain: --{what} {item!r}: value must be an integer") from None
        else:
            out[name] = value
    return out


def domain_signature(c: Any) -> Any:
    """A signature inside contract ``c``'s domain (each dim at its lower bound, first allowed values)."""
    from netra.contract import Signature

    def first(values: Any) -> str:
        return sorted(values)[0]

    return Signature(
        target=c.target, op=c.op,
        dims=tuple(sorted((k, min(r.values) if r.values is not None else r.lo) for k, r in c.dims.items())),
        dtypes=tuple(sorted((k, first(v)) for k, v in c.dtypes.items())),
        layouts=tuple(sorted((k, first(v)) for k, v in c.layouts.items())),
        quant=first(c.quant), reduction_order=first(c.reduction_order),
        graph_phase="capture" if "capture" in c.graph_phases else "eager", determinism=first(c.determinism))


def render(label: str, sig: Any, decision: Any) -> list[str]:
    lines = [f"{label}: {sig.describe()}"]
    if decision.contract is not None:
        lines.append(f"  -> tactic {decision.contract.name} ({decision.contract.maturity}); "
                     f"code object {decision.contract.code_object}")
    elif decision.rejections and decision.reason.startswith("no contract matches"):
        lines.append("  -> fallback: no candidate contract matches")
    else:
        lines.append(f"  -> fallback: {decision.reason}")
    for name, why in decision.rejections:
        lines.append(f"     candidate {name}: {why}")
    return lines


def main(args: argparse.Namespace) -> int:
    from dataclasses import replace

    from netra.contract import Signature
    from netra.dispatch import Dispatcher, plan
    from netra.ops import OPS

    disp = Dispatcher(min_maturity=args.min_maturity, disabled=True if args.disable_tactics else None)
    catalog = disp.catalog
    ops = [args.op] if args.op else sorted(set(OPS) | set(catalog.ops()))
    out: list[str] = [f"catalog: {len(catalog.contracts)} contract(s) under {catalog.root}; "
                      f"min maturity {disp.min_maturity}; tactics {'disabled' if disp.disabled else 'enabled'}"]
    for op in ops:
        examples: list[tuple[str, Signature]] = []
        if op in OPS:
            show = getattr(importlib.import_module(OPS[op]), "explain_signatures", None)
            examples = [(label, sig) for label, sig in show() if sig.op == op] if show is not None else []
        custom = args.op and (args.target or args.dim or args.dtype or args.layout or args.phase or args.quant)
        if custom:
            base = examples[0][1] if examples else Signature(target="sm90", op=op, dims=(), dtypes=(), layouts=())
            dims = dict(base.dims) | _pairs(args.dim, "dim", as_int=True)
            dtypes = dict(base.dtypes) | _pairs(args.dtype, "dtype")
            layouts = dict(base.layouts) | _pairs(args.layout, "layout")
            sig = replace(base, target=args.target or base.target, dims=tuple(sorted(dims.items())),
                          dtypes=tuple(sorted(dtypes.items())), layouts=tuple(sorted(layouts.items())),
                          graph_phase=args.phase or base.graph_phase, quant=args.quant or base.quant)
            examples = [("requested", sig)]
        if not examples:  # no op module examples: one call inside each contract's domain
            examples = [(f"domain of {c.name}", domain_signature(c)) for c in catalog.for_op(op)]
        if not examples:
            out.append(f"{op}: no contract on any target: every call runs the op's reference ({OPS.get(op, '?')})")
            continue
        for label, sig in examples:
            out.extend(render(f"{op} [{label}]", sig, plan(sig, catalog, disp.min_maturity, disp.disabled)))
    print("\n".join(out))
    return 0
