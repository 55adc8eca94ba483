"""The catalog: every contract under ``kernels/<target>/<family>/*.contract.json``, checked as a whole.

A file holds one contract, or a family of them (``variants``: `netra.contract.expand`); the catalog
is the expanded list, in file order and then variant order.

This is the one registry of tactics: the build list, the lock, the test list, the benchmark list
and `netra explain` are all derived from it. Loading rejects: a file that fails the schema, a
contract whose directory disagrees with its target/family, two contracts with one name, an
``accepted`` contract without evidence on disk, and ambiguity (two non-rejected contracts of the
same maturity whose domains overlap, so dispatch could not pick one exactly).
"""

from __future__ import annotations

import copy
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from netra.contract import MATURITIES, CodeObject, Contract, ContractError, Signature, load_contracts
from netra.resources import DATA_ROOT

KERNELS_DIR = DATA_ROOT / "kernels"
CONTRACT_GLOB = "*/*/*.contract.json"


class CatalogError(ValueError):
    """The set of contracts is inconsistent; the message names the files."""


@dataclass(frozen=True)
class Catalog:
    contracts: tuple[Contract, ...]
    root: Path

    @classmethod
    def load(cls, root: Path = KERNELS_DIR, repo_root: Path = DATA_ROOT) -> Catalog:
        if not root.is_dir():  # an empty catalog would silently put every op on its fallback
            raise CatalogError(f"no kernel catalog: {root} is not a directory")
        paths = sorted(root.glob(CONTRACT_GLOB))
        problems: list[str] = []
        contracts: list[Contract] = []
        loaded: list[Contract] = []
        for path in paths:
            try:
                loaded.extend(load_contracts(path))
            except ContractError as exc:
                problems.append(str(exc))
        for c in loaded:
            path = c.path
            target_dir, family_dir = path.parent.parent.name, path.parent.name
            if (c.target, c.family) != (target_dir, family_dir):
                problems.append(f"{path}: target/family {c.target}/{c.family} disagree with its "
                                f"directory {target_dir}/{family_dir}")
            if c.maturity == "accepted":
                if not c.evidence:
                    problems.append(f"{path}: an accepted contract must cite evidence (result records)")
                missing = [e for e in c.evidence if not (repo_root / e).is_file()]
                if missing:
                    problems.append(f"{path}: evidence not found: {missing}")
            contracts.append(c)
        problems.extend(_cross_problems(contracts))
        if problems:
            raise CatalogError("kernel catalog invalid:\n  " + "\n  ".join(problems))
        return cls(tuple(contracts), root)

    def for_op(self, op: str) -> tuple[Contract, ...]:
        return tuple(c for c in self.contracts if c.op == op)

    def ops(self) -> tuple[str, ...]:
        return tuple(sorted({c.op for c in self.contracts}))

    def doc(self, name: str) -> dict[str, Any]:
        """The expanded contract document of ``name`` (scripts and tests read ``launch`` and ``numerics``)."""
        return self.by_name(name).raw

    def by_name(self, name: str) -> Contract:
        for c in self.contracts:
            if c.name == name:
                return c
        raise KeyError(f"no contract named {name!r}; known: {[c.name for c in self.contracts]}")

    def objects(self) -> tuple[CodeObject, ...]:
        """Every distinct code object of the catalog's non-declaration contracts (the build list)."""
        seen: dict[str, CodeObject] = {}
        for c in self.contracts:
            for o in c.objects:
                seen.setdefault(o.name, o)
        return tuple(sorted(seen.values(), key=lambda o: (o.target, o.family, o.name)))

    def matching(self, sig: Signature) -> list[Contract]:
        return [c for c in self.contracts if c.mismatch(sig) is None]


_repo_catalog: list[Catalog] = []


def contract_doc(ref: str | Path) -> dict[str, Any]:
    """The repository catalog's expanded document of a contract (GPU scripts, op tests): ``ref`` is its
    name, or a path ending in ``<name>.contract.json`` (a contract's file before families, issue 34)."""
    if not _repo_catalog:
        _repo_catalog.append(Catalog.load())
    return copy.deepcopy(_repo_catalog[0].doc(Path(ref).name.removesuffix(".contract.json")))


def contract_docs(target: str, family: str, prefix: str = "") -> dict[str, dict[str, Any]]:
    """name -> expanded document of the repository catalog's contracts of one target/family whose
    name starts with ``prefix``, in catalog order."""
    if not _repo_catalog:
        _repo_catalog.append(Catalog.load())
    return {c.name: copy.deepcopy(c.raw) for c in _repo_catalog[0].contracts
            if (c.target, c.family) == (target, family) and c.name.startswith(prefix)}


def _cross_problems(contracts: Iterable[Contract]) -> list[str]:
    problems: list[str] = []
    seen: dict[str, Contract] = {}
    items = list(contracts)
    for c in items:
        if c.name in seen:
            problems.append(f"duplicate contract name {c.name!r}: {seen[c.name].path} and {c.path}")
        seen[c.name] = c
    objects: dict[str, tuple[Contract, dict[str, object]]] = {}
    for c in items:
        for o in c.objects:
            first = objects.setdefault(o.name, (c, o.definition()))
            if first[1] != o.definition():
                problems.append(f"code object {o.name!r} is defined differently by {first[0].name} ({first[0].path}) "
                                f"and {c.name} ({c.path})")
    for i, a in enumerate(items):
        for b in items[i + 1:]:
            if "rejected" in (a.maturity, b.maturity) or a.maturity != b.maturity:
                continue
            if a.overlaps(b):
                problems.append(f"ambiguous: {a.name} ({a.path}) and {b.name} ({b.path}) are both "
                                f"{a.maturity} and their domains overlap")
    return problems


def maturity_rank(m: str) -> int:
    return MATURITIES.index(m)
