"""Signatures (what a call needs) and contracts (what a tactic promises), matched exactly.

A `Signature` names everything that decides whether a tactic is correct and fast for a call:
target, op, dims, dtypes, layouts, quantization, reduction order, graph phase and determinism.
A `Contract` is a data file under ``kernels/<target>/<family>/*.contract.json`` validated against
``kernels/schema.json``: its ``match`` block is the tactic's bounded domain; the rest says how to
build and launch it, the workspace, the numerical policy, maturity and the evidence.

A model name is never part of either. Nothing here imports torch at module level (the CLI imports
this module at registration time); `Signature.of` imports it lazily.
"""

from __future__ import annotations

import copy
import json
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from netra.resources import DATA_ROOT
from netra.validate.schema import SchemaError, check

SCHEMA_PATH = DATA_ROOT / "kernels" / "schema.json"
MATURITIES = ("rejected", "experiment", "verified", "accepted")  # ascending
GRAPH_PHASES = ("eager", "capture")
# Hardware fact per target that a contract implicitly assumes (warp/wave width).
TARGET_WARP = {"sm90": 32, "gfx950": 64}

_schema_cache: dict[str, Any] = {}


class ContractError(ValueError):
    """A contract file is malformed; the message names the file and the key."""


def contract_schema() -> dict[str, Any]:
    if "s" not in _schema_cache:
        _schema_cache["s"] = json.loads(SCHEMA_PATH.read_text())
    schema: dict[str, Any] = _schema_cache["s"]
    return schema


def _dtype_name(dtype: Any) -> str:
    return str(dtype).removeprefix("torch.")


_target_cache: dict[tuple[str, int], str] = {}


def device_target(device: Any) -> str:
    """``"cpu"``, ``"sm90"`` (CUDA capability 9.0) or ``"gfx950"`` (ROCm arch) for a torch device."""
    if device.type != "cuda":
        return device.type
    index = device.index if device.index is not None else _current_device()
    key = (device.type, index)
    target = _target_cache.get(key)
    if target is None:
        import torch

        if getattr(torch.version, "hip", None):
            target = torch.cuda.get_device_properties(index).gcnArchName.split(":")[0]
        else:
            major, minor = torch.cuda.get_device_capability(index)
            target = f"sm{major}{minor}"
        _target_cache[key] = target
    return target


def _current_device() -> int:
    import torch

    return int(torch.cuda.current_device())


@dataclass(frozen=True)
class Signature:
    """One call's identity for dispatch; hashable, so decisions cache per signature.

    ``device`` is the device index (-1 on the CPU): it does not take part in matching, but a loaded
    tactic belongs to one device, so decisions are cached per device too.
    """

    target: str
    op: str
    dims: tuple[tuple[str, int], ...]
    dtypes: tuple[tuple[str, str], ...]
    layouts: tuple[tuple[str, str], ...]
    quant: str = "none"
    reduction_order: str = "any"
    graph_phase: str = "eager"
    determinism: str = "bitwise"
    device: int = -1

    @staticmethod
    def layout_of(t: Any) -> str:
        """``contiguous_align16`` / ``contiguous`` / ``strided``: what a vectorised kernel cares about."""
        if not t.is_contiguous():
            return "strided"
        return "contiguous_align16" if t.data_ptr() % 16 == 0 else "contiguous"

    @classmethod
    def of(cls, op: str, tensors: dict[str, Any], params: dict[str, int] | None = None,
           graph_phase: str | None = None, quant: str = "none", reduction_order: str = "any",
           determinism: str = "bitwise") -> Signature:
        """Build a signature from the call's tensors (dtype, layout, device) and integer params (dims).

        ``graph_phase`` defaults to ``"capture"`` while the current CUDA stream is capturing a graph.
        """
        first = next(iter(tensors.values()))
        device = first.device
        for name, t in tensors.items():
            if t.device != device:
                raise ValueError(f"{op}: tensor {name!r} is on {t.device}, expected {device}")
        if graph_phase is None:
            graph_phase = "eager"
            if device.type == "cuda":
                import torch

                if torch.cuda.is_current_stream_capturing():
                    graph_phase = "capture"
        index = -1 if device.type != "cuda" else (device.index if device.index is not None
                                                   else _current_device())
        return cls(
            target=device_target(device),
            op=op,
            dims=tuple(sorted((params or {}).items())),
            dtypes=tuple(sorted((k, _dtype_name(t.dtype)) for k, t in tensors.items())),
            layouts=tuple(sorted((k, cls.layout_of(t)) for k, t in tensors.items())),
            quant=quant,
            reduction_order=reduction_order,
            graph_phase=graph_phase,
            determinism=determinism,
            device=index,
        )

    def describe(self) -> str:
        dims = ",".join(f"{k}={v}" for k, v in self.dims)
        dtypes = ",".join(f"{k}:{v}" for k, v in self.dtypes)
        layouts = ",".join(f"{k}:{v}" for k, v in self.layouts)
        return (f"{self.op}@{self.target} dims[{dims}] dtypes[{dtypes}] layouts[{layouts}] "
                f"quant={self.quant} order={self.reduction_order} phase={self.graph_phase} "
                f"det={self.determinism}")


