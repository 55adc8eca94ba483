"""Attention decode over the FP8 E4M3 KV cache (GQA 16/2, head dim 256, with and without the output gate) and its
fused prologue, q/k Gemma RMSNorm + partial RoPE + the K/V store (kernels/sm90/attention; issue 19, item 3).

Decode, at (batch, context) = (1, 4096), (8, 4096), (64, 4096), (128, 4096), (1, 49152): each shape's check goes
through the op (dispatch at maturity ``experiment``) and fails unless dispatch chose the contract. The tactic's
launcher writes into a NaN-filled output at the contract's split count, the allocator's free memory poisoned first
(the split partials come from there), and that output is judged by `compare` under the contract's numerics against
the FP32 oracle; the op's output must equal the launcher's bitwise, eager must equal CUDA-graph replay bitwise, and a
replay with new lengths written into the captured ``seq_lens`` must equal an eager call at those lengths. Providers,
ungated: ``netra``, ``fallback`` (the oracle, as the op's fallback runs it) and ``sglang_triton`` (SGLang 0.5.23's
Triton decode from the pinned wheel: netra.bench.peers.sglang_attention); gated: ``netra`` (the gate in the
epilogue), ``unfused`` (the ungated tactic, then the output gate: the op without the gated contract) and
``fallback``. The floor: K and V once (E4M3) plus q, o (and the gate) in BF16. Check-only cases: adversarial inputs
(length 1, padded rows with mixed lengths, huge and tiny logits, k/v scales, tied scores, saturated cache values, a
dominant token at the last position and at a split edge, a 262144-token pool, the merge kernel launched with PDL)
and the accuracy table the issue asks for: ours, the oracle on q cast to E4M3 (FlashInfer XQA's numerics, emulated)
and SGLang's decode (which casts q and the probabilities to E4M3) against the FP32 oracle, and against FP64 at
batch <= 8, on flat and peaked inputs.

Prologue, at 1, 8, 64, 128 tokens timed (2048, 32768 checked too) plus adversarial inputs: q and the written K rows
under the contract's numerics, V rows bitwise (a conversion), no cache row but the written ones touched, eager ==
replay. Providers: ``netra``, ``unfused`` (two RMSNorms, RoPE and the K/V store through dispatch: the op's fallback)
and ``fallback`` (the reference chain).

``--attention-explore`` adds exploration cases (no contract: they promote nothing): other split counts, the merge
launched with PDL, other tiles. ``targets``: issue 19's "at least as fast as the best measured peer at batch 1 and
batch 128 (L = 48K and 4096)" with the floor fractions.

Smoke (CPU, interpreter): the same decode and prologue checks, minus dispatch and graphs, through the contracts'
entries at small contexts (the split rule still splits them).
"""

from __future__ import annotations

import argparse
import math
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

from netra.bench.harness import Case, CaseBuilder, Spec, entry

HQ, HKV, D, ROT, EPS = 16, 2, 256, 64, 1e-6
SM = D ** -0.5
C_DECODE, C_GATED, C_PRO = ("attention_decode_fp8_gqa16x2_d256", "attention_decode_gated_fp8_gqa16x2_d256",
                            "qk_norm_rope_store_fp8_h16x2_d256_r64")
CONTRACTS = (C_DECODE, C_GATED, C_PRO)
BENCH = ((128, 4096), (1, 49152), (1, 4096), (8, 4096), (64, 4096))  # the issue's two shapes first
PRO_BENCH, PRO_CHECK, PRO_POOL = (1, 8, 64, 128), (2048, 32768), (129, 4096)
ROTATE_BYTES = 256 << 20  # KV read by the rotated input sets together (the L2 holds 50 MB)
SPLIT_SWEEP = {1: [32, 64, 256], 8: [8, 32], 64: [1, 4], 128: [2, 4]}
TILE_SWEEP = [{"BLOCK_N": 32, "num_stages": 4}, {"BLOCK_N": 128, "num_stages": 3, "num_warps": 8}]


@dataclass
class Sizes:
    """The adversarial checks' sizes: the H200's, and the smoke path's (small enough for the interpreter)."""

    batch: int
    context: int
    mixed_batch: int
    long_context: int
    huge_context: int  # 0: none


GPU_SIZES = Sizes(8, 4096, 128, 49152, 262144)
SMOKE_SIZES = Sizes(4, 192, 5, 640, 0)


def peer_root() -> Path:
    from netra.bench.peers.sglang_loader import DEFAULT_ROOT

    return Path(os.environ.get("NETRA_SGLANG_PEER", str(DEFAULT_ROOT)))


# ---- inputs ---------------------------------------------------------------------------------------

def gen(device: str, seed: int) -> Any:
    import torch

    return torch.Generator(device=device).manual_seed(seed)


