"""The one promotion rule (issue 34): when a run's record supports raising a contract to ``accepted``.

A contract passes when

1. **oracle**: it was checked (at least one case) and every check of it passed: its outputs under the
   contract's comparison (`netra.validate.compare`), eager equal to graph replay, and whatever else the
   family's spec asserts (pools untouched outside the slots, dispatch choosing it); and
2. **speed**: at every shape of its range that the run timed, its median is at or below every other
   provider's median at that shape: the fallback, the peers (SGLang's own kernels, FlashInfer, cuBLAS)
   and the other contracts' tactics. Dispatch choosing a slower tactic than one it could have run is a
   loss, whoever wrote the faster one.

An issue's numeric targets (a speedup at one shape, a fraction of the floor) are reported beside the
rule in a record's ``targets`` and do not decide it. Nothing else in the tree promotes.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

RULE = ("promoted when every oracle check of the contract passed (at least one; eager == graph replay included) "
        "and, at every shape of its range the run timed, its median is at or below every other provider's "
        "(fallback, peers, other tactics) at that shape; targets are reported beside it and do not decide it")


def promote(checks: Iterable[Mapping[str, Any]], timings: Mapping[str, Mapping[str, float]],
            ours: str) -> dict[str, Any]:
    """Judge one contract. ``checks``: its check results (each with ``ok``); ``timings``: shape key ->
    {provider: median µs} for the shapes of its range the run timed; ``ours``: its provider name there.

    Returns ``{"pass", "oracle", "cases", "shapes", "lost"}``: ``lost`` lists each shape where another
    provider was faster (with that provider and both medians); a shape where ``ours`` was not timed, or
    nothing else was, is not a win."""
    cases = list(checks)
    oracle = bool(cases) and all(bool(c.get("ok")) for c in cases)
    lost: list[dict[str, Any]] = []
    shapes: dict[str, Any] = {}
    for shape, by in sorted(timings.items()):
        mine = by.get(ours)
        others = {p: float(t) for p, t in by.items() if p != ours and t is not None}
        best = min(others, key=lambda p: others[p]) if others else None
        shapes[shape] = {"ours_us": mine, "best_other": best, "best_other_us": others.get(best) if best else None}
        if mine is None or best is None or others[best] < float(mine):
            lost.append({"shape": shape, **shapes[shape]})
    ok = oracle and bool(shapes) and not lost
    return {"pass": ok, "oracle": oracle, "cases": len(cases), "shapes": shapes, "lost": lost}


def judge(by_contract: Mapping[str, Mapping[str, Any]]) -> dict[str, Any]:
    """A record's promotion fields from `promote`'s result per contract: ``promotion`` (the contracts that
    pass), ``not_promoted`` (the others, with why), ``promotion_rule`` and ``verdict`` (``accepted`` when
    at least one contract passes: the record supports promoting exactly those; ``info`` otherwise)."""
    passed = {n: dict(g) for n, g in by_contract.items() if g.get("pass")}
    return {"promotion": passed, "not_promoted": {n: dict(g) for n, g in by_contract.items() if n not in passed},
            "promotion_rule": RULE, "verdict": "accepted" if passed else "info"}
