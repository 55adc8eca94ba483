"""GDN speculative verify and commit (kernels/sm90/gdn/gdn_replay.py, contracts ``gdn_{verify,commit}_*_hv32``),
checked and timed beside SGLang 0.5.23's target verify and accepted-state copy (issue 36, part 1).

Grid: B = 1, 8, 32, 128 x T = 4, 12 (``--replay-batches``, ``--replay-tokens``), FP32 state (``--replay-state-dtypes
float32,bfloat16`` adds the BF16 pool); each cell is one verify case and one commit case under the contract whose
range covers it.

Check (every case; the same functions on the GPU and on the smoke path): the engine's layouts (pre-conv rows strided
views of a wider projection, a | b strided views of one), pad rows (slot 0) every 8th row, commit counts mixed over
0..T (T at row 0, 0 at row 1), outputs poisoned (verify's ``out`` and its post-conv scratch):

- under the contract's numerics (``bitwise``) against the op's reference run with the decode tactics the kernels
  repeat as steps (the Triton conv update, then the one-pass GDN decode tile at the contract's BV and warps: what
  `netra.ops.gdn._decode_pairing` requires dispatch to choose);
- against the PyTorch reference (the decode references looped, T steps): relative L2 within 1e-2 (a bf16 ulp);
- verify reads both pools only; commit leaves every slot outside the batch, the pad slot and count-0 rows bitwise
  unchanged; eager == CUDA-graph replay bitwise (verify's outputs; commit's pools and stash).

Providers (GPU, graph replay, input sets rotated over distinct pool slots past the L2):

- ``gdn_verify`` (one GDN layer): ``netra`` (the contract's entry: conv replay + GDN replay) against ``sglang``,
  SGLang's target verify as ``GDNAttnBackend.forward_extend`` runs it with its defaults: ``causal_conv1d_update`` on
  the [B, C, T] block with ``intermediate_conv_window``, then ``fused_sigmoid_gating_delta_rule_update`` with
  ``disable_state_update=True`` and every step's state written to ``intermediate_states_buffer`` (its
  ``fused_qkv_split_gdn_prefill`` copy between them is left out, which favours the peer). SGLang starts from our
  states (in its [slot, Hv, V, K] layout); its outputs against ours are recorded in the case's check.
- ``gdn_commit`` (every GDN layer, every row accepting ``count = T``): ``netra`` against SGLang's accepted-state copy
  after verify (``fused_mamba_state_scatter_with_mask`` + ``fused_conv_window_scatter_multi`` over every layer), at
  the most layers (<= 30) whose per-step state buffer fits ``--replay-peer-gib``; where that is fewer than the
  model's 30 GDN layers, a case without a contract times ours at 30 (the prediction's cell).
- ``decode_gdn`` (no contract): one non-speculative decode token's GDN part, conv update + GDN decode through the
  dispatching ops (minimum maturity ``experiment``) over the 30 layers (what a commit replaces, per accepted token).

Byte floors (per request and GDN layer; docs/kernels.md): verify of T tokens ``S + 48 KiB + T·56 KiB``; commit of n
tokens ``2·S + 96 KiB + n·48 KiB`` (S the state's bytes). Targets: the prediction written before any GPU run
(`PREDICTION`: the commit at B = 128, T = 12, FP32, 30 layers), judged on the record's rows (reported, not deciding).

Smoke (CPU, interpreter): one verify and one commit case per contract (two value heads on one key head, head dims 64,
C = 256, T = 3, two layers in the commit; B = 1 or 9: both ranges, a pad row at 8); no graphs, timing or peers.

    python -m netra.bench.harness gdn_replay --out $OUT/gdn_replay     # carry .sglang_peer
"""

from __future__ import annotations

import argparse
import zlib
from collections.abc import Callable, Iterator, Mapping
from dataclasses import asdict
from functools import partial
from typing import Any

from netra.bench.harness import Case, CaseBuilder, Spec
from netra.bench.specs.gdn_decode import (
    FULL,
    PEER_ROOT,
    SMOKE,
    Dims,
    in_range,
    n_sets,
    replay_equal,
    same,
    state_dtype,
    tactic,
    warm,
)