@dataclass(frozen=True)
class DimRange:
    lo: int
    hi: int
    values: frozenset[int] | None = None  # an explicit set ("in"), else the closed range [lo, hi]

    @classmethod
    def parse(cls, spec: dict[str, Any]) -> DimRange:
        if "eq" in spec:
            return cls(spec["eq"], spec["eq"])
        if "in" in spec:
            vals = frozenset(spec["in"])
            return cls(min(vals), max(vals), vals)
        if spec["min"] > spec["max"]:
            raise ContractError(f"dim range min {spec['min']} > max {spec['max']}")
        return cls(spec["min"], spec["max"])

    def contains(self, v: int) -> bool:
        return v in self.values if self.values is not None else self.lo <= v <= self.hi

    def overlaps(self, other: DimRange) -> bool:
        if self.values is not None:
            return any(other.contains(v) for v in self.values)
        if other.values is not None:
            return any(self.contains(v) for v in other.values)
        return self.lo <= other.hi and other.lo <= self.hi

    def __str__(self) -> str:
        if self.values is not None:
            return f"in {sorted(self.values)}"
        return f"== {self.lo}" if self.lo == self.hi else f"in [{self.lo}, {self.hi}]"


@dataclass(frozen=True)
class CodeObject:
    """One launchable unit of a contract: a cubin built by nvcc, or a Triton module (kernel.kind).

    Its identity in the lock and the runtime is ``name``: a contract without a plan has one object named
    after it; a plan's steps name theirs, and two contracts may share an object only with identical
    definitions (the catalog checks)."""

    name: str
    target: str
    family: str
    kernel: dict[str, Any]
    launch: dict[str, Any]
    workspace: dict[str, Any]

    @property
    def kind(self) -> str:
        return str(self.kernel.get("kind", "cubin"))

    @property
    def path(self) -> str:
        """Cubins: relative to the build dir; Triton modules: their source, relative to the repository."""
        if self.kind == "triton":
            return str(self.kernel["source"])
        return f"{self.target}/{self.family}/{self.name}.cubin"

    def definition(self) -> dict[str, Any]:
        return {"kernel": self.kernel, "launch": self.launch, "workspace": self.workspace}


