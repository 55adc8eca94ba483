"""The ``moe`` domain: SGLang 0.5.23's ``fused_experts`` (Triton MoE runner) -> Netra op ``moe_fp8_routed``.

SGLang's fused func for the standard dispatcher and the Triton runner
(``fused_experts_none_to_triton`` in ``sglang/srt/layers/moe/moe_runner/triton.py``) imports
``fused_experts`` lazily from ``triton_utils/fused_moe.py`` at each call, so the patched attribute is
the one it runs. The routed experts it computes, with top-k precomputed, are Netra's
``moe_fp8_routed`` when the call is:

* FP8 W8A8 with 128x128 block scales (``use_fp8_w8a8``, ``block_shape == [128, 128]``), no other
  quantization flag, no zero points, no bias, dynamic activation quantization (no ``a1_scale``,
  ``a2_scale`` or pre-quantized ``a1_q``), gate/up not interleaved for a fused SwiGLU;
* a ``MoeRunnerConfig`` with SiLU-gated activation and no GEMM1 alpha/limit or SwiGLU clamp, router
  weights applied after the down GEMM, the top-k sum computed (no ``no_combine``), no routed
  scaling other than 1, and every expert local (no expert-parallel id filtering);
* tensors of the shapes SGLang's FP8 MoE layer holds: ``x [T, H]``, ``w1 [E, 2I, H]`` with scales
  ``[E, 2I/128, H/128]`` (float32), ``w2 [E, H, I]`` with ``[E, H/128, I/128]``, ``topk_ids`` and
  ``topk_weights [T, k]``, all on one device.

The guard checks exactly that (flags, shapes, dtypes of the scales, devices; never a value); the
rest (E, H, I, k, T, dtypes, layouts, target, graph phase) is the contract's, asked through
`netra.dispatch.select` with `netra.ops.moe.routed_signature`. The result honours ``inplace`` as
SGLang's does: written into ``hidden_states`` (and that tensor returned), or into a new tensor.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from netra.plugins.sglang import REQUIRED, bind_call, capturing, launcher, recorder

DOMAIN = "moe"
OP = "moe_fp8_routed"
BLOCK = [128, 128]

# fused_experts' parameters in the pinned 0.5.23 source, in order, with their defaults
# (tests/plugins/test_sglang_source.py checks them against the wheel's file).
PARAMS: tuple[tuple[str, Any], ...] = (
    ("hidden_states", REQUIRED), ("w1", REQUIRED), ("w2", REQUIRED), ("topk_output", REQUIRED),
    ("moe_runner_config", REQUIRED), ("b1", None), ("b2", None), ("use_fp8_w8a8", False),
    ("use_int8_w8a8", False), ("use_int8_w8a16", False), ("use_int4_w4a16", False),
    ("per_channel_quant", False), ("w1_scale", None), ("w2_scale", None), ("w1_zp", None), ("w2_zp", None),
    ("a1_scale", None), ("a2_scale", None), ("block_shape", None), ("a1_q", None),
    ("fuse_swiglu_interleaved", False),
)
# MoeRunnerConfig fields and StandardTopKOutput fields the guard reads (checked against the wheel).
CONFIG_FIELDS = ("num_experts", "num_local_experts", "activation", "is_gated", "apply_router_weight_on_input",
                 "inplace", "no_combine", "routed_scaling_factor", "gemm1_alpha", "gemm1_clamp_limit",
                 "swiglu_limit")
TOPK_FIELDS = ("topk_weights", "topk_ids")

_OFF_FLAGS = ("use_int8_w8a8", "use_int8_w8a16", "use_int4_w4a16", "per_channel_quant", "fuse_swiglu_interleaved")
_ABSENT = (("b1", "expert bias"), ("b2", "expert bias"), ("w1_zp", "zero points"), ("w2_zp", "zero points"),
           ("a1_scale", "static activation scale"), ("a2_scale", "static activation scale"),
           ("a1_q", "pre-quantized activation (SGLANG_OPT_MOE_QUANT_ONCE)"))
_CONFIG_NONE = ("gemm1_alpha", "gemm1_clamp_limit", "swiglu_limit")

_prepared: dict[tuple[Any, ...], str] = {}


def config_guard(call: dict[str, Any]) -> str | None:
    """Why the call's flags are outside ``moe_fp8_routed`` (None when inside)."""
    if call["use_fp8_w8a8"] is not True:
        return "use_fp8_w8a8 is False (weights are not FP8 W8A8)"
    for flag in _OFF_FLAGS:
        if call[flag]:
            return f"{flag} is set"
    for key, what in _ABSENT:
        if call[key] is not None:
            return f"{key} given ({what})"
    if list(call["block_shape"] or ()) != BLOCK:
        return f"block_shape {call['block_shape']!r} is not {BLOCK}"
    cfg = call["moe_runner_config"]
    missing = [f for f in CONFIG_FIELDS if not hasattr(cfg, f)]
    if missing:
        return f"moe_runner_config has no {missing}"
    if cfg.activation != "silu" or cfg.is_gated is not True:
        return f"activation {cfg.activation!r} (gated {cfg.is_gated}) is not gated silu"
    for key in _CONFIG_NONE:
        if getattr(cfg, key) is not None:
            return f"moe_runner_config.{key} is set"
    if cfg.apply_router_weight_on_input:
        return "router weight applied on the input"
    if cfg.no_combine:
        return "no_combine (the caller sums the top-k outputs)"
    if cfg.routed_scaling_factor not in (None, 1.0):
        return f"routed_scaling_factor {cfg.routed_scaling_factor} is not 1"
    if cfg.num_experts is None or cfg.num_experts != cfg.num_local_experts:
        return (f"expert parallelism: {cfg.num_local_experts} local of {cfg.num_experts} experts "
                f"(ids are filtered)")
    return None