VERIFY = ("gdn_verify_f32_small_hv32", "gdn_verify_f32_hv32", "gdn_verify_bf16_hv32")
COMMIT = tuple(n.replace("verify", "commit") for n in VERIFY)
CONV_CONTRACT = "conv1d_update_c8192_w4"
GDN_DECODE_SOURCE = "kernels/sm90/gdn/gdn_decode.py"
GDN_LAYERS = 30  # Qwen3.6-35B-A3B: 30 of its 40 layers are GDN
CHECK_LAYERS = 2  # layers in the commit checks
BATCHES = (1, 8, 32, 128)
TOKENS = (4, 12)
TORCH_REF = {"policy": "rel_l2", "rtol": 1e-2}  # T decode steps of the PyTorch references: within a bf16 ulp
KIB = 1024
PREDICTION: dict[str, Any] = {
    "batch": 128, "tokens": 12, "commit_ms": 5.0, "range_ms": [4.5, 6.0], "decode_step_ms": 16.2,
    "decode_gdn_share_ms": 3.93, "fraction_of_decode_step": 0.31,
    "written": "2026-12-05, before any GPU run of the verify/commit kernels (docs/kernels.md: 30 · 128 · (4 MiB + "
               "96 KiB + 12 · 48 KiB) = 18.7 GB at the H200's copy rate and the decode kernel's floor fraction)"}
PEERS: dict[str, Any] = {}


# ---- the decode steps the kernels repeat (the bitwise oracle's steps) ------------------------------------------

def decode_steps(doc: Mapping[str, Any]) -> tuple[Callable[..., Any], Callable[..., Any]]:
    """(conv step, GDN step): the Triton conv update at its contract's launch and the one-pass GDN decode tile at
    the replay contract's BV and warps, called directly."""
    from netra.catalog import contract_doc
    from netra.ops._triton import load_source

    conv_doc = contract_doc(CONV_CONTRACT)
    conv_fn = tactic(conv_doc)
    dec_fn = load_source(GDN_DECODE_SOURCE).gdn_decode_fused
    dec_launch = {"block": doc["launch"]["block"], "grid": ["cdiv(v_dim, BV)", "batch * v_heads"],
                  "meta": {"BV": doc["launch"]["meta"]["BV"], "RELOAD": 0, "num_stages": 1}}

    def conv_step(x: Any, w: Any, pool: Any, slots: Any) -> Any:
        return conv_fn(conv_doc["launch"], x=x, weight=w, state_pool=pool, slots=slots)

    def gdn_step(q: Any, k: Any, v: Any, a: Any, b: Any, a_log: Any, dt_bias: Any, pool: Any, slots: Any) -> Any:
        return dec_fn(dec_launch, q=q, k=k, v=v, a=a, b=b, a_log=a_log, dt_bias=dt_bias, state_pool=pool, slots=slots)

    return conv_step, gdn_step


# ---- inputs ----------------------------------------------------------------------------------------------------

def make_layers(g: Any, d: Dims, n_layers: int, n_slots: int, sdt: Any, device: str) -> dict[str, Any]:
    """Stacked per-layer weights and pools: conv_weights [L, C, K], a_log / dt_bias [L, Hv], conv_pool [L, slots,
    C, K-1], ssm_pool [L, slots, Hv, dk, dv]."""
    import torch

    c, hv = d.channels, d.hv
    return {"conv_weights": (torch.randn(n_layers, c, d.width, device=device, generator=g) * 0.5).bfloat16(),
            "a_log": torch.log(torch.rand(n_layers, hv, device=device, generator=g) * 15 + 1),
            "dt_bias": (torch.randn(n_layers, hv, device=device, generator=g) * 0.5).bfloat16(),
            "conv_pool": torch.randn(n_layers, n_slots, c, d.width - 1, device=device, generator=g).bfloat16(),
            "ssm_pool": (torch.randn(n_layers, n_slots, hv, d.dk, d.dv, device=device, generator=g) * 0.3).to(sdt)}


def make_block(g: Any, d: Dims, n_layers: int, rows: int, device: str) -> dict[str, Any]:
    """Pre-conv rows [L, rows, C] as strided views of a wider in_proj output (z beside them), a | b [L, rows, Hv]
    strided views of one projection."""
    import torch

    c, hv = d.channels, d.hv
    wide = torch.randn(n_layers, rows, c + hv * d.dv, device=device, generator=g).bfloat16()
    ba = torch.randn(n_layers, rows, 2 * hv, device=device, generator=g).bfloat16()
    return {"qkv": wide[..., :c], "b": ba[..., :hv], "a": ba[..., hv:]}


def batch_slots(b: int, n_slots: int, device: str) -> Any:
    """b distinct live slots in 1..n_slots-1, shuffled, every 8th row a pad row (slot 0)."""
    import torch

    from netra.ops import gdn

    s = torch.randperm(n_slots - 1, generator=torch.Generator().manual_seed(b))[:b] + 1
    if b >= 8:
        s[7::8] = gdn.PAD_SLOT
    return s.to(torch.int64).to(device)


