"""`netra kernels build | verify`: contract sources -> code objects, the resource report, the lock.

Each code object of a target with a builder (sm90: nvcc) compiles to
``<build dir>/<target>/<family>/<object name>.cubin`` (a contract has one object named after it, or a plan of
several; a Triton module is pinned by its source's sha256 and compiled by Triton on the GPU machine). ptxas' resource report (registers,
barriers, shared memory, spills, stack) is parsed and kept. The lock, ``kernels/lock.json``, is
committed: per code object its sha256, resources and flags, plus the nvcc version line. CI rebuilds
and fails on any hash or resource difference and on spills a contract does not explain
(tests/kernels/test_kernel_lock.py). The deployment launcher and the runtime check code objects
against the lock (`verify_lock`, and the runtime re-hashes what it loads).

Builds are deterministic: nvcc runs from the repository root on the repository-relative source
path with fixed flags, so the same source gives the same bytes in any clone.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import re
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Any

from netra.kernel_lock import LOCK_PATH, LOCK_VERSION, LockError, object_path, read_lock
from netra.resources import DATA_ROOT

# Per target: the compiler and the flags every code object of that target gets (before the
# contract's own). sm_90a (not sm_90) so Hopper-only instructions are available; -Xptxas -v for
# the resource report; no -lineinfo/-G (they would embed paths and change the bytes).
TARGET_FLAGS: dict[str, list[str]] = {
    "sm90": ["-cubin", "-gencode=arch=compute_90a,code=sm_90a", "-O3", "-std=c++17", "-Xptxas=-v"],
}
RESOURCE_KEYS = ("registers", "smem_bytes", "spill_stores", "spill_loads", "stack_bytes", "barriers")


class BuildError(LockError):
    pass


def nvcc_path() -> str | None:
    return shutil.which("nvcc")


def nvcc_version(nvcc: str | None = None) -> str:
    """The ``Cuda compilation tools, release X, VY`` line of ``nvcc --version``."""
    exe = nvcc or nvcc_path()
    if exe is None:
        raise BuildError("nvcc not found on PATH (needed to build sm90 code objects)")
    out = subprocess.run([exe, "--version"], capture_output=True, text=True, check=True).stdout
    for line in out.splitlines():
        if line.startswith("Cuda compilation tools"):
            return line.strip()
    raise BuildError(f"cannot read nvcc version from: {out!r}")


def parse_ptxas(report: str, symbol: str) -> dict[str, int]:
    """Resources of ``symbol`` from ptxas' ``-v`` output (CUDA 13 format).

    ``Function properties for S`` is followed by ``N bytes stack frame, N bytes spill stores, N
    bytes spill loads``; ``Compiling entry function 'S'`` is followed by ``Used N registers, used
    M barriers, K bytes smem, ...`` (older ptxas omits barriers and puts smem first: both parse).
    """
    res: dict[str, int] = {}
    lines = report.splitlines()
    current: str | None = None
    for i, line in enumerate(lines):
        m = re.search(r"(?:Compiling entry function|Function properties for) '?([A-Za-z_][\w$]*)'?", line)
        if m:
            current = m.group(1)
            if "Function properties" in line and current == symbol and i + 1 < len(lines):
                frame = lines[i + 1]
                for key, pat in (("stack_bytes", r"(\d+) bytes stack frame"),
                                 ("spill_stores", r"(\d+) bytes spill stores"),
                                 ("spill_loads", r"(\d+) bytes spill loads")):
                    mm = re.search(pat, frame)
                    if mm:
                        res[key] = int(mm.group(1))
            continue
        if current == symbol and "Used" in line and "registers" in line:
            for key, pat in (("registers", r"Used (\d+) registers"), ("barriers", r"used (\d+) barriers"),
                             ("smem_bytes", r"(\d+) bytes smem")):
                mm = re.search(pat, line)
                res[key] = int(mm.group(1)) if mm else 0
    missing = [k for k in RESOURCE_KEYS if k not in res]
    if missing:
        raise BuildError(f"ptxas report for {symbol} lacks {missing}:\n{report}")
    return {k: res[k] for k in RESOURCE_KEYS}


def _buildable(catalog: Any) -> list[Any]:
    """The catalog's code objects of targets with a builder (declarations have none)."""
    return [o for o in catalog.objects() if o.target in TARGET_FLAGS]


