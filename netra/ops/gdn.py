"""Gated DeltaNet core: gating, the delta-rule recurrence (oracle), its chunked form, the decode step.

Per value head, with matrix state ``S [dk, dv]`` (FP32 arithmetic; stored in the pool's dtype):

    S ← exp(g_t)·S;   u_t = β_t·(v_t − Sᵀk_t);   S ← S + k_t u_tᵀ;   o_t = Sᵀq_t

with q, k L2-normalised (eps 1e-6) and q scaled by dk^-1/2 (FLA's ``use_qk_l2norm_in_kernel``),
``g = −exp(A_log)·softplus(a + dt_bias)``, ``β = sigmoid(b)``. Key heads are shared by
``Hv / Hk`` consecutive value heads (value head h reads key head ``h // (Hv/Hk)``).

The chunked form (prefill) solves each chunk of C tokens at once. With G the in-chunk cumulative
log decay, Γ = exp(G) and D[t,s] = exp(G_t − G_s) (s ≤ t), the deltas satisfy the unit lower
triangular system ``(I + A) U = βV − (βΓ)⊙(K S₀)`` with ``A[t,s] = β_t D[t,s] (k_t·k_s)`` for s < t;
then ``O = (Γ⊙Q) S₀ + ((Q Kᵀ)⊙D) U`` and ``S_C = Γ_C S₀ + (K⊙exp(G_C − G))ᵀ U``.

Prefill on CUDA (no tactic selected) runs fla-core's ``chunk_gated_delta_rule`` (pinned in
requirements/gpu.txt) over the concatenated sequences at once (``cu_seqlens``), starting from and
writing back the pool's states; `gdn_prefill_fla`. ``NETRA_GDN_PREFILL=reference`` runs the PyTorch
reference instead. Against the reference (FP32): fla rounds the L2-normalised q/k to the input dtype
(BF16) and accumulates in FP32 tiles, so outputs and states agree to `FLA_TOLERANCE`, not bitwise
(tests/ops/test_gdn_fla_gpu.py). The CPU path is the reference.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from typing import Any

import torch

from netra import settings
from netra.ops import conv
from netra.ops._common import bind, device_ints, route
from netra.ops._triton import launch_tactic

log = logging.getLogger("netra.ops.gdn")

L2_EPS = 1e-6
# fla-core's chunked prefill against the FP32 reference (atol, rtol) on outputs and final states.
FLA_TOLERANCE = (2e-2, 2e-2)
# fla-core's chunk size in chunk_gated_delta_rule (its chunk indices: (sequence, chunk) of every 64-token chunk)
FLA_CHUNK = 64
PAD_SLOT = 0  # decode rows on this slot are bucket padding (netra/engine/cache.py never hands it out)


def gdn_gating_ref(a: torch.Tensor, b: torch.Tensor, a_log: torch.Tensor, dt_bias: torch.Tensor
                   ) -> tuple[torch.Tensor, torch.Tensor]:
    """``a, b [T, Hv]`` -> (log decay ``g`` FP32, ``beta`` FP32)."""
    g = -torch.exp(a_log.float()) * torch.nn.functional.softplus(a.float() + dt_bias.float())
    return g, torch.sigmoid(b.float())


def _prep(q: torch.Tensor, k: torch.Tensor, num_v_heads: int) -> tuple[torch.Tensor, torch.Tensor]:
    qf, kf = q.float(), k.float()
    qf = qf * torch.rsqrt(qf.pow(2).sum(-1, keepdim=True) + L2_EPS) * (q.shape[-1] ** -0.5)
    kf = kf * torch.rsqrt(kf.pow(2).sum(-1, keepdim=True) + L2_EPS)
    ratio = num_v_heads // q.shape[-2]
    if ratio > 1:  # value head h reads key head h // ratio (repeat_interleave, as a broadcast copy)
        lead, hk, d = qf.shape[:-2], qf.shape[-2], qf.shape[-1]
        qf = qf.unsqueeze(-2).expand(*lead, hk, ratio, d).reshape(*lead, hk * ratio, d)
        kf = kf.unsqueeze(-2).expand(*lead, hk, ratio, d).reshape(*lead, hk * ratio, d)
    return qf, kf


def gdn_recurrent_ref(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor,
                      state: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Token-by-token oracle. ``q, k [L, Hk, dk]``, ``v [L, Hv, dv]``, ``g, beta [L, Hv]``,
    ``state [Hv, dk, dv]`` -> (``o [L, Hv, dv]`` in v's dtype, final state FP32)."""
    qf, kf = _prep(q, k, v.shape[1])
    s = state.float().clone()
    outs = []
    for t in range(q.shape[0]):
        s = s * torch.exp(g[t].float())[:, None, None]
        kv = (s * kf[t][:, :, None]).sum(-2)
        delta = (v[t].float() - kv) * beta[t].float()[:, None]
        s = s + kf[t][:, :, None] * delta[:, None, :]
        outs.append((s * qf[t][:, :, None]).sum(-2))
    return torch.stack(outs).to(v.dtype), s


