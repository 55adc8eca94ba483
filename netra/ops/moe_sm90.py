"""The sm90 tactics of the MoE family: launch structs, persistent buffers and the plan launchers.

Contracts (kernels/sm90/moe/*.contract.json) and the code objects they launch, in order:

  moe_block_t1      (op moe_fp8_block, 1 token)       moe_route (+ the shared gate_up) -> moe_layer_t1 (9 routes)
  moe_block_stream  (op moe_fp8_block, 2..128 tokens) moe_route -> moe_layer_stream's moe_ml_shared (9 routes)
  moe_block_stream_fold (the same, one launch)       moe_layer_stream's moe_ml_fold (-DML_FOLD=1: routes, then 9 routes)
  moe_routed_t1     (op moe_fp8_routed, 1 token)      moe_layer_t1
  moe_routed_stream (op moe_fp8_routed, 2..128)       moe_layer_stream's moe_ml

The block plans run the shared expert as a 9th route of every token: moe_route writes topk_ids[t, 8] = 256 and
topk_w[t, 8] = sigmoid(bf16(x . w_gate)), and the layers read expert 256's weights from the shared expert's own
tensors (no stacked copy of the experts).

Every step is launched on the caller's stream with the launch attributes and the grid rule its contract
states (`netra.runtime.Tactic.grid`); the host side only fills each step's one POD struct, whose ctypes
layout is checked against the contract's ``params_layout`` here (and the runtime checks the device's).
The first eager call allocates every buffer (for up to 128 tokens) before any capture; a launch then allocates
only its output.
"""

from __future__ import annotations

import ctypes
from typing import Any

import torch

from netra import runtime as rt
from netra.ops.moe_fp8 import HIDDEN, INTER, MAX_TOKENS, ROUTE_STRIDE, TOPK

ROUTE, LAYER_T1, LAYER_STREAM, LAYER_STREAM_SHARED, LAYER_STREAM_FOLD = (
    "moe_route_e256_k9", "moe_layer_t1_e256_k8", "moe_layer_stream_e256_k8", "moe_layer_stream_e256_k9",
    "moe_layer_stream_fold_e256_k9")


class RouteParams(ctypes.Structure):
    _fields_ = [(n, ctypes.c_void_p) for n in ("x", "w_router", "logits", "topk_ids", "topk_w", "counters", "w_gate",
                                               "sw13", "sw13_scale", "h_shared")] + [
        ("M", ctypes.c_int32), ("_pad", ctypes.c_int32)]


class LayerT1Params(ctypes.Structure):
    _fields_ = [(n, ctypes.c_void_p) for n in (
        "x", "topk_ids", "topk_w", "w13", "w13_scale", "w2", "w2_scale", "gu", "out", "bar", "dbg_hq", "dbg_hs", "sw2",
        "sw2_scale", "sh_h")]


class LayerStreamParams(ctypes.Structure):
    _fields_ = [(n, ctypes.c_void_p) for n in (
        "x", "topk_ids", "topk_w", "w13", "w13_scale", "w2", "w2_scale", "hbuf", "y", "out", "bar", "hq", "hs")] + [
        ("M", ctypes.c_int32), ("_pad", ctypes.c_int32)] + [
        (n, ctypes.c_void_p) for n in ("sw13", "sw13_scale", "sw2", "sw2_scale")]


class LayerStreamFoldParams(ctypes.Structure):
    """moe_ml_fold (-DML_FOLD=1): moe_ml's struct + the router, the shared gate row and the logits scratch."""
    _fields_ = LayerStreamParams._fields_ + [(n, ctypes.c_void_p) for n in ("w_router", "w_gate", "logits")]


STRUCTS: dict[str, type[ctypes.Structure]] = {ROUTE: RouteParams, LAYER_T1: LayerT1Params,
                                              LAYER_STREAM: LayerStreamParams, LAYER_STREAM_SHARED: LayerStreamParams,
                                              LAYER_STREAM_FOLD: LayerStreamFoldParams}


