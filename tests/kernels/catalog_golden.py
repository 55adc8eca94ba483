"""The catalog's golden record: every contract's full dict and `netra explain`'s decision over a grid.

Captured once from the catalog of one contract per file (before contract files declared ``variants``,
issue 34) so that `tests/kernels/test_catalog_golden.py` proves the expanded catalog is the same,
contract for contract, and that dispatch decides the same for every op over the grid. Regenerate
(``python -m tests.kernels.catalog_golden``) only for an intended change of the catalog, and say so.

The grid: each op's example signatures (``explain_signatures``) and, per contract, its domain's corners
(every dim at its low and at its high bound), each dim one step outside, every allowed dtype and
layout of each tensor, every quant of the op, both graph phases and every determinism class.
"""

from __future__ import annotations

import gzip
import importlib
import json
from dataclasses import replace
from pathlib import Path
from typing import Any

from netra.catalog import Catalog
from netra.contract import Signature

GOLDEN = Path(__file__).parent / "golden"
CONTRACTS = GOLDEN / "catalog.json"
EXPLAIN = GOLDEN / "explain.json.gz"  # ~2500 signatures x 3 maturities: 6.6 MB of JSON
MIN_MATURITIES = ("experiment", "verified", "accepted")


def contract_dicts(cat: Catalog) -> dict[str, dict[str, Any]]:
    """name -> the contract's full dict (the expanded document), plus the directory it lives in."""
    return {c.name: {"dir": f"{c.target}/{c.family}", "doc": c.raw} for c in cat.contracts}


def _sig_json(s: Signature) -> dict[str, Any]:
    return {"target": s.target, "op": s.op, "dims": [list(d) for d in s.dims],
            "dtypes": [list(d) for d in s.dtypes], "layouts": [list(d) for d in s.layouts],
            "quant": s.quant, "reduction_order": s.reduction_order, "graph_phase": s.graph_phase,
            "determinism": s.determinism}


def sig_from_json(d: dict[str, Any]) -> Signature:
    return Signature(target=d["target"], op=d["op"], dims=tuple((k, v) for k, v in d["dims"]),
                     dtypes=tuple((k, v) for k, v in d["dtypes"]),
                     layouts=tuple((k, v) for k, v in d["layouts"]), quant=d["quant"],
                     reduction_order=d["reduction_order"], graph_phase=d["graph_phase"],
                     determinism=d["determinism"])


def grid(cat: Catalog) -> list[Signature]:
    from netra.dispatch_cli import domain_signature
    from netra.ops import OPS

    sigs: list[Signature] = []
    for op in sorted(set(OPS) | set(cat.ops())):
        if op in OPS:
            show = getattr(importlib.import_module(OPS[op]), "explain_signatures", None)
            sigs.extend(s for _, s in (show() if show is not None else []) if s.op == op)
        quants = sorted({q for c in cat.for_op(op) for q in c.quant})
        for c in cat.for_op(op):
            base = domain_signature(c)
            lo = {k: (min(r.values) if r.values is not None else r.lo) for k, r in c.dims.items()}
            hi = {k: (max(r.values) if r.values is not None else r.hi) for k, r in c.dims.items()}
            corners = [lo, hi]
            for k in c.dims:
                corners += [lo | {k: lo[k] - 1}, hi | {k: hi[k] + 1}]
            shapes = [replace(base, dims=tuple(sorted(d.items()))) for d in corners]
            variants: list[Signature] = []
            for s in shapes:
                variants.append(s)
                variants.extend(replace(s, quant=q) for q in quants)
                variants.append(replace(s, graph_phase="eager" if s.graph_phase == "capture" else "capture"))
                variants.extend(replace(s, determinism=d) for d in ("bitwise", "run_to_run", "none"))
            for t, allowed in c.dtypes.items():
                variants.extend(replace(base, dtypes=tuple(sorted(dict(base.dtypes, **{t: v}).items())))
                                for v in sorted(allowed | {"float16"}))
            for t, allowed in c.layouts.items():
                variants.extend(replace(base, layouts=tuple(sorted(dict(base.layouts, **{t: v}).items())))
                                for v in sorted(allowed | {"strided"}))
            sigs.extend(variants)
    seen: set[Signature] = set()
    return [s for s in sigs if not (s in seen or seen.add(s))]  # type: ignore[func-returns-value]


def decisions(cat: Catalog, sigs: list[Signature]) -> list[dict[str, Any]]:
    """Each signature's `netra explain` lines under every minimum maturity."""
    from netra.dispatch import plan
    from netra.dispatch_cli import render

    return [{"signature": _sig_json(s),
             "explain": {m: render(s.op, s, plan(s, cat, m)) for m in MIN_MATURITIES}} for s in sigs]


def load_explain() -> list[dict[str, Any]]:
    data: list[dict[str, Any]] = json.loads(gzip.decompress(EXPLAIN.read_bytes()))
    return data


def main() -> None:
    cat = Catalog.load()
    GOLDEN.mkdir(exist_ok=True)
    CONTRACTS.write_text(json.dumps(contract_dicts(cat), indent=1, sort_keys=True) + "\n")
    EXPLAIN.write_bytes(gzip.compress(json.dumps(decisions(cat, grid(cat))).encode(), mtime=0))


if __name__ == "__main__":
    main()
