"""GDN speculative verify and commit: T decode token steps per request in one pass over the state.

Verify (entry `gdn_verify`) gives the outputs of a block of T tokens per request without writing any state; commit
(entry `gdn_commit`) replays the accepted prefix (``count[r]`` tokens of request r) of every GDN layer on the real
pools. Both must be bitwise the decode step (kernels/sm90/conv/conv1d_update.py, then kernels/sm90/gdn/gdn_decode.py's
one-pass kernel) repeated, so each runs two kernels that repeat those kernels' arithmetic expression for expression:

1. ``_conv_steps_kernel``, program (layer·B + r, channel block of BC): the channel's window (K-1 = 3 values, the
   pool's dtype) and weights read once, then for j < n: ``y = w0·s0 + w1·s1 + w2·s2 + w3·x_j`` (FP32, the conv
   update's order), ``silu(y) = y / (1 + exp(-y))`` stored in x's dtype, window ← (s1, s2, x_j). Verify (n = T) writes
   the post-conv rows to a scratch ``[B·T, C]`` and never the window; commit (n = count[r]) writes them over the
   stash's rows in place (the stash is consumed) and the new window once at the end.
2. ``_gdn_steps_kernel``, program ((layer·B + r)·Hv + h, v tile): the ``[dk, BV]`` state tile read once and kept in
   registers (FP32) through n steps of the decode kernel's body (gating, L2 norm, ``Sᵀk̂`` and ``Sᵀq̂`` of the tile,
   ``o = e·Sᵀq̂ + (k̂·q̂)·δ``, ``S' = e·S + k̂ δᵀ``), rounded to the pool's dtype after every step as the decode's
   store and reload do. q, k, v are loaded from the post-conv rows with the decode kernel's load expressions, so the
   L2-norm and state reductions run in the decode kernel's layouts (tests/ops/test_gdn_spec_sm90_compile.py
   compares them): the conv is NOT fused into this kernel for that reason (values computed in registers would take
   the layout of the conv's loads, and a reduction's FP32 order follows its layout). Verify stores every step's
   output and never the state; commit stores the state once after the last step and no output.

Pad rows (slot 0) and commit rows with count 0 touch nothing; verify's pad rows give zero outputs.

Bitwise policy: against the decode tactics the kernels repeat, where dispatch pairs them (netra.ops.gdn
`_decode_pairing`: the Triton conv update, and the one-pass GDN tile with the same BV and warps, which each contract
mirrors by batch range and state dtype); TRITON_INTERPRET tests compare bitwise against the decode kernels looped.
Elsewhere the ops run the decode ops looped (the references).

Byte floor (Qwen3.6-35B-A3B: Hv 32, dk = dv = 128, C = 8192, bf16 rows; per request and GDN layer; docs/kernels.md):
a decode step moves the state in and out every token (fp32 4 MiB, bf16 2 MiB) plus ≈ 152 KiB of conv, q/k/v and
output traffic. Verify of T tokens reads the state once (fp32 2 MiB, bf16 1 MiB) and the window once (48 KiB), and
per token reads x (16 KiB), writes and re-reads the post-conv row (2 × 16 KiB) and writes o (8 KiB): fp32
2 MiB + 48 KiB + T · 56 KiB (T = 16: 2.9 MiB, against 16 decode steps' 66.4 MiB). Commit of n tokens reads and
writes the state once (fp32 4 MiB, bf16 2 MiB) and the window (96 KiB), and per token reads x, writes y over it and
re-reads y (48 KiB): fp32 4 MiB + 96 KiB + n · 48 KiB. Timing: results/sm90/NOTES.md.
"""

from __future__ import annotations

from typing import Any

import torch
import triton
import triton.language as tl

from netra.runtime import grid_size

PAD_SLOT = 0
L2_EPS = 1e-6


@triton.jit
def _log1p(y):
    # log(1 + y) for y >= 0 without losing a small y (Goldberg's trick): exact when 1 + y rounds to 1.
    u = 1.0 + y
    d = tl.where(u == 1.0, 1.0, u - 1.0)
    return tl.where(u == 1.0, y, tl.log(u) * (y / d))


