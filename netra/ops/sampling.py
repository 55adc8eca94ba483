"""Token sampling: greedy rows and temperature / top-k / top-p / min-p rows with per-request seeds.

Random rows use the Gumbel-max trick with counter-based noise: the uniform for (request seed, output
step, token id) is a fixed hash, so a request's tokens depend only on its seed and its own logits,
never on the batch it shares or the step's launch order, and the whole op is graph-safe (no
generator state, no host sync). Filters act on the temperature-scaled distribution in this order:
top-k, then top-p (smallest prefix of the sorted distribution whose mass reaches p; the top token
always stays), then min-p (drop tokens below ``min_p · p_max``).

Before temperature, `process_logits_ref` turns the model's logits into the logits that are sampled,
in SGLang 0.5.23's order: additive penalties (frequency, presence, and min-tokens' ban of stop
tokens), then the repetition penalty (scaling), then the grammar mask, then `logit_bias`.
`logprobs_ref` reads log-probabilities from those same processed logits (before temperature), so a
returned logprob is the one the sampler saw.
"""

from __future__ import annotations

import torch

from netra.ops._common import route
from netra.ops.argmax import argmax as argmax_op

_M32 = 0xFFFFFFFF
_BELOW_ONE = 1.0 - 2.0 ** -24  # the largest FP32 below 1


def _argmax(logits: torch.Tensor) -> torch.Tensor:
    """Greedy pick through the argmax op family (dispatch: the sm90 tactic or torch.argmax, same result)."""
    return argmax_op(logits)


def _mix32(h: torch.Tensor) -> torch.Tensor:
    """MurmurHash3's 32-bit finaliser on int64 tensors holding uint32 values (low bits exact under wraparound)."""
    h = h ^ (h >> 16)
    h = (h * 0x85EBCA6B) & _M32
    h = h ^ (h >> 13)
    h = (h * 0xC2B2AE35) & _M32
    return h ^ (h >> 16)


def uniform_noise_ref(seeds: torch.Tensor, steps: torch.Tensor, token_ids: torch.Tensor) -> torch.Tensor:
    """``seeds [B]``, ``steps [B]`` int64, ``token_ids [B, V]`` int64 -> uniforms in (0, 1) FP32 ``[B, V]``."""
    lo, hi = (seeds & _M32)[:, None], ((seeds >> 32) & _M32)[:, None]
    h = _mix32((token_ids + 0x9E3779B9) & _M32)
    h = _mix32(h ^ (steps[:, None] & _M32))
    h = _mix32(h ^ hi)
    h = _mix32(h ^ lo)
    # (h >> 8) + 0.5 is exact in FP32 except at the top: 2^24 - 0.5 rounds to 2^24, which would make u
    # exactly 1 and the Gumbel noise +inf, so that token would win whatever its logit (a grammar-masked
    # or biased-away token included: -inf + inf is NaN, which argmax picks). One hash in 2^24 per token:
    # with a 248k vocabulary, about one sampled step in 70. The clamp moves only that value.
    u = ((h >> 8).to(torch.float32) + 0.5) * (1.0 / (1 << 24))
    return u.clamp(max=_BELOW_ONE)


