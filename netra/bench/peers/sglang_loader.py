"""Import SGLang 0.5.23's own kernel files without its server, for peer baselines on the H200.

The pinned ``sglang`` wheel is installed here with ``--no-deps``: its files are present, importing
it is not (the server needs CUDA-only dependencies). A peer therefore declares a ``Manifest``:

* ``modules``: the dotted ``sglang.*`` modules that run from their real files (a package is named
  by its own dotted name, which loads its ``__init__.py``). Every other ``sglang.*`` module and
  every ``sgl_kernel`` module resolves to a stub module: its ``stubs`` attributes (values SGLang
  reads at import, e.g. ``is_cuda() -> True``) or, for any other attribute, a function that raises
  when called and is recorded in ``NOTES``.
* ``refs``: a stub attribute that stands for SGLang code which cannot run here, resolved on first
  use to another real module's attribute (``"module:attr"``) with a note saying what runs instead
  (for example the AOT ``sgl_kernel.moe_sum_reduce`` -> SGLang's Triton ``moe_sum_reduce_triton``).
  The first call of each is recorded in ``NOTES``: nothing is substituted silently.
* ``files``: other files the peer reads (tuned configs); ``jit``: SGLang JIT CUDA modules to build
  here (``JitBuild``: a module's own getter and its arguments); ``wheels``: Python packages the GPU
  host lacks (pip requirement -> import name), carried as cp312 wheels.

``PEERS`` lists the modules holding a ``MANIFEST`` (a peer adds one line); ``sglang_common.COMMON``
(SGLang's JIT loader, its kernel registry, the platform stubs of a TP1 CUDA sm90 process, the wheels)
comes with every peer. ``stage`` produces the
folder the H200 run carries (default ``.sglang_peer/``, git-ignored; ``make sglang-peer``):

    <dest>/sglang/...             the manifests' files, copied from the installed wheel
    <dest>/jit/<module>.so        SGLang's JIT modules, built by SGLang's own ``load_jit`` with nvcc
                                  for sm_90a (``override_jit_cuda_arch(9, 0)``), no GPU needed
    <dest>/jit/MANIFEST.json      per module: the exact ``load_jit`` request it was built for
    <dest>/wheels/*.whl           apache-tvm-ffi (the version SGLang pins), msgspec
    <dest>/MANIFEST.json          what was staged, from which sglang version

``install(root)`` (on the H200; also here, for the CPU self-test) puts a meta-path finder in front
of every other, installs the carried wheels into a temporary site folder when they are missing, and
replaces ``sglang.kernels.jit.utils.load_jit`` by a lookup of the prebuilt module under SGLang's own
module name (``sgl_kernel_jit_<args>``), loaded with ``tvm_ffi.load_module``: a request that differs
from the one the module was built for (files, wrappers, flags, target) is an error, never a rebuild.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tempfile
import types
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

SGLANG_VERSION = "0.5.23"
DEFAULT_ROOT = Path(".sglang_peer")
# The modules that hold a MANIFEST; a new peer (GDN, conv, attention, GEMM) adds its module here.
PEERS: tuple[str, ...] = ("netra.bench.peers.sglang_moe", "netra.bench.peers.sglang_gdn",
                          "netra.bench.peers.sglang_attention", "netra.bench.peers.sglang_plugin",
                          "netra.bench.peers.sglang_gemm", "netra.bench.peers.sglang_spec")
# The GPU host: CPython 3.12 on x86-64 (its torch, triton and CUDA come with the image).
WHEEL_PLATFORM = ("--python-version", "3.12", "--implementation", "cp", "--platform", "manylinux_2_28_x86_64",
                  "--platform", "manylinux_2_27_x86_64", "--platform", "manylinux_2_24_x86_64",
                  "--platform", "manylinux_2_17_x86_64", "--platform", "manylinux2014_x86_64")
JIT_TARGET = (9, 0)  # sm_90a: SGLang's _cuda_arch_suffix gives Hopper the arch-specific "a" target
NOTES: list[str] = []


@dataclass(frozen=True)
class JitBuild:
    """One SGLang JIT module: ``module.getter(*args, **kwargs)`` is the call SGLang itself makes to
    get it. Arguments are data; a string ``"torch.<dtype>"`` names a torch dtype."""

    module: str
    getter: str
    args: tuple[Any, ...] = ()
    kwargs: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Manifest:
    name: str
    modules: tuple[str, ...]
    files: tuple[str, ...] = ()
    stubs: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    refs: Mapping[str, Mapping[str, tuple[str, str]]] = field(default_factory=dict)  # attr -> (target, note)
    jit: tuple[JitBuild, ...] = ()
    wheels: Mapping[str, str] = field(default_factory=dict)  # pip requirement -> import name


def manifests(peers: tuple[str, ...] = PEERS) -> list[Manifest]:
    """``sglang_common.COMMON`` (shared by every peer), then each peer's ``MANIFEST``."""
    return [importlib.import_module(p).MANIFEST for p in ("netra.bench.peers.sglang_common", *peers)]