def build_one(obj: Any, build_dir: Path, nvcc: str | None) -> dict[str, Any]:
    """Compile one code object (a cubin), or pin a Triton module by its source's sha256; returns its lock entry.

    A Triton module is compiled by Triton on the GPU machine at first use (before any capture); what the
    lock pins is the source it compiles, so a deployment cannot run another one."""
    src = obj.kernel["source"]
    if not (DATA_ROOT / src).is_file():
        raise BuildError(f"code object {obj.name}: kernel source {src} not found")
    entry = {"target": obj.target, "family": obj.family, "name": obj.name, "source": src, "kind": obj.kind,
             "code_object": obj.path}
    if obj.kind == "triton":
        return {**entry, "sha256": hashlib.sha256((DATA_ROOT / src).read_bytes()).hexdigest(), "flags": [],
                "resources": {}}
    if nvcc is None:
        raise BuildError("nvcc not found on PATH (needed to build sm90 code objects)")
    out = build_dir / obj.path
    out.parent.mkdir(parents=True, exist_ok=True)
    flags = TARGET_FLAGS[obj.target] + list(obj.kernel["flags"])
    proc = subprocess.run([nvcc, *flags, "-o", str(out), src], cwd=DATA_ROOT, capture_output=True, text=True)
    if proc.returncode != 0:
        raise BuildError(f"nvcc failed for {obj.name} ({src}):\n{proc.stderr}{proc.stdout}")
    resources = parse_ptxas(proc.stderr + proc.stdout, obj.kernel["symbol"])
    spills = resources["spill_stores"] + resources["spill_loads"]
    if spills and not obj.kernel.get("accepted_spills"):
        raise BuildError(f"{obj.name}: ptxas reports spills ({resources['spill_stores']} B stores, "
                         f"{resources['spill_loads']} B loads) and the contract does not explain them "
                         "(kernel.accepted_spills)")
    return {**entry, "sha256": hashlib.sha256(out.read_bytes()).hexdigest(), "flags": flags, "resources": resources}


def build_all(build_dir: Path, catalog: Any = None, families: set[str] | None = None,
              base: dict[str, Any] | None = None) -> dict[str, Any]:
    """Build every code object (of ``families``, default all) into ``build_dir``; returns the lock document
    (not written). With ``families``, other families' entries are kept from ``base``."""
    from netra.catalog import Catalog

    catalog = catalog or Catalog.load()
    chosen = [o for o in _buildable(catalog) if families is None or o.family in families]
    if families is not None and not chosen:
        raise BuildError(f"no buildable code object in families {sorted(families)}")
    nvcc = nvcc_path()
    if nvcc is None and any(o.kind == "cubin" for o in chosen):
        raise BuildError("nvcc not found on PATH (needed to build sm90 code objects)")
    entries = [build_one(o, build_dir, nvcc) for o in chosen]
    if families is not None and base is not None:
        entries += [e for e in base["code_objects"] if e["family"] not in families]
    return {"version": LOCK_VERSION, "nvcc": nvcc_version(nvcc) if nvcc else "",
            "code_objects": sorted(entries, key=lambda e: (e["target"], e["family"], e["name"]))}


def write_lock(lock: dict[str, Any], path: Path = LOCK_PATH) -> None:
    path.write_text(json.dumps(lock, indent=2, sort_keys=True) + "\n")


def compare_locks(want: dict[str, Any], have: dict[str, Any]) -> list[str]:
    """Differences of a fresh build (``have``) from the committed lock (``want``)."""
    problems: list[str] = []
    if want.get("nvcc") != have.get("nvcc"):
        problems.append(f"nvcc differs: lock {want.get('nvcc')!r}, here {have.get('nvcc')!r} "
                        "(hashes are only comparable with the same nvcc)")
    w = {e["name"]: e for e in want["code_objects"]}
    h = {e["name"]: e for e in have["code_objects"]}
    for name in sorted(set(w) - set(h)):
        problems.append(f"{name}: in the lock but no contract builds it")
    for name in sorted(set(h) - set(w)):
        problems.append(f"{name}: built but missing from the lock (run `netra kernels build`)")
    for name in sorted(set(w) & set(h)):
        for key in ("sha256", "resources", "flags", "source", "code_object", "target", "family", "kind"):
            if w[name].get(key) != h[name].get(key):
                problems.append(f"{name}: {key} differs: lock {w[name].get(key)!r}, rebuilt {h[name].get(key)!r}")
    return problems


