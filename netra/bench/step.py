"""`netra bench step`: the full-shape decode step of the embedded engine on one GPU, against its byte floor.

For each batch size B: the seeded full preset (`qwen36-35b-a3b`), every request slot 1..B holding a context of
``--context`` tokens (the KV cache and the GDN / conv state filled with random values, never zeros), the decode
step captured as a CUDA graph over the engine's own forward (exactly what the scheduler captures per bucket),
and its replay timed (median of ``--replays``). Then, with every tactic disabled (the A/B control arm), the same
step eagerly (a few steps: at the full shape the references take seconds). Checks: the eager step and the
replayed step, from the same state snapshot, give bitwise equal logits and the same greedy tokens.

The byte floor of a step is what it must move once: the dense weights (attention, GDN, lm_head), the experts
the step's routing selects (expected distinct experts of 256 under B x 8 draws) plus each layer's shared expert
and router, the GDN recurrent state read and written, the conv state, and the KV cache read up to each row's
length; over the device-to-device copy rate measured in the same run. A per-kernel breakdown of one replay
comes from the profiler (kernel names grouped by family).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

BATCHES = (1, 8, 32, 64, 128)
# First match wins (a kernel's lower-cased name): attention's prologue before the norms, Netra's Triton linear kernels
# beside the library GEMMs.
FAMILY_PATTERNS = (("moe", ("moe_",)), ("argmax", ("argmax",)),
                   ("linear", ("_linear_kernel", "_split_sum_kernel", "_fp8_gemm_kernel", "_act_quant_kernel", "w8a8",
                               "fp8_matmul")),
                   ("gemm", ("gemm", "gemv", "cutlass", "sm90_xmma", "nvjet")),
                   ("gdn", ("gdn", "delta", "recurrent")), ("conv", ("conv",)),
                   ("attention", ("attn", "attention", "decode_fp8", "decode_merge", "qk_norm_rope")),
                   ("norm", ("norm",)), ("elementwise", ("elementwise", "vectorized", "unrolled", "reduce", "index")))


def _torch() -> Any:
    import torch

    return torch


def build(context: int, batch_max: int, ssm_dtype: str | None) -> Any:
    from netra.engine.engine import build_engine
    from netra.engine.options import EngineOptions

    opts = EngineOptions(preset="qwen36-35b-a3b", device="cuda", context_length=context,
                         max_running_requests=batch_max, cuda_graph_bs=(1,), mamba_ssm_dtype=ssm_dtype)
    return build_engine(opts)


def fill_state(engine: Any, rows: int, seed: int) -> None:
    """Random KV cache / GDN state / conv state for slots 1..rows (the pad slot 0 keeps zeros)."""
    torch = _torch()
    p = engine.pools
    g = torch.Generator(device="cuda").manual_seed(seed)
    for t, scale in ((p.k, 1.0), (p.v, 1.0)):
        for i in range(t.shape[0]):
            t[i, 1:rows + 1] = (torch.randn(t[i, 1:rows + 1].shape, generator=g, device="cuda") * scale).to(t.dtype)
    for i in range(p.ssm.shape[0]):
        p.ssm[i, 1:rows + 1] = (torch.randn(p.ssm[i, 1:rows + 1].shape, generator=g, device="cuda") * 0.05).to(
            p.ssm.dtype)
    p.conv[:, 1:rows + 1] = (torch.randn(p.conv[:, 1:rows + 1].shape, generator=g, device="cuda") * 0.5).to(
        p.conv.dtype)


def decode_batch(engine: Any, b: int, lens: list[int], seed: int) -> Any:
    from netra.engine.model import ForwardBatch

    torch = _torch()
    g = torch.Generator(device="cuda").manual_seed(seed)
    ids = torch.randint(0, engine.config.vocab_size, (b,), generator=g, device="cuda")
    seq = torch.tensor(lens, dtype=torch.int64, device="cuda")
    slots = torch.arange(1, b + 1, dtype=torch.int64, device="cuda")
    return ForwardBatch(decode=True, input_ids=ids, positions=seq - 1, token_slots=slots, slots=slots, seq_lens=seq,
                        max_len=engine.pools.context_length, logits_rows=torch.arange(b, device="cuda"),
                        seq_slots=[], seq_starts=[], q_lens=[])


def snapshot(engine: Any, b: int) -> list[Any]:
    p = engine.pools
    return [t[:, 1:b + 1].clone() for t in (p.k, p.v, p.ssm, p.conv)]


def restore(engine: Any, b: int, snap: list[Any]) -> None:
    p = engine.pools
    for t, s in zip((p.k, p.v, p.ssm, p.conv), snap, strict=True):
        t[:, 1:b + 1].copy_(s)


def floor_bytes(engine: Any, b: int, lens: list[int]) -> dict[str, float]:
    """The bytes one decode step of b rows must move (see the module docstring)."""
    from netra.engine.weights import AttentionWeights

    cfg, w, p = engine.config, engine.model.w, engine.pools
    dense = w.lm_head.data.numel() * w.lm_head.data.element_size()
    experts = routed_expert_bytes = 0.0
    for layer in w.layers:
        m = layer.mixer
        projs = [m.q_proj, m.k_proj, m.v_proj, m.o_proj] if isinstance(m, AttentionWeights) else \
            [m.in_proj_qkv, m.in_proj_z, m.in_proj_b, m.in_proj_a, m.out_proj]
        for q in projs:
            dense += q.data.numel() * q.data.element_size() + (q.scale_inv.numel() * 4 if q.scale_inv is not None else 0)
        e = layer.moe
        per_expert = (e.w13.data[0].numel() + e.w2.data[0].numel() + e.w13.scale_inv[0].numel() * 4
                      + e.w2.scale_inv[0].numel() * 4)
        n_exp = e.num_experts
        distinct = n_exp * (1.0 - (1.0 - e.top_k / n_exp) ** b)
        routed_expert_bytes = per_expert
        experts += distinct * per_expert + per_expert + e.router.data.numel() * 2
    state = 2 * b * p.ssm[0, 0].numel() * p.ssm.element_size() * p.ssm.shape[0]
    conv = 2 * b * p.conv[0, 0].numel() * p.conv.element_size() * p.conv.shape[0]
    kv_row = 2 * cfg.num_key_value_heads * cfg.head_dim * p.k.element_size()
    kv = sum(lens) * kv_row * p.k.shape[0]
    total = dense + experts + state + conv + kv
    return {"dense": dense, "moe": experts, "expert_bytes": routed_expert_bytes, "gdn_state": state, "conv_state": conv,
            "kv_cache": kv, "total": total}


def breakdown(run: Any, top: int = 15) -> tuple[dict[str, float], dict[str, dict[str, float]]]:
    """µs per kernel family in one call of ``run`` (a graph's replay, or an eager forward), from the profiler's
    kernel records, and the ``top`` kernels by time (name -> µs summed over the call, launches)."""
    torch = _torch()
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        run()
        torch.cuda.synchronize()
    out: dict[str, float] = {}
    kernels: dict[str, list[float]] = {}
    for ev in prof.events():
        if ev.device_type != torch.autograd.DeviceType.CUDA:
            continue
        name = ev.name.lower()
        fam = next((f for f, pats in FAMILY_PATTERNS if any(s in name for s in pats)), "other")
        out[fam] = out.get(fam, 0.0) + float(ev.device_time)
        k = kernels.setdefault(ev.name[:96], [0.0, 0.0])
        k[0] += float(ev.device_time)
        k[1] += 1
    ranked = sorted(kernels.items(), key=lambda kv: -kv[1][0])[:top]
    return ({k: round(v, 1) for k, v in sorted(out.items(), key=lambda kv: -kv[1])},
            {name: {"us": round(v[0], 1), "launches": int(v[1])} for name, (v) in ranked})


def shadow_moe(engine: Any, fb: Any) -> dict[str, Any]:
    """One eager step with every MoE block also run by its oracle on the same input (teacher forcing): per layer,
    the tactic's rel-L2 against `moe_ref` on the tactic's own routing, and the routing's agreement with the
    reference's (differences at BF16 near-ties are legitimate; any other is an error)."""
    import netra.engine.model as model_mod
    from netra.bench.specs.moe import tactic_routing
    from netra.ops.linear import linear_ref
    from netra.ops.moe import moe, moe_ref, moe_route_ref, routing_agreement

    torch = _torch()
    per_layer: list[dict[str, Any]] = []

    def shadow(x: Any, w: Any) -> Any:
        out = moe(x, w)
        logits = linear_ref(x, w.router, torch.bfloat16)
        ids, tw = tactic_routing(x)
        ref_ids = moe_route_ref(logits, w.top_k, w.renormalize)[1]
        ref = moe_ref(x, w, routing=(tw, ids))
        rel = float((out.float() - ref.float()).norm() / ref.float().norm())
        per_layer.append({"rel_l2": rel, **routing_agreement(logits, ids, ref_ids)})
        return out

    real = model_mod.moe
    model_mod.moe = shadow
    try:
        engine.model.forward(fb)
    finally:
        model_mod.moe = real
    return {"layers": len(per_layer), "max_rel_l2": max(r["rel_l2"] for r in per_layer),
            "routing_rows_differ": sum(r["rows_differ"] for r in per_layer),
            "routing_near_ties": sum(r["near_ties"] for r in per_layer),
            "routing_errors": sum(r["errors"] for r in per_layer)}


def perturbed_reference(engine: Any, fb: Any, base_logits: Any) -> dict[str, float]:
    """How far the step's logits move when one layer's MoE output moves by one BF16 rounding (every op on its
    reference): the seeded model's own sensitivity, the yardstick for the tactics-on vs tactics-off distance."""
    import netra.engine.model as model_mod

    torch = _torch()
    calls = [0]
    real = model_mod.moe

    def nudged(x: Any, w: Any) -> Any:
        out = real(x, w)
        calls[0] += 1
        if calls[0] == 1:
            g = torch.Generator(device=out.device).manual_seed(0)
            noise = torch.randn(out.shape, generator=g, device=out.device) * 2.0 ** -9
            out = (out.float() * (1.0 + noise)).to(out.dtype)
        return out

    model_mod.moe = nudged
    try:
        logits = engine.model.forward(fb)
    finally:
        model_mod.moe = real
    rel = float((logits.float() - base_logits.float()).norm() / base_logits.float().norm())
    return {"logits_rel_l2": rel, "tokens_agree": float((logits.argmax(-1) == base_logits.argmax(-1)).float().mean())}


def measure(engine: Any, b: int, context: int, replays: int, eager_off_steps: int, copy_bps: float,
            log: Any, shadow: bool = False) -> dict[str, Any]:
    from netra import dispatch
    from netra.bench.timing import capture, event_ms, quantile
    from netra.ops import _common

    torch = _torch()
    lens = [context // 2 + (i * 7919) % (context // 2) for i in range(b)]
    fill_state(engine, b, seed=b)
    fb = decode_batch(engine, b, lens, seed=b)
    snap = snapshot(engine, b)
    row: dict[str, Any] = {"batch": b, "context_mean": sum(lens) / b}
    # tactics on (the catalog's decisions): eager step, then the captured step replayed
    t0 = time.perf_counter()
    eager_logits = engine.model.forward(fb).clone()
    torch.cuda.synchronize()
    row["eager_on_ms"] = round((time.perf_counter() - t0) * 1e3, 2)
    restore(engine, b, snap)
    graph, out = capture(lambda: engine.model.forward(fb))
    restore(engine, b, snap)
    graph.replay()
    torch.cuda.synchronize()
    row["eager_equals_replay_bitwise"] = bool(torch.equal(eager_logits, out))
    row["tokens_equal"] = bool(torch.equal(eager_logits.argmax(-1), out.argmax(-1)))
    times = [event_ms(graph.replay) for _ in range(replays)]
    med = quantile(times, 0.5)
    row.update(replay_ms=round(med, 3), replay_p90_ms=round(quantile(times, 0.9), 3))
    row["decisions"] = {op: labs for op, labs in _common.decisions().items()}
    if shadow:
        restore(engine, b, snap)
        row["moe_teacher_forced"] = shadow_moe(engine, fb)
    fl = floor_bytes(engine, b, lens)
    row["floor_bytes"] = {k: round(v) for k, v in fl.items()}
    row["floor_ms"] = round(fl["total"] / copy_bps * 1e3, 3)
    row["floor_fraction"] = round(row["floor_ms"] / med, 3)
    try:
        row["breakdown_us"], row["top_kernels_us"] = breakdown(graph.replay)
    except Exception as exc:  # the breakdown is informative; a profiler failure must not lose the row
        row["breakdown_us"] = {"error": f"{type(exc).__name__}: {exc}"}
    del graph, out
    # tactics off: every op on its reference, eagerly (a host-synchronising fallback cannot be captured)
    if eager_off_steps > 0:
        dispatch.reset(dispatch.Dispatcher(disabled=True))
        _common.reset_decisions()
        off = []
        for _ in range(eager_off_steps):
            restore(engine, b, snap)
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            off_logits = engine.model.forward(fb)
            torch.cuda.synchronize()
            off.append((time.perf_counter() - t0) * 1e3)
        row["tactics_off_eager_ms"] = round(min(off), 1)
        d = (off_logits.float() - eager_logits.float()).norm() / eager_logits.float().norm()
        row["logits_rel_l2_on_vs_off"] = float(d)
        row["tokens_agree_on_vs_off"] = float((off_logits.argmax(-1) == eager_logits.argmax(-1)).float().mean())
        if shadow:  # the control: the reference against itself with layer 0's MoE output moved by ~1 BF16 ulp
            restore(engine, b, snap)
            row["control_reference_perturbed"] = perturbed_reference(engine, fb, off_logits)
        dispatch.reset(None)
        _common.reset_decisions()
    restore(engine, b, snap)
    log(f"B={b:4d} replay {row['replay_ms']:8.3f} ms  floor {row['floor_ms']:.3f} ms ({row['floor_fraction']:.3f})  "
        f"eager==replay {row['eager_equals_replay_bitwise']}  off {row.get('tactics_off_eager_ms', '-')} ms")
    return row


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--batches", default=",".join(map(str, BATCHES)), help="batch sizes (default: %(default)s)")
    p.add_argument("--context", type=int, default=2048, help="context length of the pools (default: %(default)s)")
    p.add_argument("--ssm-dtype", default=None, choices=("float32", "bfloat16"),
                   help="GDN state dtype (default: the preset's)")
    p.add_argument("--replays", type=int, default=20, help="timed graph replays per batch (default: %(default)s)")
    p.add_argument("--off-steps", type=int, default=1,
                   help="eager steps with tactics disabled per batch, 0 to skip (default: %(default)s)")
    p.add_argument("--off-max-batch", type=int, default=64,
                   help="largest batch timed with tactics off (default: %(default)s)")
    p.add_argument("--shadow-batches", default="8",
                   help="batches whose MoE blocks are also checked against the oracle, layer by layer (default: %(default)s)")
    p.add_argument("--out", type=Path, required=True, help="directory for step_<ssm dtype>.json")
    p.add_argument("--git-sha", default="", help="commit measured (device copies have no .git)")


def main(args: argparse.Namespace) -> int:
    torch = _torch()
    if not torch.cuda.is_available():
        print("netra bench step: needs a CUDA GPU")
        return 2
    from netra.bench.timing import copy_bandwidth

    def log(msg: str) -> None:
        print(msg, flush=True)

    batches = [int(b) for b in args.batches.split(",")]
    t0 = time.monotonic()
    engine = build(args.context, max(batches), args.ssm_dtype)
    log(f"engine built in {time.monotonic() - t0:.1f} s; ssm {engine.pools.ssm.dtype}")
    copy_bps = copy_bandwidth()
    rows = []
    for b in batches:
        rows.append(measure(engine, b, args.context, args.replays,
                            args.off_steps if b <= args.off_max_batch else 0, copy_bps, log,
                            shadow=str(b) in args.shadow_batches.split(",")))
    record = {"kind": "serving", "family": "decode_step", "target": "sm90", "device": torch.cuda.get_device_name(),
              "git_sha": args.git_sha, "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
              "command": f"python -m netra.bench.step --batches {args.batches} --context {args.context}"
                         + (f" --ssm-dtype {args.ssm_dtype}" if args.ssm_dtype else ""),
              "status": "measured", "copy_bandwidth_gbps": round(copy_bps / 1e9, 1),
              "ssm_dtype": str(engine.pools.ssm.dtype), "rows": rows,
              "checks": {"eager_equals_replay": all(r["eager_equals_replay_bitwise"] for r in rows),
                         "tokens_equal": all(r["tokens_equal"] for r in rows)},
              "wall_s": round(time.monotonic() - t0, 1), "verdict": "info"}
    args.out.mkdir(parents=True, exist_ok=True)
    name = f"step_{str(engine.pools.ssm.dtype).removeprefix('torch.')}.json"
    (args.out / name).write_text(json.dumps(record, indent=1, default=str) + "\n")
    log(f"{'B':>4s} {'replay ms':>10s} {'floor ms':>9s} {'frac':>6s} {'off ms':>9s} eager==replay")
    for r in rows:
        log(f"{r['batch']:4d} {r['replay_ms']:10.3f} {r['floor_ms']:9.3f} {r['floor_fraction']:6.3f} "
            f"{r.get('tactics_off_eager_ms', 0):9.1f} {r['eager_equals_replay_bitwise']}")
    return 0


if __name__ == "__main__":
    _p = argparse.ArgumentParser(prog="python -m netra.bench.step", description=__doc__.split("\n\n")[0])
    add_arguments(_p)
    raise SystemExit(main(_p.parse_args()))