def module_file(root: Path, name: str) -> Path:
    """The real file of dotted module ``name`` under ``root`` (a package: its ``__init__.py``)."""
    base = root.joinpath(*name.split("."))
    for cand in (base.with_suffix(".py"), base / "__init__.py"):
        if cand.is_file():
            return cand
    raise FileNotFoundError(f"SGLang peer file for {name} missing under {root}")


def module_relpath(root: Path, name: str) -> str:
    return module_file(root, name).relative_to(root).as_posix()


# ---------------------------------------------------------------------------------------------
# the merged view of several manifests
# ---------------------------------------------------------------------------------------------

@dataclass
class Plan:
    modules: set[str]
    files: list[str]
    stubs: dict[str, dict[str, Any]]
    refs: dict[str, dict[str, tuple[str, str]]]
    jit: list[JitBuild]
    wheels: dict[str, str]


def merge(ms: list[Manifest]) -> Plan:
    """One plan for several peers; a module real in one and stubbed in another is an error."""
    plan = Plan(set(), [], {}, {}, [], {})
    for m in ms:
        plan.modules.update(m.modules)
        plan.files += [f for f in m.files if f not in plan.files]
        plan.jit += [j for j in m.jit if j not in plan.jit]
        plan.wheels.update(m.wheels)
        for table, src in ((plan.stubs, m.stubs), (plan.refs, m.refs)):
            for mod, attrs in src.items():
                have = table.setdefault(mod, {})
                for k, v in attrs.items():
                    if k in have and have[k] is not v and have[k] != v:
                        raise ValueError(f"peer manifests disagree on {mod}.{k} ({m.name})")
                    have[k] = v
    clash = plan.modules & (set(plan.stubs) | set(plan.refs))
    if clash:
        raise ValueError(f"modules both real and stubbed: {sorted(clash)}")
    return plan


# ---------------------------------------------------------------------------------------------
# the finder
# ---------------------------------------------------------------------------------------------

