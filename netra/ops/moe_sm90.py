"""The sm90 tactics of the MoE family: launch structs, persistent buffers and the plan launchers.

Contracts (kernels/sm90/moe/*.contract.json) and the code objects they launch, in order:

  moe_block_t1      (op moe_fp8_block, 1 token)       moe_route -> moe_layer_t1 -> moe_shared
  moe_block_stream  (op moe_fp8_block, 2..128 tokens) moe_route -> moe_layer_stream -> moe_shared
  moe_routed_t1     (op moe_fp8_routed, 1 token)      moe_layer_t1
  moe_routed_stream (op moe_fp8_routed, 2..128)       moe_layer_stream

Every step is launched on the caller's stream with the launch attributes and the grid rule its contract
states (`netra.runtime.Tactic.grid`); the host side only fills each step's one POD struct, whose ctypes
layout is checked against the contract's ``params_layout`` here (and the runtime checks the device's).
`prepare` allocates every buffer (for up to 128 tokens) and packs the shared expert's weights before any
capture; a launch then allocates only its output.
"""

from __future__ import annotations

import ctypes
import threading
from typing import Any

import torch

from netra import runtime as rt
from netra.ops.moe_fp8 import HIDDEN, INTER, MAX_TOKENS, TOPK

ROUTE, LAYER_T1, LAYER_STREAM, SHARED = ("moe_route_e256_k8", "moe_layer_t1_e256_k8", "moe_layer_stream_e256_k8",
                                         "moe_shared_h2048_i512")
SHARED_CTAS = 4  # moe_shared's grid: the SMs an H200 (132) has beyond the routed layer's 128


class RouteParams(ctypes.Structure):
    _fields_ = [(n, ctypes.c_void_p) for n in ("x", "w_router", "logits", "topk_ids", "topk_w", "counters")] + [
        ("M", ctypes.c_int32), ("_pad", ctypes.c_int32)]


class LayerT1Params(ctypes.Structure):
    _fields_ = [(n, ctypes.c_void_p) for n in (
        "x", "topk_ids", "topk_w", "w13", "w13_scale", "w2", "w2_scale", "gu", "out", "bar", "dbg_hq", "dbg_hs")]


class LayerStreamParams(ctypes.Structure):
    _fields_ = [(n, ctypes.c_void_p) for n in (
        "x", "topk_ids", "topk_w", "w13", "w13_scale", "w2", "w2_scale", "hbuf", "y", "out", "bar", "hq", "hs")] + [
        ("M", ctypes.c_int32), ("_pad", ctypes.c_int32)]


class SharedParams(ctypes.Structure):
    _fields_ = [(n, ctypes.c_void_p) for n in ("x", "w_gate", "w13p", "w13_scale", "w2p", "w2_scale", "out", "ws")] + [
        ("M", ctypes.c_int32), ("_pad", ctypes.c_int32)]


STRUCTS: dict[str, type[ctypes.Structure]] = {ROUTE: RouteParams, LAYER_T1: LayerT1Params,
                                              LAYER_STREAM: LayerStreamParams, SHARED: SharedParams}


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