def tensors(call: dict[str, Any]) -> dict[str, Any] | str:
    """The call's tensors by Netra's names, or why their shapes/devices do not form a routed MoE call."""
    import torch

    topk = call["topk_output"]
    t = {"x": call["hidden_states"], "w13": call["w1"], "w13_scale": call["w1_scale"], "w2": call["w2"],
         "w2_scale": call["w2_scale"], "topk_ids": getattr(topk, "topk_ids", None),
         "topk_w": getattr(topk, "topk_weights", None)}
    for name, v in t.items():
        if not isinstance(v, torch.Tensor):
            return f"{name} is {type(v).__name__}, not a tensor"
    if len({v.device for v in t.values()}) != 1:
        return f"tensors on several devices {sorted({str(v.device) for v in t.values()})}"
    x, w13, w2, ids, tw = t["x"], t["w13"], t["w2"], t["topk_ids"], t["topk_w"]
    if x.dim() != 2 or w13.dim() != 3 or w2.dim() != 3 or ids.dim() != 2:
        return f"ranks x {x.dim()}, w1 {w13.dim()}, w2 {w2.dim()}, topk_ids {ids.dim()} are not 2, 3, 3, 2"
    e, n, h = w13.shape
    if n % 2 or tuple(w2.shape) != (e, h, n // 2) or x.shape[1] != h:
        return f"w1 {tuple(w13.shape)}, w2 {tuple(w2.shape)}, x {tuple(x.shape)} are not [E, 2I, H], [E, H, I], [T, H]"
    if tuple(tw.shape) != tuple(ids.shape) or ids.shape[0] != x.shape[0]:
        return f"topk_ids {tuple(ids.shape)} / topk_weights {tuple(tw.shape)} do not match x {tuple(x.shape)}"
    b = BLOCK[0]
    for name, want in (("w13_scale", (e, -(-n // b), -(-h // b))), ("w2_scale", (e, -(-h // b), -(-(n // 2) // b)))):
        s = t[name]
        if tuple(s.shape) != want or s.dtype != torch.float32 or not s.is_contiguous():
            return (f"{name} is {s.dtype} {tuple(s.shape)}{'' if s.is_contiguous() else ' strided'}, "
                    f"not contiguous float32 {want}")
    return t


def _shape_key(t: dict[str, Any]) -> tuple[Any, ...]:
    return (t["x"].device, t["x"].dtype, t["w13"].dtype, t["topk_ids"].dtype, t["topk_w"].dtype,
            tuple(t["w13"].shape), int(t["topk_ids"].shape[1]))


def _signature(x: Any, w13: Any, w2: Any, topk_ids: Any, topk_w: Any) -> Any:
    """The op's signature, as `netra.ops.moe` builds it for the embedded engine (one definition)."""
    from netra.ops import moe as moe_op

    return moe_op.routed_signature(x, w13, w2, topk_ids, topk_w)


def select(t: dict[str, Any]) -> Any:
    """Dispatch's decision for the call, or the reason it cannot be asked here (a tactic that was not
    loaded before this capture: loading inside a capture is never attempted)."""
    from netra import dispatch

    sig = _signature(t["x"], t["w13"], t["w2"], t["topk_ids"], t["topk_w"])
    if capturing():
        from netra import runtime

        d = dispatch.dispatcher()
        pure = dispatch.plan(sig, d.catalog, d.min_maturity, d.disabled)
        loaded = runtime.loaded_tactics()
        if pure.contract is not None and any((o.name, sig.device) not in loaded for o in pure.contract.objects):
            return f"tactic {pure.contract.name} was not loaded before this CUDA graph capture"
    return dispatch.select(sig)


def prepare(t: dict[str, Any]) -> str:
    """Load every ``moe_fp8_routed`` tactic dispatch would select for these weights at any token count
    the contracts cover (both graph phases), and run each once eagerly on zero inputs so that any
    lazily built launch state and output buffer exist before a capture. Eager only."""
    import torch

    from netra import dispatch

    x, w13, w2 = t["x"], t["w13"], t["w2"]
    e, _, h = w13.shape
    k = int(t["topk_ids"].shape[1])
    contracts = [c for c in dispatch.dispatcher().catalog.for_op(OP) if "tokens" in c.dims]
    tmax = max((c.dims["tokens"].hi for c in contracts), default=0)
    if tmax < 1:
        return f"no {OP} contract: nothing to load"
    dev = x.device
    xs = torch.zeros((tmax, h), dtype=x.dtype, device=dev)
    ids = (torch.arange(tmax * k, device=dev) % e).to(t["topk_ids"].dtype).view(tmax, k)
    tw = torch.zeros((tmax, k), dtype=t["topk_w"].dtype, device=dev)
    run: Any = None
    names: set[str] = set()
    for n in range(1, tmax + 1):
        sig = _signature(xs[:n], w13, w2, ids[:n], tw[:n])
        dispatch.select(dataclasses.replace(sig, graph_phase="capture"))
        d = dispatch.select(sig)
        if d.tactic is None:
            continue
        if run is None:
            run = launcher(OP)
        run(d, x=xs[:n], w13=w13, w13_scale=t["w13_scale"], w2=w2, w2_scale=t["w2_scale"], topk_ids=ids[:n],
            topk_w=tw[:n])
        names.add(d.contract.name if d.contract is not None else d.reason)
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)
    return f"tokens 1-{tmax}: {', '.join(sorted(names)) or 'no tactic selected'}"


def _original(reason: str, original: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    recorder().miss(DOMAIN, reason)
    return original(*args, **kwargs)


def hook(original: Any, *args: Any, **kwargs: Any) -> Any:
    """AROUND hook on ``fused_experts``: Netra's tactic when the call is in a contract, else SGLang's."""
    call = bind_call(PARAMS, args, kwargs)
    if isinstance(call, str):
        return _original(call, original, args, kwargs)
    why = config_guard(call)
    if why is not None:
        return _original(why, original, args, kwargs)
    t = tensors(call)
    if isinstance(t, str):
        return _original(t, original, args, kwargs)
    rec = recorder()
    key = _shape_key(t)
    if key not in _prepared:
        if capturing():
            return _original("tactics not prepared: the first call of these shapes is inside a CUDA graph "
                             "capture", original, args, kwargs)
        try:
            _prepared[key] = prepare(t)
        except Exception as exc:
            rec.fail(f"moe prepare failed: {type(exc).__name__}: {exc}")
            raise
        rec.set_prepared(DOMAIN, _prepared[key])
    decision = select(t)
    if isinstance(decision, str):
        return _original(decision, original, args, kwargs)
    if decision.tactic is None:
        return _original(decision.reason, original, args, kwargs)
    out = launcher(OP)(decision, **t)
    x = t["x"]
    result = x if call["moe_runner_config"].inplace else x.new_empty(x.shape)
    result.copy_(out)
    rec.hit(DOMAIN)
    return result


def reset() -> None:
    """Forget which shapes were prepared (tests)."""
    _prepared.clear()