def _raising(modname: str, attr: str) -> Callable[..., Any]:
    def stub(*args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError(f"SGLang peer stub {modname}.{attr} was called: it is not part of the peer")

    stub.__name__ = attr
    return stub


class _Ref:
    """A stub attribute resolved to another module's attribute; its first call is noted."""

    def __init__(self, where: str, target: str, note: str) -> None:
        self.where, self.target, self.note, self.called = where, target, note, False
        self.fn: Callable[..., Any] | None = None

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if self.fn is None:
            mod, _, attr = self.target.partition(":")
            self.fn = getattr(importlib.import_module(mod), attr)
        if not self.called:
            self.called = True
            NOTES.append(f"ran {self.target} for {self.where}: {self.note}")
        return self.fn(*args, **kwargs)


class _StubModule(types.ModuleType):
    _refs: dict[str, tuple[str, str]]
    _known: set[str]  # dotted names the plan covers (real, stubbed or with refs)

    def __getattr__(self, attr: str) -> Any:
        if attr.startswith("__"):
            raise AttributeError(attr)
        sub = f"{self.__name__}.{attr}"
        if sub in self._known:  # `from <stub package> import <module the plan names>`
            return importlib.import_module(sub)
        ref = self._refs.get(attr)
        if ref is not None:
            value: Any = _Ref(f"{self.__name__}.{attr}", *ref)
        else:
            NOTES.append(f"stub {self.__name__}.{attr} (raises if called)")
            value = _raising(self.__name__, attr)
        setattr(self, attr, value)
        return value


class _RealLoader(importlib.machinery.SourceFileLoader):
    def __init__(self, fullname: str, path: str, hooks: Mapping[str, Callable[[types.ModuleType], None]]) -> None:
        super().__init__(fullname, path)
        self.hooks = hooks

    def exec_module(self, module: types.ModuleType) -> None:
        super().exec_module(module)
        hook = self.hooks.get(module.__name__)
        if hook is not None:
            hook(module)


class _Finder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def __init__(self, root: Path, plan: Plan, hooks: Mapping[str, Callable[[types.ModuleType], None]]) -> None:
        self.root, self.plan, self.hooks = root, plan, hooks
        self.known = set(plan.modules) | set(plan.stubs) | set(plan.refs)

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> importlib.machinery.ModuleSpec | None:
        if fullname.split(".")[0] not in ("sglang", "sgl_kernel"):
            return None
        if fullname in self.plan.modules:
            f = module_file(self.root, fullname)
            pkg = [str(f.parent)] if f.name == "__init__.py" else None
            return importlib.util.spec_from_file_location(fullname, f, loader=_RealLoader(fullname, str(f), self.hooks),
                                                          submodule_search_locations=pkg)
        return importlib.machinery.ModuleSpec(fullname, self, is_package=True)

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        mod = _StubModule(spec.name)
        mod.__path__ = []
        mod._refs = dict(self.plan.refs.get(spec.name, {}))
        mod._known = self.known
        for k, v in self.plan.stubs.get(spec.name, {}).items():
            setattr(mod, k, v)
        return mod

    def exec_module(self, module: types.ModuleType) -> None:
        return None


# ---------------------------------------------------------------------------------------------
# JIT modules: SGLang's own request, built here, looked up on the GPU host
# ---------------------------------------------------------------------------------------------

def jit_request(args: tuple[Any, ...], kw: Mapping[str, Any]) -> dict[str, Any]:
    """A ``load_jit`` call as data: what the prebuilt module must have been built for."""
    keys = ("cpp_files", "cuda_files", "cpp_wrappers", "cuda_wrappers", "extra_cflags", "extra_cuda_cflags",
            "extra_ldflags", "extra_include_paths", "extra_dependencies")
    req: dict[str, Any] = {"args": [str(a) for a in args]}
    for k in keys:
        req[k] = [list(v) if isinstance(v, tuple) else v for v in (kw.get(k) or [])]
    req["header_only"] = bool(kw.get("header_only", True))
    return req


def _arch_tag() -> str:
    from sglang.kernels.jit.utils import get_jit_cuda_arch  # type: ignore[import-not-found]

    a = get_jit_cuda_arch()
    return f"sm_{a.major}{a.minor}{a.suffix}"


def _module_name(args: tuple[Any, ...]) -> str:
    from sglang.kernels.jit.utils.compile.spec import _MODULE_NAME_PREFIX  # type: ignore[import-not-found]

    return str(_MODULE_NAME_PREFIX + "_".join(str(a) for a in args))


def _prebuilt_load_jit(jit_dir: Path) -> Callable[..., Any]:
    table_file = jit_dir / "MANIFEST.json"
    table: dict[str, Any] = json.loads(table_file.read_text())["modules"] if table_file.is_file() else {}

    def load_jit(*args: Any, **kw: Any) -> Any:
        name = _module_name(args)
        entry = table.get(name)
        if entry is None:
            raise RuntimeError(f"SGLang JIT module {name} is not prebuilt in {jit_dir}; add it to the peer "
                               f"manifest's jit list and re-stage (make sglang-peer)")
        want = jit_request(args, kw)
        if entry["request"] != want:
            raise RuntimeError(f"SGLang JIT module {name}: prebuilt for {entry['request']}, requested {want}")
        arch = _arch_tag()
        if entry["target"] != arch:
            raise RuntimeError(f"SGLang JIT module {name} was built for {entry['target']}, this GPU is {arch}")
        from tvm_ffi import load_module  # type: ignore[import-not-found]

        NOTES.append(f"jit {name}: prebuilt {entry['file']} loaded through tvm_ffi")
        return load_module(str(jit_dir / entry["file"]))

    return load_jit


class _JitRecorder:
    """Build mode: SGLang's load_jit compiles; the library path is returned instead of a module."""

    def __init__(self, real: Callable[..., Any]) -> None:
        self.real, self.compile = real, True
        self.built: dict[str, dict[str, Any]] = {}

    def __call__(self, *args: Any, **kw: Any) -> Any:
        # compile=False records the request only (tests: the manifest without nvcc)
        lib = self.real(*args, **kw) if self.compile else Path(f"{_module_name(args)}.so")
        self.built[_module_name(args)] = {"request": jit_request(args, kw), "path": str(lib), "target": _arch_tag()}
        return lib


def _jit_hooks(mode: str, jit_dir: Path) -> tuple[dict[str, Callable[[types.ModuleType], None]], list[Any]]:
    recorder: list[Any] = []

    def on_loader(mod: types.ModuleType) -> None:
        if mode == "build":
            # No GPU here: instead of loading the library, keep a copy (a fresh build lives in a
            # staging folder that load_jit publishes or removes right after this call).
            keep = Path(tempfile.mkdtemp(prefix="netra_sglang_jit_"))

            def _keep(library: Any) -> Path:
                out = keep / Path(str(library)).name
                shutil.copyfile(str(library), out)
                return out

            mod._load = _keep  # type: ignore[attr-defined]

    def on_utils(mod: types.ModuleType) -> None:
        if mode == "build":
            rec = _JitRecorder(mod.load_jit)  # type: ignore[attr-defined]
            recorder.append(rec)
            fn: Callable[..., Any] = rec
        else:
            fn = _prebuilt_load_jit(jit_dir)
        mod.load_jit = fn  # type: ignore[attr-defined]
        compile_mod = sys.modules.get("sglang.kernels.jit.utils.compile")
        if compile_mod is not None:
            compile_mod.load_jit = fn  # type: ignore[attr-defined]

    return ({"sglang.kernels.jit.utils.compile.loader": on_loader, "sglang.kernels.jit.utils": on_utils}, recorder)


# ---------------------------------------------------------------------------------------------
# install / stage
# ---------------------------------------------------------------------------------------------

@dataclass
class Installed:
    root: Path
    mode: str
    plan: Plan
    recorder: list[Any]


_INSTALLED: Installed | None = None


def ensure_wheels(root: Path, wheels: Mapping[str, str]) -> None:
    """Make the carried wheels importable: each missing package's wheel, pip-installed (--no-index)
    into a temporary site folder for this Python. Best effort, one package at a time: the wheels are
    every peer's (cp312 for the GPU host), a peer needs only its own, and a package that stays missing
    fails where it is imported; each one not installed is noted."""
    missing = {req: imp for req, imp in wheels.items()
               if imp not in sys.modules and importlib.util.find_spec(imp) is None}
    if not missing:
        return
    site = Path(tempfile.gettempdir()) / f"netra_sglang_peer_py{sys.version_info[0]}{sys.version_info[1]}"
    installed = []
    for req, imp in sorted(missing.items()):
        prefix = req.split("==")[0].replace("-", "_").lower() + "-"
        files = [f for f in sorted((root / "wheels").glob("*.whl")) if f.name.lower().startswith(prefix)]
        if not files:
            NOTES.append(f"{imp} not importable and no {req} wheel under {root / 'wheels'}")
            continue
        if not (site / imp).exists():
            r = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--no-compile",
                                "--upgrade", "--target", str(site), *map(str, files)], capture_output=True, text=True)
            if r.returncode != 0:
                NOTES.append(f"{imp}: {files[0].name} does not install for this Python: {r.stderr.strip()[-200:]}")
                continue
        installed.append(files[0].name)
    if installed:
        if str(site) not in sys.path:
            sys.path.insert(0, str(site))
        importlib.invalidate_caches()
        NOTES.append(f"installed carried wheels {installed} into {site}")


