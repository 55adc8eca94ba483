"""The runtime bridge: code objects loaded through the CUDA driver API (`cuda.bindings.driver`).

`load_tactic(contract, device)` runs once per (contract, device), before any graph capture: it
finds the contract's code object in the kernel lock, checks its sha256, loads it into the device's
primary context (the one PyTorch uses), resolves the kernel symbol, checks the launch-argument
struct layout against the device's own ``netra_params_layout`` table, and allocates the persistent
workspace. `Tactic.launch` then only fills a preallocated argument buffer and calls
``cuLaunchKernel`` on the caller's stream: no allocation, no symbol lookup, no file or environment
access, no host synchronisation (tests/ops/test_argmax.py spies on all four), so a launch made
while PyTorch captures a CUDA graph is captured like any other kernel.

Importing this package needs no GPU and no driver; the first call that needs one raises
`RuntimeBridgeError` with the reason.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import threading
from dataclasses import dataclass, field
from typing import Any

from netra.contract import CodeObject, Contract

PARAMS_LAYOUT_SYMBOL = b"netra_params_layout"


class RuntimeBridgeError(RuntimeError):
    """A GPU call could not be made (no driver, missing/mismatched code object, a CUDA error)."""


_state: dict[str, Any] = {}
_load_lock = threading.Lock()
_tactics: dict[tuple[str, int], Tactic] = {}


def driver() -> Any:
    """`cuda.bindings.driver`, initialised; a clear error where there is no driver."""
    cached = _state.get("cu")
    if cached is not None:
        return cached
    try:
        from cuda.bindings import driver as cu
    except ImportError as exc:  # the package itself is missing
        raise RuntimeBridgeError(f"cuda-bindings is not installed ({exc}); pip install cuda-bindings") from exc
    try:
        (err,) = cu.cuInit(0)
    except Exception as exc:  # cuda.pathfinder raises when libcuda.so cannot be found
        raise RuntimeBridgeError(f"no NVIDIA driver on this machine: {exc}") from exc
    if int(err) != 0:
        raise RuntimeBridgeError(f"cuInit failed: {_err_name(cu, err)}")
    _state["cu"] = cu
    return cu


def _err_name(cu: Any, err: Any) -> str:
    try:
        _, name = cu.cuGetErrorName(err)
        return f"{name.decode() if isinstance(name, bytes) else name} ({int(err)})"
    except Exception:  # naming the error must never hide it
        return f"CUresult {int(err)}"


def check(result: Any, what: str) -> Any:
    """Unpack a cuda-bindings ``(CUresult, *values)`` tuple, raising on any error."""
    cu = _state["cu"]
    err, *values = result if isinstance(result, tuple) else (result,)
    if int(err) != 0:
        raise RuntimeBridgeError(f"{what}: {_err_name(cu, err)}")
    if not values:
        return None
    return values[0] if len(values) == 1 else tuple(values)


@dataclass
class Tactic:
    """A loaded, launchable code object for one contract on one device."""

    contract: Contract
    device: int
    sha256: str
    function: Any  # a CUfunction; a Triton module's entry function
    module: Any    # a CUmodule; the Triton module
    workspace: Any  # torch uint8 tensor, zeroed at load when the contract says so
    params: ctypes.Array[ctypes.c_char]  # the launch-argument struct's bytes (one POD struct)
    block: int
    smem_bytes: int
    # Op-specific prepared state (e.g. a ctypes view of `params`); filled once by the op module.
    binding: dict[str, Any] = field(default_factory=dict)
    obj: CodeObject | None = None  # the code object (None: the contract's own, for contracts loaded before plans)
    _param_ptrs: Any = None
    _param_ptrs_addr: int = 0
    _ex_config: Any = None
    _launch_lock: threading.Lock = field(default_factory=threading.Lock)

    def __post_init__(self) -> None:
        # kernelParams is a void*[1] pointing at the struct (the kernel takes the struct by value).
        self._param_ptrs = (ctypes.c_void_p * 1)(ctypes.addressof(self.params))
        self._param_ptrs_addr = ctypes.addressof(self._param_ptrs)

    @property
    def lock(self) -> threading.Lock:
        """Held by the op while it fills `params` and launches (the buffer is shared)."""
        return self._launch_lock

    def launch(self, grid: int, stream: int) -> None:
        """Launch with the current contents of `params` on ``stream`` (a raw CUstream handle).

        A contract whose launch names a thread-block ``cluster`` or ``pdl`` goes through
        ``cuLaunchKernelEx`` with a config prepared once at load (`_prepare_ex`); others through
        ``cuLaunchKernel``."""
        cfg = self._ex_config
        if cfg is not None:
            cfg.gridDimX = grid
            cfg.hStream = stream
            (err,) = _state["cu"].cuLaunchKernelEx(cfg, self.function, self._param_ptrs_addr, 0)
        else:
            (err,) = _state["cu"].cuLaunchKernel(self.function, grid, 1, 1, self.block, 1, 1, self.smem_bytes,
                                                 stream, self._param_ptrs_addr, 0)
        if int(err) != 0:
            raise RuntimeBridgeError(f"launch {self.name} (grid {grid}): {_err_name(_state['cu'], err)}")

    @property
    def launch_spec(self) -> dict[str, Any]:
        return self.obj.launch if self.obj is not None else self.contract.launch

    @property
    def name(self) -> str:
        return self.obj.name if self.obj is not None else self.contract.name

    @property
    def entry(self) -> Any:
        """A Triton module's entry function, called as ``entry(launch, **op_args)`` (under ``NETRA_NO_PDL``, with
        the launch's ``PDL`` meta turned off)."""
        from netra import settings

        fn = self.function
        if not settings.get("NETRA_NO_PDL"):
            return fn

        def no_pdl(launch: dict[str, Any], **op_args: Any) -> Any:
            meta = dict(launch.get("meta", {}))
            if "PDL" in meta:
                meta["PDL"] = 0
            return fn({**launch, "meta": meta, "pdl": False}, **op_args)
        return no_pdl

    @property
    def cluster(self) -> int:
        return int(self.launch_spec.get("cluster", 1))

    @property
    def pdl(self) -> bool:
        from netra import settings

        return bool(self.launch_spec.get("pdl", False)) and not settings.get("NETRA_NO_PDL")

    @property
    def cooperative(self) -> bool:
        """All CTAs co-resident (grid-wide barriers are safe); the launch fails rather than hangs if not."""
        return bool(self.launch_spec.get("cooperative", False))

    def grid(self, dims: dict[str, int]) -> int:
        """The 1-D grid size of this code object for a call's dims (the contract's grid rule)."""
        rule = self.launch_spec["grid"]
        if not isinstance(rule, list) or len(rule) != 1:
            raise RuntimeBridgeError(f"{self.name}: grid {rule!r} is not a 1-D rule")
        return grid_size(rule, {**dims, **self.launch_spec.get("meta", {})})[0]

    def _prepare_ex(self) -> None:
        """Build the ``cuLaunchKernelEx`` config for cluster / PDL / cooperative launches (once, at load)."""
        if self.cluster == 1 and not self.pdl and not self.cooperative:
            return
        self._ex_config = _launch_config(self.block, self.smem_bytes, cluster=self.cluster, pdl=self.pdl,
                                         cooperative=self.cooperative)

    def launch_pdl(self, grid: int, stream: int) -> None:
        """As `launch`, with programmatic dependent launch allowed (Hopper): the kernel may be
        scheduled before the previous kernel in the stream ends, and waits for it in-kernel
        (``griddepcontrol.wait``). For exploration rows of a contract that does not declare
        ``pdl`` (netra bench kernels); dispatch launches as the contract says."""
        cu = _state["cu"]
        cfg = self.binding.get("_pdl_config")
        if cfg is None:
            cfg = _launch_config(self.block, self.smem_bytes, cluster=self.cluster, pdl=True)
            self.binding["_pdl_config"] = cfg
        cfg.gridDimX = grid
        cfg.hStream = stream
        (err,) = cu.cuLaunchKernelEx(cfg, self.function, self._param_ptrs_addr, 0)
        if int(err) != 0:
            raise RuntimeBridgeError(f"cuLaunchKernelEx (PDL) {self.contract.name}: {_err_name(cu, err)}")