def gdn_chunked_ref(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor,
                    state: torch.Tensor, chunk: int = 64) -> tuple[torch.Tensor, torch.Tensor]:
    """Same contract as `gdn_recurrent_ref`, solved a chunk at a time (FP32)."""
    qf, kf = _prep(q, k, v.shape[1])
    qh, kh = qf.transpose(0, 1), kf.transpose(0, 1)  # [H, L, dk]
    vh = v.float().transpose(0, 1)  # [H, L, dv]
    gh, bh = g.float().t(), beta.float().t()  # [H, L]
    s = state.float().clone()
    outs = []
    for c0 in range(0, q.shape[0], chunk):
        qc, kc, vc = qh[:, c0:c0 + chunk], kh[:, c0:c0 + chunk], vh[:, c0:c0 + chunk]
        gc, bc = gh[:, c0:c0 + chunk], bh[:, c0:c0 + chunk]
        n = qc.shape[1]
        cum = gc.cumsum(-1)  # [H, n]
        gamma = torch.exp(cum)
        tri = torch.ones(n, n, dtype=torch.bool, device=q.device).tril()
        diff = (cum[:, :, None] - cum[:, None, :]).masked_fill(~tri, float("-inf"))
        decay = torch.exp(diff)  # [H, n, n], zero above the diagonal
        kk = kc @ kc.transpose(-1, -2)
        a = (bc[:, :, None] * decay * kk).tril(-1)
        eye = torch.eye(n, dtype=a.dtype, device=a.device)
        rhs = bc[:, :, None] * vc - (bc * gamma)[:, :, None] * (kc @ s)
        u = torch.linalg.solve_triangular(eye + a, rhs, upper=False, unitriangular=True)
        outs.append((gamma[:, :, None] * qc) @ s + ((qc @ kc.transpose(-1, -2)) * decay) @ u)
        tail = torch.exp(cum[:, -1:] - cum)  # [H, n]
        s = gamma[:, -1, None, None] * s + (kc * tail[:, :, None]).transpose(-1, -2) @ u
    o = torch.cat(outs, dim=1).transpose(0, 1)
    return o.to(v.dtype), s


def gdn_prefill_ref(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor,
                    state_pool: torch.Tensor, seq_slots: list[int], q_lens: list[int]) -> torch.Tensor:
    """Concatenated sequences; sequence i continues from ``state_pool[seq_slots[i]]`` and writes it back."""
    outs = []
    offset = 0
    for slot, n in zip(seq_slots, q_lens, strict=True):
        sl = slice(offset, offset + n)
        o, s = gdn_chunked_ref(q[sl], k[sl], v[sl], g[sl], beta[sl], state_pool[slot])
        state_pool[slot] = s.to(state_pool.dtype)
        outs.append(o)
        offset += n
    return torch.cat(outs, dim=0)


@functools.cache
def _fla_chunk() -> Callable[..., Any]:
    try:
        from fla.ops.gated_delta_rule import chunk_gated_delta_rule
    except ImportError as exc:
        raise RuntimeError("GDN prefill on CUDA runs fla-core's chunk_gated_delta_rule, which does not import "
                           f"here ({exc}): install requirements/gpu.txt (fla-core==0.6.0), or set "
                           "NETRA_GDN_PREFILL=reference for the PyTorch reference") from exc
    fn: Callable[..., Any] = chunk_gated_delta_rule
    return fn


def cuda_prefill_backend() -> str:
    """``fla`` or ``reference`` (``NETRA_GDN_PREFILL``) for the GDN prefill on CUDA; with fla, fla-core must
    import (the engine asks at start-up, so a missing one fails there, naming the fix)."""
    how = settings.get("NETRA_GDN_PREFILL")
    if how == "fla":
        _fla_chunk()
    elif how != "reference":
        raise settings.SettingError(f"NETRA_GDN_PREFILL={how!r}: expected fla or reference")
    return str(how)