@triton.jit
def _gates(a, b, a_log, dt_bias):
    # gdn_decode.py's gating, expression for expression: softplus(x) = max(x, 0) + log1p(exp(-|x|)), decay
    # e = exp(g), beta = sigmoid(b)
    x = a + dt_bias
    softplus = tl.maximum(x, 0.0) + _log1p(tl.exp(-tl.abs(x)))
    decay = tl.exp(-tl.exp(a_log) * softplus)
    beta = 1.0 / (1.0 + tl.exp(-b))
    return decay, beta


@triton.jit
def _conv_steps_kernel(
    x_ptr, w_ptr, state_ptr, slots_ptr, count_ptr, y_ptr, channels, tokens, batch,
    sx_l, sx_r, sx_c, sw_l, sw_c, sw_k, ss_l, ss_n, sy_r,
    BC: tl.constexpr, PAD: tl.constexpr, COMMIT: tl.constexpr,
):
    i_lr = tl.program_id(0)
    i_c = tl.program_id(1)
    i_l = (i_lr // batch).to(tl.int64)
    i_r = i_lr % batch
    c0 = i_c * BC
    lc = tl.arange(0, BC)
    offs_c = c0 + lc
    mask_c = offs_c < channels

    slot = tl.load(slots_ptr + i_r).to(tl.int64)
    n = tl.load(count_ptr + i_r).to(tl.int32) if COMMIT else tokens
    if (slot == PAD) | (n <= 0):
        return

    w_base = w_ptr + i_l * sw_l
    w0 = tl.load(w_base + offs_c * sw_c, mask=mask_c, other=0.0).to(tl.float32)
    w1 = tl.load(w_base + offs_c * sw_c + sw_k, mask=mask_c, other=0.0).to(tl.float32)
    w2 = tl.load(w_base + offs_c * sw_c + 2 * sw_k, mask=mask_c, other=0.0).to(tl.float32)
    w3 = tl.load(w_base + offs_c * sw_c + 3 * sw_k, mask=mask_c, other=0.0).to(tl.float32)
    st = state_ptr + i_l * ss_l + slot * ss_n + c0 * 3  # pool [.., slots, C, 3]: last two dims contiguous
    s0 = tl.load(st + lc * 3, mask=mask_c, other=0.0)
    s1 = tl.load(st + lc * 3 + 1, mask=mask_c, other=0.0)
    s2 = tl.load(st + lc * 3 + 2, mask=mask_c, other=0.0)

    for j in range(n):
        row = (i_r * tokens + j).to(tl.int64)
        x_ptrs = x_ptr + i_l * sx_l + row * sx_r + offs_c * sx_c
        x = tl.load(x_ptrs, mask=mask_c, other=0.0)
        # conv1d_update.py's sum, in its order (the same FMA contraction)
        y = s0.to(tl.float32) * w0
        y = y + s1.to(tl.float32) * w1
        y = y + s2.to(tl.float32) * w2
        y = y + x.to(tl.float32) * w3
        y = y / (1.0 + tl.exp(-y))
        if COMMIT:
            # the post-conv row overwrites the pre-conv row it came from: every thread's load of x_j before any
            # thread's store over it (Triton orders global memory only per thread; see conv1d_update.py, issue 19)
            tl.debug_barrier()
            tl.store(x_ptrs, y.to(x_ptr.dtype.element_ty), mask=mask_c)
        else:
            tl.store(y_ptr + row * sy_r + offs_c, y.to(y_ptr.dtype.element_ty), mask=mask_c)
        s0 = s1
        s1 = s2
        s2 = x.to(state_ptr.dtype.element_ty)

    if COMMIT:
        tl.debug_barrier()  # the window's loads (any thread) before its stores
        tl.store(st + lc * 3, s0, mask=mask_c)
        tl.store(st + lc * 3 + 1, s1, mask=mask_c)
        tl.store(st + lc * 3 + 2, s2, mask=mask_c)


@triton.jit
def _gdn_steps_kernel(
    q_ptr, k_ptr, v_ptr, a_ptr, b_ptr, a_log_ptr, dt_bias_ptr, state_ptr, slots_ptr, count_ptr, o_ptr,
    tokens, batch,
    sq_l, sq_b, sq_h, sq_d, sk_b, sk_h, sk_d, sv_b, sv_h, sv_d, sa_l, sa_b, sa_h, sb_b, sb_h, sg_l, ss_l,
    HV: tl.constexpr, HK: tl.constexpr, DK: tl.constexpr, DV: tl.constexpr, BV: tl.constexpr,
    PAD: tl.constexpr, EPS: tl.constexpr, SCALE: tl.constexpr, COMMIT: tl.constexpr,
):
    # q, k, v share the layer stride sq_l (views of one stash / scratch); a and b share sa_l. The (layer, request,
    # head) axis is the grid's first: 30 layers x 128 requests x 32 heads exceed the 65535 of a CUDA grid's y axis
    i_lbh = tl.program_id(0)
    i_v = tl.program_id(1)
    i_lb = i_lbh // HV
    i_hv = i_lbh % HV
    i_l = (i_lb // batch).to(tl.int64)
    i_b = i_lb % batch
    i_hk = i_hv // (HV // HK)
    offs_v = i_v * BV + tl.arange(0, BV)
    offs_k = tl.arange(0, DK)

    slot = tl.load(slots_ptr + i_b).to(tl.int64)
    if COMMIT:
        n = tl.load(count_ptr + i_b).to(tl.int32)
        if (slot == PAD) | (n <= 0):
            return
    else:
        n = tokens
        if slot == PAD:
            for j in range(tokens):
                o_ptrs = o_ptr + ((i_b * tokens + j).to(tl.int64) * HV + i_hv) * DV + offs_v
                tl.store(o_ptrs, tl.zeros([BV], dtype=tl.float32).to(o_ptr.dtype.element_ty))
            return

    s_ptrs = state_ptr + i_l * ss_l + (slot * HV + i_hv) * (DK * DV) + offs_k[:, None] * DV + offs_v[None, :]
    s = tl.load(s_ptrs).to(tl.float32)
    a_log = tl.load(a_log_ptr + i_l * sg_l + i_hv).to(tl.float32)
    dt_bias = tl.load(dt_bias_ptr + i_l * sg_l + i_hv).to(tl.float32)
    q_base = q_ptr + i_l * sq_l
    k_base = k_ptr + i_l * sq_l
    v_base = v_ptr + i_l * sq_l
    a_base = a_ptr + i_l * sa_l
    b_base = b_ptr + i_l * sa_l

    for j in range(n):
        row = (i_b * tokens + j).to(tl.int64)
        # gdn_decode.py's _gdn_decode_fused_kernel body, expression for expression
        q = tl.load(q_base + row * sq_b + i_hk * sq_h + offs_k * sq_d).to(tl.float32)
        k = tl.load(k_base + row * sk_b + i_hk * sk_h + offs_k * sk_d).to(tl.float32)
        v = tl.load(v_base + row * sv_b + i_hv * sv_h + offs_v * sv_d).to(tl.float32)
        a = tl.load(a_base + row * sa_b + i_hv * sa_h).to(tl.float32)
        b = tl.load(b_base + row * sb_b + i_hv * sb_h).to(tl.float32)

        decay, beta = _gates(a, b, a_log, dt_bias)

        q = q * (tl.rsqrt(tl.sum(q * q, axis=0) + EPS) * SCALE)
        k = k * tl.rsqrt(tl.sum(k * k, axis=0) + EPS)

        sk = tl.sum(s * k[:, None], axis=0)  # [BV]  (Sᵀk̂ of the state before this step)
        sq = tl.sum(s * q[:, None], axis=0)  # [BV]  (Sᵀq̂ of the state before this step)
        kq = tl.sum(k * q, axis=0)
        delta = beta * (v - decay * sk)
        o = decay * sq + kq * delta
        s = s * decay + k[:, None] * delta[None, :]
        # the decode step stores the state in the pool's dtype and the next step reloads it: round the same way
        s = s.to(state_ptr.dtype.element_ty).to(tl.float32)
        if not COMMIT:
            o_ptrs = o_ptr + (row * HV + i_hv) * DV + offs_v
            tl.store(o_ptrs, o.to(o_ptr.dtype.element_ty))

    if COMMIT:
        tl.store(s_ptrs, s.to(state_ptr.dtype.element_ty))


def _check_pool(conv_pool: torch.Tensor, who: str) -> None:
    if conv_pool.shape[-1] != 3 or conv_pool.stride(-1) != 1 or conv_pool.stride(-2) != 3:
        raise ValueError(f"{who}: the conv pool must be [.., slots, C, 3] with its last two dims contiguous (got "
                         f"shape {tuple(conv_pool.shape)}, strides {conv_pool.stride()})")


def _views(y: torch.Tensor, hk: int, dk: int, hv: int, dv: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """q, k, v of post-conv rows ``y [.., n, C]`` (strided views, channels contiguous)."""
    kd = hk * dk
    return (y[..., :kd].unflatten(-1, (hk, dk)), y[..., kd:2 * kd].unflatten(-1, (hk, dk)),
            y[..., 2 * kd:].unflatten(-1, (hv, dv)))


def _launch_steps(launch: dict[str, Any], *, layers: int, batch: int, tokens: int, y: torch.Tensor,
                  a: torch.Tensor, b: torch.Tensor, a_log: torch.Tensor, dt_bias: torch.Tensor,
                  ssm_pool: torch.Tensor, slots: torch.Tensor, count: torch.Tensor, out: torch.Tensor,
                  commit: bool) -> None:
    """The GDN kernel over post-conv rows ``y [L, B·T, C]``, ``a, b [L, B·T, Hv]``, ``a_log, dt_bias [L, Hv]``,
    ``ssm_pool [L, slots, Hv, dk, dv]`` (layer strides may be 0 for one layer)."""
    hv, dk, dv = ssm_pool.shape[-3:]
    hk = (y.shape[-1] - hv * dv) // (2 * dk)
    meta = dict(launch["meta"])
    num_stages = int(meta.pop("num_stages", 1))
    dims = {"layers": layers, "batch": batch, "block_tokens": tokens, "k_heads": hk, "v_heads": hv, "k_dim": dk,
            "v_dim": dv}
    grid = tuple(grid_size(launch["grid"], {**dims, **meta}))
    q, k, v = _views(y, hk, dk, hv, dv)
    if ssm_pool.stride(-1) != 1 or ssm_pool.stride(-2) != dv or ssm_pool.stride(-3) != dk * dv \
            or ssm_pool.stride(-4) != hv * dk * dv:
        raise ValueError(f"GDN replay: the state pool must be [.., slots, Hv, dk, dv] with its last four dims "
                         f"contiguous (got strides {ssm_pool.stride()})")
    _gdn_steps_kernel[grid](
        q, k, v, a, b, a_log, dt_bias, ssm_pool, slots, count, out, tokens, batch,
        y.stride(0), q.stride(1), q.stride(2), q.stride(3), k.stride(1), k.stride(2), k.stride(3),
        v.stride(1), v.stride(2), v.stride(3), a.stride(0), a.stride(1), a.stride(2), b.stride(1), b.stride(2),
        a_log.stride(0), ssm_pool.stride(0),
        HV=hv, HK=hk, DK=dk, DV=dv, BV=meta["BV"], PAD=PAD_SLOT, EPS=L2_EPS, SCALE=dk ** -0.5, COMMIT=int(commit),
        num_warps=int(launch["block"]) // 32, num_stages=num_stages,
    )


def _launch_conv(launch: dict[str, Any], *, layers: int, batch: int, tokens: int, x: torch.Tensor,
                 weight: torch.Tensor, conv_pool: torch.Tensor, slots: torch.Tensor, count: torch.Tensor,
                 y: torch.Tensor, commit: bool) -> None:
    """The conv kernel over pre-conv rows ``x [L, B·T, C]``, ``weight [L, C, 4]``, ``conv_pool [L, slots, C, 3]``;
    verify writes ``y [B·T, C]`` (contiguous rows), commit writes over ``x`` (``y`` is x)."""
    channels = x.shape[-1]
    meta = launch["meta"]
    grid = (layers * batch, triton.cdiv(channels, meta["BC"]))
    _conv_steps_kernel[grid](
        x, weight, conv_pool, slots, count, y, channels, tokens, batch,
        x.stride(0), x.stride(1), x.stride(2), weight.stride(0), weight.stride(1), weight.stride(2),
        conv_pool.stride(0), conv_pool.stride(1), y.stride(-2),
        BC=meta["BC"], PAD=PAD_SLOT, COMMIT=int(commit), num_warps=int(meta["CONV_WARPS"]), num_stages=1,
    )


def gdn_verify(launch: dict[str, Any], *, qkv: torch.Tensor, a: torch.Tensor, b: torch.Tensor,
               conv_weight: torch.Tensor, a_log: torch.Tensor, dt_bias: torch.Tensor, conv_pool: torch.Tensor,
               ssm_pool: torch.Tensor, slots: torch.Tensor, tokens: int, out: torch.Tensor | None = None,
               conv_out: torch.Tensor | None = None) -> torch.Tensor:
    """Host entry of the verify contracts: ``qkv [B·T, C]`` (channels contiguous), ``a, b [B·T, Hv]``,
    ``conv_weight [C, 4]``, ``a_log, dt_bias [Hv]``, ``conv_pool [slots, C, 3]``, ``ssm_pool [slots, Hv, dk, dv]``,
    ``slots [B]``, ``tokens`` = T; returns ``o [B·T, Hv, dv]`` in qkv's dtype (``out`` if given). The post-conv rows
    go to ``conv_out [B·T, C]`` (a scratch if not given). Reads the pools only; no host synchronisation."""
    bsz = slots.shape[0]
    hv, dv = ssm_pool.shape[1], ssm_pool.shape[3]
    _check_pool(conv_pool, "gdn_verify")
    if out is None:
        out = torch.empty((bsz * tokens, hv, dv), dtype=qkv.dtype, device=qkv.device)
    if conv_out is None:
        conv_out = torch.empty(qkv.shape, dtype=qkv.dtype, device=qkv.device)
    _launch_conv(launch, layers=1, batch=bsz, tokens=tokens, x=qkv.unsqueeze(0), weight=conv_weight.unsqueeze(0),
                 conv_pool=conv_pool.unsqueeze(0), slots=slots, count=slots, y=conv_out, commit=False)
    _launch_steps(launch, layers=1, batch=bsz, tokens=tokens, y=conv_out.unsqueeze(0), a=a.unsqueeze(0),
                  b=b.unsqueeze(0), a_log=a_log.unsqueeze(0), dt_bias=dt_bias.unsqueeze(0),
                  ssm_pool=ssm_pool.unsqueeze(0), slots=slots, count=slots, out=out, commit=False)
    return out


def gdn_commit(launch: dict[str, Any], *, qkv_stash: torch.Tensor, a_stash: torch.Tensor, b_stash: torch.Tensor,
               conv_weights: torch.Tensor, a_log: torch.Tensor, dt_bias: torch.Tensor, conv_pool: torch.Tensor,
               ssm_pool: torch.Tensor, slots: torch.Tensor, count: torch.Tensor, tokens: int) -> None:
    """Host entry of the commit contracts: ``qkv_stash [L, B·T, C]`` (channels contiguous; rows j < count[r] are
    overwritten with their post-conv values), ``a_stash, b_stash [L, B·T, Hv]``, ``conv_weights [L, C, 4]``,
    ``a_log, dt_bias [L, Hv]``, ``conv_pool [L, slots, C, 3]``, ``ssm_pool [L, slots, Hv, dk, dv]``, ``slots [B]``,
    ``count [B]`` (device); two launches for all layers (conv replay, then GDN replay). No host synchronisation."""
    n_layers, bsz = qkv_stash.shape[0], slots.shape[0]
    _check_pool(conv_pool, "gdn_commit")
    if a_log.stride(0) != dt_bias.stride(0) or a_stash.stride(0) != b_stash.stride(0):
        raise ValueError("gdn_commit: a_log / dt_bias and a_stash / b_stash must share their layer strides")
    _launch_conv(launch, layers=n_layers, batch=bsz, tokens=tokens, x=qkv_stash, weight=conv_weights,
                 conv_pool=conv_pool, slots=slots, count=count, y=qkv_stash, commit=True)
    _launch_steps(launch, layers=n_layers, batch=bsz, tokens=tokens, y=qkv_stash, a=a_stash, b=b_stash,
                  a_log=a_log, dt_bias=dt_bias, ssm_pool=ssm_pool, slots=slots, count=count, out=qkv_stash,
                  commit=True)
