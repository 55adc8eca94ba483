"""Row argmax over the last dim (greedy sampling over the vocabulary).

``argmax(x)`` returns ``torch.argmax(x, dim=-1)`` exactly: NaN beats every number and the first
NaN wins; equal values give the lowest index; +0.0 equals -0.0; infinities keep their order.

Contract (kernels/sm90/argmax/*.contract.json): sm90, float32 or bfloat16 ``x`` of shape
[rows, 248320], rows 1..256, contiguous with a 16-byte-aligned base, eager or graph capture. Two
tactics: the chunked kernel (argmax.cu; bf16 rows 1-256, fp32 rows 1 and 17-256) and, for fp32
decode batches (rows 2-16), the cluster kernel (argmax_cluster.cu: one 8-CTA cluster per row, TMA
into shared memory, a DSMEM fold, programmatic dependent launch).
Anything else (CPU tensors, other shapes/dtypes/layouts, NETRA_DISABLE_TACTICS=1) runs the fallback,
``torch.argmax``, with the reason logged once.
"""

from __future__ import annotations

import ctypes
from typing import Any

from netra import dispatch
from netra.contract import Signature

OP = "argmax"
VOCAB = 248320


def argmax_ref(x: Any) -> Any:
    """The oracle: plain PyTorch on an fp32 upcast (exact for bf16), int64 indices."""
    import torch

    return torch.argmax(x.to(torch.float32), dim=-1)


def signature(x: Any) -> Signature:
    rows = 1
    for d in x.shape[:-1]:
        rows *= int(d)
    params = {"rows": rows, "vocab": int(x.shape[-1]) if x.dim() else 0}
    return Signature.of(op=OP, tensors={"x": x}, params=params)


def explain_signatures() -> list[tuple[str, Signature]]:
    """An in-contract and out-of-contract example per case `netra explain` shows."""
    def sig(target: str, rows: int, vocab: int, dtype: str, layout: str = "contiguous_align16",
            phase: str = "eager") -> Signature:
        return Signature(target=target, op=OP, dims=(("rows", rows), ("vocab", vocab)),
                         dtypes=(("x", dtype),), layouts=(("x", layout),), graph_phase=phase)

    return [
        ("in-contract fp32 decode batch", sig("sm90", 16, VOCAB, "float32", phase="capture")),
        ("in-contract fp32 large batch", sig("sm90", 128, VOCAB, "float32", phase="capture")),
        ("in-contract bf16", sig("sm90", 128, VOCAB, "bfloat16")),
        ("out: other vocab", sig("sm90", 16, 151936, "float32")),
        ("out: fp16", sig("sm90", 16, VOCAB, "float16")),
        ("out: 512 rows", sig("sm90", 512, VOCAB, "float32")),
        ("out: strided", sig("sm90", 16, VOCAB, "float32", layout="strided")),
        ("out: cpu", sig("cpu", 16, VOCAB, "float32")),
        ("gfx950", sig("gfx950", 16, VOCAB, "float32")),
    ]


# ---- the sm90 tactic binding ---------------------------------------------------------------------

class ArgmaxParams(ctypes.Structure):
    """Host mirror of ``struct ArgmaxParams`` in kernels/sm90/argmax/argmax.cu (one POD struct)."""

    _fields_ = (
        ("x", ctypes.c_void_p),
        ("out", ctypes.c_void_p),
        ("keys", ctypes.c_void_p),
        ("counters", ctypes.c_void_p),
        ("row_stride", ctypes.c_int64),
        ("rows", ctypes.c_int32),
        ("vocab", ctypes.c_int32),
        ("chunks", ctypes.c_int32),
        ("pad_", ctypes.c_int32),
    )


class ArgmaxClusterParams(ctypes.Structure):
    """Host mirror of ``struct ArgmaxClusterParams`` in kernels/sm90/argmax/argmax_cluster.cu."""

    _fields_ = (
        ("x", ctypes.c_void_p),
        ("out", ctypes.c_void_p),
        ("row_stride", ctypes.c_int64),
        ("rows", ctypes.c_int32),
        ("vocab", ctypes.c_int32),
        ("probe", ctypes.c_int32),
        ("pad_", ctypes.c_int32),
    )