def struct_layout(cls: type[ctypes.Structure]) -> dict[str, int]:
    """``{"size": sizeof, field: offset, ...}`` of a ctypes struct (padding fields left out)."""
    out = {"size": ctypes.sizeof(cls)}
    for name, _ in cls._fields_:  # type: ignore[misc]
        if not name.startswith("_"):
            out[name] = getattr(cls, name).offset
    return out


def check_struct(name: str, layout: dict[str, int]) -> None:
    """The host struct of code object ``name`` has the contract's ``params_layout``."""
    have = struct_layout(STRUCTS[name])
    if have != layout:
        raise rt.RuntimeBridgeError(f"{name}: host launch struct {have} != contract params_layout {layout}")


class _Buffers:
    """Per-device persistent scratch for up to 128 tokens (graph replays read fixed addresses). The block's routes
    are [tokens, 9] (8 routed ranks, then the shared expert); h and y have a row per route."""

    def __init__(self, device: torch.device) -> None:
        bf = torch.bfloat16
        self.logits = torch.empty(MAX_TOKENS, 256, dtype=bf, device=device)
        self.topk_ids = torch.zeros(MAX_TOKENS, ROUTE_STRIDE, dtype=torch.int32, device=device)
        self.topk_w = torch.zeros(MAX_TOKENS, ROUTE_STRIDE, dtype=torch.float32, device=device)
        self.hbuf = torch.empty(MAX_TOKENS * ROUTE_STRIDE, INTER, dtype=bf, device=device)
        self.y = torch.empty(MAX_TOKENS * ROUTE_STRIDE, HIDDEN, dtype=bf, device=device)

    def h_shared(self) -> int:
        """moe_block_t1's shared-expert h: row TOPK of hbuf (the routed h of one token are rows 0..7)."""
        return int(self.hbuf[TOPK].data_ptr())


_buffers: dict[int, _Buffers] = {}


def _bufs(device: torch.device) -> _Buffers:
    idx = device.index if device.index is not None else torch.cuda.current_device()
    b = _buffers.get(idx)
    if b is None:
        if torch.cuda.is_current_stream_capturing():
            raise rt.RuntimeBridgeError("MoE tactic buffers first allocated inside a capture: call the op eagerly first")
        b = _buffers[idx] = _Buffers(device)
    return b


def _steps(decision: Any) -> dict[str, rt.Tactic]:
    plan = decision.tactic
    steps: dict[str, rt.Tactic] = plan.steps if isinstance(plan, rt.Plan) else {plan.name: plan}
    for name, t in steps.items():
        if "struct_ok" not in t.binding:
            check_struct(name, t.obj.kernel["params_layout"] if t.obj is not None else {})
            t.binding["struct_ok"] = True
            t.binding["params"] = STRUCTS[name].from_buffer(t.params)
    return steps


def _stream() -> int:
    return int(torch.cuda.current_stream().cuda_stream)


def _p(t: torch.Tensor | None) -> int | None:
    return t.data_ptr() if t is not None else None