def mixed_counts(b: int, t: int, device: str) -> Any:
    """count[r] over 0..T (T at row 0, 0 at row 1 where b > 1), int32."""
    import torch

    cnt = (torch.arange(b) * 5 + t) % (t + 1)
    cnt[0] = t
    if b > 1:
        cnt[1] = 0
    return cnt.to(torch.int32).to(device)


# ---- checks ----------------------------------------------------------------------------------------------------

def check_verify(doc: Mapping[str, Any], d: Dims, b: int, t: int, device: str) -> dict[str, Any]:
    import torch

    from netra.ops import conv, gdn
    from netra.validate.compare import compare

    g = torch.Generator(device=device).manual_seed(zlib.crc32(f"verify {doc['name']} {b} {t}".encode()))
    n_slots = b + 3
    lay = {k: v[0] for k, v in make_layers(g, d, 1, n_slots, state_dtype(doc), device).items()}
    blk = {k: v[0] for k, v in make_block(g, d, 1, b * t, device).items()}
    slots = batch_slots(b, n_slots, device)
    args: dict[str, Any] = {"qkv": blk["qkv"], "a": blk["a"], "b": blk["b"], "conv_weight": lay["conv_weights"],
                            "a_log": lay["a_log"], "dt_bias": lay["dt_bias"], "conv_pool": lay["conv_pool"],
                            "ssm_pool": lay["ssm_pool"], "slots": slots, "tokens": t}
    conv_before, ssm_before = lay["conv_pool"].clone(), lay["ssm_pool"].clone()
    fn = tactic(doc)
    start = {"out": torch.full((b * t, d.hv, d.dv), float("nan"), dtype=torch.bfloat16, device=device),
             "conv_out": torch.full((b * t, d.channels), float("nan"), dtype=torch.bfloat16, device=device)}
    eager = {k: v.clone() for k, v in start.items()}
    fn(doc["launch"], **args, **eager)
    out = eager["out"]
    conv_step, gdn_step = decode_steps(doc)
    want = gdn.gdn_verify_ref(**args, conv_step=conv_step, gdn_step=gdn_step)
    torch_ref = gdn.gdn_verify_ref(**args, conv_step=conv.causal_conv1d_update_ref, gdn_step=gdn.gdn_decode_fused_ref)
    pad = (slots == gdn.PAD_SLOT).repeat_interleave(t)
    res: dict[str, Any] = {
        "decode_kernels_looped": compare(doc["numerics"], out, want), "torch_ref": compare(TORCH_REF, out, torch_ref),
        "pools_unchanged": same(lay["conv_pool"], conv_before) and same(lay["ssm_pool"], ssm_before),
        "pad_rows_zero": bool((out[pad] == 0).all()), "no_nan": not bool(out.isnan().any())}
    ok = (res["decode_kernels_looped"]["ok"] and res["torch_ref"]["ok"] and res["pools_unchanged"]
          and res["pad_rows_zero"] and res["no_nan"])
    res["eager_equals_replay"] = None
    if device == "cuda":
        res["eager_equals_replay"] = replay_equal(lambda bufs: fn(doc["launch"], **args, **bufs), start, eager)
        ok = ok and res["eager_equals_replay"]
    return {**res, "ok": ok}