@dataclass(frozen=True)
class Contract:
    name: str
    target: str
    family: str
    op: str
    maturity: str
    dims: dict[str, DimRange]
    dtypes: dict[str, frozenset[str]]
    layouts: dict[str, frozenset[str]]
    quant: frozenset[str]
    reduction_order: frozenset[str]
    graph_phases: frozenset[str]
    determinism: frozenset[str]
    kernel: dict[str, Any]
    launch: dict[str, Any]
    workspace: dict[str, Any]
    numerics: dict[str, Any]
    evidence: tuple[str, ...]
    declaration: bool  # the domain is declared for the target; no code object exists
    path: Path = field(compare=False)
    raw: dict[str, Any] = field(compare=False, repr=False)

    @property
    def objects(self) -> tuple[CodeObject, ...]:
        """The code objects this contract launches, in order: one named after the contract, or its plan's steps."""
        if self.declaration:
            return ()
        steps = self.raw.get("plan")
        if steps is None:
            return (CodeObject(self.name, self.target, self.family, self.kernel, self.launch, self.workspace),)
        return tuple(CodeObject(st["object"], self.target, self.family, st["kernel"], st["launch"], st["workspace"])
                     for st in steps)

    @property
    def code_object(self) -> str:
        """The code objects' paths (relative to the build dir for cubins), comma-separated (`netra explain`)."""
        return ", ".join(o.path for o in self.objects)

    def mismatch(self, sig: Signature) -> str | None:
        """``None`` when ``sig`` lies inside this contract's domain, else the first reason it does not."""
        if sig.target != self.target:
            return f"target {sig.target} != {self.target}"
        if sig.op != self.op:
            return f"op {sig.op} != {self.op}"
        dims = dict(sig.dims)
        for name, rng in self.dims.items():
            if name not in dims:
                return f"dim {name} not given"
            if not rng.contains(dims[name]):
                return f"dim {name}={dims[name]} not {rng}"
        extra = sorted(set(dims) - set(self.dims))
        if extra:
            return f"dims {extra} not covered by the contract"
        for label, want, have in (("dtype", self.dtypes, dict(sig.dtypes)),
                                  ("layout", self.layouts, dict(sig.layouts))):
            for name, allowed in want.items():
                if name not in have:
                    return f"{label} of {name} not given"
                if have[name] not in allowed:
                    return f"{label} {name}={have[name]} not in {sorted(allowed)}"
        for label, allowed, value in (("quant", self.quant, sig.quant),
                                      ("reduction order", self.reduction_order, sig.reduction_order),
                                      ("graph phase", self.graph_phases, sig.graph_phase),
                                      ("determinism", self.determinism, sig.determinism)):
            if value not in allowed:
                return f"{label} {value} not in {sorted(allowed)}"
        return None

    def overlaps(self, other: Contract) -> bool:
        """Whether some signature would match both (used to reject ambiguous catalogs)."""
        if (self.target, self.op) != (other.target, other.op):
            return False
        if set(self.dims) != set(other.dims) or set(self.dtypes) != set(other.dtypes):
            return False
        if not all(self.dims[k].overlaps(other.dims[k]) for k in self.dims):
            return False
        for mine, theirs in ((self.dtypes, other.dtypes), (self.layouts, other.layouts)):
            if any(k in theirs and not (mine[k] & theirs[k]) for k in mine):
                return False
        return all(a & b for a, b in ((self.quant, other.quant),
                                      (self.reduction_order, other.reduction_order),
                                      (self.graph_phases, other.graph_phases),
                                      (self.determinism, other.determinism)))