def pool(slots: int, ctx: int, device: str, scale: float = 1.0, seed: int = 0) -> tuple[Any, Any]:
    """A K and a V pool ``[slots, ctx, Hkv, D]`` (E4M3), filled slot by slot (bounded temporaries)."""
    import torch

    from netra.ops import fp8

    g = gen(device, seed)
    k = torch.empty(slots, ctx, HKV, D, dtype=fp8.E4M3, device=device)
    v = torch.empty_like(k)
    for t in (k, v):
        for s in range(slots):
            t[s] = (torch.randn(ctx, HKV, D, device=device, generator=g) * scale).clamp(-448, 448).to(fp8.E4M3)
    return k, v


@dataclass
class Decode:
    """One decode call's inputs; ``gate`` is a strided view of q|gate, as the engine passes it."""

    q: Any
    kc: Any
    vc: Any
    slots: Any
    lens: Any
    gate: Any = None
    k_scale: float = 1.0
    v_scale: float = 1.0

    @property
    def ctx(self) -> int:
        return int(self.kc.shape[1])

    def ref(self, gated: bool) -> Any:
        from netra.ops import attention

        args = (self.kc, self.vc, self.slots, self.lens, self.ctx, SM, self.k_scale, self.v_scale)
        if gated:
            return attention.attention_decode_gated_ref(self.q, self.gate, *args)
        return attention.attention_decode_ref(self.q, *args)


def random_decode(b: int, ctx: int, device: str, seed: int, lens: Any = None, pools: Any = None) -> Decode:
    import torch

    g = gen(device, seed)
    kc, vc = pools if pools is not None else pool(b + 1, ctx, device, seed=seed)
    q = torch.randn(b, HQ, D, device=device, generator=g).bfloat16()
    gate = torch.randn(b, HQ, 2 * D, device=device, generator=g).bfloat16()[..., D:]
    if lens is None:
        lens = torch.full((b,), ctx, dtype=torch.int64, device=device)
    return Decode(q, kc, vc, torch.arange(1, b + 1, device=device), lens, gate)


def realistic(b: int, ctx: int, peaked: bool, device: str, seed: int) -> Decode:
    """q and the cached keys as after Gemma RMSNorm (rms 1 per head, times 1 + w); ``peaked``: a shared
    direction lifts ~1% of the keys well above the rest (attention sinks, retrieved tokens)."""
    import torch

    from netra.ops import fp8

    d = random_decode(b, ctx, device, seed)
    g = gen(device, seed + 1)
    w_q = torch.randn(D, device=device, generator=g) * 0.5
    w_k = torch.randn(D, device=device, generator=g) * 0.5
    q = torch.randn(b, HQ, D, device=device, generator=g)
    q = q / q.pow(2).mean(-1, keepdim=True).sqrt() * (1 + w_q)
    for i in range(b):
        k = torch.randn(ctx, HKV, D, device=device, generator=g)
        k = k / k.pow(2).mean(-1, keepdim=True).sqrt() * (1 + w_k)
        if peaked:
            u = torch.randn(D, device=device, generator=g)
            u = u / u.norm()
            hot = torch.rand(ctx, device=device, generator=g) < 0.01
            k[hot] += 12.0 * u
            q[i] += 12.0 * u
        d.kc[i + 1] = k.clamp(-448, 448).to(fp8.E4M3)
    d.q = q.bfloat16()
    return d


