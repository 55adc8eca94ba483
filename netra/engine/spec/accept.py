"""Acceptance of a drafted block on the device: greedy, and the lossless rule for sampled rows.

The target verifies the block ``[pending, d1..d(T−1)]`` in one forward and returns logits at ``T``
positions: position ``i`` predicts the token after block token ``i``, with ``d1..di`` as prefix.
Acceptance turns them into ``count [B]`` (tokens the row commits, ``1 ≤ count ≤ T``) and
``tokens [B, T]`` (the committed tokens in ``tokens[:, :count]``, ``REJECTED`` after them):

- greedy rows accept ``d_i`` while it equals the target's argmax at ``i − 1``, then take the
  target's argmax at the first mismatch (the bonus token), as DFlash and the peers do;
- sampled rows accept ``d_i`` with probability ``p_{i−1}(d_i)`` (the draft is one-hot, so the usual
  ``min(1, p/q)`` is ``p(d)``); at the first rejection they draw from ``p_{i−1}`` with ``d_i``
  removed and renormalised, and on full acceptance they draw the bonus from ``p_{T−1}``. The tokens
  are then distributed exactly as sequential sampling from the target (lossless), but they are not
  the tokens non-speculative decoding draws with the same seed: the acceptance uniforms are extra
  randomness, so a row's stream of tokens depends on the drafts it was offered.

``p_i`` is the distribution the non-speculative sampler (`SlotSampler.step`, `sampling.sample_ref`)
would use at output position ``out_len + i`` with ``d1..di`` appended to the output: penalties
(frequency, presence, repetition) over the counts including the drafts, min-new-tokens at that
position, logit bias, temperature, top-k, top-p, min-p, computed by the same functions in the same
order, so the processed logits are bit for bit the sampler's and the log-probabilities are those the
sampler's Gumbel draw reads.

Randomness is counter-based (`sampling.uniform_noise_ref`): the acceptance uniform of draft ``i`` is
keyed by (seed, output position ``out_len + i − 1``, `ACCEPT_KEY`), and the emitted draw at output
position ``s`` uses exactly the Gumbel noise the non-speculative sampler uses at step ``s`` (keyed by
seed, ``s`` and token id). A rerun is reproducible, independent of the batch; and a row verified at
``T = 1`` (``t_eff = 1``) draws the non-speculative sampler's token (the same noise on the same
log-probabilities; only an exact floating-point tie of two Gumbel scores could break differently,
vocabulary order here against sorted order there).

Every function is batch-shaped with fixed shapes, reads no host data and has no data-dependent Python
control flow (the host chooses ``greedy`` / ``processed`` as it does for `StepVariant`): safe inside a
captured graph.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from netra.ops import sampling

if TYPE_CHECKING:
    from netra.engine.sampler import SlotSampler

# Key of the acceptance uniforms in the counter-based hash: no token id is 2^32 − 1, so the acceptance
# uniform of a position never reuses the Gumbel noise of a token at that position.
ACCEPT_KEY = 0xFFFFFFFF
REJECTED = -1  # ``tokens`` past ``count``: not committed


@dataclass(frozen=True)
class RowSampling:
    """Per-row sampling state of one verify step (``[B]`` or ``[B, V]`` each), as the slot sampler holds
    it: the rows' gathered copy, so acceptance is a pure function of tensors."""

    temperature: torch.Tensor  # [B] FP32, 0 = greedy
    top_k: torch.Tensor  # [B] int64, -1 = off
    top_p: torch.Tensor  # [B] FP32
    min_p: torch.Tensor  # [B] FP32
    seed: torch.Tensor  # [B] int64
    out_len: torch.Tensor  # [B] int64: tokens generated before the block (the pending one excluded)
    counts: torch.Tensor  # [B, V] int32: output-token counts before the block
    frequency: torch.Tensor  # [B] FP32
    presence: torch.Tensor  # [B] FP32
    repetition: torch.Tensor  # [B] FP32
    min_tokens: torch.Tensor  # [B] int64
    stop_mask: torch.Tensor  # [B, V] bool: the tokens min-new-tokens bans
    bias: torch.Tensor  # [B, V] FP32: logit_bias
    grammar_on: torch.Tensor  # [B] bool

    @classmethod
    def gather(cls, sampler: SlotSampler, slots: torch.Tensor) -> RowSampling:
        """The rows' state from the slot sampler for ``slots [B]`` (graph-safe gathers, no host sync)."""
        s = sampler
        return cls(temperature=s.temperature[slots], top_k=s.top_k[slots], top_p=s.top_p[slots],
                   min_p=s.min_p[slots], seed=s.seed[slots], out_len=s.out_len[slots],
                   counts=s.counts.index_select(0, slots), frequency=s.frequency[slots],
                   presence=s.presence[slots], repetition=s.repetition[slots], min_tokens=s.min_tokens[slots],
                   stop_mask=s.stop_mask.index_select(0, slots), bias=s.bias.index_select(0, slots),
                   grammar_on=s.grammar_on[slots])


