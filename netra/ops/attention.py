"""Grouped-query attention over a per-request-slot KV cache (FP8 E4M3 or BF16), causal.

Cache layout: ``k_cache, v_cache [slots, max_context, kv_heads, head_dim]``; token t of the request
in slot s lives at ``[s, t]``. FP8 stores ``k / k_scale`` saturated to ±448 (SGLang's
``fp8_e4m3`` cache; the scales are 1.0 unless a checkpoint provides them); attention dequantizes
``q8 · scale`` exactly into the accumulator. Query head h reads KV head ``h // (Hq / Hkv)``.

References: `attention_prefill_ref` (a list of sequences, each a chunk appended to its cached
prefix) and `attention_decode_ref` (one query per sequence, batched and masked by length). Both
accumulate in `acc_dtype` and round the output once to the query dtype.

Decode on sm90 (kernels/sm90/attention/, Triton; contracts ``attention_decode_fp8_*``,
``qk_norm_rope_store_fp8``): `qk_norm_rope_store` is the prologue in one kernel (q/k Gemma RMSNorm,
partial RoPE, K/V into the E4M3 cache; reference `qk_norm_rope_store_ref`, the composition of
`rmsnorm_ref`, `rope_ref` and `kv_store_ref`), and `attention_decode` with ``gate=`` is the
split-sequence decode with the output gate in its epilogue (op ``attention_decode_gated``;
reference `attention_decode_gated_ref`). Their fallbacks run today's chain of ops.
"""

from __future__ import annotations

from typing import Any

import torch

from netra import dispatch, settings
from netra.ops import fp8, norm, rope
from netra.ops._common import acc_dtype, bind, route
from netra.ops._triton import launch_tactic


def kv_store_ref(k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                 token_slots: torch.Tensor, positions: torch.Tensor, k_scale: float = 1.0,
                 v_scale: float = 1.0) -> None:
    """Write ``k, v [T, Hkv, D]`` at ``cache[token_slots[t], positions[t]]``."""
    if k_cache.dtype == fp8.E4M3:
        kq = (k.float() / k_scale).clamp(-fp8.E4M3_MAX, fp8.E4M3_MAX).to(fp8.E4M3)
        vq = (v.float() / v_scale).clamp(-fp8.E4M3_MAX, fp8.E4M3_MAX).to(fp8.E4M3)
    else:
        kq, vq = k.to(k_cache.dtype), v.to(v_cache.dtype)
    k_cache[token_slots, positions] = kq
    v_cache[token_slots, positions] = vq


def _load(cache: torch.Tensor, scale: float, dtype: torch.dtype) -> torch.Tensor:
    out = cache.to(dtype)
    return out * scale if scale != 1.0 else out


