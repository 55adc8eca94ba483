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
import hashlib
import threading
from dataclasses import dataclass, field
from typing import Any

from netra.contract import Contract

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
    function: Any
    module: Any
    workspace: Any  # torch uint8 tensor, zeroed at load when the contract says so
    params: ctypes.Array[ctypes.c_char]  # the launch-argument struct's bytes (one POD struct)
    block: int
    smem_bytes: int
    # Op-specific prepared state (e.g. a ctypes view of `params`); filled once by the op module.
    binding: dict[str, Any] = field(default_factory=dict)
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
            raise RuntimeBridgeError(f"launch {self.contract.name} (grid {grid}): {_err_name(_state['cu'], err)}")

    @property
    def cluster(self) -> int:
        return int(self.contract.launch.get("cluster", 1))

    @property
    def pdl(self) -> bool:
        return bool(self.contract.launch.get("pdl", False))

    @property
    def cooperative(self) -> bool:
        """All CTAs co-resident (grid-wide barriers are safe); the launch fails rather than hangs if not."""
        return bool(self.contract.launch.get("cooperative", False))

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


def load_tactic(contract: Contract, device: int) -> Tactic:
    """Load (once) the contract's code object on ``device``; see the module docstring."""
    key = (contract.name, device)
    tactic = _tactics.get(key)
    if tactic is not None:
        return tactic
    with _load_lock:
        tactic = _tactics.get(key)
        if tactic is None:
            tactic = _load(contract, device)
            _tactics[key] = tactic
    return tactic


def _load(contract: Contract, device: int) -> Tactic:
    import torch

    if device < 0 or not torch.cuda.is_available():
        raise RuntimeBridgeError(f"tactic {contract.name} needs a CUDA GPU ({contract.target}); "
                                 "none is available to torch on this machine")
    if torch.cuda.is_current_stream_capturing():
        raise RuntimeBridgeError(f"tactic {contract.name} is first used inside a CUDA graph capture; "
                                 "run the op once eagerly (or call its prepare()) before capturing")
    cu = driver()
    from netra import settings
    from netra.build import read_lock

    build_dir = settings.get("NETRA_BUILD_DIR")
    lock = read_lock()
    entry = next((e for e in lock["code_objects"] if e["name"] == contract.name), None)
    if entry is None:
        raise RuntimeBridgeError(f"kernel lock has no code object for {contract.name}; run `netra kernels build`")
    path = build_dir / entry["code_object"]
    try:
        image = path.read_bytes()
    except OSError as exc:
        raise RuntimeBridgeError(f"code object {path} for {contract.name} unreadable ({exc}); "
                                 "run `netra kernels build`") from exc
    sha = hashlib.sha256(image).hexdigest()
    if sha != entry["sha256"]:
        raise RuntimeBridgeError(f"code object {path} sha256 {sha[:16]}… differs from the lock's "
                                 f"{entry['sha256'][:16]}…; rebuild (`netra kernels build`) or fix the lock")
    with torch.cuda.device(device):
        torch.zeros(1, device=f"cuda:{device}")  # make sure the primary context exists and is current
        module = check(cu.cuModuleLoadData(image), f"cuModuleLoadData {path}")
        function = check(cu.cuModuleGetFunction(module, contract.kernel["symbol"].encode()),
                         f"cuModuleGetFunction {contract.kernel['symbol']} in {path}")
        layout = contract.kernel.get("params_layout", {})
        if layout:
            _check_params_layout(cu, module, contract, layout)
        _set_function_attributes(cu, function, contract)
        ws_bytes = int(contract.workspace["bytes"])
        alloc = torch.zeros if contract.workspace["zeroed"] else torch.empty
        workspace = alloc(max(ws_bytes, 1), dtype=torch.uint8, device=f"cuda:{device}")
        torch.cuda.synchronize(device)
    size = int(layout.get("size", 0)) or 8
    tactic = Tactic(contract=contract, device=device, sha256=sha, function=function, module=module,
                    workspace=workspace, params=ctypes.create_string_buffer(size),
                    block=int(contract.launch["block"]), smem_bytes=int(contract.launch["smem_bytes"]))
    tactic._prepare_ex()
    return tactic


def _set_function_attributes(cu: Any, function: Any, contract: Contract) -> None:
    """Raise the dynamic shared-memory limit above the 48 KB default, and allow a non-portable
    cluster size (> 8), where the contract's launch asks for it; at load, never on launch."""
    attr = cu.CUfunction_attribute
    smem = int(contract.launch["smem_bytes"])
    if smem > 48 * 1024:
        check(cu.cuFuncSetAttribute(function, attr.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, smem),
              f"cuFuncSetAttribute max dynamic smem {smem} B ({contract.name})")
    if int(contract.launch.get("cluster", 1)) > 8:
        check(cu.cuFuncSetAttribute(function, attr.CU_FUNC_ATTRIBUTE_NON_PORTABLE_CLUSTER_SIZE_ALLOWED, 1),
              f"cuFuncSetAttribute non-portable cluster ({contract.name})")


def _check_params_layout(cu: Any, module: Any, contract: Contract, layout: dict[str, int]) -> None:
    """The device's ``netra_params_layout`` (u32: sizeof, then each field's offsetof) == the contract's."""
    dptr, nbytes = check(cu.cuModuleGetGlobal(module, PARAMS_LAYOUT_SYMBOL),
                         f"cuModuleGetGlobal netra_params_layout ({contract.name})")
    n = int(nbytes) // 4
    host = (ctypes.c_uint32 * n)()
    check(cu.cuMemcpyDtoH(ctypes.addressof(host), dptr, int(nbytes)), "cuMemcpyDtoH params layout")
    want = list(layout.values())
    if list(host) != want:
        raise RuntimeBridgeError(f"{contract.name}: launch-argument layout on the device {list(host)} != "
                                 f"contract params_layout {dict(layout)} (size, then field offsets)")


def loaded_tactics() -> dict[tuple[str, int], Tactic]:
    return dict(_tactics)