@dataclass
class Accepted:
    count: torch.Tensor  # [B] int64: tokens committed, 1..min(t_eff, limit)
    tokens: torch.Tensor  # [B, T] int64: tokens[:, :count] committed, REJECTED after


def _per_position(x: torch.Tensor, t: int) -> torch.Tensor:
    """``[B, ...]`` -> ``[B·T, ...]``, each row repeated for its ``t`` block positions (row-major)."""
    return x[:, None].expand(x.shape[0], t, *x.shape[1:]).reshape(x.shape[0] * t, *x.shape[1:])


def block_counts(counts: torch.Tensor, drafts: torch.Tensor) -> torch.Tensor:
    """``counts [B, V]`` int32 (output tokens so far), ``drafts [B, T−1]`` -> ``[B, T, V]`` int32: the
    counts position ``i`` sees, with ``d1..di`` appended to the output (one-hot counts, cumulated)."""
    b, v = counts.shape
    t = drafts.shape[1] + 1
    delta = torch.zeros(b, t, v, dtype=torch.int32, device=counts.device)
    delta[:, 1:].scatter_(2, drafts[..., None], 1)
    return delta.cumsum(dim=1, dtype=torch.int32) + counts[:, None]


def processed_logits(logits: torch.Tensor, drafts: torch.Tensor, rows: RowSampling,
                     grammar_bits: torch.Tensor | None = None) -> torch.Tensor:
    """``logits [B, T, V]`` -> the logits the non-speculative sampler samples at each position (FP32
    ``[B, T, V]``), by `sampling.process_logits_ref` with the drafts counted as output and min-new-tokens
    evaluated at output position ``out_len + i``: bit for bit the sampler's at that position.

    ``grammar_bits [B, T, W]``: position ``i``'s packed mask for the rows with ``grammar_on`` (the host
    advances a copy of the matcher through ``d1..di``); ``None`` applies no grammar mask, so grammar rows
    must then stay out of speculation (SGLang's DFlash refuses them)."""
    b, t, v = logits.shape
    pos = rows.out_len[:, None] + torch.arange(t, device=logits.device)
    ban = (pos < rows.min_tokens[:, None]).reshape(-1)
    if grammar_bits is None:
        bits = torch.zeros(b * t, 1, dtype=torch.int32, device=logits.device)
        on = torch.zeros(b * t, dtype=torch.bool, device=logits.device)
    else:
        bits, on = grammar_bits.reshape(b * t, -1), _per_position(rows.grammar_on, t)
    x = sampling.process_logits_ref(
        logits.reshape(b * t, v), block_counts(rows.counts, drafts).reshape(b * t, v),
        _per_position(rows.frequency, t), _per_position(rows.presence, t), _per_position(rows.repetition, t),
        ban, _per_position(rows.stop_mask, t), bits, on, _per_position(rows.bias, t))
    return x.view(b, t, v)


def filtered_logprobs(x: torch.Tensor, temperature: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor,
                      min_p: torch.Tensor) -> torch.Tensor:
    """``x [N, V]`` (processed logits) -> the log-probabilities `sampling.sample_ref` draws from, in
    vocabulary order (``-inf`` for filtered tokens): the same function computes both, so the values are
    bitwise the ones its Gumbel-max reads. Rows with temperature 0 get the temperature-1 distribution (unused)."""
    logp, sorted_ids = sampling.filtered_sorted_logprobs(x, temperature, top_k, top_p, min_p)
    return torch.empty_like(logp).scatter_(1, sorted_ids, logp)


def target_logprobs(logits: torch.Tensor, drafts: torch.Tensor, rows: RowSampling, *, processed: bool = True,
                    grammar_bits: torch.Tensor | None = None) -> torch.Tensor:
    """``logits [B, T, V]``, ``drafts [B, T−1]`` -> ``log p_i`` ``[B, T, V]`` FP32: at each position the
    distribution non-speculative decoding would sample with ``d1..di`` as prefix. ``processed=False``
    (no row has a penalty, bias, min-tokens or grammar: the host's `StepVariant.processed`) skips
    `processed_logits`, which would leave the logits unchanged anyway."""
    b, t, v = logits.shape
    x = processed_logits(logits, drafts, rows, grammar_bits) if processed else logits.reshape(b, t, v)
    lp = filtered_logprobs(x.reshape(b * t, v), _per_position(rows.temperature, t), _per_position(rows.top_k, t),
                           _per_position(rows.top_p, t), _per_position(rows.min_p, t))
    return lp.view(b, t, v)