def check_commit(doc: Mapping[str, Any], d: Dims, b: int, t: int, n_layers: int, device: str) -> dict[str, Any]:
    import torch

    from netra.ops import conv, gdn
    from netra.validate.compare import compare

    g = torch.Generator(device=device).manual_seed(zlib.crc32(f"commit {doc['name']} {b} {t}".encode()))
    n_slots = b + 3
    lay = make_layers(g, d, n_layers, n_slots, state_dtype(doc), device)
    blk = make_block(g, d, n_layers, b * t, device)
    slots = batch_slots(b, n_slots, device)
    count = mixed_counts(b, t, device)
    base = {"qkv_stash": blk["qkv"], "a_stash": blk["a"], "b_stash": blk["b"], "conv_weights": lay["conv_weights"],
            "a_log": lay["a_log"], "dt_bias": lay["dt_bias"], "conv_pool": lay["conv_pool"],
            "ssm_pool": lay["ssm_pool"]}
    mutable = ("qkv_stash", "conv_pool", "ssm_pool")

    def fresh() -> dict[str, Any]:
        return {k: (v.clone() if k in mutable else v) for k, v in base.items()}

    fn = tactic(doc)
    mine, oracle, torch_ref = fresh(), fresh(), fresh()
    fn(doc["launch"], **mine, slots=slots, count=count, tokens=t)
    conv_step, gdn_step = decode_steps(doc)
    gdn.gdn_commit_ref(**oracle, slots=slots, count=count, tokens=t, conv_step=conv_step, gdn_step=gdn_step)
    gdn.gdn_commit_ref(**torch_ref, slots=slots, count=count, tokens=t, conv_step=conv.causal_conv1d_update_ref,
                       gdn_step=gdn.gdn_decode_fused_ref)
    live = {int(s) for s, c in zip(slots.tolist(), count.tolist(), strict=True) if s != gdn.PAD_SLOT and c > 0}
    others = [i for i in range(n_slots) if i not in live]
    res: dict[str, Any] = {
        "decode_kernels_looped": {p: compare(doc["numerics"], mine[p], oracle[p]) for p in ("ssm_pool", "conv_pool")},
        "torch_ref": compare(TORCH_REF, mine["ssm_pool"], torch_ref["ssm_pool"]),
        "untouched_bitwise": same(mine["ssm_pool"][:, others], base["ssm_pool"][:, others])
        and same(mine["conv_pool"][:, others], base["conv_pool"][:, others]),
        "counts": count.tolist()[:16]}
    ok = (all(v["ok"] for v in res["decode_kernels_looped"].values()) and res["torch_ref"]["ok"]
          and res["untouched_bitwise"])
    res["eager_equals_replay"] = None
    if device == "cuda":
        res["eager_equals_replay"] = replay_equal(
            lambda bufs: fn(doc["launch"], **{**base, **bufs}, slots=slots, count=count, tokens=t),
            {k: base[k] for k in mutable}, {k: mine[k] for k in mutable})
        ok = ok and res["eager_equals_replay"]
    return {**res, "ok": ok}


def check_decode_dispatch(b: int, d: Dims = FULL, device: str = "cuda") -> dict[str, Any]:
    """The decode step's ops as the reference case runs them pick Triton tactics (a conv update contract and a GDN
    decode contract), and give what `gdn_decode_fused_ref` after `causal_conv1d_update_ref` gives under the GDN
    contract's numerics."""
    import torch

    from netra.catalog import contract_doc
    from netra.ops import _common, conv, gdn
    from netra.validate.compare import compare

    g = torch.Generator(device=device).manual_seed(b)
    lay = {k: v[0] for k, v in make_layers(g, d, 1, b + 1, torch.float32, device).items()}
    blk = {k: v[0] for k, v in make_block(g, d, 1, b, device).items()}
    slots = torch.arange(1, b + 1, dtype=torch.int64, device=device)
    _common.reset_decisions()
    pools = {k: lay[k].clone() for k in ("conv_pool", "ssm_pool")}
    o = decode_layer(d, blk["qkv"], blk["a"], blk["b"], lay["conv_weights"], lay["a_log"], lay["dt_bias"],
                     pools["conv_pool"], pools["ssm_pool"], slots, conv.causal_conv1d_update, gdn.gdn_decode_fused)
    chosen = _common.decisions()
    ref = decode_layer(d, blk["qkv"], blk["a"], blk["b"], lay["conv_weights"], lay["a_log"], lay["dt_bias"],
                       lay["conv_pool"].clone(), lay["ssm_pool"].clone(), slots, conv.causal_conv1d_update_ref,
                       gdn.gdn_decode_fused_ref)
    _common.reset_decisions()
    picked = {op: chosen.get(op, []) for op in ("causal_conv1d_update", "gdn_decode_fused")}
    triton = (any(n.startswith("conv1d_update") for n in picked["causal_conv1d_update"])
              and any(n.startswith("gdn_decode") for n in picked["gdn_decode_fused"]))
    o_cmp = compare(contract_doc("gdn_decode_f32_hv32")["numerics"], o, ref)
    return {"selected": picked, "triton": triton, "o": o_cmp, "ok": triton and o_cmp["ok"]}


def decode_layer(d: Dims, x: Any, a: Any, b: Any, w: Any, a_log: Any, dt_bias: Any, conv_pool: Any, ssm_pool: Any,
                 slots: Any, conv_op: Callable[..., Any], gdn_op: Callable[..., Any]) -> Any:
    """One layer's decode token: conv update, then GDN decode on its q/k/v views."""
    bsz, kd = x.shape[0], d.hk * d.dk
    y = conv_op(x, w, conv_pool, slots)
    q, k, v = y[:, :kd].view(bsz, d.hk, d.dk), y[:, kd:2 * kd].view(bsz, d.hk, d.dk), y[:, 2 * kd:].view(bsz, d.hv, d.dv)
    return gdn_op(q, k, v, a, b, a_log, dt_bias, ssm_pool, slots)


# ---- timing (GPU) ----------------------------------------------------------------------------------------------