def _launch_config(block: int, smem_bytes: int, *, cluster: int = 1, pdl: bool = False,
                   cooperative: bool = False) -> Any:
    """A reusable ``CUlaunchConfig`` (grid and stream filled per launch)."""
    cu = _state["cu"]
    attrs = []
    if cooperative:
        attr = cu.CUlaunchAttribute()
        attr.id = cu.CUlaunchAttributeID.CU_LAUNCH_ATTRIBUTE_COOPERATIVE
        attr.value.cooperative = 1
        attrs.append(attr)
    if pdl:
        attr = cu.CUlaunchAttribute()
        attr.id = cu.CUlaunchAttributeID.CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION
        attr.value.programmaticStreamSerializationAllowed = 1
        attrs.append(attr)
    if cluster > 1:
        attr = cu.CUlaunchAttribute()
        attr.id = cu.CUlaunchAttributeID.CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION
        attr.value.clusterDim.x = cluster
        attr.value.clusterDim.y = 1
        attr.value.clusterDim.z = 1
        attrs.append(attr)
    cfg = cu.CUlaunchConfig()
    cfg.gridDimY = cfg.gridDimZ = 1
    cfg.blockDimX, cfg.blockDimY, cfg.blockDimZ = block, 1, 1
    cfg.sharedMemBytes = smem_bytes
    cfg.attrs = attrs
    cfg.numAttrs = len(attrs)
    _KEEPALIVE.append(attrs)  # the attribute objects live as long as any config that points at them
    return cfg