def target_probs(logits: torch.Tensor, drafts: torch.Tensor, rows: RowSampling, *, processed: bool = True,
                 grammar_bits: torch.Tensor | None = None) -> torch.Tensor:
    """``exp`` of `target_logprobs`: ``p_i [B, T, V]``."""
    return target_logprobs(logits, drafts, rows, processed=processed, grammar_bits=grammar_bits).exp()


def _accepted(ok: torch.Tensor) -> torch.Tensor:
    """``ok [B, T−1]`` bool -> the length of its all-true prefix ``[B]`` int64."""
    return ok.to(torch.int64).cumprod(dim=1).sum(dim=1)


def _considered(t_eff: torch.Tensor | None, drafts: torch.Tensor) -> torch.Tensor:
    """Draft ``i`` (column ``i − 1``) is part of the row's block iff ``i < t_eff``."""
    i = torch.arange(1, drafts.shape[1] + 1, device=drafts.device)[None, :]
    if t_eff is None:
        return torch.ones_like(drafts, dtype=torch.bool)
    return i < t_eff[:, None]


def _emit(accepted: torch.Tensor, drafts: torch.Tensor, last: torch.Tensor,
          limit: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(count, tokens): the accepted drafts, then ``last`` at column ``accepted``, cut at ``limit``."""
    b, t = drafts.shape[0], drafts.shape[1] + 1
    j = torch.arange(t, device=drafts.device)[None, :]
    padded = torch.cat([drafts, torch.zeros(b, 1, dtype=drafts.dtype, device=drafts.device)], dim=1)
    tokens = torch.where(j < accepted[:, None], padded, last[:, None])
    count = torch.minimum(accepted + 1, limit)
    return count, torch.where(j < count[:, None], tokens, torch.full_like(tokens, REJECTED))


def greedy_accept(target_argmax: torch.Tensor, drafts: torch.Tensor, limit: torch.Tensor,
                  t_eff: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """``target_argmax [B, T]``, ``drafts [B, T−1]``, ``limit [B]`` (tokens the row may still take, ≥ 1),
    ``t_eff [B]`` (the row's own block length, 1..T; ``None`` = T) -> (``count [B]``, ``tokens [B, T]``)
    int64.

    Accepts ``d_i`` while ``i < t_eff`` and ``d_i == target_argmax[:, i−1]``; ``count`` = accepted + 1
    (the bonus: the argmax at the first mismatch, or at ``t_eff − 1``), clipped to ``limit``;
    ``tokens[:, :count]`` = the accepted drafts then the bonus (that is ``target_argmax[:, :count]``),
    ``REJECTED`` after. For greedy rows ``t_eff`` and ``limit`` cut alike (``min`` of the two)."""
    ok = (drafts == target_argmax[:, :-1]) & _considered(t_eff, drafts)
    accepted = _accepted(ok)
    last = target_argmax.gather(1, accepted[:, None])[:, 0]
    return _emit(accepted, drafts, last, limit)


def rejection_accept(logprobs: torch.Tensor, drafts: torch.Tensor, seeds: torch.Tensor, out_len: torch.Tensor,
                     limit: torch.Tensor, t_eff: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """The lossless rule with one-hot drafts. ``logprobs [B, T, V]`` (``log p_i``, e.g. `target_logprobs`;
    ``-inf`` = probability 0), ``drafts [B, T−1]``, ``seeds [B]``, ``out_len [B]`` (output position of
    block position 0), ``limit [B]``, ``t_eff [B]`` (1..T, ``None`` = T) -> (``count [B]``,
    ``tokens [B, T]``) int64.

    Draft ``i < t_eff`` is accepted iff ``u < p_{i−1}(d_i)``, ``u`` keyed by (seed, ``out_len + i − 1``,
    `ACCEPT_KEY`), while every earlier one was; with ``a`` accepted, position ``a`` emits a Gumbel-max
    draw with the non-speculative sampler's noise at step ``out_len + a``, from ``p_a`` with ``d_{a+1}``
    removed if ``a < t_eff − 1`` (a rejection), from all of ``p_a`` otherwise (the bonus). ``count`` =
    ``a + 1`` clipped to ``limit`` (a prefix of a lossless sample is a lossless prefix); ``tokens`` as in
    `greedy_accept`. Log-probabilities, not probabilities, so a ``t_eff = 1`` row draws on exactly the
    values the non-speculative sampler does."""
    b, t, v = logprobs.shape
    dev = logprobs.device
    if t > 1:  # a static shape, not a device value
        steps = (out_len[:, None] + torch.arange(t - 1, device=dev)).reshape(-1)
        key = torch.full((b * (t - 1), 1), ACCEPT_KEY, dtype=torch.int64, device=dev)
        u = sampling.uniform_noise_ref(_per_position(seeds, t - 1), steps, key).view(b, t - 1)
        p_draft = logprobs[:, :-1].gather(2, drafts[..., None])[..., 0].exp()
        accepted = _accepted((u < p_draft) & _considered(t_eff, drafts))
        eff = t_eff if t_eff is not None else torch.full_like(accepted, t)
        rejected = drafts.gather(1, accepted.clamp(max=t - 2)[:, None])
        remove = accepted[:, None] < eff[:, None] - 1
    else:
        accepted = torch.zeros(b, dtype=torch.int64, device=dev)
        rejected = torch.zeros(b, 1, dtype=torch.int64, device=dev)
        remove = torch.zeros(b, 1, dtype=torch.bool, device=dev)
    vocab = torch.arange(v, device=dev)[None, :]
    lp = logprobs.gather(1, accepted[:, None, None].expand(b, 1, v))[:, 0]
    lp = lp.masked_fill((vocab == rejected) & remove, float("-inf"))
    noise = sampling.uniform_noise_ref(seeds, out_len + accepted, vocab.expand(b, v))
    drawn = torch.argmax(lp - torch.log(-torch.log(noise)), dim=-1)
    return _emit(accepted, drafts, drawn, limit)


def verify_accept(logits: torch.Tensor, drafts: torch.Tensor, rows: RowSampling, limit: torch.Tensor,
                  t_eff: torch.Tensor | None = None, *, greedy: bool, processed: bool,
                  grammar_bits: torch.Tensor | None = None) -> Accepted:
    """One verify step's acceptance for a mixed batch: ``logits [B, T, V]`` (the target's), ``drafts
    [B, T−1]``, the rows' state, ``limit [B]``, ``t_eff [B]`` -> `Accepted`.

    Rows with temperature 0 go through `greedy_accept` on the argmax of the processed logits (the
    sampler's greedy pick), the others through `rejection_accept` on `target_logprobs`. ``greedy`` (every
    row greedy) and ``processed`` are the host's choices, as in `StepVariant`: ``greedy`` skips the
    sort and the noise; ``processed=False`` skips the penalties. Drafts must be valid token ids in every
    column (pad the columns at and past ``t_eff − 1`` with any id)."""
    b, t, v = logits.shape
    x = processed_logits(logits, drafts, rows, grammar_bits) if processed else logits.float()
    argmax = sampling.greedy(x.reshape(b * t, v)).view(b, t)
    count, tokens = greedy_accept(argmax, drafts, limit, t_eff)
    if greedy:
        return Accepted(count, tokens)
    lp = filtered_logprobs(x.reshape(b * t, v), _per_position(rows.temperature, t), _per_position(rows.top_k, t),
                           _per_position(rows.top_p, t), _per_position(rows.min_p, t)).view(b, t, v)
    s_count, s_tokens = rejection_accept(lp, drafts, rows.seed, rows.out_len, limit, t_eff)
    sampled = rows.temperature > 0
    return Accepted(torch.where(sampled, s_count, count), torch.where(sampled[:, None], s_tokens, tokens))


def commit_counts(counts: torch.Tensor, out_len: torch.Tensor, slots: torch.Tensor, accepted: Accepted,
                  live: torch.Tensor) -> None:
    """Add the committed tokens to the slot sampler's ``counts [S, V]`` and ``out_len [S]`` in place, as
    ``count`` non-speculative steps would (``live [B]`` bool: rows that count, e.g. ``slots != PAD_SLOT``)."""
    t, v = accepted.tokens.shape[1], counts.shape[1]
    take = (torch.arange(t, device=slots.device)[None, :] < accepted.count[:, None]) & live[:, None]
    tok = torch.where(take, accepted.tokens, torch.zeros_like(accepted.tokens))
    counts.view(-1).scatter_add_(0, (slots[:, None] * v + tok).reshape(-1), take.to(counts.dtype).reshape(-1))
    out_len.scatter_add_(0, slots, take.sum(dim=1).to(out_len.dtype))