@functools.lru_cache(maxsize=64)
def fla_chunk_indices(q_lens: tuple[int, ...], device: torch.device) -> torch.Tensor:
    """fla's ``chunk_indices`` ``[chunks, 2]`` int64: (sequence, chunk within it) of every FLA_CHUNK-token chunk;
    made once per chunk layout (every GDN layer of a forward asks for the same)."""
    flat = tuple(v for i, n in enumerate(q_lens) for j in range(-(-n // FLA_CHUNK)) for v in (i, j))
    return device_ints(flat, device).view(-1, 2)


def gdn_prefill_fla(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor,
                    state_pool: torch.Tensor, seq_slots: list[int], q_lens: list[int],
                    gate: tuple[torch.Tensor, torch.Tensor] | None = None) -> torch.Tensor:
    """`gdn_prefill_ref`'s contract through fla-core: every sequence in one varlen call (``cu_seqlens``),
    initial states gathered from the pool and final states scattered back (in the pool's dtype).

    ``gate = (a_log, dt_bias)``: ``g`` and ``beta`` are the raw projections ``a`` and ``b``, and fla computes
    `gdn_gating_ref`'s ``-exp(a_log) * softplus(a + dt_bias)`` inside its chunk cumsum and ``sigmoid(b)`` itself
    (its ``use_gate_in_kernel`` / ``use_beta_sigmoid_in_kernel``), in FP32."""
    offsets = [0]
    for n in q_lens:
        offsets.append(offsets[-1] + n)
    cu_cpu = torch.tensor(offsets, dtype=torch.int64)
    # Made once per chunk layout and shared by every layer, on the device asynchronously: fla would otherwise build
    # its chunk indices on the host and copy them from pageable memory, a stream synchronisation per GDN layer
    # (30 per prefill forward, which kept the host from running ahead of the device; scripts/gpu/prefill_profile.py).
    cu = device_ints(tuple(offsets), q.device)
    slots = device_ints(tuple(seq_slots), q.device)
    chunks = fla_chunk_indices(tuple(q_lens), q.device)
    h0 = state_pool.index_select(0, slots).float()
    fused = {} if gate is None else {"use_gate_in_kernel": True, "A_log": gate[0], "dt_bias": gate[1],
                                     "use_beta_sigmoid_in_kernel": True}
    if gate is None:
        g, beta = g.float(), beta.float()
    o, final = _fla_chunk()(q.unsqueeze(0).contiguous(), k.unsqueeze(0).contiguous(), v.unsqueeze(0).contiguous(),
                            g.unsqueeze(0).contiguous(), beta.unsqueeze(0).contiguous(),
                            scale=q.shape[-1] ** -0.5, initial_state=h0, output_final_state=True,
                            use_qk_l2norm_in_kernel=True, cu_seqlens=cu, cu_seqlens_cpu=cu_cpu,
                            chunk_indices=chunks, **fused)
    state_pool.index_copy_(0, slots, final.to(state_pool.dtype))
    out: torch.Tensor = o.squeeze(0).to(v.dtype)
    return out


def gdn_decode_ref(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor,
                   state_pool: torch.Tensor, slots: torch.Tensor) -> torch.Tensor:
    """One token per row: ``q, k [B, Hk, dk]``, ``v [B, Hv, dv]``; updates ``state_pool[slots]`` in place."""
    qf, kf = _prep(q, k, v.shape[1])
    s = state_pool.index_select(0, slots).float()  # [B, Hv, dk, dv]
    s = s * torch.exp(g.float())[:, :, None, None]
    kv = (s * kf[:, :, :, None]).sum(-2)
    delta = (v.float() - kv) * beta.float()[:, :, None]
    s = s + kf[:, :, :, None] * delta[:, :, None, :]
    o = (s * qf[:, :, :, None]).sum(-2)
    state_pool.index_copy_(0, slots, s.to(state_pool.dtype))
    return o.to(v.dtype)


def gdn_decode_fused_ref(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, a: torch.Tensor, b: torch.Tensor,
                         a_log: torch.Tensor, dt_bias: torch.Tensor, state_pool: torch.Tensor,
                         slots: torch.Tensor) -> torch.Tensor:
    """Gating + decode step in one op (the fused tactic's oracle): `gdn_gating_ref` then
    `gdn_decode_ref`, except that rows on ``PAD_SLOT`` output zeros and leave the pool as it was
    (graph-capturable: no data-dependent shapes; pad rows write back slot 0's own old value)."""
    g, beta = gdn_gating_ref(a, b, a_log, dt_bias)
    qf, kf = _prep(q, k, v.shape[1])
    old = state_pool.index_select(0, slots)
    s = old.float() * torch.exp(g)[:, :, None, None]
    kv = (s * kf[:, :, :, None]).sum(-2)
    delta = (v.float() - kv) * beta[:, :, None]
    s = s + kf[:, :, :, None] * delta[:, :, None, :]
    o = (s * qf[:, :, :, None]).sum(-2)
    pad = (slots == PAD_SLOT)
    state_pool.index_copy_(0, slots, torch.where(pad[:, None, None, None], old, s.to(state_pool.dtype)))
    return torch.where(pad[:, None, None], 0.0, o).to(v.dtype)


def gdn_gating(a: torch.Tensor, b: torch.Tensor, a_log: torch.Tensor, dt_bias: torch.Tensor
               ) -> tuple[torch.Tensor, torch.Tensor]:
    hit = route("gdn_gating", {"a": a, "b": b, "a_log": a_log}, {"tokens": a.shape[0], "v_heads": a.shape[1]})
    if hit is not None:
        out: tuple[torch.Tensor, torch.Tensor] = hit[0](hit[1], a=a, b=b, a_log=a_log, dt_bias=dt_bias)
        return out
    return gdn_gating_ref(a, b, a_log, dt_bias)


def _dims(q: torch.Tensor, v: torch.Tensor) -> dict[str, int]:
    return {"tokens": q.shape[0], "k_heads": q.shape[1], "v_heads": v.shape[1], "k_dim": q.shape[2],
            "v_dim": v.shape[2]}


def gdn_prefill(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor,
                state_pool: torch.Tensor, seq_slots: list[int], q_lens: list[int]) -> torch.Tensor:
    hit = route("gdn_prefill", {"q": q, "k": k, "v": v, "state": state_pool}, _dims(q, v))
    if hit is not None:
        return hit[0](hit[1], q=q, k=k, v=v, g=g, beta=beta, state_pool=state_pool, seq_slots=seq_slots,
                      q_lens=q_lens)
    if q.is_cuda and cuda_prefill_backend() == "fla":
        return gdn_prefill_fla(q, k, v, g, beta, state_pool, seq_slots, q_lens)
    return gdn_prefill_ref(q, k, v, g, beta, state_pool, seq_slots, q_lens)


def gdn_prefill_gated(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, a: torch.Tensor, b: torch.Tensor,
                      a_log: torch.Tensor, dt_bias: torch.Tensor, state_pool: torch.Tensor, seq_slots: list[int],
                      q_lens: list[int]) -> torch.Tensor:
    """`gdn_gating` then `gdn_prefill` in one call, from the raw projections ``a, b [T, Hv]``. Where the prefill
    runs through fla-core (CUDA, no prefill contract), the gating runs inside fla's kernels (`gdn_prefill_fla`'s
    ``gate``): about ten elementwise launches fewer per GDN layer of a prefill forward than the gating op's
    reference (300 per forward of the 30 GDN layers)."""
    if q.is_cuda and route("gdn_prefill", {"q": q, "k": k, "v": v, "state": state_pool}, _dims(q, v)) is None \
            and cuda_prefill_backend() == "fla":
        return gdn_prefill_fla(q, k, v, a, b, state_pool, seq_slots, q_lens, gate=(a_log, dt_bias))
    g, beta = gdn_gating(a, b, a_log, dt_bias)
    return gdn_prefill(q, k, v, g, beta, state_pool, seq_slots, q_lens)


def gdn_decode(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor,
               state_pool: torch.Tensor, slots: torch.Tensor) -> torch.Tensor:
    hit = route("gdn_decode", {"q": q, "k": k, "v": v, "state": state_pool, "slots": slots}, _dims(q, v))
    if hit is not None:
        return hit[0](hit[1], q=q, k=k, v=v, g=g, beta=beta, state_pool=state_pool, slots=slots)
    return gdn_decode_ref(q, k, v, g, beta, state_pool, slots)


def gdn_decode_fused(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, a: torch.Tensor, b: torch.Tensor,
                     a_log: torch.Tensor, dt_bias: torch.Tensor, state_pool: torch.Tensor,
                     slots: torch.Tensor) -> torch.Tensor:
    """One decode step of every GDN head: gating from ``a, b`` + L2-normalised q/k + delta rule on
    ``state_pool[slots]`` in place + output ``[B, Hv, dv]`` (in v's dtype). ``q, k [B, Hk, dk]`` and
    ``v [B, Hv, dv]`` may be strided views of the convolution output; pad rows (slot 0) give zeros."""
    hit = route("gdn_decode_fused", {"q": q, "k": k, "v": v, "a": a, "b": b, "a_log": a_log, "dt_bias": dt_bias,
                                     "state": state_pool, "slots": slots},
                {"batch": q.shape[0], "k_heads": q.shape[1], "v_heads": v.shape[1], "k_dim": q.shape[2],
                 "v_dim": v.shape[2]})
    if hit is not None:
        return hit[0](hit[1], q=q, k=k, v=v, a=a, b=b, a_log=a_log, dt_bias=dt_bias, state_pool=state_pool,
                      slots=slots)
    return gdn_decode_fused_ref(q, k, v, a, b, a_log, dt_bias, state_pool, slots)


# ---- speculative decoding: verify a block of T tokens per request without writing state, then commit the accepted
# prefix by replaying it through the decode token step (docs/kernels.md, "GDN verify and commit").

ConvStep = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]
GDNStep = Callable[..., torch.Tensor]


def gdn_split_heads(qkv_dim: int, v_heads: int, k_dim: int, v_dim: int) -> int:
    """The key head count of a conv row of ``qkv_dim = 2·Hk·dk + Hv·dv`` channels (q | k | v)."""
    hk, rem = divmod(qkv_dim - v_heads * v_dim, 2 * k_dim)
    if rem or hk <= 0 or v_heads % hk:
        raise ValueError(f"conv rows of {qkv_dim} channels do not split into q | k | v with {v_heads} value heads "
                         f"of {v_dim} and key heads of {k_dim} (2·Hk·dk + Hv·dv, Hv a multiple of Hk)")
    return hk


def _qkv_views(y: torch.Tensor, hk: int, dk: int, hv: int, dv: int
               ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """q, k, v of conv output rows ``y [n, C]``, as the engine's decode step makes them (strided views)."""
    n, kd = y.shape[0], hk * dk
    return y[:, :kd].reshape(n, hk, dk), y[:, kd:2 * kd].reshape(n, hk, dk), y[:, 2 * kd:].reshape(n, hv, dv)


def gdn_verify_ref(qkv: torch.Tensor, a: torch.Tensor, b: torch.Tensor, conv_weight: torch.Tensor,
                   a_log: torch.Tensor, dt_bias: torch.Tensor, conv_pool: torch.Tensor, ssm_pool: torch.Tensor,
                   slots: torch.Tensor, tokens: int, *, conv_step: ConvStep | None = None,
                   gdn_step: GDNStep | None = None) -> torch.Tensor:
    """`gdn_verify` as ``tokens`` decode steps (``conv_step`` then ``gdn_step``, by default the dispatching decode
    ops `netra.ops.conv.causal_conv1d_update` and `gdn_decode_fused`) on a copy of the slots' conv windows and
    states: request r is row r + 1 of the copy (a pad row stays on the copy's pad row 0), so no real row lands on
    the pad index and the real pools are only read. Bitwise T decode steps by construction, whatever the decode
    ops dispatch to."""
    conv_step = conv.causal_conv1d_update if conv_step is None else conv_step
    gdn_step = gdn_decode_fused if gdn_step is None else gdn_step
    bsz = slots.shape[0]
    hv, dk, dv = ssm_pool.shape[1:]
    hk = gdn_split_heads(qkv.shape[1], hv, dk, dv)
    if qkv.shape[0] != bsz * tokens:
        raise ValueError(f"gdn_verify: {qkv.shape[0]} qkv rows, expected batch {bsz} x {tokens} tokens")
    live = slots != PAD_SLOT
    rows = torch.where(live, torch.arange(1, bsz + 1, device=slots.device), PAD_SLOT)
    conv_tmp = torch.zeros((bsz + 1, *conv_pool.shape[1:]), dtype=conv_pool.dtype, device=conv_pool.device)
    ssm_tmp = torch.zeros((bsz + 1, *ssm_pool.shape[1:]), dtype=ssm_pool.dtype, device=ssm_pool.device)
    conv_tmp[1:] = conv_pool.index_select(0, slots)
    ssm_tmp[1:] = ssm_pool.index_select(0, slots)
    xs, as_, bs_ = qkv.unflatten(0, (bsz, tokens)), a.unflatten(0, (bsz, tokens)), b.unflatten(0, (bsz, tokens))
    outs = []
    for j in range(tokens):
        q, k, v = _qkv_views(conv_step(xs[:, j], conv_weight, conv_tmp, rows), hk, dk, hv, dv)
        outs.append(gdn_step(q, k, v, as_[:, j], bs_[:, j], a_log, dt_bias, ssm_tmp, rows))
    return torch.stack(outs, dim=1).flatten(0, 1)


def gdn_commit_ref(qkv_stash: torch.Tensor, a_stash: torch.Tensor, b_stash: torch.Tensor,
                   conv_weights: torch.Tensor, a_log: torch.Tensor, dt_bias: torch.Tensor, conv_pool: torch.Tensor,
                   ssm_pool: torch.Tensor, slots: torch.Tensor, count: torch.Tensor, tokens: int, *,
                   conv_step: ConvStep | None = None, gdn_step: GDNStep | None = None) -> None:
    """`gdn_commit` as decode steps: for every layer and j < tokens, ``conv_step`` then ``gdn_step`` (by default the
    dispatching decode ops) on the real pools, with the rows of requests whose ``count <= j`` redirected to the pad
    slot (they touch nothing). No host read of ``count``."""
    conv_step = conv.causal_conv1d_update if conv_step is None else conv_step
    gdn_step = gdn_decode_fused if gdn_step is None else gdn_step
    n_layers, bsz = qkv_stash.shape[0], slots.shape[0]
    hv, dk, dv = ssm_pool.shape[2:]
    hk = gdn_split_heads(qkv_stash.shape[2], hv, dk, dv)
    if qkv_stash.shape[1] != bsz * tokens:
        raise ValueError(f"gdn_commit: {qkv_stash.shape[1]} stashed rows, expected batch {bsz} x {tokens} tokens")
    step_slots = [torch.where(count > j, slots, PAD_SLOT) for j in range(tokens)]
    for li in range(n_layers):
        xs = qkv_stash[li].unflatten(0, (bsz, tokens))
        as_, bs_ = a_stash[li].unflatten(0, (bsz, tokens)), b_stash[li].unflatten(0, (bsz, tokens))
        for j in range(tokens):
            y = conv_step(xs[:, j], conv_weights[li], conv_pool[li], step_slots[j])
            q, k, v = _qkv_views(y, hk, dk, hv, dv)
            gdn_step(q, k, v, as_[:, j], bs_[:, j], a_log[li], dt_bias[li], ssm_pool[li], step_slots[j])


CONV_UPDATE_SOURCE = "kernels/sm90/conv/conv1d_update.py"
GDN_DECODE_SOURCE = "kernels/sm90/gdn/gdn_decode.py"
_pairing: dict[tuple[Any, ...], str | None] = {}
_pairing_logged: set[tuple[str, str]] = set()


def pairing_problem(fused: Any, conv_decode: Any, gdn_decode: Any) -> str | None:
    """Why the verify/commit contract ``fused`` is not bitwise the decode step whose conv and GDN tactics are the
    contracts ``conv_decode`` and ``gdn_decode`` (None: a reference fallback), or None when it is: the Triton conv
    update (per-channel arithmetic, whatever its channel block) and the one-pass GDN decode tile with the fused
    contract's BV and thread count (the reductions' layouts follow the tile and the warps)."""
    if conv_decode is None:
        return "the decode conv step runs its reference here"
    if conv_decode.kernel["source"] != CONV_UPDATE_SOURCE:
        return f"the decode conv step is {conv_decode.name}, not the Triton conv update"
    if gdn_decode is None:
        return "the GDN decode step runs its reference here"
    meta, mine = gdn_decode.launch.get("meta", {}), fused.launch["meta"]
    if gdn_decode.kernel["source"] != GDN_DECODE_SOURCE or meta.get("BK", 0) or meta.get("RELOAD", 0):
        return f"the GDN decode step is {gdn_decode.name}, not the one-pass Triton tile"
    if (meta.get("BV"), gdn_decode.launch["block"]) != (mine["BV"], fused.launch["block"]):
        return (f"the GDN decode step is {gdn_decode.name} (BV {meta.get('BV')}, {gdn_decode.launch['block']} "
                f"threads), not this contract's tile (BV {mine['BV']}, {fused.launch['block']} threads)")
    return None


def _decode_pairing(fused: Any, x_row: torch.Tensor, conv_weight: torch.Tensor, conv_state: torch.Tensor,
                    a_row: torch.Tensor, b_row: torch.Tensor, a_log: torch.Tensor, dt_bias: torch.Tensor,
                    ssm_state: torch.Tensor, slots: torch.Tensor) -> str | None:
    """`pairing_problem` of the verify/commit tactic ``fused`` (a decision) and the decode tactics dispatch picks for
    the decode steps the reference would take at this call (cached per shape and dtypes). The fused kernels repeat
    the decode tactics' arithmetic (the conv tactic's per-channel sum, the GDN tactic's one-pass [dk, BV] tile, its
    reductions in its layout), so they stand in for the decode ops only where dispatch sends those to exactly these
    tactics. Elsewhere (a decode op on its PyTorch reference, another tile) the op runs its reference: the decode
    ops looped, bitwise by construction."""
    contract = fused.contract
    hv, dk, dv = ssm_state.shape[1:]
    key = (contract.name, x_row.dtype, conv_weight.dtype, conv_state.dtype, a_row.dtype, b_row.dtype,
           a_log.dtype, dt_bias.dtype, ssm_state.dtype, x_row.device, tuple(x_row.shape), hv, dk, dv)
    if key in _pairing:
        return _pairing[key]
    bsz = x_row.shape[0]
    hk = gdn_split_heads(x_row.shape[1], hv, dk, dv)
    conv_hit = route("causal_conv1d_update", {"x": x_row, "w": conv_weight, "state": conv_state, "slots": slots},
                     {"batch": bsz, "channels": x_row.shape[1], "width": conv_weight.shape[1]})
    y = torch.empty(x_row.shape, dtype=x_row.dtype, device=x_row.device)
    q, k, v = _qkv_views(y, hk, dk, hv, dv)
    gdn_hit = route("gdn_decode_fused", {"q": q, "k": k, "v": v, "a": a_row, "b": b_row, "a_log": a_log,
                                         "dt_bias": dt_bias, "state": ssm_state, "slots": slots},
                    {"batch": bsz, "k_heads": hk, "v_heads": hv, "k_dim": dk, "v_dim": dv})
    why = pairing_problem(contract, None if conv_hit is None else conv_hit[1].contract,
                          None if gdn_hit is None else gdn_hit[1].contract)
    _pairing[key] = why
    if why is not None and (contract.name, why) not in _pairing_logged:
        _pairing_logged.add((contract.name, why))
        log.info("netra %s: fallback to the decode-step reference (%s is bitwise only against its decode "
                 "tactics: %s)", contract.op, contract.name, why)
    return why


def _replay_dims(bsz: int, tokens: int, hk: int, hv: int, dk: int, dv: int, channels: int, width: int
                 ) -> dict[str, int]:
    return {"batch": bsz, "block_tokens": tokens, "k_heads": hk, "v_heads": hv, "k_dim": dk, "v_dim": dv,
            "channels": channels, "width": width}


def gdn_verify(qkv: torch.Tensor, a: torch.Tensor, b: torch.Tensor, conv_weight: torch.Tensor, a_log: torch.Tensor,
               dt_bias: torch.Tensor, conv_pool: torch.Tensor, ssm_pool: torch.Tensor, slots: torch.Tensor,
               tokens: int) -> torch.Tensor:
    """The GDN outputs of a speculative block, writing no state.

    ``qkv [B·T, C]`` (pre-conv rows, in_proj output; rows grouped per request: row ``r·T + j`` is token j of request
    r), ``a, b [B·T, Hv]`` (raw projections), ``conv_weight [C, K]``, ``a_log, dt_bias [Hv]``, ``conv_pool [slots,
    C, K-1]``, ``ssm_pool [slots, Hv, dk, dv]`` (fp32 or bf16), ``slots [B]`` int64, ``tokens`` = T (host int);
    ``C = 2·Hk·dk + Hv·dv`` (q | k | v). Returns ``o [B·T, Hv, dv]`` in qkv's dtype: the outputs of T sequential
    decode steps (conv update + `gdn_decode_fused`) from each slot's committed conv window and state; both pools
    are only read. Pad rows (slot 0) give zeros. Tactic: contracts ``gdn_verify_*`` (kernels/sm90/gdn/
    gdn_replay.py), used only where bitwise the decode steps (`_decode_pairing`); fallback `gdn_verify_ref`."""
    bsz = slots.shape[0]
    hv, dk, dv = ssm_pool.shape[1:]
    hk = gdn_split_heads(qkv.shape[1], hv, dk, dv)
    hit = route("gdn_verify", {"qkv": qkv, "a": a, "b": b, "w": conv_weight, "a_log": a_log, "dt_bias": dt_bias,
                               "conv_state": conv_pool, "state": ssm_pool, "slots": slots},
                _replay_dims(bsz, tokens, hk, hv, dk, dv, qkv.shape[1], conv_weight.shape[1]))
    if hit is not None and _decode_pairing(hit[1], qkv.unflatten(0, (bsz, tokens))[:, 0], conv_weight, conv_pool,
                                           a[::tokens], b[::tokens], a_log, dt_bias, ssm_pool, slots) is None:
        out: torch.Tensor = hit[0](hit[1], qkv=qkv, a=a, b=b, conv_weight=conv_weight, a_log=a_log,
                                   dt_bias=dt_bias, conv_pool=conv_pool, ssm_pool=ssm_pool, slots=slots,
                                   tokens=tokens)
        return out
    return gdn_verify_ref(qkv, a, b, conv_weight, a_log, dt_bias, conv_pool, ssm_pool, slots, tokens)


def gdn_commit(qkv_stash: torch.Tensor, a_stash: torch.Tensor, b_stash: torch.Tensor, conv_weights: torch.Tensor,
               a_log: torch.Tensor, dt_bias: torch.Tensor, conv_pool: torch.Tensor, ssm_pool: torch.Tensor,
               slots: torch.Tensor, count: torch.Tensor, tokens: int) -> None:
    """Commit the accepted prefix of a verified block in every GDN layer: replays tokens ``0..count[r]-1`` of
    request r through the decode token step (conv update, then `gdn_decode_fused`) on the real pools, so the
    committed conv windows and states are bitwise ``count[r]`` decode steps.

    ``qkv_stash [L, B·T, C]``, ``a_stash, b_stash [L, B·T, Hv]`` (`gdn_verify`'s inputs of each layer, stacked),
    ``conv_weights [L, C, K]``, ``a_log, dt_bias [L, Hv]``, ``conv_pool [L, slots, C, K-1]``, ``ssm_pool [L, slots,
    Hv, dk, dv]`` (the engine's whole pools), ``slots [B]`` int64, ``count [B]`` int32/int64 on the device (0..T;
    0 and pad rows commit nothing), ``tokens`` = T. No host read of ``count``: graph-capturable. The stash is
    consumed: the Triton tactic overwrites rows ``j < count[r]`` of ``qkv_stash`` with their post-conv values (the
    reference leaves it). Tactic: contracts ``gdn_commit_*`` (kernels/sm90/gdn/gdn_replay.py), used only where
    bitwise the decode steps (`_decode_pairing`); fallback `gdn_commit_ref`."""
    n_layers, bsz = qkv_stash.shape[0], slots.shape[0]
    hv, dk, dv = ssm_pool.shape[2:]
    hk = gdn_split_heads(qkv_stash.shape[2], hv, dk, dv)
    dims = _replay_dims(bsz, tokens, hk, hv, dk, dv, qkv_stash.shape[2], conv_weights.shape[2])
    hit = route("gdn_commit", {"qkv": qkv_stash, "a": a_stash, "b": b_stash, "w": conv_weights, "a_log": a_log,
                               "dt_bias": dt_bias, "conv_state": conv_pool, "state": ssm_pool, "slots": slots,
                               "count": count}, {"layers": n_layers, **dims})
    if hit is not None and _decode_pairing(hit[1], qkv_stash[0].unflatten(0, (bsz, tokens))[:, 0], conv_weights[0],
                                           conv_pool[0], a_stash[0, ::tokens], b_stash[0, ::tokens], a_log[0],
                                           dt_bias[0], ssm_pool[0], slots) is None:
        hit[0](hit[1], qkv_stash=qkv_stash, a_stash=a_stash, b_stash=b_stash, conv_weights=conv_weights,
               a_log=a_log, dt_bias=dt_bias, conv_pool=conv_pool, ssm_pool=ssm_pool, slots=slots, count=count,
               tokens=tokens)
        return
    gdn_commit_ref(qkv_stash, a_stash, b_stash, conv_weights, a_log, dt_bias, conv_pool, ssm_pool, slots, count,
                   tokens)


bind("gdn_decode_fused", launch_tactic)
bind("gdn_verify", launch_tactic)
bind("gdn_commit", launch_tactic)