_KEEPALIVE: list[Any] = []


@dataclass
class Plan:
    """A plan contract's code objects, loaded, by object name (launched in the plan's order by the op)."""

    contract: Contract
    device: int
    steps: dict[str, Tactic]

    @property
    def sha256(self) -> str:
        return ",".join(t.sha256 for t in self.steps.values())


def load_tactic(contract: Contract, device: int) -> Any:
    """Load (once) the contract's code objects on ``device``: a `Tactic`, or a `Plan` of them for a plan
    contract (objects shared between contracts are loaded once per device); see the module docstring."""
    objects = contract.objects
    if not objects:
        raise RuntimeBridgeError(f"contract {contract.name} is a declaration: nothing to load")
    if "plan" not in contract.raw:
        return _load_object(contract, objects[0], device)
    return Plan(contract, device, {o.name: _load_object(contract, o, device) for o in objects})


def _load_object(contract: Contract, obj: CodeObject, device: int) -> Tactic:
    key = (obj.name, device)
    tactic = _tactics.get(key)
    if tactic is not None:
        return tactic
    with _load_lock:
        tactic = _tactics.get(key)
        if tactic is None:
            tactic = _load(contract, obj, device)
            _tactics[key] = tactic
    return tactic


def _lock_entry(obj: CodeObject) -> tuple[dict[str, Any], Any]:
    from netra import settings
    from netra.kernel_lock import object_path, read_lock

    lock = read_lock()
    entry = next((e for e in lock["code_objects"] if e["name"] == obj.name), None)
    if entry is None:
        raise RuntimeBridgeError(f"kernel lock has no code object for {obj.name}; run `netra kernels build`")
    return entry, object_path(entry, settings.get("NETRA_BUILD_DIR"))