def parse_contract(doc: Any, path: Path) -> Contract:
    """Validate ``doc`` against the schema and build a `Contract`; errors name ``path``."""
    try:
        check(doc, contract_schema(), str(path))
    except SchemaError as exc:
        raise ContractError(str(exc)) from None
    m = doc["match"]
    try:
        dims = {k: DimRange.parse(v) for k, v in m["dims"].items()}
    except ContractError as exc:
        raise ContractError(f"{path}: {exc}") from None
    declaration = bool(doc.get("declaration", False))
    parts = [k for k in ("kernel", "launch", "workspace", "plan") if k in doc]
    if declaration and parts:
        raise ContractError(f"{path}: a declaration has no code object; remove {parts}")
    if not declaration:
        single = [k for k in ("kernel", "launch", "workspace") if k in doc]
        if "plan" in doc and single:
            raise ContractError(f"{path}: a plan contract names its code objects in its steps; remove {single}")
        missing = [] if "plan" in doc else [k for k in ("kernel", "launch", "workspace") if k not in doc]
        if missing:
            raise ContractError(f"{path}: missing required keys {missing} (or a \"plan\", or \"declaration\": true)")
        expected_dir = f"kernels/{doc['target']}/{doc['family']}/"
        kernels = [st["kernel"] for st in doc["plan"]] if "plan" in doc else [doc["kernel"]]
        for k in kernels:
            if not k["source"].startswith(expected_dir):
                raise ContractError(f"{path}: kernel.source {k['source']!r} must live under {expected_dir}")
        names = [st["object"] for st in doc.get("plan", [])]
        if len(set(names)) != len(names):
            raise ContractError(f"{path}: a plan names each code object once, got {names}")
    if declaration and doc["maturity"] not in ("experiment", "rejected"):
        raise ContractError(f"{path}: a declaration cannot be {doc['maturity']} (nothing was built or measured)")
    return Contract(
        name=doc["name"], target=doc["target"], family=doc["family"], op=doc["op"],
        maturity=doc["maturity"], dims=dims,
        dtypes={k: frozenset(v) for k, v in m["dtypes"].items()},
        layouts={k: frozenset(v) for k, v in m["layouts"].items()},
        quant=frozenset(m["quant"]), reduction_order=frozenset(m["reduction_order"]),
        graph_phases=frozenset(m["graph_phases"]), determinism=frozenset(m["determinism"]),
        kernel=doc.get("kernel", {}), launch=doc.get("launch", {}), workspace=doc.get("workspace", {}),
        numerics=doc["numerics"], evidence=tuple(doc["evidence"]), declaration=declaration, path=path, raw=doc,
    )


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7396 JSON merge patch: objects merge key by key, ``null`` removes a key, anything else
    (a list, a string, a number) replaces the target's value. ``target`` is not modified."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    out = copy.deepcopy(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            out.pop(key, None)
        else:
            out[key] = merge_patch(out.get(key), value)
    return out


def expand(doc: Any, path: Path) -> list[dict[str, Any]]:
    """The contract documents a file holds: itself, or one per entry of its ``variants``.

    A contract family is one file: the fields its members share, and ``variants``, a list of merge
    patches (`merge_patch`), each naming one contract (``name``) and giving the fields that differ. Each
    expansion is then an ordinary contract, validated and matched like a file of its own."""
    if not isinstance(doc, dict) or "variants" not in doc:
        return [doc]
    variants = doc["variants"]
    if not isinstance(variants, list) or not variants:
        raise ContractError(f"{path}: $.variants: expected a non-empty list of merge patches")
    base = {k: v for k, v in doc.items() if k != "variants"}
    out: list[dict[str, Any]] = []
    for i, patch in enumerate(variants):
        if not isinstance(patch, dict) or not isinstance(patch.get("name"), str):
            raise ContractError(f"{path}: $.variants[{i}]: a variant is an object that names its contract (\"name\")")
        if "variants" in patch:
            raise ContractError(f"{path}: $.variants[{i}]: variants do not nest")
        out.append(merge_patch(base, patch))
    return out


def load_contracts(path: Path) -> list[Contract]:
    """Every contract a file declares (one, or one per variant); errors name the file and the variant."""
    try:
        doc = json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise ContractError(f"{path}: not valid JSON ({exc})") from None
    docs = expand(doc, path)
    if docs[0] is doc:
        return [parse_contract(doc, path)]
    return [replace(parse_contract(d, Path(f"{path}[{d['name']}]")), path=path) for d in docs]


def load_contract(path: Path) -> Contract:
    """The one contract of a file without ``variants`` (`load_contracts` reads any file)."""
    contracts = load_contracts(path)
    if len(contracts) != 1:
        raise ContractError(f"{path}: declares {len(contracts)} contracts (variants); use load_contracts")
    return contracts[0]