def _launch_layer(steps: dict[str, rt.Tactic], b: _Buffers, m: int, x: torch.Tensor, ids: torch.Tensor,
                  tw: torch.Tensor, w13: torch.Tensor, s13: torch.Tensor, w2: torch.Tensor, s2: torch.Tensor,
                  out: torch.Tensor, stream: int, shared: Any = None) -> None:
    """The plan's layer step; ``shared`` (the block: MoEWeights) adds the shared expert as route 8."""
    name = next(n for n in (LAYER_T1, LAYER_STREAM_FOLD, LAYER_STREAM_SHARED, LAYER_STREAM) if n in steps)
    t = steps[name]
    p = t.binding["params"]
    with t.lock:
        p.x, p.topk_ids, p.topk_w = x.data_ptr(), ids.data_ptr(), tw.data_ptr()
        p.w13, p.w13_scale, p.w2, p.w2_scale = w13.data_ptr(), s13.data_ptr(), w2.data_ptr(), s2.data_ptr()
        p.out, p.bar = out.data_ptr(), t.workspace.data_ptr()
        sw2, ss2 = (_p(shared.shared_w2.data), _p(shared.shared_w2.scale_inv)) if shared is not None else (None, None)
        if name == LAYER_T1:
            p.gu, p.dbg_hq, p.dbg_hs = b.hbuf.data_ptr(), None, None
            p.sw2, p.sw2_scale, p.sh_h = sw2, ss2, (b.h_shared() if shared is not None else None)
        else:
            p.hbuf, p.y, p.hq, p.hs, p.M = b.hbuf.data_ptr(), b.y.data_ptr(), None, None, m
            p.sw13 = _p(shared.shared_w13.data) if shared is not None else None
            p.sw13_scale = _p(shared.shared_w13.scale_inv) if shared is not None else None
            p.sw2, p.sw2_scale = sw2, ss2
            if name == LAYER_STREAM_FOLD:  # the block in one launch: the layer routes the tokens itself
                p.w_router, p.w_gate = shared.router.data.data_ptr(), shared.shared_gate.data.data_ptr()
                p.logits = b.logits.data_ptr()
        t.launch(t.grid({"tokens": m}), stream)


def launch_routed(decision: Any, *, x: torch.Tensor, w13: torch.Tensor, w13_scale: torch.Tensor, w2: torch.Tensor,
                  w2_scale: torch.Tensor, topk_ids: torch.Tensor, topk_w: torch.Tensor) -> torch.Tensor:
    """Op ``moe_fp8_routed``: the routed experts from given top-8 ids / weights -> a new ``[T, 2048]`` BF16."""
    steps = _steps(decision)
    b = _bufs(x.device)
    m = int(x.shape[0])
    out = torch.empty(m, HIDDEN, dtype=torch.bfloat16, device=x.device)
    _launch_layer(steps, b, m, x, topk_ids, topk_w, w13, w13_scale, w2, w2_scale, out, _stream())
    return out


def launch_route(steps: dict[str, rt.Tactic], b: _Buffers, x: torch.Tensor, w: Any, stream: int) -> None:
    """The block's route step: top-8 and the shared expert's gate as route 8 into ``b``'s [tokens, 9] tables (and,
    at one token, the shared expert's h)."""
    m = int(x.shape[0])
    r = steps[ROUTE]
    p = r.binding["params"]
    with r.lock:
        p.x, p.w_router, p.logits = x.data_ptr(), w.router.data.data_ptr(), b.logits.data_ptr()
        p.topk_ids, p.topk_w, p.counters, p.M = b.topk_ids.data_ptr(), b.topk_w.data_ptr(), r.workspace.data_ptr(), m
        p.w_gate, p.sw13, p.sw13_scale = (w.shared_gate.data.data_ptr(), w.shared_w13.data.data_ptr(),
                                          w.shared_w13.scale_inv.data_ptr())
        p.h_shared = b.h_shared()
        r.launch(r.grid({"tokens": m}), stream)


def launch_block_layer(steps: dict[str, rt.Tactic], b: _Buffers, x: torch.Tensor, w: Any, out: torch.Tensor,
                       stream: int) -> None:
    """The block's layer step over the 9 routes the route step left in ``b``."""
    _launch_layer(steps, b, int(x.shape[0]), x, b.topk_ids, b.topk_w, w.w13.data, w.w13.scale_inv, w.w2.data,
                  w.w2.scale_inv, out, stream, shared=w)


def launch_block(decision: Any, *, x: torch.Tensor, weights: Any) -> torch.Tensor:
    """Op ``moe_fp8_block``: route (+ the shared expert's gate as route 8, and its gate_up at one token) -> the layer
    over 9 routes, on the current stream."""
    steps = _steps(decision)
    b = _bufs(x.device)
    out = torch.empty(int(x.shape[0]), HIDDEN, dtype=torch.bfloat16, device=x.device)
    stream = _stream()
    if ROUTE in steps:  # moe_block_stream_fold routes inside its one launch
        launch_route(steps, b, x, weights, stream)
    launch_block_layer(steps, b, x, weights, out, stream)
    return out