def pack_shared_expert(w13: torch.Tensor, w2: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The shared expert's E4M3 weights in moe_shared's stage order (kernels/sm90/moe/moe_shared.cu):
    ``w13 [1024, 2048]`` -> ``[4 CTAs][16 K blocks][256 rows][128]`` (CTA c: gate rows 128c.., then up rows
    512 + 128c..) and ``w2 [2048, 512]`` -> ``[4][4 K blocks][512 rows][128]`` (CTA c: rows 512c..)."""
    a = w13.view(torch.uint8)
    b = w2.view(torch.uint8)
    if a.shape != (2 * INTER, HIDDEN) or b.shape != (HIDDEN, INTER):
        raise ValueError(f"shared expert {tuple(a.shape)} / {tuple(b.shape)}: expected [1024, 2048] / [2048, 512]")
    w13p = torch.stack([torch.cat([a[128 * c:128 * c + 128], a[INTER + 128 * c:INTER + 128 * c + 128]])
                        .view(256, HIDDEN // 128, 128).permute(1, 0, 2) for c in range(SHARED_CTAS)]).contiguous()
    w2p = torch.stack([b[512 * c:512 * c + 512].view(512, INTER // 128, 128).permute(1, 0, 2)
                       for c in range(SHARED_CTAS)]).contiguous()
    return w13p.view(torch.float8_e4m3fn), w2p.view(torch.float8_e4m3fn)


class _Buffers:
    """Per-device persistent scratch for up to 128 tokens (graph replays read fixed addresses)."""

    def __init__(self, device: torch.device) -> None:
        bf = torch.bfloat16
        self.logits = torch.empty(MAX_TOKENS, 256, dtype=bf, device=device)
        self.topk_ids = torch.zeros(MAX_TOKENS, TOPK, dtype=torch.int32, device=device)
        self.topk_w = torch.zeros(MAX_TOKENS, TOPK, dtype=torch.float32, device=device)
        self.hbuf = torch.empty(MAX_TOKENS * TOPK, INTER, dtype=bf, device=device)
        self.y = torch.empty(MAX_TOKENS * TOPK, HIDDEN, dtype=bf, device=device)


_buffers: dict[int, _Buffers] = {}
_packed: dict[tuple[int, int], tuple[Any, Any, torch.Tensor, torch.Tensor]] = {}
_lock = threading.Lock()


def _bufs(device: torch.device) -> _Buffers:
    idx = device.index if device.index is not None else torch.cuda.current_device()
    b = _buffers.get(idx)
    if b is None:
        if torch.cuda.is_current_stream_capturing():
            raise rt.RuntimeBridgeError("MoE tactic buffers first allocated inside a capture: call the op eagerly first")
        b = _buffers[idx] = _Buffers(device)
    return b


def packed_shared(w13: torch.Tensor, w2: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """`pack_shared_expert` once per weight pair (cached by the tensors' identity, kept alive with them)."""
    key = (id(w13), id(w2))
    hit = _packed.get(key)
    if hit is not None and hit[0] is w13 and hit[1] is w2:
        return hit[2], hit[3]
    if torch.cuda.is_current_stream_capturing():
        raise rt.RuntimeBridgeError("shared expert first packed inside a capture: call the op eagerly first")
    with _lock:
        w13p, w2p = pack_shared_expert(w13, w2)
        _packed[key] = (w13, w2, w13p, w2p)
    return w13p, w2p


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
                  out: torch.Tensor, stream: int) -> None:
    name = LAYER_T1 if LAYER_T1 in steps else LAYER_STREAM
    t = steps[name]
    p = t.binding["params"]
    with t.lock:
        p.x, p.topk_ids, p.topk_w = x.data_ptr(), ids.data_ptr(), tw.data_ptr()
        p.w13, p.w13_scale, p.w2, p.w2_scale = w13.data_ptr(), s13.data_ptr(), w2.data_ptr(), s2.data_ptr()
        p.out, p.bar = out.data_ptr(), t.workspace.data_ptr()
        if name == LAYER_T1:
            p.gu, p.dbg_hq, p.dbg_hs = b.hbuf.data_ptr(), None, None
        else:
            p.hbuf, p.y, p.hq, p.hs, p.M = b.hbuf.data_ptr(), b.y.data_ptr(), None, None, m
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


def launch_block(decision: Any, *, x: torch.Tensor, weights: Any) -> torch.Tensor:
    """Op ``moe_fp8_block``: route -> routed layer -> shared expert + combine, on the current stream."""
    steps = _steps(decision)
    b = _bufs(x.device)
    w = weights
    m = int(x.shape[0])
    w13p, w2p = packed_shared(w.shared_w13.data, w.shared_w2.data)
    out = torch.empty(m, HIDDEN, dtype=torch.bfloat16, device=x.device)
    stream = _stream()
    r = steps[ROUTE]
    p = r.binding["params"]
    with r.lock:
        p.x, p.w_router, p.logits = x.data_ptr(), w.router.data.data_ptr(), b.logits.data_ptr()
        p.topk_ids, p.topk_w, p.counters, p.M = b.topk_ids.data_ptr(), b.topk_w.data_ptr(), r.workspace.data_ptr(), m
        r.launch(r.grid({"tokens": m}), stream)
    _launch_layer(steps, b, m, x, b.topk_ids, b.topk_w, w.w13.data, w.w13.scale_inv, w.w2.data, w.w2.scale_inv, out,
                  stream)
    s = steps[SHARED]
    p = s.binding["params"]
    with s.lock:
        p.x, p.w_gate = x.data_ptr(), w.shared_gate.data.data_ptr()
        p.w13p, p.w13_scale, p.w2p, p.w2_scale = (w13p.data_ptr(), w.shared_w13.scale_inv.data_ptr(), w2p.data_ptr(),
                                                  w.shared_w2.scale_inv.data_ptr())
        p.out, p.ws, p.M = out.data_ptr(), s.workspace.data_ptr(), m
        s.launch(s.grid({"tokens": m}), stream)
    return out