def _logger_once_methods() -> None:
    """SGLang calls ``logger.warning_once`` / ``info_once``: methods that transformers (imported by
    every SGLang server process) adds to ``logging.Logger``. Add the same here when they are absent."""
    import functools
    import logging

    for level in ("warning", "info"):
        name = f"{level}_once"
        if not hasattr(logging.Logger, name):
            method = getattr(logging.Logger, level)
            setattr(logging.Logger, name, functools.lru_cache(None)(lambda self, *a, _m=method, **k: _m(self, *a, **k)))


def install(root: Path = DEFAULT_ROOT, *, mode: str = "run", peers: tuple[str, ...] = PEERS,
            manifest_list: list[Manifest] | None = None) -> Installed:
    """Route ``sglang.*`` / ``sgl_kernel.*`` imports to ``root`` (see the module docstring); the
    manifests are those of ``peers`` unless ``manifest_list`` is given."""
    global _INSTALLED
    root = Path(root).resolve()
    if _INSTALLED is not None:
        if (_INSTALLED.root, _INSTALLED.mode) != (root, mode):
            raise RuntimeError(f"SGLang peer already installed from {_INSTALLED.root} ({_INSTALLED.mode})")
        return _INSTALLED
    if mode not in ("run", "build"):
        raise ValueError(f"mode must be run or build, got {mode!r}")
    if any(m.split(".")[0] in ("sglang", "sgl_kernel") for m in sys.modules):
        raise RuntimeError("a real or stubbed sglang is already imported in this process; install the peer first")
    plan = merge(manifest_list if manifest_list is not None else manifests(peers))
    missing = []
    for name in sorted(plan.modules):
        try:
            module_file(root, name)
        except FileNotFoundError:
            missing.append(name)
    missing += [f for f in plan.files if not (root / f).is_file()]
    if missing:
        raise FileNotFoundError(f"SGLang peer files missing under {root}: {missing[:8]} (make sglang-peer)")
    if mode == "run":
        # tvm-ffi would JIT-build a torch DLPack add-on when torch lacks the C exchange API; its
        # fallback passes torch's current stream just the same (only eager host cost differs).
        os.environ.setdefault("TVM_FFI_DISABLE_TORCH_C_DLPACK", "1")
        ensure_wheels(root, plan.wheels)
    _logger_once_methods()
    hooks, recorder = _jit_hooks(mode, root / "jit")
    sys.meta_path.insert(0, _Finder(root, plan, hooks))
    _INSTALLED = Installed(root, mode, plan, recorder)
    return _INSTALLED