def _attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor, sm_scale: float
            ) -> torch.Tensor:
    """``q [B, Lq, Hq, D]``, ``k, v [B, Lk, Hkv, D]`` (accumulator dtype), ``mask [B, Lq, Lk]`` True=keep."""
    b, lq, hq, d = q.shape
    hkv = k.shape[2]
    qg = q.reshape(b, lq, hkv, hq // hkv, d)
    scores = torch.einsum("bqhgd,bkhd->bhgqk", qg, k) * sm_scale
    scores = scores.masked_fill(~mask[:, None, None], float("-inf"))
    probs = torch.softmax(scores, dim=-1)
    out = torch.einsum("bhgqk,bkhd->bqhgd", probs, v)
    return out.reshape(b, lq, hq, d)


def attention_prefill_ref(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                          seq_slots: list[int], seq_starts: list[int], q_lens: list[int], sm_scale: float,
                          k_scale: float = 1.0, v_scale: float = 1.0) -> torch.Tensor:
    """``q [T, Hq, D]`` (sequences concatenated); sequence i's queries sit at positions
    ``seq_starts[i] .. seq_starts[i]+q_lens[i]-1`` and see the cache up to their own position."""
    acc = acc_dtype(q.device)
    outs = []
    offset = 0
    for slot, start, n in zip(seq_slots, seq_starts, q_lens, strict=True):
        total = start + n
        qs = q[offset:offset + n].to(acc)[None]
        ks = _load(k_cache[slot, :total], k_scale, acc)[None]
        vs = _load(v_cache[slot, :total], v_scale, acc)[None]
        qpos = torch.arange(start, total, device=q.device)
        kpos = torch.arange(total, device=q.device)
        mask = (kpos[None, :] <= qpos[:, None])[None]
        outs.append(_attend(qs, ks, vs, mask, sm_scale)[0])
        offset += n
    return torch.cat(outs, dim=0).to(q.dtype)


def attention_prefill_sdpa(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                           seq_slots: list[int], seq_starts: list[int], q_lens: list[int], sm_scale: float,
                           k_scale: float = 1.0, v_scale: float = 1.0) -> torch.Tensor:
    """`attention_prefill_ref`'s contract through PyTorch's fused ``scaled_dot_product_attention`` (on CUDA its
    FlashAttention backend: no chunk x prefix score matrix, so a long prompt's chunk does not need
    ``Hq x n x total`` FP32 scores). Per run of consecutive sequences of one shape (the same cached prefix and
    chunk length: a chunk of fresh prompts of one length is one run, one SDPA call instead of one per sequence):
    q in its own dtype (BF16), the cached prefixes and the chunks' own K/V (already stored) gathered from their
    slots, dequantized exactly to q's dtype and repeated to the query heads, a causal mask aligned to the bottom
    right (query i, at position ``start + i``, sees keys ``0 .. start + i``). Numerics: BF16 operands, FP32
    accumulation inside the kernel, one rounding of the output; the declared tolerance against the FP32 reference
    is rel-L2 <= 1e-2 (tests/ops/test_attention_prefill_sdpa.py)."""
    from torch.nn.attention.bias import causal_lower_right

    from netra.ops._common import device_ints

    hq, hkv, d = q.shape[1], k_cache.shape[2], q.shape[2]
    outs = []
    offset = i = 0
    while i < len(q_lens):
        start, n = seq_starts[i], q_lens[i]
        j = i + 1
        while j < len(q_lens) and (seq_starts[j], q_lens[j]) == (start, n):
            j += 1
        total, group = start + n, j - i
        qs = q[offset:offset + group * n].reshape(group, n, hq, d).transpose(1, 2)  # [G, Hq, n, D]
        if group == 1:
            kv = (k_cache[seq_slots[i], :total][None], v_cache[seq_slots[i], :total][None])
        else:
            idx = device_ints(tuple(seq_slots[i:j]), q.device)
            kv = (k_cache[idx, :total], v_cache[idx, :total])
        ks, vs = (_load(c, sc, q.dtype).repeat_interleave(hq // hkv, dim=2).transpose(1, 2)
                  for c, sc in zip(kv, (k_scale, v_scale), strict=True))
        o = torch.nn.functional.scaled_dot_product_attention(qs, ks, vs, attn_mask=causal_lower_right(n, total),
                                                             scale=sm_scale)
        outs.append(o.transpose(1, 2).reshape(group * n, hq, d))
        offset += group * n
        i = j
    return (outs[0] if len(outs) == 1 else torch.cat(outs, dim=0)).to(q.dtype)


def prefill_backend() -> str:
    """``sdpa`` or ``reference`` (``NETRA_ATTN_PREFILL``): the attention prefill on CUDA where no contract serves it."""
    how = str(settings.get("NETRA_ATTN_PREFILL"))
    if how not in ("sdpa", "reference"):
        raise settings.SettingError(f"NETRA_ATTN_PREFILL={how!r}: expected sdpa or reference")
    return how


def attention_decode_ref(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                         slots: torch.Tensor, seq_lens: torch.Tensor, max_len: int, sm_scale: float,
                         k_scale: float = 1.0, v_scale: float = 1.0) -> torch.Tensor:
    """``q [B, Hq, D]``: each row attends to ``cache[slots[b], :seq_lens[b]]`` (its own token included)."""
    acc = acc_dtype(q.device)
    ks = _load(k_cache[slots, :max_len], k_scale, acc)
    vs = _load(v_cache[slots, :max_len], v_scale, acc)
    mask = (torch.arange(max_len, device=q.device)[None, :] < seq_lens[:, None])[:, None, :]
    return _attend(q.to(acc)[:, None], ks, vs, mask, sm_scale)[:, 0].to(q.dtype)


def output_gate_ref(o: torch.Tensor, gate: torch.Tensor) -> torch.Tensor:
    """Gated attention output: ``o · sigmoid(gate)`` in FP32, rounded to o's dtype (``[T, Hq, D]`` both)."""
    return (o.float() * torch.sigmoid(gate.float())).to(o.dtype)


def attention_decode_gated_ref(q: torch.Tensor, gate: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                               slots: torch.Tensor, seq_lens: torch.Tensor, max_len: int, sm_scale: float,
                               k_scale: float = 1.0, v_scale: float = 1.0) -> torch.Tensor:
    """`attention_decode_ref` then `output_gate_ref` (the output is rounded before the gate, as unfused)."""
    o = attention_decode_ref(q, k_cache, v_cache, slots, seq_lens, max_len, sm_scale, k_scale, v_scale)
    return output_gate_ref(o, gate)


def qk_norm_rope_store_ref(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, q_weight: torch.Tensor,
                           k_weight: torch.Tensor, eps: float, positions: torch.Tensor, rope_table: torch.Tensor,
                           rotary_dim: int, k_cache: torch.Tensor, v_cache: torch.Tensor,
                           token_slots: torch.Tensor, k_scale: float = 1.0, v_scale: float = 1.0) -> torch.Tensor:
    """The attention prologue: q/k Gemma RMSNorm, partial RoPE at ``positions``, k/v stored in the cache at
    ``[token_slots, positions]``; returns the normalised, rotated q ``[T, Hq, D]``."""
    qr, kr = rope.rope_ref(norm.rmsnorm_ref(q, q_weight, eps), norm.rmsnorm_ref(k, k_weight, eps), positions,
                           rope_table, rotary_dim)
    kv_store_ref(kr, v, k_cache, v_cache, token_slots, positions, k_scale, v_scale)
    return qr


for _op in ("attention_decode", "attention_decode_gated", "qk_norm_rope_store"):
    bind(_op, launch_tactic)


def output_gate(o: torch.Tensor, gate: torch.Tensor) -> torch.Tensor:
    hit = route("attention_output_gate", {"o": o, "gate": gate}, {"tokens": o.shape[0], "width": o[0].numel()})
    if hit is not None:
        return hit[0](hit[1], o=o, gate=gate)
    return output_gate_ref(o, gate)


def kv_store(k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
             token_slots: torch.Tensor, positions: torch.Tensor, k_scale: float = 1.0,
             v_scale: float = 1.0) -> None:
    hit = route("kv_store", {"k": k, "v": v, "k_cache": k_cache, "slots": token_slots},
                {"tokens": k.shape[0], "kv_heads": k.shape[1], "head_dim": k.shape[2]})
    if hit is not None:
        hit[0](hit[1], k=k, v=v, k_cache=k_cache, v_cache=v_cache, token_slots=token_slots,
               positions=positions, k_scale=k_scale, v_scale=v_scale)
        return
    kv_store_ref(k, v, k_cache, v_cache, token_slots, positions, k_scale, v_scale)


def attention_prefill(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, seq_slots: list[int],
                      seq_starts: list[int], q_lens: list[int], sm_scale: float, k_scale: float = 1.0,
                      v_scale: float = 1.0) -> torch.Tensor:
    hit = route("attention_prefill", {"q": q, "k_cache": k_cache},
                {"tokens": q.shape[0], "q_heads": q.shape[1], "kv_heads": k_cache.shape[2],
                 "head_dim": q.shape[2]})
    if hit is not None:
        return hit[0](hit[1], q=q, k_cache=k_cache, v_cache=v_cache, seq_slots=seq_slots,
                      seq_starts=seq_starts, q_lens=q_lens, sm_scale=sm_scale, k_scale=k_scale,
                      v_scale=v_scale)
    if q.is_cuda and prefill_backend() == "sdpa":
        return attention_prefill_sdpa(q, k_cache, v_cache, seq_slots, seq_starts, q_lens, sm_scale, k_scale, v_scale)
    return attention_prefill_ref(q, k_cache, v_cache, seq_slots, seq_starts, q_lens, sm_scale, k_scale,
                                 v_scale)


def qk_norm_rope_store(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, q_weight: torch.Tensor,
                       k_weight: torch.Tensor, eps: float, positions: torch.Tensor, rope_table: torch.Tensor,
                       rotary_dim: int, k_cache: torch.Tensor, v_cache: torch.Tensor, token_slots: torch.Tensor,
                       k_scale: float = 1.0, v_scale: float = 1.0) -> torch.Tensor:
    """``q [T, Hq, D]``, ``k, v [T, Hkv, D]`` (views with a unit last stride) -> the normalised, rotated q;
    K/V land in the cache. Fallback: `norm.rmsnorm` twice, `rope.rope`, `kv_store` (each through dispatch)."""
    hit = route("qk_norm_rope_store",
                {"q": q, "k": k, "v": v, "q_weight": q_weight, "k_weight": k_weight, "positions": positions,
                 "rope_table": rope_table, "k_cache": k_cache, "v_cache": v_cache, "token_slots": token_slots},
                {"tokens": q.shape[0], "q_heads": q.shape[1], "kv_heads": k.shape[1], "head_dim": q.shape[2],
                 "rotary_dim": rotary_dim})
    if hit is not None:
        out: torch.Tensor = hit[0](hit[1], q=q, k=k, v=v, q_weight=q_weight, k_weight=k_weight, eps=eps,
                                   positions=positions, rope_table=rope_table, rotary_dim=rotary_dim,
                                   k_cache=k_cache, v_cache=v_cache, token_slots=token_slots, k_scale=k_scale,
                                   v_scale=v_scale)
        return out
    qr, kr = rope.rope(norm.rmsnorm(q, q_weight, eps), norm.rmsnorm(k, k_weight, eps), positions, rope_table,
                       rotary_dim)
    kv_store(kr, v, k_cache, v_cache, token_slots, positions, k_scale, v_scale)
    return qr


def decode_route(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, slots: torch.Tensor,
                 seq_lens: torch.Tensor, gate: torch.Tensor | None = None) -> tuple[Any, dispatch.Decision] | None:
    """The dispatch answer for a decode call (op ``attention_decode``, or ``attention_decode_gated`` with a gate)."""
    dims = {"batch": q.shape[0], "q_heads": q.shape[1], "kv_heads": k_cache.shape[2], "head_dim": q.shape[2],
            "context": k_cache.shape[1]}
    tensors = {"q": q, "k_cache": k_cache, "v_cache": v_cache, "slots": slots, "seq_lens": seq_lens}
    if gate is None:
        return route("attention_decode", tensors, dims)
    return route("attention_decode_gated", {**tensors, "gate": gate}, dims)


def attention_decode(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, slots: torch.Tensor,
                     seq_lens: torch.Tensor, max_len: int, sm_scale: float, k_scale: float = 1.0,
                     v_scale: float = 1.0, gate: torch.Tensor | None = None) -> torch.Tensor:
    """``q [B, Hq, D]`` over ``cache[slots[b], :seq_lens[b]]``; with ``gate [B, Hq, D]`` the output is
    ``o · sigmoid(gate)`` (op ``attention_decode_gated``: the gate fused into the tactic's epilogue; the
    fallback runs `output_gate` after the ungated op). ``max_len`` bounds the reference's span only: the
    tactics read the lengths on the device."""
    hit = decode_route(q, k_cache, v_cache, slots, seq_lens, gate)
    if gate is not None:
        if hit is not None:
            gated: torch.Tensor = hit[0](hit[1], q=q, k_cache=k_cache, v_cache=v_cache, slots=slots,
                                         seq_lens=seq_lens, max_len=max_len, sm_scale=sm_scale, k_scale=k_scale,
                                         v_scale=v_scale, gate=gate)
            return gated
        return output_gate(attention_decode(q, k_cache, v_cache, slots, seq_lens, max_len, sm_scale, k_scale,
                                            v_scale), gate)
    if hit is not None:
        out: torch.Tensor = hit[0](hit[1], q=q, k_cache=k_cache, v_cache=v_cache, slots=slots, seq_lens=seq_lens,
                                   max_len=max_len, sm_scale=sm_scale, k_scale=k_scale, v_scale=v_scale)
        return out
    return attention_decode_ref(q, k_cache, v_cache, slots, seq_lens, max_len, sm_scale, k_scale, v_scale)