def _read_checked(obj: CodeObject) -> tuple[bytes, str, Any]:
    entry, path = _lock_entry(obj)
    try:
        image = path.read_bytes()
    except OSError as exc:
        raise RuntimeBridgeError(f"code object {path} for {obj.name} unreadable ({exc}); "
                                 "run `netra kernels build`") from exc
    sha = hashlib.sha256(image).hexdigest()
    if sha != entry["sha256"]:
        raise RuntimeBridgeError(f"code object {path} sha256 {sha[:16]}… differs from the lock's "
                                 f"{entry['sha256'][:16]}…; rebuild (`netra kernels build`) or fix the lock")
    return image, sha, path


def _load(contract: Contract, obj: CodeObject, device: int) -> Tactic:
    import torch

    if device < 0 or not torch.cuda.is_available():
        raise RuntimeBridgeError(f"tactic {contract.name} needs a CUDA GPU ({contract.target}); "
                                 "none is available to torch on this machine")
    if torch.cuda.is_current_stream_capturing():
        raise RuntimeBridgeError(f"tactic {contract.name} is first used inside a CUDA graph capture; "
                                 "run the op once eagerly (or call its prepare()) before capturing")
    image, sha, path = _read_checked(obj)
    ws_bytes = int(obj.workspace["bytes"])
    alloc = torch.zeros if obj.workspace["zeroed"] else torch.empty
    if obj.kind == "triton":
        module = _import_source(obj, image)
        entry = getattr(module, obj.kernel["symbol"], None)
        if not callable(entry):
            raise RuntimeBridgeError(f"{path}: no entry function {obj.kernel['symbol']!r} for {obj.name}")
        workspace = alloc(max(ws_bytes, 1), dtype=torch.uint8, device=f"cuda:{device}")
        return Tactic(contract=contract, device=device, sha256=sha, function=entry, module=module,
                      workspace=workspace, params=ctypes.create_string_buffer(8), block=int(obj.launch["block"]),
                      smem_bytes=0, obj=obj)
    cu = driver()
    with torch.cuda.device(device):
        torch.zeros(1, device=f"cuda:{device}")  # make sure the primary context exists and is current
        module = check(cu.cuModuleLoadData(image), f"cuModuleLoadData {path}")
        function = check(cu.cuModuleGetFunction(module, obj.kernel["symbol"].encode()),
                         f"cuModuleGetFunction {obj.kernel['symbol']} in {path}")
        layout = obj.kernel.get("params_layout", {})
        if layout:
            _check_params_layout(cu, module, obj.name, layout)
        _set_function_attributes(cu, function, obj)
        workspace = alloc(max(ws_bytes, 1), dtype=torch.uint8, device=f"cuda:{device}")
        torch.cuda.synchronize(device)
    size = int(layout.get("size", 0)) or 8
    tactic = Tactic(contract=contract, device=device, sha256=sha, function=function, module=module,
                    workspace=workspace, params=ctypes.create_string_buffer(size),
                    block=int(obj.launch["block"]), smem_bytes=int(obj.launch["smem_bytes"]), obj=obj)
    tactic._prepare_ex()
    return tactic


_SOURCE_MODULES: dict[tuple[str, str], Any] = {}


def _import_source(obj: CodeObject, source: bytes) -> Any:
    """Import a Triton module from the bytes whose sha256 was just checked (not from the path again): once per
    source file and content, so the contracts of one source share its module (its caches, e.g. the linear group
    tactics' stacked weights, and its compiled kernels)."""
    import linecache
    import sys
    import types

    from netra.resources import DATA_ROOT

    key = (str(obj.kernel["source"]), hashlib.sha256(source).hexdigest())
    if key in _SOURCE_MODULES:
        return _SOURCE_MODULES[key]
    name = f"netra_tactics.{obj.target}.{obj.family}.{key[0].rsplit('/', 1)[-1].removesuffix('.py')}_{key[1][:16]}"
    filename = str(DATA_ROOT / obj.kernel["source"])
    text = source.decode()
    # @triton.jit reads each kernel's source through inspect/linecache: serve it the checked bytes
    linecache.cache[filename] = (len(text), None, text.splitlines(True), filename)
    module = types.ModuleType(name)
    module.__file__ = filename
    sys.modules[name] = module
    exec(compile(text, filename, "exec"), module.__dict__)
    _SOURCE_MODULES[key] = module
    return module