def _dtype_args(values: tuple[Any, ...]) -> list[Any]:
    import torch

    return [getattr(torch, v[6:]) if isinstance(v, str) and v.startswith("torch.") else v for v in values]


def build_jit(jit_dir: Path, jit: list[JitBuild], compile: bool = True) -> dict[str, Any]:
    """Build mode (after ``install(..., mode="build")``): run each getter under sm_90a, copy the
    libraries into ``jit_dir`` and write its MANIFEST.json (``compile=False``: the requests only)."""
    assert _INSTALLED is not None and _INSTALLED.mode == "build"
    from sglang.kernels.jit.utils import override_jit_cuda_arch  # type: ignore[import-not-found]

    jit_dir.mkdir(parents=True, exist_ok=True)
    rec = _INSTALLED.recorder[0]
    rec.compile = compile
    with override_jit_cuda_arch(*JIT_TARGET):
        for jb in jit:
            fn = getattr(importlib.import_module(jb.module), jb.getter)
            fn(*_dtype_args(jb.args), **jb.kwargs)
    table = {}
    for name, entry in sorted(rec.built.items()):
        if compile:
            shutil.copyfile(entry["path"], jit_dir / f"{name}.so")
        table[name] = {"file": f"{name}.so", "request": entry["request"], "target": entry["target"]}
    doc = {"sglang": SGLANG_VERSION, "built_with": "sglang.kernels.jit.utils.load_jit + nvcc", "modules": table}
    (jit_dir / "MANIFEST.json").write_text(json.dumps(doc, indent=1) + "\n")
    return doc