def verify_lock(build_dir: Path, lock_path: Path = LOCK_PATH) -> list[str]:
    """Problems with the code objects under ``build_dir`` against the lock (empty list: all good).

    Checks every lock entry's file exists with the locked sha256, and that the lock covers exactly
    the buildable contracts of the catalog. No compiler needed (the deployment launcher calls this).
    """
    from netra.catalog import Catalog

    try:
        lock = read_lock(lock_path)
    except BuildError as exc:
        return [str(exc)]
    problems: list[str] = []
    names = set()
    for e in lock["code_objects"]:
        names.add(e["name"])
        path = object_path(e, build_dir)
        if not path.is_file():
            problems.append(f"{e['name']}: code object {path} missing (run `netra kernels build`)")
            continue
        sha = hashlib.sha256(path.read_bytes()).hexdigest()
        if sha != e["sha256"]:
            problems.append(f"{e['name']}: {path} sha256 {sha} != lock {e['sha256']}")
    wanted = {o.name for o in _buildable(Catalog.load())}
    problems.extend(f"{n}: code object has no lock entry" for n in sorted(wanted - names))
    problems.extend(f"{n}: lock entry has no contract" for n in sorted(names - wanted))
    return problems


def register(sub: Any) -> None:
    k = sub.add_parser("kernels", help="build code objects and the kernel lock, or verify them")
    verbs = k.add_subparsers(dest="kernels_verb", metavar="WHAT", required=True)
    b = verbs.add_parser("build", help="compile every contract's source; write the lock")
    b.add_argument("--check", action="store_true",
                   help="build into a temporary dir and compare with the committed lock; write nothing")
    b.add_argument("--family", action="append", default=None,
                   help="only these families (repeatable); other lock entries are kept as they are")
    b.set_defaults(func=_cmd_build)
    v = verbs.add_parser("verify", help="check built code objects against the lock (no compiler)")
    v.set_defaults(func=_cmd_verify)


def _print_lock(lock: dict[str, Any]) -> None:
    print(lock["nvcc"])
    for e in lock["code_objects"]:
        r = e["resources"]
        if not r:  # a Triton module: pinned by its source
            print(f"  {e['code_object']}: sha256 {e['sha256'][:16]}  (Triton, compiled at first use)")
            continue
        print(f"  {e['code_object']}: sha256 {e['sha256'][:16]}  regs {r['registers']}  smem {r['smem_bytes']}  "
              f"stack {r['stack_bytes']}  spills {r['spill_stores']}/{r['spill_loads']}  barriers {r['barriers']}")


def _cmd_build(args: argparse.Namespace) -> int:
    from netra import settings

    try:
        if args.check:
            families = set(args.family) if args.family else None
            want = read_lock()
            with tempfile.TemporaryDirectory(prefix="netra-build-") as tmp:
                lock = build_all(Path(tmp), families=families, base=want)
            problems = compare_locks(want, lock)
            _print_lock(lock)
            for p in problems:
                print(f"MISMATCH {p}")
            return 1 if problems else 0
        build_dir = settings.get("NETRA_BUILD_DIR")
        families = set(args.family) if args.family else None
        lock = build_all(build_dir, families=families, base=read_lock() if families and LOCK_PATH.exists() else None)
        write_lock(lock)
    except BuildError as exc:
        print(f"netra kernels build: {exc}")
        return 1
    _print_lock(lock)
    print(f"wrote {LOCK_PATH} and code objects under {build_dir}")
    return 0


def _cmd_verify(args: argparse.Namespace) -> int:
    from netra import settings

    problems = verify_lock(settings.get("NETRA_BUILD_DIR"))
    for p in problems:
        print(f"PROBLEM {p}")
    print("kernel lock: ok" if not problems else f"kernel lock: {len(problems)} problem(s)")
    return 1 if problems else 0