def state_bytes(d: Dims, sdt: Any) -> int:
    import torch

    return d.hv * d.dk * d.dv * torch.empty((), dtype=sdt).element_size()


def verify_floor(d: Dims, b: int, t: int, sdt: Any) -> int:
    return b * (state_bytes(d, sdt) + 48 * KIB + t * 56 * KIB)


def commit_floor(d: Dims, b: int, n: int, layers: int, sdt: Any) -> int:
    return layers * b * (2 * state_bytes(d, sdt) + 96 * KIB + n * 48 * KIB)


def peer_layers(d: Dims, b: int, t: int, sdt: Any, gib: float) -> int:
    """The most GDN layers (<= 30) whose SGLang per-step state buffer [L, B, T, ...] fits in ``gib``."""
    return max(1, min(GDN_LAYERS, int(gib * (1 << 30)) // (b * t * state_bytes(d, sdt))))


def dtype_label(sdt: Any) -> str:
    return f"state {str(sdt).removeprefix('torch.')}"


def verify_case(doc: dict[str, Any], b: int, t: int, d: Dims = FULL, device: str = "cuda") -> Case:
    import torch

    from netra.validate.compare import compare

    fn, sdt = tactic(doc), state_dtype(doc)
    c, hv, hk, dk, dv, w = d.channels, d.hv, d.hk, d.dk, d.dv, d.width
    n = n_sets(b * state_bytes(d, sdt), most=64) if device == "cuda" else 2
    g = torch.Generator(device=device).manual_seed(b * 100 + t)
    lay = {k: v[0] for k, v in make_layers(g, d, 1, n * b + 1, sdt, device).items()}
    blk = {k: v[0] for k, v in make_block(g, d, 1, b * t, device).items()}
    slots = [torch.arange(1 + i * b, 1 + (i + 1) * b, dtype=torch.int64, device=device) for i in range(n)]
    out = torch.empty(b * t, hv, dv, dtype=torch.bfloat16, device=device)
    scratch = torch.empty(b * t, c, dtype=torch.bfloat16, device=device)
    common = {"qkv": blk["qkv"], "a": blk["a"], "b": blk["b"], "conv_weight": lay["conv_weights"],
              "a_log": lay["a_log"], "dt_bias": lay["dt_bias"], "conv_pool": lay["conv_pool"],
              "ssm_pool": lay["ssm_pool"], "tokens": t, "out": out, "conv_out": scratch}
    providers: dict[str, Callable[[int], Any]] = {"netra": lambda i: fn(doc["launch"], **common, slots=slots[i])}
    hold: list[Any] = [lay, blk, slots, out, scratch]
    info: dict[str, Any] = {}
    if "sglang" in PEERS:
        p = PEERS["sglang"]
        # SGLang's pools: temporal state [slot, Hv, V, K] (K contiguous), conv [slot, C, K-1]; per-step buffers
        # [rows, T, Hv, V, K] and the deduplicated window [rows, C, T+K-2] seen as [rows, T, C, K-1]
        spool = lay["ssm_pool"].transpose(-1, -2).contiguous()  # our states in SGLang's layout
        sconv = lay["conv_pool"].clone()  # SGLang's verify rolls the window (its accepted-state copy restores it)
        inter = torch.empty(n * b, t, hv, dv, dk, dtype=sdt, device=device)
        wl = t + w - 2
        phys = torch.zeros(n * b, c, wl, dtype=torch.bfloat16, device=device)
        win = phys.as_strided((n * b, t, c, w - 1), (c * wl, 1, wl, 1))
        sslots = [s.to(torch.int32) for s in slots]
        rows = [torch.arange(i * b, (i + 1) * b, dtype=torch.int32, device=device) for i in range(n)]
        cu = torch.arange(0, (b + 1) * t, t, dtype=torch.int32, device=device)
        xq = blk["qkv"].contiguous()  # SGLang's mixed_qkv [B·T, C], seen as [B, C, T] as forward_extend does
        x_bct = xq.view(b, t, c).transpose(1, 2)

        def sglang_verify(i: int) -> Any:
            y = p["conv"](x_bct, sconv, lay["conv_weights"], None, "silu", conv_state_indices=sslots[i],
                          intermediate_conv_window=win, intermediate_state_indices=rows[i])
            y = y.transpose(1, 2).reshape(b * t, c)  # SGLang: .transpose(1, 2).view(seq_len, -1)
            q = y[:, :hk * dk].view(1, b * t, hk, dk)
            k = y[:, hk * dk:2 * hk * dk].view(1, b * t, hk, dk)
            v = y[:, 2 * hk * dk:].view(1, b * t, hv, dv)
            return p["verify"](A_log=lay["a_log"], a=blk["a"], dt_bias=lay["dt_bias"], softplus_beta=1.0,
                               softplus_threshold=20.0, q=q, k=k, v=v, b=blk["b"], initial_state_source=spool,
                               initial_state_indices=sslots[i], cu_seqlens=cu, use_qk_l2norm_in_kernel=True,
                               is_kda=False, disable_state_update=True, intermediate_states_buffer=inter,
                               intermediate_state_indices=rows[i], cache_steps=t, retrieve_parent_token=None)

        providers["sglang"] = sglang_verify
        hold += [spool, sconv, inter, phys, win, sslots, rows, cu, xq, x_bct]
        info["sglang_method_bytes"] = b * ((t + 1) * state_bytes(d, sdt) + 48 * KIB + t * 56 * KIB + t * c * 2)
    if "sglang" in providers:
        try:  # the same job from the same states, before any call rolls its conv window (reported, not deciding)
            mine = fn(doc["launch"], **common, slots=slots[0]).clone()
            info["sglang_against_netra"] = compare(TORCH_REF, providers["sglang"](0).reshape(b * t, hv, dv), mine)
        except Exception as exc:
            info["sglang_against_netra"] = f"{type(exc).__name__}: {exc}"[:300]
    dropped: dict[str, str] = {}
    providers = warm(providers, dropped, device)

    def check() -> dict[str, Any]:
        return {**check_verify(doc, d, b, t, device), **info, **({"providers_dropped": dropped} if dropped else {})}

    shape = {"batch": b, "block_tokens": t, "v_heads": hv, "k_dim": dk, "v_dim": dv, "channels": c, "layers": 1}
    return Case(key=f"verify {dtype_label(sdt)} b{b} t{t}", op="gdn_verify", shape=shape, dtype=dtype_label(sdt),
                providers=providers, check=check, contract=doc["name"], n_inputs=n,
                floor_bytes=verify_floor(d, b, t, sdt), hold=hold, min_calls=8)


def commit_case(doc: dict[str, Any], b: int, t: int, n_layers: int, peer: bool, d: Dims = FULL,
                device: str = "cuda") -> Case:
    """``n_layers`` GDN layers committing ``t`` tokens for every row; ``peer``: beside SGLang's accepted-state copy
    at the same layers (the contract's case), else ours alone (no contract)."""
    import torch

    fn, sdt = tactic(doc), state_dtype(doc)
    c, hv, dk, dv, w = d.channels, d.hv, d.dk, d.dv, d.width
    n = n_sets(n_layers * b * state_bytes(d, sdt), most=64) if device == "cuda" else 2
    g = torch.Generator(device=device).manual_seed(b * 1000 + t * 10 + n_layers)
    lay = make_layers(g, d, n_layers, n * b + 1, sdt, device)
    blk = make_block(g, d, n_layers, b * t, device)
    stash = blk["qkv"].contiguous()  # the engine's stash is its own buffer (consumed by the commit)
    slots = [torch.arange(1 + i * b, 1 + (i + 1) * b, dtype=torch.int64, device=device) for i in range(n)]
    count = torch.full((b,), t, dtype=torch.int32, device=device)
    args: dict[str, Any] = {
        "qkv_stash": stash, "a_stash": blk["a"], "b_stash": blk["b"], "conv_weights": lay["conv_weights"],
        "a_log": lay["a_log"], "dt_bias": lay["dt_bias"], "conv_pool": lay["conv_pool"], "ssm_pool": lay["ssm_pool"],
        "count": count, "tokens": t}
    providers: dict[str, Callable[[int], Any]] = {"netra": lambda i: fn(doc["launch"], **args, slots=slots[i])}
    hold: list[Any] = [lay, blk, stash, slots, count]
    info: dict[str, Any] = {}
    if peer and "sglang" in PEERS:
        p = PEERS["sglang"]
        spool = torch.empty(n_layers, n * b + 1, hv, dv, dk, dtype=sdt, device=device).normal_().mul_(0.3)
        inter = torch.empty(n_layers, b, t, hv, dv, dk, dtype=sdt, device=device).normal_().mul_(0.3)
        wl = t + w - 2
        phys = torch.zeros(n_layers, b, c, wl, dtype=torch.bfloat16, device=device)
        win = phys.as_strided((n_layers, b, t, c, w - 1), (b * c * wl, c * wl, 1, wl, 1))
        sslots = [s.to(torch.int32) for s in slots]
        last = torch.full((b,), t - 1, dtype=torch.int64, device=device)  # last_correct_step_indices

        def sglang_commit(i: int) -> None:
            p["scatter_ssm"](spool, inter, sslots[i], last)
            p["scatter_conv"]([(lay["conv_pool"], win)], sslots[i], last)

        providers["sglang"] = sglang_commit
        hold += [spool, inter, phys, win, sslots, last]
        info["sglang_method_bytes"] = n_layers * b * (2 * state_bytes(d, sdt) + 2 * c * (w - 1) * 2)
    dropped: dict[str, str] = {}
    providers = warm(providers, dropped, device)

    def check() -> dict[str, Any]:
        return {**check_commit(doc, d, b, t, CHECK_LAYERS, device), **info,
                **({"providers_dropped": dropped} if dropped else {})}

    shape = {"batch": b, "block_tokens": t, "count": t, "layers": n_layers, "v_heads": hv, "k_dim": dk, "v_dim": dv,
             "channels": c}
    return Case(key=f"commit {dtype_label(sdt)} b{b} t{t} L{n_layers}", op="gdn_commit", shape=shape,
                dtype=dtype_label(sdt), providers=providers, check=check, contract=doc["name"] if peer else None,
                n_inputs=n, floor_bytes=commit_floor(d, b, t, n_layers, sdt), hold=hold,
                min_calls=2 if b * n_layers >= 512 else 8)


def decode_case(b: int, sdt: Any, d: Dims = FULL, device: str = "cuda") -> Case:
    """One decode token's GDN part over the 30 layers through the dispatching ops (a reference: no contract)."""
    import torch

    from netra.ops import conv, gdn

    n = n_sets(GDN_LAYERS * b * state_bytes(d, sdt), most=64) if device == "cuda" else 2
    g = torch.Generator(device=device).manual_seed(b)
    lay = make_layers(g, d, GDN_LAYERS, n * b + 1, sdt, device)
    blk = make_block(g, d, GDN_LAYERS, b, device)
    slots = [torch.arange(1 + i * b, 1 + (i + 1) * b, dtype=torch.int64, device=device) for i in range(n)]

    def step(i: int) -> None:
        for li in range(GDN_LAYERS):
            decode_layer(d, blk["qkv"][li], blk["a"][li], blk["b"][li], lay["conv_weights"][li], lay["a_log"][li],
                         lay["dt_bias"][li], lay["conv_pool"][li], lay["ssm_pool"][li], slots[i],
                         conv.causal_conv1d_update, gdn.gdn_decode_fused)

    floor = GDN_LAYERS * b * (2 * state_bytes(d, sdt) + 2 * d.channels * 2 + 2 * d.channels * 3 * 2
                              + d.hv * d.dv * 2)
    shape = {"batch": b, "layers": GDN_LAYERS, "v_heads": d.hv, "k_dim": d.dk, "v_dim": d.dv, "channels": d.channels}
    return Case(key=f"decode_gdn {dtype_label(sdt)} b{b} L{GDN_LAYERS}", op="decode_gdn", shape=shape,
                dtype=dtype_label(sdt), providers={"netra": step}, check=partial(check_decode_dispatch, b, d, device),
                n_inputs=n, floor_bytes=floor, hold=[lay, blk, slots], min_calls=2 if b >= 16 else 8)


def covering(names: tuple[str, ...], sdt: Any, b: int, t: int) -> dict[str, Any] | None:
    from netra.catalog import contract_doc

    for name in names:
        doc = contract_doc(name)
        if state_dtype(doc) == sdt and in_range(doc, batch=b, block_tokens=t):
            return doc
    return None


def _ints(v: Any, default: tuple[int, ...]) -> list[int]:
    return [int(x) for x in str(v or ",".join(map(str, default))).split(",")]


def cases(opts: argparse.Namespace) -> Iterator[CaseBuilder]:
    import torch

    batches = _ints(getattr(opts, "replay_batches", ""), BATCHES)
    tokens = _ints(getattr(opts, "replay_tokens", ""), TOKENS)
    gib = float(getattr(opts, "replay_peer_gib", 0) or 40.0)
    for sname in str(getattr(opts, "replay_state_dtypes", "") or "float32").split(","):
        sdt = getattr(torch, sname)
        if PREDICTION["batch"] in batches:
            yield partial(decode_case, PREDICTION["batch"], sdt)
        cells = [(b, t) for b in batches for t in tokens]
        cells.sort(key=lambda c: c != (PREDICTION["batch"], PREDICTION["tokens"]))  # the prediction's cell first
        for b, t in cells:
            v = covering(VERIFY, sdt, b, t)
            if v is not None:
                yield partial(verify_case, v, b, t)
            cm = covering(COMMIT, sdt, b, t)
            if cm is None:
                continue
            lp = peer_layers(FULL, b, t, sdt, gib) if "sglang" in PEERS else GDN_LAYERS
            yield partial(commit_case, cm, b, t, lp, True)
            if lp < GDN_LAYERS:
                yield partial(commit_case, cm, b, t, GDN_LAYERS, False)


def check_case(key: str, op: str, doc: Mapping[str, Any], check: Callable[[], Mapping[str, Any]], **shape: Any) -> Case:
    return Case(key=key, op=op, shape=shape, dtype=dtype_label(state_dtype(doc)), check=check, contract=doc["name"])


def smoke() -> Iterator[CaseBuilder]:
    from netra.catalog import contract_doc

    t = 3
    for names, op in ((VERIFY, "gdn_verify"), (COMMIT, "gdn_commit")):
        for name in names:
            doc = contract_doc(name)
            b = [x for x in (1, 9) if in_range(doc, batch=x, block_tokens=t)][-1]  # both ranges; a pad row at 8
            check = (partial(check_verify, doc, SMOKE, b, t, "cpu") if op == "gdn_verify"
                     else partial(check_commit, doc, SMOKE, b, t, CHECK_LAYERS, "cpu"))
            yield partial(check_case, f"{name} b{b} t{t}", op, doc, check, batch=b, block_tokens=t)


def targets(record: dict[str, Any]) -> dict[str, Any]:
    """The prediction against the record's commit row at its cell (30 layers, FP32) and the decode reference."""
    rows = record.get("rows", [])
    hit = [r for r in rows if r["op"] == "gdn_commit" and r["provider"] == "netra" and r["dtype"] == "state float32"
           and r["shape"]["batch"] == PREDICTION["batch"] and r["shape"]["block_tokens"] == PREDICTION["tokens"]
           and r["shape"]["layers"] == GDN_LAYERS]
    dec = [r for r in rows if r["op"] == "decode_gdn" and r["dtype"] == "state float32"
           and r["shape"]["batch"] == PREDICTION["batch"]]
    res: dict[str, Any] = {"prediction": dict(PREDICTION)}
    if hit:
        ms = hit[0]["median_us"] / 1e3
        res.update(measured_commit_ms=round(ms, 3),
                   measured_fraction_of_decode_step=round(ms / PREDICTION["decode_step_ms"], 3),
                   within_range=PREDICTION["range_ms"][0] <= ms <= PREDICTION["range_ms"][1])
    else:
        res["within_range"] = None
    if dec:
        res["decode_gdn_30_layers_ms_same_run"] = round(dec[0]["median_us"] / 1e3, 3)
        if hit:
            res["commit_over_decode_gdn_same_run"] = round(hit[0]["median_us"] / dec[0]["median_us"], 3)
    return res


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--replay-batches", default="", help="gdn_replay: comma-separated batches (default 1,8,32,128)")
    p.add_argument("--replay-tokens", default="", help="gdn_replay: comma-separated block tokens T (default 4,12)")
    p.add_argument("--replay-state-dtypes", default="", help="gdn_replay: state dtypes (default float32)")
    p.add_argument("--replay-peer-gib", type=float, default=40.0,
                   help="gdn_replay: memory for SGLang's per-step state buffer in the commit cases (GiB)")


def setup(opts: argparse.Namespace) -> dict[str, Any]:
    PEERS.clear()
    if getattr(opts, "smoke", False):
        return {"peers": "none (smoke path)", "dims": asdict(SMOKE)}
    from netra import dispatch

    # the decode reference case dispatches its ops: the experiment decode tactics too (the conv update is verified)
    dispatch.reset(dispatch.Dispatcher(min_maturity="experiment"))
    try:
        from netra.bench.peers import sglang_spec

        PEERS["sglang"] = sglang_spec.load(PEER_ROOT)
        peers = ("0.5.23 wheel files: causal_conv1d_update (intermediate_conv_window) + "
                 "fused_sigmoid_gating_delta_rule_update (disable_state_update, intermediate_states_buffer) per layer "
                 "for verify; fused_mamba_state_scatter_with_mask + fused_conv_window_scatter_multi for the "
                 "accepted-state copy")
    except Exception as exc:
        peers = f"not loaded: {type(exc).__name__}: {exc}"[:300]
    return {"peers": {"sglang": peers}, "dims": asdict(FULL), "gdn_layers": GDN_LAYERS, "min_maturity": "experiment"}


SPEC = Spec(name="gdn_replay", family="gdn", doc="GDN speculative verify/commit beside SGLang's verify and state copy",
            cases=cases, smoke=smoke, contracts=(*VERIFY, *COMMIT), setup=setup, targets=targets,
            add_arguments=add_arguments)
