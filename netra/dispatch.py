"""Dispatch: a call's `Signature` -> a loaded tactic, or the op's fallback with a reason.

Every op module does::

    sig = Signature.of(op="argmax", tensors={"x": x}, params={"rows": r, "vocab": v})
    decision = dispatch.select(sig)          # a dict lookup after the first call per signature
    if decision.tactic is None:
        return fallback(x)                   # decision.reason says why (logged once)
    ...launch decision.tactic...

Rules (ARCHITECTURE.md): matching is exact (a partial match is a fallback with a reason, never an
approximate launch); only contracts at or above the minimum maturity (``accepted`` by default,
``NETRA_TACTIC_MIN_MATURITY``) are selected; ``rejected`` never is; ``NETRA_DISABLE_TACTICS=1``
sends every op to its fallback (the A/B control arm). A matched contract whose code object cannot
be loaded is an error, not a silent fallback: the deployment is broken and must say so.

The first `select` for a signature loads the code object and allocates its workspace, so make it
before any graph capture (run the op once eagerly, or call the op module's `prepare`); a first load
attempted while the stream is capturing raises `netra.runtime.RuntimeBridgeError`.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass, field
from typing import Any

from netra import settings
from netra.catalog import Catalog, maturity_rank
from netra.contract import MATURITIES, Contract, Signature

log = logging.getLogger("netra.dispatch")


@dataclass(frozen=True)
class Decision:
    """``tactic`` is a loaded, launchable `netra.runtime.Tactic`, or None for the fallback."""

    tactic: Any
    reason: str
    contract: Contract | None = None
    # (contract name, why it was not chosen) for every other candidate of the op: `netra explain`.
    rejections: tuple[tuple[str, str], ...] = field(default=(), compare=False)

    @property
    def fallback(self) -> bool:
        return self.tactic is None


def plan(sig: Signature, catalog: Catalog, min_maturity: str = "accepted",
         disabled: bool = False) -> Decision:
    """The pure decision (no loading): which contract, if any, serves ``sig`` and why not the others."""
    if min_maturity not in MATURITIES or min_maturity == "rejected":
        raise ValueError(f"min maturity {min_maturity!r} must be one of {MATURITIES[1:]}")
    candidates = catalog.for_op(sig.op)
    rejections: list[tuple[str, str]] = []
    eligible: list[Contract] = []
    for c in candidates:
        why = c.mismatch(sig)
        if why is None and c.declaration:
            why = f"declaration only: no code object for {c.target} yet"
        elif why is None and c.maturity == "rejected":
            why = "maturity rejected (kept as evidence, never selected)"
        elif why is None and maturity_rank(c.maturity) < maturity_rank(min_maturity):
            why = f"maturity {c.maturity} below the required {min_maturity}"
        if why is None:
            eligible.append(c)
        else:
            rejections.append((c.name, why))
    if disabled:
        return Decision(None, "NETRA_DISABLE_TACTICS is set: every op uses its fallback",
                        None, tuple(rejections) + tuple((c.name, "tactics disabled") for c in eligible))
    if not eligible:
        if not candidates:
            reason = f"no contract for op {sig.op!r}"
        else:
            reason = "no contract matches: " + "; ".join(f"{n}: {w}" for n, w in rejections)
        return Decision(None, reason, None, tuple(rejections))
    # The catalog guarantees no two overlapping contracts share a maturity: highest maturity wins.
    eligible.sort(key=lambda c: maturity_rank(c.maturity), reverse=True)
    chosen, others = eligible[0], eligible[1:]
    rejections.extend((c.name, f"outranked by {chosen.name} ({chosen.maturity})") for c in others)
    return Decision(None, f"contract {chosen.name} ({chosen.maturity})", chosen, tuple(rejections))


class Dispatcher:
    """Holds the catalog, the settings read once, and the per-signature decision cache."""

    def __init__(self, catalog: Catalog | None = None, min_maturity: str | None = None,
                 disabled: bool | None = None) -> None:
        self._catalog = catalog
        self.min_maturity: str = (min_maturity if min_maturity is not None
                                  else settings.get("NETRA_TACTIC_MIN_MATURITY"))
        self.disabled: bool = disabled if disabled is not None else settings.get("NETRA_DISABLE_TACTICS")
        if self.min_maturity not in MATURITIES[1:]:
            raise settings.SettingError(f"NETRA_TACTIC_MIN_MATURITY={self.min_maturity!r}: expected one of "
                                        f"{MATURITIES[1:]}")
        self._cache: dict[Signature, Decision] = {}
        self._logged: set[tuple[str, str]] = set()
        self._lock = threading.Lock()

    @property
    def catalog(self) -> Catalog:
        if self._catalog is None:
            self._catalog = Catalog.load()
        return self._catalog

    def select(self, sig: Signature) -> Decision:
        decision = self._cache.get(sig)
        if decision is not None:
            return decision
        with self._lock:
            decision = self._cache.get(sig)
            if decision is None:
                decision = self._decide(sig)
                self._cache[sig] = decision
        return decision

    def _decide(self, sig: Signature) -> Decision:
        d = plan(sig, self.catalog, self.min_maturity, self.disabled)
        if d.contract is None:
            key = (sig.op, d.reason)
            if key not in self._logged:
                self._logged.add(key)
                log.info("netra %s: fallback (%s) for %s", sig.op, d.reason, sig.describe())
            return d
        from netra.runtime import load_tactic

        tactic = load_tactic(d.contract, sig.device)
        log.info("netra %s: tactic %s for %s", sig.op, d.contract.name, sig.describe())
        return Decision(tactic, d.reason, d.contract, d.rejections)

    def logged_reasons(self) -> set[tuple[str, str]]:
        return set(self._logged)


_default: Dispatcher | None = None


def dispatcher() -> Dispatcher:
    global _default
    if _default is None:
        _default = Dispatcher()
    return _default


def select(sig: Signature) -> Decision:
    """The dispatch API every op calls; cached per signature."""
    return dispatcher().select(sig)


def reset(dispatcher_: Dispatcher | None = None) -> None:
    """Drop cached decisions and re-read the catalog and settings (tests, or after a rebuild)."""
    global _default
    _default = dispatcher_