def fp64_truth(d: Decode) -> Any:
    import torch

    outs = []
    for i in range(d.q.shape[0]):
        s, n = int(d.slots[i]), int(d.lens[i])
        k = d.kc[s, :n].double().repeat_interleave(HQ // HKV, dim=1)
        v = d.vc[s, :n].double().repeat_interleave(HQ // HKV, dim=1)
        p = torch.softmax(torch.einsum("hd,khd->hk", d.q[i].double(), k) * SM, dim=-1)
        outs.append(torch.einsum("hk,khd->hd", p, v))
    return torch.stack(outs)


# ---- the decode check (GPU and smoke alike) -------------------------------------------------------

def numerics(name: str) -> dict[str, Any]:
    from netra.catalog import contract_doc

    return dict(contract_doc(name)["numerics"])


def poison(device: str) -> None:
    """Leave NaN in the caching allocator's free memory, so the next buffers (outputs, split partials) start
    poisoned. The CPU allocator caches nothing: there the NaN-filled output the launcher writes stands alone."""
    import torch

    from netra.validate.oracle import poison_next

    if device != "cpu":
        poison_next(((1 << 30) // 4,), torch.float32, device)


def decode_tactic(d: Decode, gated: bool, gpu: bool) -> tuple[str | None, Any, dict[str, Any], Callable[..., Any]]:
    """(the contract chosen, its module, its launch, the op as called): dispatch's choice through the op on a GPU;
    the contract's entry on the CPU (dispatch picks the reference there)."""
    from netra.ops import attention
    from netra.ops._triton import load_source

    gate = d.gate if gated else None

    def call(fn: Callable[..., Any], lens: Any) -> Any:
        return fn(q=d.q, k_cache=d.kc, v_cache=d.vc, slots=d.slots, seq_lens=lens, max_len=d.ctx, sm_scale=SM,
                  k_scale=d.k_scale, v_scale=d.v_scale, gate=gate)

    if gpu:
        hit = attention.decode_route(d.q, d.kc, d.vc, d.slots, d.lens, gate)
        if hit is None or hit[1].contract is None:
            return None, None, {}, lambda lens: call(attention.attention_decode, lens)
        return (hit[1].contract.name, hit[1].tactic.module, hit[1].tactic.launch_spec,
                lambda lens: call(attention.attention_decode, lens))
    name = C_GATED if gated else C_DECODE
    fn, doc = entry(name)
    return name, load_source(doc["kernel"]["source"]), doc["launch"], lambda lens: call(fn, lens)


def decode_check(d: Decode, gated: bool, gpu: bool, replay: bool = True) -> dict[str, Any]:
    """The tactic against the oracle (the contract's numerics) from a NaN-filled output, the op equal to the
    launcher, and on a GPU: dispatch chose the contract, eager == replay, a replay at new lengths == eager."""
    import torch

    from netra.bench.timing import capture
    from netra.runtime import grid_size
    from netra.validate.compare import compare

    name = C_GATED if gated else C_DECODE
    chosen, mod, launch, op = decode_tactic(d, gated, gpu)
    out: dict[str, Any] = {"contract": name, "chosen": chosen, "batch": int(d.q.shape[0]), "context": d.ctx}
    if mod is None:
        return {**out, "ok": False}
    dev = str(d.q.device)
    meta = {**launch["meta"], "num_warps": int(launch["block"]) // 32}
    _, splits = grid_size(launch["grid"], {**mod.dims_of(d.q, d.kc), **meta})
    poison(dev)
    got = mod.launch_decode(d.q, d.kc, d.vc, d.slots, d.lens, SM, d.k_scale, d.v_scale, d.gate if gated else None,
                            splits, meta, out=torch.full_like(d.q, float("nan")))
    poison(dev)
    via_op = op(d.lens)
    out.update(splits=splits, out=compare(numerics(name), got, d.ref(gated)),
               op_equals_launcher=bool(torch.equal(via_op, got)))
    ok = out["out"]["ok"] and out["op_equals_launcher"] and chosen == name
    if gpu and replay:
        lens_g = d.lens.clone()
        g, rep = capture(lambda: op(lens_g))
        g.replay()
        torch.cuda.synchronize()
        out["eager_equals_replay"] = bool(torch.equal(rep, via_op))
        ctx = d.ctx
        lens_g.copy_(torch.randint(1, ctx + 1, d.lens.shape, device=dev, generator=gen(dev, ctx + d.q.shape[0])))
        lens_g[d.slots == 0] = 1
        g.replay()
        eager_new = op(lens_g)
        torch.cuda.synchronize()
        out["replay_new_lengths_equal"] = bool(torch.equal(rep, eager_new))
        ok = ok and out["eager_equals_replay"] and out["replay_new_lengths_equal"]
        del g
    return {**out, "ok": bool(ok)}


def adversarial(s: Sizes, device: str) -> Iterator[tuple[str, bool, Callable[[], Decode], bool]]:
    """(key, gated, inputs, replay) of each adversarial decode check, at sizes ``s``."""
    import torch

    b, L = s.batch, s.context

    def base(seed: int = 5, scale: float = 1.0) -> Decode:
        return random_decode(b, L, device, seed, pools=pool(b + 1, L, device, scale, seed))

    def ones() -> Decode:
        d = base()
        d.lens = torch.ones(b, dtype=torch.int64, device=device)
        return d

    def padded() -> Decode:
        d = base()
        pad = max(1, b * 3 // 8)  # the tail: bucket padding (the pad slot 0, length 1)
        real = [3, 1, 7, 2, 5] if b == 8 else list(range(b - pad, 0, -1))
        d.slots = torch.tensor(real + [0] * pad, device=device)
        d.lens = torch.tensor([L, 1, 17, L // 2 - 48, 65][:b - pad] + [1] * pad, device=device)
        return d

    def scaled_q(f: float) -> Callable[[], Decode]:
        def make() -> Decode:
            d = base()
            d.q = (d.q.float() * f).bfloat16()
            return d
        return make

    def kv_scales() -> Decode:
        d = base()
        d.k_scale, d.v_scale = 0.5, 3.0
        return d

    def ties() -> Decode:
        d = base()
        kb = d.kc.view(torch.uint8)
        kb[1:] = kb[1:2, 5:6].clone()  # every key of every request equal: all scores tie
        return d

    def mixed() -> Decode:
        g = gen(device, 11)
        return random_decode(s.mixed_batch, L, device, 11,
                             lens=torch.randint(1, L + 1, (s.mixed_batch,), device=device, generator=g))

    def dominant(at: int) -> Callable[[], Decode]:
        def make() -> Decode:
            kc, vc = pool(2, s.long_context, device, 0.25, 13)
            q = torch.zeros(1, HQ, D, device=device)
            q[:, :, 0] = 30.0 * 16  # score 30 for the token whose k[0] is 1, 0 for the rest
            kb = kc.view(torch.uint8)
            kb[1, :, :, 0] = 0x00  # E4M3 0.0
            kb[1, at, :, 0] = 0x38  # E4M3 1.0
            return Decode(q.bfloat16(), kc, vc, torch.tensor([1], device=device),
                          torch.tensor([s.long_context], device=device))
        return make

    def huge(n: int) -> Callable[[], Decode]:
        def make() -> Decode:
            d = random_decode(1, s.huge_context, device, 17)
            d.lens = torch.tensor([n], device=device)
            return d
        return make

    yield "seq_len 1", True, ones, True
    yield "padded rows + mixed lengths", True, padded, True
    yield "huge logits (q x 1e3)", False, scaled_q(1e3), True
    yield "tiny q (x 1e-30)", False, scaled_q(1e-30), True
    yield "kv scales 0.5 / 3", True, kv_scales, True
    yield "ties (equal keys)", False, ties, True
    yield "saturated cache values", True, lambda: base(7, 300.0), True
    yield f"B={s.mixed_batch} mixed lengths", False, mixed, True
    yield f"dominant last token L={s.long_context}", False, dominant(s.long_context - 1), True
    yield f"dominant token at a split edge L={s.long_context}", False, dominant(s.long_context // 2 // 64 * 64), True
    if s.huge_context:
        for n in (s.huge_context, s.huge_context * 3 // 4 + 1):
            yield f"pool {s.huge_context} len {n}", False, huge(n), False


def pdl_check(b: int, ctx: int) -> dict[str, Any]:
    """The merge kernel launched with PDL (an exploration: the contracts say PDL 0), eager and replayed."""
    import torch

    from netra.bench.timing import capture
    from netra.ops import attention
    from netra.runtime import grid_size
    from netra.validate.compare import compare

    d = random_decode(b, ctx, "cuda", 23)
    hit = attention.decode_route(d.q, d.kc, d.vc, d.slots, d.lens, d.gate)
    if hit is None:
        return {"ok": False, "error": "dispatch chose the fallback"}
    mod, launch = hit[1].tactic.module, hit[1].tactic.launch_spec
    meta = {**launch["meta"], "num_warps": launch["block"] // 32, "PDL": 1}
    _, splits = grid_size(launch["grid"], {**mod.dims_of(d.q, d.kc), **meta})
    poison("cuda")
    got = mod.launch_decode(d.q, d.kc, d.vc, d.slots, d.lens, SM, 1.0, 1.0, d.gate, splits, meta,
                            out=torch.full_like(d.q, float("nan")))
    g, rep = capture(lambda: mod.launch_decode(d.q, d.kc, d.vc, d.slots, d.lens, SM, 1.0, 1.0, d.gate, splits, meta))
    g.replay()
    torch.cuda.synchronize()
    res: dict[str, Any] = {"splits": splits, "out": compare(numerics(C_GATED), got, d.ref(True)),
           "eager_equals_replay": bool(torch.equal(rep, got))}
    return {**res, "ok": bool(res["out"]["ok"] and res["eager_equals_replay"] and splits > 1)}


def accuracy_check(b: int, ctx: int, peaked: bool) -> dict[str, Any]:
    """Ours, the oracle on E4M3 q (XQA's numerics, emulated) and SGLang's decode, each against the FP32 oracle
    (and FP64 at b <= 8), all through `compare` under the contract's numerics; ``ok`` is ours."""
    import torch

    from netra.ops import attention, fp8
    from netra.validate.compare import compare

    num = numerics(C_DECODE)
    d = realistic(b, ctx, peaked, "cuda", 7 + b)
    ref = d.ref(False)
    ours = attention.attention_decode(d.q, d.kc, d.vc, d.slots, d.lens, ctx, SM)
    q8 = d.q.float().clamp(-448, 448).to(fp8.E4M3).to(torch.bfloat16)
    fp8q = attention.attention_decode_ref(q8, d.kc, d.vc, d.slots, d.lens, ctx, SM)
    out: dict[str, Any] = {"ours": compare(num, ours, ref), "fp8_q": compare(num, fp8q, ref),
                           "ref_abs_max": float(ref.float().abs().max())}
    sg = None
    try:
        from netra.bench.peers.sglang_attention import SglangDecodeAttention

        sg = SglangDecodeAttention(d.kc, d.vc, d.slots, d.lens, HQ, SM, root=peer_root())(d.q)
        out["sglang_triton"] = compare(num, sg, ref)
    except Exception as exc:
        out["sglang_error"] = f"{type(exc).__name__}: {exc}"
    if b <= 8:
        truth = fp64_truth(d)
        out["vs_fp64"] = {k: compare(num, v, truth)["rel_l2"] for k, v in
                          (("ours", ours), ("fp32_oracle", ref), ("fp8_q", fp8q), ("sglang_triton", sg)) if v is not None}
    return {**out, "ok": out["ours"]["ok"]}


# ---- the prologue check (GPU and smoke alike) -----------------------------------------------------

def prologue_inputs(t: int, slots: int, ctx: int, device: str, seed: int, w_scale: float = 0.3, x_scale: float = 1.0,
                    cache: Any = None) -> dict[str, Any]:
    import torch

    from netra.ops import fp8, rope

    g = gen(device, seed)
    proj = (torch.randn(t, 2 * HQ * D + 2 * HKV * D, device=device, generator=g) * x_scale).bfloat16()
    qg = proj[:, :2 * HQ * D].reshape(t, HQ, 2 * D)
    if cache is None:
        kc = torch.randn(slots, ctx, HKV, D, device=device, generator=g).to(fp8.E4M3)
        cache = (kc, kc.clone())
    pos = torch.randperm(slots * ctx, device=device, generator=g)[:t]  # distinct (slot, position) pairs
    return {"q": qg[..., :D], "k": proj[:, 2 * HQ * D:2 * HQ * D + HKV * D].reshape(t, HKV, D),
            "v": proj[:, 2 * HQ * D + HKV * D:].reshape(t, HKV, D),
            "q_weight": (torch.randn(D, device=device, generator=g) * w_scale).bfloat16(),
            "k_weight": (torch.randn(D, device=device, generator=g) * w_scale).bfloat16(), "eps": EPS,
            "positions": pos % ctx, "rope_table": rope.rope_cache(ctx, ROT, 1e7, device), "rotary_dim": ROT,
            "k_cache": cache[0], "v_cache": cache[1], "token_slots": pos // ctx}


def prologue_adversarial(device: str) -> Iterator[tuple[str, Callable[[], dict[str, Any]]]]:
    import torch

    def nonfinite() -> dict[str, Any]:
        a = prologue_inputs(64, 9, 512, device, 31, w_scale=100.0, x_scale=1e4)
        a["v"][0, 0, :4] = torch.tensor([float("inf"), -float("inf"), float("nan"), 1e6], device=device)
        return a

    def pad_rows() -> dict[str, Any]:
        a = prologue_inputs(8, 9, 512, device, 32)
        a["token_slots"] = torch.tensor([0, 0, 0, 1, 2, 3, 4, 5], device=device)
        a["positions"] = torch.tensor([0, 1, 511, 0, 511, 7, 8, 9], device=device)
        return a

    yield "saturating weights, non-finite V", nonfinite
    yield "pad-slot rows, positions 0 and last", pad_rows
    yield "kv scales 0.5 / 4", lambda: {**prologue_inputs(16, 9, 512, device, 33), "k_scale": 0.5, "v_scale": 4.0}


def unfused_prologue(**a: Any) -> Any:
    """The op's fallback: the two RMSNorms, RoPE and the K/V store, each through dispatch."""
    from netra.ops import attention, norm, rope

    qr, kr = rope.rope(norm.rmsnorm(a["q"], a["q_weight"], a["eps"]), norm.rmsnorm(a["k"], a["k_weight"], a["eps"]),
                       a["positions"], a["rope_table"], a["rotary_dim"])
    attention.kv_store(kr, a["v"], a["k_cache"], a["v_cache"], a["token_slots"], a["positions"],
                       a.get("k_scale", 1.0), a.get("v_scale", 1.0))
    return qr


def prologue_check(args: dict[str, Any], gpu: bool) -> dict[str, Any]:
    """q and the written K rows under the contract's numerics, V rows bitwise, no other cache row touched; on a
    GPU: dispatch chose the contract, the output poisoned first, eager == replay (caches reset between)."""
    import torch

    from netra.bench.timing import capture
    from netra.ops import _common, attention
    from netra.validate.compare import compare
    from netra.validate.oracle import poison_next

    num = numerics(C_PRO)
    k0, v0 = args["k_cache"].clone(), args["v_cache"].clone()
    ref_args = {**args, "k_cache": k0.clone(), "v_cache": v0.clone()}
    ref_q = attention.qk_norm_rope_store_ref(**ref_args)
    if gpu:
        _common.reset_decisions()
        poison_next(tuple(args["q"].shape), args["q"].dtype, args["q"].device)
        op: Callable[..., Any] = attention.qk_norm_rope_store
    else:
        op = entry(C_PRO)[0]
    got_q = op(**args)
    chosen = _common.decisions().get("qk_norm_rope_store", []) if gpu else [C_PRO]
    written = torch.zeros(args["k_cache"].shape[:2], dtype=torch.bool, device=args["q"].device)
    written[args["token_slots"], args["positions"]] = True
    out: dict[str, Any] = {"contract": C_PRO, "chosen": chosen, "tokens": int(args["q"].shape[0]),
                           "q": compare(num, got_q, ref_q),
                           "k_rows": compare(num, args["k_cache"][written].float(), ref_args["k_cache"][written].float()),
                           "v_rows": compare({"policy": "bitwise"}, args["v_cache"][written], ref_args["v_cache"][written]),
                           "q_bitwise_fraction": float((got_q == ref_q).float().mean())}
    ok = out["q"]["ok"] and out["k_rows"]["ok"] and out["v_rows"]["ok"] and C_PRO in chosen
    for nm in ("k_cache", "v_cache"):
        out[f"{nm}_untouched_elsewhere"] = bool(torch.equal(args[nm][~written].view(torch.uint8),
                                                            ref_args[nm][~written].view(torch.uint8)))
        ok = ok and out[f"{nm}_untouched_elsewhere"]
    if gpu:
        eager_k, eager_v = args["k_cache"].clone(), args["v_cache"].clone()
        g, rep = capture(lambda: op(**args))
        args["k_cache"].copy_(k0)
        args["v_cache"].copy_(v0)
        g.replay()
        torch.cuda.synchronize()
        out["eager_equals_replay"] = bool(
            torch.equal(rep, got_q) and torch.equal(args["k_cache"].view(torch.uint8), eager_k.view(torch.uint8))
            and torch.equal(args["v_cache"].view(torch.uint8), eager_v.view(torch.uint8)))
        ok = ok and out["eager_equals_replay"]
        del g
    return {**out, "ok": bool(ok)}


# ---- GPU cases ------------------------------------------------------------------------------------

def kv_floor_bytes(lens_total: int, b: int, gated: bool) -> int:
    """K and V once (E4M3), q read and o written in BF16 (and the gate read when gated)."""
    return 2 * lens_total * HKV * D + (3 if gated else 2) * b * HQ * D * 2


class DecodeSets:
    """``n`` input sets at (b, ctx) over one pool (> 256 MB of KV together, past the L2)."""

    def __init__(self, b: int, ctx: int) -> None:
        import torch

        self.b, self.ctx = b, ctx
        self.n = n = max(2, min(64, math.ceil(ROTATE_BYTES / (2 * b * ctx * HKV * D))))
        self.kc, self.vc = pool(n * b + 1, ctx, "cuda", seed=b + ctx)
        self.sets = [random_decode(b, ctx, "cuda", 100 * b + i, pools=(self.kc, self.vc)) for i in range(n)]
        for i, d in enumerate(self.sets):
            d.slots = torch.arange(1 + i * b, 1 + (i + 1) * b, device="cuda")

    def op(self, i: int, gated: bool = False) -> Any:
        from netra.ops import attention

        d = self.sets[i]
        return attention.attention_decode(d.q, d.kc, d.vc, d.slots, d.lens, self.ctx, SM,
                                          gate=d.gate if gated else None)

    def ref(self, i: int, gated: bool = False) -> Any:
        return self.sets[i].ref(gated)

    def unfused(self, i: int) -> Any:
        from netra.ops import attention

        return attention.output_gate(self.op(i), self.sets[i].gate)

    def peer(self) -> tuple[Callable[[int], Any] | None, str | None]:
        """SGLang's decode over the same sets (None and why, when it cannot load)."""
        import torch

        try:
            from netra.bench.peers.sglang_attention import SglangDecodeAttention

            peers = [SglangDecodeAttention(d.kc, d.vc, d.slots, d.lens, HQ, SM, root=peer_root()) for d in self.sets]
            outs = [torch.empty_like(d.q) for d in self.sets]
            return (lambda i: peers[i](self.sets[i].q, outs[i])), None
        except Exception as exc:
            return None, f"{type(exc).__name__}: {exc}"


def decode_case(b: int, ctx: int, gated: bool) -> Case:
    s = DecodeSets(b, ctx)
    provs: dict[str, Callable[[int], Any]] = {"netra": lambda i: s.op(i, gated),
                                              "fallback": lambda i: s.ref(i, gated)}
    peer_error = None
    if gated:
        provs["unfused"] = s.unfused
    else:
        fn, peer_error = s.peer()
        if fn is not None:
            provs["sglang_triton"] = fn

    def check() -> dict[str, Any]:
        res = decode_check(s.sets[0], gated, gpu=True)
        return {**res, **({"peer_error": peer_error} if peer_error else {})}

    return Case(key=f"decode{' gated' if gated else ''} B={b} L={ctx}",
                op="attention_decode_gated" if gated else "attention_decode", shape={"batch": b, "context": ctx},
                dtype="bf16 q, e4m3 kv", providers=provs, check=check, contract=C_GATED if gated else C_DECODE,
                n_inputs=s.n, floor_bytes=kv_floor_bytes(b * ctx, b, gated), hold=s, min_calls=s.n)


def explore_case(b: int, ctx: int) -> Case:
    """Launch variants of the ungated tactic beside the contract's launch (no contract: information only)."""
    from netra.ops import attention
    from netra.runtime import grid_size
    from netra.validate.compare import compare

    s = DecodeSets(b, ctx)
    d0 = s.sets[0]
    hit = attention.decode_route(d0.q, d0.kc, d0.vc, d0.slots, d0.lens)
    if hit is None:
        raise RuntimeError("dispatch chose the fallback")
    mod, launch = hit[1].tactic.module, hit[1].tactic.launch_spec
    meta = {**launch["meta"], "num_warps": launch["block"] // 32}
    _, splits = grid_size(launch["grid"], {**mod.dims_of(d0.q, d0.kc), **meta})

    def variant(sp: int, m: dict[str, Any]) -> Callable[[int], Any]:
        return lambda i: mod.launch_decode(s.sets[i].q, s.kc, s.vc, s.sets[i].slots, s.sets[i].lens, SM, 1.0, 1.0,
                                           None, sp, m)

    provs: dict[str, Callable[[int], Any]] = {"netra": lambda i: s.op(i)}
    provs.update({f"splits={sp}": variant(sp, meta) for sp in SPLIT_SWEEP.get(b, []) if sp != splits})
    if splits > 1:
        provs["PDL=1"] = variant(splits, {**meta, "PDL": 1})
    if (b, ctx) in ((1, 49152), (128, 4096)):
        provs.update({",".join(f"{k}={v}" for k, v in tv.items()): variant(splits, {**meta, **tv}) for tv in TILE_SWEEP})

    def check() -> dict[str, Any]:
        """Every variant against the oracle; a failing variant is dropped from the timing and listed."""
        ref, num = d0.ref(False), numerics(C_DECODE)
        res: dict[str, Any] = {"splits": splits, "variants": {}, "dropped": []}
        for name in [p for p in provs if p != "netra"]:
            try:
                res["variants"][name] = compare(num, provs[name](0), ref)
                ok = res["variants"][name]["ok"]
            except Exception as exc:
                res["variants"][name], ok = {"ok": False, "error": f"{type(exc).__name__}: {exc}"}, False
            if not ok:
                res["dropped"].append(name)
                del provs[name]
        res["netra"] = compare(num, provs["netra"](0), ref)
        return {**res, "ok": res["netra"]["ok"]}

    return Case(key=f"decode B={b} L={ctx} (exploration)", op="attention_decode_exploration",
                shape={"batch": b, "context": ctx}, dtype="bf16 q, e4m3 kv", providers=provs, check=check,
                n_inputs=s.n, floor_bytes=kv_floor_bytes(b * ctx, b, False), hold=s, min_calls=s.n)


def prologue_case(t: int) -> Case:
    import torch

    from netra.ops import attention, fp8

    n = 16
    kc = torch.randn(*PRO_POOL, HKV, D, device="cuda").to(fp8.E4M3)
    cache = (kc, kc.clone())
    sets = [prologue_inputs(t, *PRO_POOL, "cuda", 1000 * t + i, cache=cache) for i in range(n)]
    fresh = prologue_inputs(t, *PRO_POOL, "cuda", t)
    # q|gate's q half, k, v read (BF16), q written (BF16), K and V written (E4M3)
    floor = t * (2 * (HQ + 2 * HKV) * D + 2 * HQ * D + 2 * HKV * D)
    return Case(key=f"prologue T={t}", op="qk_norm_rope_store", shape={"tokens": t}, dtype="bf16 -> e4m3 cache",
                providers={"netra": lambda i: attention.qk_norm_rope_store(**sets[i]),
                           "unfused": lambda i: unfused_prologue(**sets[i]),
                           "fallback": lambda i: attention.qk_norm_rope_store_ref(**sets[i])},
                check=lambda: prologue_check(fresh, gpu=True), contract=C_PRO, n_inputs=n, floor_bytes=floor,
                hold=(sets, cache))


def checked(key: str, op: str, contract: str, check: Callable[[], dict[str, Any]], **shape: Any) -> CaseBuilder:
    """A check-only case (nothing timed): its result counts in the contract's oracle."""
    return partial(Case, key=key, op=op, shape=shape, dtype="bf16 q, e4m3 kv", check=check, contract=contract)


def inputs_then(check: Callable[..., dict[str, Any]], make: Callable[[], Any], *args: Any, **kw: Any
                ) -> Callable[[], dict[str, Any]]:
    """``check(make(), *args, **kw)``, the inputs made when the case runs (one case's tensors at a time)."""
    return lambda: check(make(), *args, **kw)


def cases(opts: argparse.Namespace) -> Iterator[CaseBuilder]:
    """Ordered for ``--deadline`` (no case starts after it): every kind of case early, the issue's shapes first:
    the timed decode at the two issue shapes (plain, gated) and two prologue sizes, the check-only cases, the
    accuracy table at the issue's shapes, then the other shapes of each."""
    issue, others = BENCH[:2], BENCH[2:]
    for b, ctx in issue:
        yield partial(decode_case, b, ctx, False)
        yield partial(decode_case, b, ctx, True)
    for t in (PRO_BENCH[0], PRO_BENCH[-1]):
        yield partial(prologue_case, t)
    for key, gated, make, replay in adversarial(GPU_SIZES, "cuda"):
        yield checked(f"decode {key}", "attention_decode", C_GATED if gated else C_DECODE,
                      inputs_then(decode_check, make, gated, gpu=True, replay=replay))
    for b, ctx in ((1, GPU_SIZES.long_context), (GPU_SIZES.batch, GPU_SIZES.context)):
        yield checked(f"decode PDL merge B={b} L={ctx}", "attention_decode", C_GATED, partial(pdl_check, b, ctx),
                      batch=b, context=ctx)
    for key, pro in prologue_adversarial("cuda"):
        yield checked(f"prologue {key}", "qk_norm_rope_store", C_PRO, inputs_then(prologue_check, pro, gpu=True))
    for shapes in (issue, others):
        for b, ctx in shapes:
            for peaked in (False, True):
                yield checked(f"accuracy B={b} L={ctx} {'peaked' if peaked else 'flat'}", "attention_decode",
                              C_DECODE, partial(accuracy_check, b, ctx, peaked), batch=b, context=ctx)
        if shapes is issue:
            for b, ctx in others:
                yield partial(decode_case, b, ctx, False)
                yield partial(decode_case, b, ctx, True)
            for t in PRO_BENCH[1:-1]:
                yield partial(prologue_case, t)
            for t in PRO_CHECK:
                yield checked(f"prologue T={t} (check)", "qk_norm_rope_store", C_PRO,
                              inputs_then(prologue_check, partial(prologue_inputs, t, *PRO_POOL, "cuda", t), gpu=True),
                              tokens=t)
    if getattr(opts, "attention_explore", False):
        for b, ctx in BENCH:
            yield partial(explore_case, b, ctx)


# ---- smoke ----------------------------------------------------------------------------------------

SMOKE_DECODE = ("padded", "huge logits", "kv scales", "dominant token at a split edge")
SMOKE_PROLOGUE = ("saturating", "pad-slot")


def smoke_decode(b: int, ctx: int) -> Decode:
    import torch

    return random_decode(b, ctx, "cpu", 1, lens=torch.tensor([ctx, 1, 77][:b]))


def smoke() -> Iterator[CaseBuilder]:
    """The GPU path's decode and prologue checks on the CPU (the contracts' entries, no dispatch, no graphs)."""
    for gated in (False, True):
        yield checked(f"decode{' gated' if gated else ''} B=3 L=200", "attention_decode", C_GATED if gated else C_DECODE,
                      inputs_then(decode_check, partial(smoke_decode, 3, 200), gated, gpu=False))
    for key, gated, make, _ in adversarial(SMOKE_SIZES, "cpu"):
        if key.startswith(SMOKE_DECODE):
            yield checked(f"decode {key}", "attention_decode", C_GATED if gated else C_DECODE,
                          inputs_then(decode_check, make, gated, gpu=False))
    yield checked("prologue T=5", "qk_norm_rope_store", C_PRO,
                  inputs_then(prologue_check, partial(prologue_inputs, 5, 3, 64, "cpu", 2), gpu=False))
    for key, pro in prologue_adversarial("cpu"):
        if key.startswith(SMOKE_PROLOGUE):
            yield checked(f"prologue {key}", "qk_norm_rope_store", C_PRO, inputs_then(prologue_check, pro, gpu=False))


# ---- spec -----------------------------------------------------------------------------------------

def targets(record: dict[str, Any]) -> dict[str, Any]:
    """Issue 19: at batch 1 (L = 49152) and batch 128 (L = 4096) at least as fast as the best measured peer, with
    the floor fraction; the accuracy table (ours beside E4M3 q) is in the checks (``accuracy ...`` cases)."""
    out: dict[str, Any] = {}
    for b, ctx in ((1, 49152), (128, 4096)):
        rows = {r["provider"]: r for r in record["rows"]
                if r["op"] == "attention_decode" and r["shape"] == {"batch": b, "context": ctx}}
        ours, peer = rows.get("netra"), rows.get("sglang_triton")
        out[f"B={b} L={ctx}: netra <= sglang_triton"] = {
            "pass": bool(ours and peer and ours["median_us"] <= peer["median_us"]),
            "netra_us": ours and ours["median_us"], "sglang_triton_us": peer and peer["median_us"],
            "netra_floor_fraction": ours and ours.get("floor_fraction")}
    return out


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--attention-explore", action="store_true",
                   help="attention: also time launch variants (split counts, PDL merge, tiles) as exploration cases")


def setup(opts: argparse.Namespace) -> dict[str, Any]:
    if getattr(opts, "smoke", False):
        return {"entries": "the contracts' entries under the interpreter"}
    import torch

    from netra import dispatch
    from netra.ops import _common

    torch.backends.cuda.matmul.allow_tf32 = False  # the FP32 oracle stays FP32 (as the engine sets it)
    torch.backends.cudnn.allow_tf32 = False
    dispatch.reset(dispatch.Dispatcher(min_maturity="experiment"))
    _common.reset_decisions()
    out: dict[str, Any] = {"min_maturity": "experiment", "sglang_peer_root": str(peer_root())}
    try:
        from netra.bench.peers import sglang_attention, sglang_loader

        sglang_loader.install(peer_root(), peers=("netra.bench.peers.sglang_attention",))
        out["sglang_notes"] = list(sglang_attention.RUN_NOTES)
    except Exception as exc:
        out["sglang_error"] = f"{type(exc).__name__}: {exc}"
    out["notes"] = ["FlashInfer XQA is not run (no wheel carried); its numerics (q cast to E4M3) are emulated in "
                    "the accuracy cases as fp8_q", "floor bytes: K and V once (E4M3) + q and o (BF16) (+ the gate "
                    "when gated); split partials are extra traffic, not in the floor"]
    return out


SPEC = Spec(name="attention", family="attention", doc="FP8-KV GQA decode (plain, gated) and its fused prologue",
            cases=cases, smoke=smoke, contracts=CONTRACTS, setup=setup, targets=targets, add_arguments=add_arguments,
            samples=25)