def wheel_root() -> Path:
    """The folder holding the installed ``sglang`` distribution (pinned, --no-deps; not imported)."""
    from importlib.metadata import distribution

    dist = distribution("sglang")
    if dist.version != SGLANG_VERSION:
        raise RuntimeError(f"installed sglang is {dist.version}, the peer is pinned to {SGLANG_VERSION}")
    return Path(str(dist.locate_file("")))


def stage_files(dest: Path, plan: Plan, src: Path | None = None) -> list[str]:
    src = src or wheel_root()
    rels = sorted({module_relpath(src, m) for m in plan.modules} | set(plan.files))
    for rel in rels:
        out = dest / rel
        out.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(src / rel, out)
    # sglang.kernels.jit.utils.compile.paths requires these folders; the modules are prebuilt.
    for sub in ("include", "csrc"):
        d = dest / "sglang" / "kernels" / "jit" / sub
        d.mkdir(parents=True, exist_ok=True)
        (d / "README").write_text("JIT sources are not carried: the modules are prebuilt under jit/.\n")
    return rels


def download_wheels(dest: Path, wheels: Mapping[str, str]) -> list[str]:
    (dest / "wheels").mkdir(parents=True, exist_ok=True)
    if wheels:
        subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:",
                        *WHEEL_PLATFORM, "-d", str(dest / "wheels"), *sorted(wheels)], check=True)
    return sorted(p.name for p in (dest / "wheels").glob("*.whl"))


def stage(dest: Path = DEFAULT_ROOT, peers: tuple[str, ...] = PEERS, wheels: bool = True,
          compile: bool = True) -> dict[str, Any]:
    """Everything the H200 run carries, in ``dest`` (run in a fresh process: it imports sglang)."""
    dest = Path(dest)
    plan = merge(manifests(peers))
    src = wheel_root()
    files = stage_files(dest, plan, src)
    os.environ.setdefault("SGLANG_JIT_CACHE_DIR", str(Path.home() / ".cache" / "netra" / "sglang_jit"))
    if "CUDA_HOME" not in os.environ and "CUDA_PATH" not in os.environ:
        # SGLang derives the toolkit from `which nvcc`; a wrapper script there (/usr/local/bin/nvcc
        # here) hides lib64, so name the toolkit that holds both nvcc and libcudart.
        for home in (Path("/usr/local/cuda"), Path("/usr/local/cuda-13.0")):
            if (home / "bin" / "nvcc").is_file() and any((home / "lib64").glob("libcudart.so*")):
                os.environ["CUDA_HOME"] = str(home)
                break
    install(src, mode="build", peers=peers)
    jit = build_jit(dest / "jit", plan.jit, compile)
    whl = download_wheels(dest, plan.wheels) if wheels else []
    size = sum(p.stat().st_size for p in dest.rglob("*") if p.is_file())
    doc = {"sglang": SGLANG_VERSION, "peers": list(peers), "files": files, "jit": sorted(jit["modules"]),
           "wheels": whl, "bytes": size, "notes": sorted(set(NOTES))}
    (dest / "MANIFEST.json").write_text(json.dumps(doc, indent=1) + "\n")
    return doc


def main(argv: list[str] | None = None) -> int:
    import argparse

    ap = argparse.ArgumentParser(description="stage SGLang's kernel files, prebuilt JIT modules and wheels for the "
                                             "H200 peer runs (git-ignored folder; carry it to the GPU host)")
    ap.add_argument("dest", type=Path, nargs="?", default=DEFAULT_ROOT)
    ap.add_argument("--no-wheels", action="store_true", help="skip downloading the cp312 wheels")
    ap.add_argument("--no-compile", action="store_true", help="record the JIT requests without building (tests)")
    a = ap.parse_args(argv)
    doc = stage(a.dest, wheels=not a.no_wheels, compile=not a.no_compile)
    print(f"staged {len(doc['files'])} files, {len(doc['jit'])} JIT modules, {len(doc['wheels'])} wheels into "
          f"{a.dest} ({doc['bytes'] / 1e6:.1f} MB)")
    for name in doc["jit"]:
        print(f"  jit {name}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