def filtered_sorted_logprobs(logits: torch.Tensor, temperature: torch.Tensor, top_k: torch.Tensor,
                             top_p: torch.Tensor, min_p: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The distribution `sample_ref` draws from: ``logits [B, V]`` at each row's temperature (1 for greedy
    rows), cut by top-k, top-p and min-p, as log-probabilities in descending order (``-inf`` for cut
    tokens) with the token id of each position. The speculative acceptance reads the same values."""
    vocab = logits.shape[-1]
    temp = torch.where(temperature > 0, temperature, torch.ones_like(temperature))
    sorted_logits, sorted_ids = torch.sort(logits.float() / temp[:, None], dim=-1, descending=True, stable=True)
    rank = torch.arange(vocab, device=logits.device)[None, :]
    k = torch.where(top_k > 0, top_k, torch.full_like(top_k, vocab))
    keep = rank < k[:, None]
    probs = torch.softmax(sorted_logits.masked_fill(~keep, float("-inf")), dim=-1)
    before = probs.cumsum(dim=-1) - probs  # mass strictly above this token
    keep = keep & (before < top_p[:, None])
    keep = keep & (probs >= min_p[:, None] * probs[:, :1])
    keep[:, 0] = True
    return torch.log_softmax(sorted_logits.masked_fill(~keep, float("-inf")), dim=-1), sorted_ids


def sample_ref(logits: torch.Tensor, temperature: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor,
               min_p: torch.Tensor, seeds: torch.Tensor, steps: torch.Tensor) -> torch.Tensor:
    """``logits [B, V]`` (FP32); per-row ``temperature`` (0 = greedy), ``top_k`` (-1 or ≥1), ``top_p``,
    ``min_p``, ``seeds``, ``steps`` -> token ids ``[B]`` int64."""
    # No early return for an all-greedy batch: that test would synchronise with the host, and this
    # op runs inside captured decode graphs (the scheduler sends all-greedy batches to `greedy`).
    greedy = _argmax(logits)
    logp, sorted_ids = filtered_sorted_logprobs(logits, temperature, top_k, top_p, min_p)
    u = uniform_noise_ref(seeds, steps, sorted_ids)
    gumbel = -torch.log(-torch.log(u))
    pick = torch.argmax(logp + gumbel, dim=-1)
    sampled = sorted_ids.gather(1, pick[:, None])[:, 0]
    return torch.where(temperature > 0, sampled, greedy)


def sample(logits: torch.Tensor, temperature: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor,
           min_p: torch.Tensor, seeds: torch.Tensor, steps: torch.Tensor) -> torch.Tensor:
    hit = route("sample", {"logits": logits, "temperature": temperature},
                {"batch": logits.shape[0], "vocab": logits.shape[1]})
    if hit is not None:
        return hit[0](hit[1], logits=logits, temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p,
                      seeds=seeds, steps=steps)
    return sample_ref(logits, temperature, top_k, top_p, min_p, seeds, steps)


def greedy(logits: torch.Tensor) -> torch.Tensor:
    """All-greedy batch: argmax per row (the kernel-lab argmax op when it exists)."""
    return _argmax(logits)


NEG_INF = float("-inf")
BITS = 32  # grammar masks are packed 32 tokens per int32 word (llguidance's and xgrammar's layout)


def unpack_bitmask_ref(bits: torch.Tensor, vocab: int) -> torch.Tensor:
    """``bits [B, W]`` int32 (bit ``t % 32`` of word ``t // 32`` set = token ``t`` allowed) -> bool ``[B, vocab]``.

    Tokens past ``32 * W`` are not allowed."""
    tok = torch.arange(vocab, device=bits.device)
    word = (tok // BITS).clamp(max=bits.shape[1] - 1)
    shift = (tok % BITS).to(torch.int32)
    allowed = ((bits.index_select(1, word) >> shift) & 1).bool()
    return allowed & (tok < BITS * bits.shape[1])


def process_logits_ref(logits: torch.Tensor, counts: torch.Tensor, frequency: torch.Tensor,
                       presence: torch.Tensor, repetition: torch.Tensor, ban_stops: torch.Tensor,
                       stop_mask: torch.Tensor, grammar_bits: torch.Tensor, grammar_on: torch.Tensor,
                       bias: torch.Tensor) -> torch.Tensor:
    """The logits that are sampled, from the model's ``logits [B, V]`` FP32 and per-row state:

    - ``counts [B, V]`` int32: how often each token was generated so far (output tokens only);
    - ``frequency``, ``presence`` ``[B]`` FP32: ``logit -= frequency · count + presence · (count > 0)``;
    - ``ban_stops [B]`` bool with ``stop_mask [B, V]`` bool: min-tokens, ``-inf`` on stop tokens while set;
    - ``repetition [B]`` FP32: for generated tokens, ``logit / r`` when positive, ``logit · r`` otherwise;
    - ``grammar_bits [B, W]`` int32 with ``grammar_on [B]`` bool: tokens outside the mask get ``-inf``;
    - ``bias [B, V]`` FP32: added last (OpenAI ``logit_bias``).

    A row whose state is neutral (zeros, ``repetition`` 1, flags off) comes back unchanged, bit for bit.
    Fixed shapes, no host synchronisation: safe inside a captured graph."""
    x = logits.float()
    c = counts.to(torch.float32)
    x = x - frequency[:, None] * c - presence[:, None] * (c > 0).to(torch.float32)
    x = x.masked_fill(stop_mask & ban_stops[:, None], NEG_INF)
    r = repetition[:, None]
    x = torch.where(counts > 0, torch.where(x < 0, x * r, x / r), x)
    allowed = unpack_bitmask_ref(grammar_bits, x.shape[1])
    x = x.masked_fill(~allowed & grammar_on[:, None], NEG_INF)
    return x + bias


def logprobs_ref(logits: torch.Tensor, tokens: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``logits [B, V]`` (the processed logits that were sampled), ``tokens [B]`` -> (logprob of each
    token ``[B]``, top-``k`` logprobs ``[B, k]`` descending, their token ids ``[B, k]``); FP32 log-softmax."""
    logp = torch.log_softmax(logits.float(), dim=-1)
    chosen = logp.gather(1, tokens[:, None])[:, 0]
    top = torch.topk(logp, k=min(k, logp.shape[1]), dim=-1)
    return chosen, top.values, top.indices