_GRID_FUNCS = {"cdiv": lambda a, b: -(-a // b), "min": min, "max": max}


def grid_size(rule: list[str], env: dict[str, int]) -> list[int]:
    """Evaluate a contract's grid rule: up to 3 axis expressions over ``env`` (the call's dims and the
    launch's meta constants) with integers, + - * //, and cdiv/min/max. Nothing else parses."""
    import ast

    def ev(node: ast.AST) -> int:
        if isinstance(node, ast.Expression):
            return ev(node.body)
        if isinstance(node, ast.Constant) and isinstance(node.value, int):
            return int(node.value)
        if isinstance(node, ast.Name):
            if node.id not in env:
                raise RuntimeBridgeError(f"grid rule names {node.id!r}, not a dim or meta constant ({sorted(env)})")
            return int(env[node.id])
        if isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Add, ast.Sub, ast.Mult, ast.FloorDiv)):
            a, b = ev(node.left), ev(node.right)
            if isinstance(node.op, ast.Add):
                return a + b
            if isinstance(node.op, ast.Sub):
                return a - b
            return a * b if isinstance(node.op, ast.Mult) else a // b
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in _GRID_FUNCS \
                and not node.keywords:
            fn: Any = _GRID_FUNCS[node.func.id]
            return int(fn(*(ev(a) for a in node.args)))
        raise RuntimeBridgeError(f"grid rule {ast.unparse(node)!r}: only names, integers, + - * // and "
                                 f"cdiv/min/max are allowed")

    if not 1 <= len(rule) <= 3:
        raise RuntimeBridgeError(f"grid rule {rule!r}: 1 to 3 axes")
    return [ev(_parse_axis(axis)) for axis in rule]


@functools.lru_cache(maxsize=256)
def _parse_axis(axis: str) -> Any:
    """One grid axis expression parsed once (a launch evaluates it; parsing on every launch showed in the host
    profile of a prefill forward, scripts/gpu/prefill_profile.py: results/serving/NOTES.md)."""
    import ast

    return ast.parse(axis, mode="eval")


def _set_function_attributes(cu: Any, function: Any, obj: CodeObject) -> None:
    """Raise the dynamic shared-memory limit above the 48 KB default, and allow a non-portable
    cluster size (> 8), where the launch asks for it; at load, never on launch."""
    attr = cu.CUfunction_attribute
    smem = int(obj.launch["smem_bytes"])
    if smem > 48 * 1024:
        check(cu.cuFuncSetAttribute(function, attr.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, smem),
              f"cuFuncSetAttribute max dynamic smem {smem} B ({obj.name})")
    if int(obj.launch.get("cluster", 1)) > 8:
        check(cu.cuFuncSetAttribute(function, attr.CU_FUNC_ATTRIBUTE_NON_PORTABLE_CLUSTER_SIZE_ALLOWED, 1),
              f"cuFuncSetAttribute non-portable cluster ({obj.name})")


def _check_params_layout(cu: Any, module: Any, name: str, layout: dict[str, int]) -> None:
    """The device's ``netra_params_layout`` (u32: sizeof, then each field's offsetof) == the contract's."""
    dptr, nbytes = check(cu.cuModuleGetGlobal(module, PARAMS_LAYOUT_SYMBOL),
                         f"cuModuleGetGlobal netra_params_layout ({name})")
    n = int(nbytes) // 4
    host = (ctypes.c_uint32 * n)()
    check(cu.cuMemcpyDtoH(ctypes.addressof(host), dptr, int(nbytes)), "cuMemcpyDtoH params layout")
    want = list(layout.values())
    if list(host) != want:
        raise RuntimeBridgeError(f"{name}: launch-argument layout on the device {list(host)} != "
                                 f"contract params_layout {dict(layout)} (size, then field offsets)")


def loaded_tactics() -> dict[tuple[str, int], Tactic]:
    return dict(_tactics)
