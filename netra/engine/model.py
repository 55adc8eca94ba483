"""The Qwen3.5/3.6 hybrid-MoE text model over the engine's state pools.

Layer l is gated full attention when ``(l+1) % full_attention_interval == 0``, Gated DeltaNet
otherwise; every layer ends in the sparse MoE block. Each hot op goes through `netra.ops` (dispatch,
reference fallback). `ForwardBatch` carries either a prefill batch (chunks of several sequences,
concatenated), a decode batch (one token per row, possibly padded with rows on `PAD_SLOT`), or a
mixed batch (``decode_rows`` decode rows first, then prefill chunks): row-wise ops run once over every
token, the mixers (attention, convolution, delta rule) run their decode op on the decode rows and
their prefill op on the chunks, so a decode row's arithmetic is the decode path's. The decode path reads only tensors of fixed shape per bucket (plus ``max_len``, the reference's
attention span), so a captured graph can replay it from persistent buffers.

Speculative verify (``spec_tokens`` = T > 0 on a decode batch): the rows are B blocks of T tokens, row
(r, i) a decode row of request r at position committed + i, so attention, norms, MoE and projections run
the decode path row by row (the K/V store of every row runs before attention reads it, so row i sees the
block's rows before it). Only the GDN layers differ: each block's T token steps run the decode ops
(convolution update, fused delta rule) on a copy of the request's window and state, so no pool moves; the
layers' pre-convolution rows and gating inputs are kept (`ForwardOut.gdn_stash`) for `Model.commit_gdn`,
which replays a block's accepted prefix through the same decode ops on the real pools.

Hidden-state capture (`Model.run` with ``capture``): the output of decoder layer i (the residual stream after
layer i's MoE, Hugging Face's ``hidden_states[i + 1]``) of every token row, for a drafter.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from netra.engine.cache import StatePools
from netra.engine.config import ModelConfig
from netra.engine.weights import AttentionWeights, GDNWeights, ModelWeights
from netra.ops import attention, conv, fp8, gdn, norm
from netra.ops._common import acc_dtype, to_device
from netra.ops.linear import act_quant, linear, linear_group
from netra.ops.moe import moe
from netra.ops.rope import rope_cache


@dataclass
class ForwardBatch:
    decode: bool
    input_ids: torch.Tensor  # [T] int64
    positions: torch.Tensor  # [T] int64
    token_slots: torch.Tensor  # [T] int64: slot of each token
    slots: torch.Tensor  # [B] int64
    seq_lens: torch.Tensor  # [B] int64: cached length after this step
    max_len: int  # max(seq_lens)
    logits_rows: torch.Tensor  # [N] int64: token rows whose logits are wanted
    # Prefill only (host lists): per sequence slot, cached length before the chunk, chunk length.
    seq_slots: list[int]
    seq_starts: list[int]
    q_lens: list[int]
    # Mixed batch (decode False): the first ``decode_rows`` tokens are decode rows described by
    # ``slots`` / ``seq_lens`` / ``max_len``; the prefill chunks (``seq_*``, ``q_lens``) follow them.
    decode_rows: int = 0
    # Speculative verify (decode True): the rows are ``len // spec_tokens`` blocks of ``spec_tokens`` rows, one
    # block per request (``slots``, ``seq_lens``, ``positions`` per row); 0: an ordinary batch.
    spec_tokens: int = 0


@dataclass
class ForwardOut:
    logits: torch.Tensor  # [len(logits_rows), vocab] FP32
    # capture: the outputs of the captured decoder layers, concatenated per token row [T, layers x hidden]
    features: torch.Tensor | None = None
    # spec_tokens > 0: every GDN layer's (pool order) pre-convolution rows [L, T, conv_dim] and gating inputs
    # a, b [L, T, Hv] (what `Model.commit_gdn` replays)
    gdn_stash: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None


class Model:
    def __init__(self, cfg: ModelConfig, weights: ModelWeights, pools: StatePools, device: torch.device) -> None:
        self.cfg, self.w, self.pools, self.device = cfg, weights, pools, device
        self.rope_cache = rope_cache(pools.context_length, cfg.rotary_dim, cfg.rope_theta, device)
        self.sm_scale = cfg.head_dim ** -0.5
        # per layer, the activation quant of the mixer's input projections and of the GDN output projection: the
        # norms in front of FP8 projections write the rows' E4M3 form too where a contract covers it (netra.ops.norm)
        self.in_quant = [act_quant(layer.mixer.q_proj if isinstance(layer.mixer, AttentionWeights)
                                   else layer.mixer.in_proj_qkv) for layer in weights.layers]
        self.out_quant = [act_quant(layer.mixer.out_proj) if isinstance(layer.mixer, GDNWeights) else "none"
                          for layer in weights.layers]
        if device.type == "cuda":
            # The fallbacks are FP32 references: TF32 GEMMs (10-bit mantissa) would move BF16/FP8
            # rounding decisions and drift from the oracle; tactics are unaffected (own kernels).
            torch.backends.cuda.matmul.allow_tf32 = False
            torch.backends.cudnn.allow_tf32 = False
        self._gdn_stack: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None
        if device.type == "cpu":
            # Every op runs its reference on a CPU: dequantize each projection once into the
            # accumulator dtype instead of on every call (same numbers, far fewer ops per step).
            acc = acc_dtype(device)
            for weight in weights.all_weights():
                weight.dequantized(acc)

    def decode_capture_blocker(self, tokens: int) -> str | None:
        """Why the decode forward of a ``tokens``-row bucket cannot be captured as a CUDA graph, or None.

        Every op's fallback on the decode path is graph-safe except the grouped MoE fallback (more than
        `moe.DENSE_FALLBACK_MAX_EXPERTS` experts reads per-expert counts on the host); the MoE tactics
        (kernels/sm90/moe: 1..128 tokens) lift that, so dispatch decides per bucket.
        """
        from netra.ops.moe import graph_blocker

        for i, layer in enumerate(self.w.layers):
            why = graph_blocker(layer.moe, tokens, self.device)
            if why is not None:
                return f"layer {i}: {why}"
        return None

    def forward(self, fb: ForwardBatch) -> torch.Tensor:
        """Logits ``[len(logits_rows), vocab]`` FP32 for the requested rows; updates the pools."""
        return self.run(fb).logits

    def run(self, fb: ForwardBatch, capture: tuple[int, ...] = ()) -> ForwardOut:
        """`forward`, with the outputs of the decoder layers ``capture`` (HF's ``hidden_states[i + 1]``) and,
        in a verify batch, the GDN layers' inputs."""
        cfg = self.cfg
        eps = cfg.rms_norm_eps
        out = ForwardOut(logits=torch.empty(0))
        saved: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = []
        taken: dict[int, torch.Tensor] = {}
        h = self.w.embed.index_select(0, fb.input_ids)
        residual = h
        xa = norm.rmsnorm_quant(h, self.w.layers[0].input_layernorm, eps, self.in_quant[0])
        for i, layer in enumerate(self.w.layers):
            if i > 0:
                xa, residual = norm.add_rmsnorm_quant(h, residual, layer.input_layernorm, eps, self.in_quant[i])
            if isinstance(layer.mixer, AttentionWeights):
                h = self._attention(xa, layer.mixer, fb, self.pools.attn_index[i])
            else:
                h = self._gdn(xa, layer.mixer, fb, self.pools.gdn_index[i], self.out_quant[i], saved)
            x, residual = norm.add_rmsnorm(h, residual, layer.post_attention_layernorm, eps)
            h = moe(x, layer.moe)
            if i in capture:  # the residual add the next norm makes (add_rmsnorm's rounding: one op)
                taken[i] = h + residual if h.dtype == residual.dtype else (h.float() + residual.float()).to(residual.dtype)
        x, _ = norm.add_rmsnorm(h, residual, self.w.norm, eps)
        if saved:
            qkv, a, b = (torch.stack(t) for t in zip(*saved, strict=True))
            out.gdn_stash = (qkv, a, b)
        if capture:
            out.features = torch.cat([taken[i] for i in capture], dim=-1)
        out.logits = linear(x.index_select(0, fb.logits_rows), self.w.lm_head, torch.float32)
        return out

    def _attention(self, x: torch.Tensor | fp8.GroupQuantized, w: AttentionWeights, fb: ForwardBatch, li: int
                   ) -> torch.Tensor:
        cfg = self.cfg
        t, hq, hkv, d = x.shape[0], cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
        qg, k, v = linear_group(x, [w.q_proj, w.k_proj, w.v_proj])
        if cfg.attn_output_gate:
            qg = qg.reshape(t, hq, 2 * d)
            q, gate = qg[..., :d], qg[..., d:]
        else:
            q, gate = qg.reshape(t, hq, d), None
        k, v = k.reshape(t, hkv, d), v.reshape(t, hkv, d)
        kc, vc = self.pools.k[li], self.pools.v[li]
        # q/k norms, RoPE and the K/V store (one op: fused on sm90, today's chain of ops as fallback)
        q = attention.qk_norm_rope_store(q, k, v, w.q_norm, w.k_norm, cfg.rms_norm_eps, fb.positions,
                                         self.rope_cache, cfg.rotary_dim, kc, vc, fb.token_slots)
        if fb.decode:  # the output gate rides in the decode op (fused on sm90)
            o = attention.attention_decode(q, kc, vc, fb.slots, fb.seq_lens, fb.max_len, self.sm_scale, gate=gate)
        else:
            nd = fb.decode_rows
            o = attention.attention_prefill(q[nd:], kc, vc, fb.seq_slots, fb.seq_starts, fb.q_lens, self.sm_scale)
            if gate is not None:
                o = attention.output_gate(o, gate[nd:])
            if nd:
                od = attention.attention_decode(q[:nd], kc, vc, fb.slots, fb.seq_lens, fb.max_len, self.sm_scale,
                                                gate=None if gate is None else gate[:nd])
                o = torch.cat([od, o])
        return linear(o.reshape(t, hq * d), w.o_proj)

    def _gdn(self, x: torch.Tensor | fp8.GroupQuantized, w: GDNWeights, fb: ForwardBatch, li: int,
             out_quant: str, saved: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]) -> torch.Tensor:
        cfg = self.cfg
        t = x.shape[0]
        hk, hv = cfg.linear_num_key_heads, cfg.linear_num_value_heads
        dk, dv = cfg.linear_key_head_dim, cfg.linear_value_head_dim
        qkv, z = linear_group(x, [w.in_proj_qkv, w.in_proj_z])
        z = z.reshape(t, hv, dv)
        b, a = linear_group(x, [w.in_proj_b, w.in_proj_a])
        conv_pool, ssm_pool = self.pools.conv[li], self.pools.ssm[li]
        nd = fb.decode_rows
        if fb.spec_tokens:  # the block's T decode steps from a copy of the state; the inputs kept for the commit
            saved.append((qkv, a, b))
            o = gdn.gdn_verify(qkv, a, b, w.conv1d, w.a_log, w.dt_bias, conv_pool, ssm_pool,
                               fb.slots[::fb.spec_tokens], fb.spec_tokens)
            rows = norm.gated_rmsnorm_quant(o, z, w.norm, cfg.rms_norm_eps, out_quant)
            return linear(rows.reshape(t, hv * dv), w.out_proj)
        if fb.decode:
            qkv = conv.causal_conv1d_update(qkv, w.conv1d, conv_pool, fb.slots)
        elif nd:
            qkv = torch.cat([conv.causal_conv1d_update(qkv[:nd], w.conv1d, conv_pool, fb.slots),
                             conv.causal_conv1d_prefill(qkv[nd:], w.conv1d, conv_pool, fb.seq_slots, fb.q_lens)])
        else:
            qkv = conv.causal_conv1d_prefill(qkv, w.conv1d, conv_pool, fb.seq_slots, fb.q_lens)
        kd = cfg.linear_key_dim
        q = qkv[:, :kd].reshape(t, hk, dk)
        k = qkv[:, kd:2 * kd].reshape(t, hk, dk)
        v = qkv[:, 2 * kd:].reshape(t, hv, dv)
        if fb.decode:  # gating + L2 norm + delta rule + output, one op (pad rows: zeros, pool untouched)
            o = gdn.gdn_decode_fused(q, k, v, a, b, w.a_log, w.dt_bias, ssm_pool, fb.slots)
        else:
            o = gdn.gdn_prefill_gated(q[nd:], k[nd:], v[nd:], a[nd:], b[nd:], w.a_log, w.dt_bias, ssm_pool,
                                      fb.seq_slots, fb.q_lens)
            if nd:
                o = torch.cat([gdn.gdn_decode_fused(q[:nd], k[:nd], v[:nd], a[:nd], b[:nd], w.a_log, w.dt_bias,
                                                    ssm_pool, fb.slots), o])
        rows = norm.gated_rmsnorm_quant(o, z, w.norm, cfg.rms_norm_eps, out_quant)
        return linear(rows.reshape(t, hv * dv), w.out_proj)

    def commit_gdn(self, stash: tuple[torch.Tensor, torch.Tensor, torch.Tensor], slots: torch.Tensor,
                   counts: torch.Tensor, steps: int) -> None:
        """Advance the GDN pools of the blocks' requests (``slots [B]``) by the first ``counts [B]`` rows of a
        verify batch of ``steps`` rows per block (`ForwardOut.gdn_stash`), through the decode token step on the
        real pools (`gdn.gdn_commit`): the state equals that of ``counts`` decode steps. Fixed shapes, no host
        synchronisation."""
        conv_w, a_log, dt_bias = self._gdn_params()
        gdn.gdn_commit(*stash, conv_w, a_log, dt_bias, self.pools.conv, self.pools.ssm, slots, counts, steps)

    def _gdn_params(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Every GDN layer's conv weight, A_log and dt_bias, stacked in pool order (made once)."""
        if self._gdn_stack is None:
            ws = [self.w.layers[i].mixer for i in self.cfg.gdn_layers]
            assert all(isinstance(w, GDNWeights) for w in ws)
            self._gdn_stack = tuple(torch.stack([getattr(w, name) for w in ws])  # type: ignore[assignment]
                                    for name in ("conv1d", "a_log", "dt_bias"))
        assert self._gdn_stack is not None
        return self._gdn_stack


def prefill_batch(device: torch.device, chunks: list[tuple[int, list[int], int, bool]],
                  decode: list[tuple[int, int, int]] | None = None) -> ForwardBatch:
    """Build a prefill `ForwardBatch` from ``(slot, token_ids, start, wants_logits)`` per sequence; with
    ``decode`` (``(slot, token_id, seq_len)`` per running request) a mixed batch: those decode rows first,
    each wanting logits, then the chunks."""
    rows_d = decode or []
    ids = [tok for _, tok, _ in rows_d]
    pos = [n - 1 for _, _, n in rows_d]
    tok_slots = [slot for slot, _, _ in rows_d]
    rows = list(range(len(rows_d)))
    for slot, toks, start, wants in chunks:
        ids += toks
        pos += range(start, start + len(toks))
        tok_slots += [slot] * len(toks)
        if wants:
            rows.append(len(ids) - 1)
    if rows_d:
        slots, seq_lens = [r[0] for r in rows_d], [r[2] for r in rows_d]
    else:
        slots, seq_lens = [c[0] for c in chunks], [start + len(toks) for _, toks, start, _ in chunks]

    def t(v: list[int]) -> torch.Tensor:  # no host-device synchronisation: the device may still be busy
        return to_device(v, device)

    return ForwardBatch(decode=False, input_ids=t(ids), positions=t(pos), token_slots=t(tok_slots),
                        slots=t(slots), seq_lens=t(seq_lens), max_len=max(seq_lens),
                        logits_rows=t(rows), seq_slots=[c[0] for c in chunks],
                        seq_starts=[c[2] for c in chunks], q_lens=[len(c[1]) for c in chunks],
                        decode_rows=len(rows_d))