CLUSTER_SYMBOL = "netra_argmax_cluster_sm90"


def params_layout(struct: type[ctypes.Structure] = ArgmaxParams) -> dict[str, int]:
    """``{"size": sizeof, field: offset...}`` in the contract's ``params_layout`` order."""
    layout = {"size": ctypes.sizeof(struct)}
    for field in struct._fields_:
        name = field[0]
        if name != "pad_":
            layout[name] = getattr(struct, name).offset
    return layout


def is_cluster(contract: Any) -> bool:
    """Whether a contract is the cluster tactic (argmax_cluster.cu) rather than the chunked one."""
    return bool(contract.kernel.get("symbol") == CLUSTER_SYMBOL)


MAX_ROWS = 256
KEYS_BYTES = 8 * MAX_ROWS  # workspace: u64 keys, then u32 counters (see the contract)


def vec_elems(dtype_name: str) -> int:
    """Elements per 16-byte load."""
    return 8 if dtype_name == "bfloat16" else 4


def launch_shape(rows: int, vocab: int, dtype_name: str, block: int, target_blocks: int) -> tuple[int, int]:
    """``(grid, chunks)``: row chunks so that rows * chunks <= target_blocks (one resident wave)
    fill the GPU, each thread owning at least one 16-byte load (the contract's launch.grid rule)."""
    max_chunks = max(1, vocab // (vec_elems(dtype_name) * block))
    chunks = min(max(1, target_blocks // rows), max_chunks)
    return rows * chunks, chunks


def contract_for(rows: int, dtype_name: str) -> Any:
    """The sm90 argmax contract (not rejected) whose domain holds ``rows`` x ``dtype_name``."""
    from netra.catalog import Catalog

    for c in Catalog.load().for_op(OP):
        if c.target == "sm90" and not c.declaration and c.maturity != "rejected" \
                and dtype_name in c.dtypes["x"] and c.dims["rows"].contains(rows):
            return c
    raise LookupError(f"no sm90 argmax contract for {dtype_name} rows {rows}")


def contract_launch_shape(rows: int, dtype_name: str) -> tuple[int, int]:
    """``(grid, chunks)`` the sm90 contract for ``rows`` x ``dtype_name`` launches (tests, emulation);
    for the cluster tactic a chunk is one CTA's share of the row (chunks = cluster size)."""
    c = contract_for(rows, dtype_name)
    if is_cluster(c):
        cl = int(c.launch["cluster"])
        return rows * cl, cl
    return launch_shape(rows, c.dims["vocab"].lo, dtype_name, int(c.launch["block"]), int(c.launch["target_blocks"]))


def _bind(tactic: Any) -> dict[str, Any]:
    """Once per loaded tactic: a typed view of its argument buffer, workspace pointers, shapes."""
    b: dict[str, Any] = tactic.binding
    if "params" not in b and is_cluster(tactic.contract):
        _bind_cluster(tactic)
    if "params" not in b:
        p = ArgmaxParams.from_buffer(tactic.params)
        ws = tactic.workspace.data_ptr()
        p.keys, p.counters = ws, ws + KEYS_BYTES
        c = tactic.contract
        dtype_name = next(iter(c.dtypes["x"]))
        vocab = c.dims["vocab"].lo
        p.vocab = vocab
        p.row_stride = vocab
        b["target_blocks"] = int(c.launch["target_blocks"])
        b["shapes"] = {r: launch_shape(r, vocab, dtype_name, tactic.block, b["target_blocks"])
                       for r in range(1, MAX_ROWS + 1)}
        b["params"] = p
    return b


def _bind_cluster(tactic: Any) -> None:
    b: dict[str, Any] = tactic.binding
    p = ArgmaxClusterParams.from_buffer(tactic.params)
    vocab = tactic.contract.dims["vocab"].lo
    p.vocab = vocab
    p.row_stride = vocab
    p.probe = 0
    cl = tactic.cluster
    b["shapes"] = {r: (r * cl, cl) for r in range(1, MAX_ROWS + 1)}
    b["params"] = p
    b["ex_configs"] = {}


def cluster_config(tactic: Any, cluster: int, pdl: bool) -> Any:
    """A launch config of the cluster tactic with another cluster size or PDL setting (benchmark
    explorations; built once per variant, eagerly, before any capture)."""
    from netra import runtime as rt

    b = tactic.binding if "params" in tactic.binding else _bind(tactic)
    key = (cluster, pdl)
    if key not in b["ex_configs"]:
        cu = rt.driver()
        if cluster > 8:  # a non-portable cluster size must be allowed on the function first
            rt.check(cu.cuFuncSetAttribute(
                tactic.function, cu.CUfunction_attribute.CU_FUNC_ATTRIBUTE_NON_PORTABLE_CLUSTER_SIZE_ALLOWED, 1),
                "cuFuncSetAttribute non-portable cluster")
        b["ex_configs"][key] = rt._launch_config(tactic.block, tactic.smem_bytes, cluster=cluster, pdl=pdl)
    return b["ex_configs"][key]


def max_active_clusters(tactic: Any, cluster: int | None = None) -> int:
    """``cuOccupancyMaxActiveClusters`` of the cluster tactic: how many clusters fit at once
    (rows x cluster CTAs need rows clusters co-resident for one wave)."""
    from netra import runtime as rt

    cfg = cluster_config(tactic, cluster or tactic.cluster, False)
    cfg.gridDimX = 16 * (cluster or tactic.cluster)
    return int(rt.check(rt.driver().cuOccupancyMaxActiveClusters(tactic.function, cfg), "cuOccupancyMaxActiveClusters"))


def _launch_cluster(tactic: Any, b: dict[str, Any], x: Any, out: Any, rows: int, stream: int, pdl: bool | None,
                    cluster: int | None, probe: bool) -> None:
    from netra import runtime as rt

    p = b["params"]
    cl = tactic.cluster if cluster is None else cluster
    cfg = None if (cluster is None and pdl is None) else b["ex_configs"][(cl, tactic.pdl if pdl is None else pdl)]
    with tactic.lock:
        p.x = x.data_ptr()
        p.out = out.data_ptr()
        p.rows = rows
        p.probe = 1 if probe else 0
        if cfg is None:
            tactic.launch(rows * cl, stream)
            return
        cfg.gridDimX = rows * cl
        cfg.hStream = stream
        (err,) = rt._state["cu"].cuLaunchKernelEx(cfg, tactic.function, tactic._param_ptrs_addr, 0)
        if int(err) != 0:
            raise rt.RuntimeBridgeError(f"cuLaunchKernelEx {tactic.contract.name} (cluster {cl}): {int(err)}")


CHUNKED_EXPLORATION_SYMBOLS = ("netra_argmax_u16_sm90", "netra_argmax_probe_sm90")


def chunked_variant(tactic: Any, symbol: str, pdl: bool) -> tuple[Any, Any]:
    """``(function, launch config)`` of another entry point in the chunked tactic's code object
    (benchmark explorations: 16 loads per thread, the fold-free probe), resolved once, eagerly."""
    from netra import runtime as rt

    b = tactic.binding if "params" in tactic.binding else _bind(tactic)
    cache = b.setdefault("variants", {})
    key = (symbol, pdl)
    if key not in cache:
        if symbol not in CHUNKED_EXPLORATION_SYMBOLS:
            raise ValueError(f"unknown argmax exploration symbol {symbol!r}")
        fn = rt.check(rt.driver().cuModuleGetFunction(tactic.module, symbol.encode()), f"cuModuleGetFunction {symbol}")
        cache[key] = (fn, rt._launch_config(tactic.block, tactic.smem_bytes, pdl=pdl))
    return cache[key]


def launch(tactic: Any, x: Any, out: Any, target_blocks: int | None = None, pdl: bool | None = None,
           cluster: int | None = None, probe: bool = False, symbol: str | None = None) -> Any:
    """Launch the tactic on ``x`` into ``out`` on the current stream (no allocation, no sync).

    Benchmark explorations only: ``target_blocks`` overrides the chunked tactic's launch shape;
    ``pdl`` True/False forces programmatic dependent launch on or off (None: as the contract says);
    ``cluster`` runs the cluster tactic with another cluster size and ``probe`` as the read-only
    floor probe (its variants' configs come from `cluster_config`, called before capture);
    ``symbol`` runs another entry point of the chunked tactic's code object (`chunked_variant`).
    """
    import torch

    b = tactic.binding if "params" in tactic.binding else _bind(tactic)
    if "ex_configs" in b:
        rows = x.numel() // x.shape[-1]
        stream = torch.cuda.current_stream(x.device).cuda_stream
        _launch_cluster(tactic, b, x, out, rows, stream, pdl, cluster, probe)
        return out
    rows = x.numel() // x.shape[-1]
    if target_blocks is None:
        grid, chunks = b["shapes"][rows]
    else:
        c = tactic.contract
        grid, chunks = launch_shape(rows, x.shape[-1], next(iter(c.dtypes["x"])), tactic.block, target_blocks)
    stream = torch.cuda.current_stream(x.device).cuda_stream
    p = b["params"]
    with tactic.lock:
        p.x = x.data_ptr()
        p.out = out.data_ptr()
        p.rows = rows
        p.chunks = chunks
        if symbol is not None:  # an exploration entry point (`chunked_variant`, prepared before capture)
            from netra import runtime as rt

            fn, cfg = b["variants"][(symbol, bool(pdl))]
            cfg.gridDimX = grid
            cfg.hStream = stream
            (err,) = rt._state["cu"].cuLaunchKernelEx(cfg, fn, tactic._param_ptrs_addr, 0)
            if int(err) != 0:
                raise rt.RuntimeBridgeError(f"cuLaunchKernelEx {symbol}: {int(err)}")
        elif pdl:
            tactic.launch_pdl(grid, stream)
        else:
            tactic.launch(grid, stream)
    return out


def _check_out(x: Any, out: Any) -> None:
    import torch

    if out.dtype != torch.int64 or out.device != x.device or tuple(out.shape) != tuple(x.shape[:-1]) \
            or not out.is_contiguous():
        raise ValueError(f"argmax out must be a contiguous int64 tensor of shape {tuple(x.shape[:-1])} on "
                         f"{x.device}; got {out.dtype} {tuple(out.shape)} on {out.device}")


def argmax(x: Any, out: Any = None) -> Any:
    """``torch.argmax(x, dim=-1)`` through dispatch: [..., vocab] logits -> int64 [...] indices.

    In-contract calls (see the module docstring) run the sm90 tactic; others run ``torch.argmax``.
    ``out`` (optional) is written in place and returned; with it, the tactic path allocates nothing.
    """
    import torch

    if x.dim() == 0:
        raise ValueError("argmax needs at least one dimension (the vocabulary)")
    decision = dispatch.select(signature(x))
    if out is not None:
        _check_out(x, out)
    if decision.tactic is None:
        result = torch.argmax(x, dim=-1)
        if out is None:
            return result
        out.copy_(result)
        return out
    if out is None:
        out = torch.empty(x.shape[:-1], dtype=torch.int64, device=x.device)
    return launch(decision.tactic, x, out)


def prepare(device: Any = None) -> list[str]:
    """Load every argmax tactic dispatch would select on ``device``, before any graph capture.

    Returns the decision reason per dtype (a tactic name or why it falls back).
    """
    import torch

    dev = torch.device(device) if device is not None else torch.device("cuda", torch.cuda.current_device())
    reasons = []
    for dtype in (torch.float32, torch.bfloat16):
        seen: dict[str, list[int]] = {}
        full = torch.empty((MAX_ROWS, VOCAB), dtype=dtype, device=dev)
        for rows in range(1, MAX_ROWS + 1):  # every row count: tactics differ by row range
            x = full[:rows]
            d = dispatch.select(signature(x))
            if d.tactic is not None:
                _bind(d.tactic)
            seen.setdefault(d.reason, []).append(rows)
        for reason, rs in seen.items():
            reasons.append(f"{dtype} rows {rs[0]}-{rs[-1]} ({len(rs)}): {reason}")
    return reasons
