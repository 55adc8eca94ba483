"""Per-slot sampling state on the device: penalties, logit bias, min-tokens, grammar masks, logprobs.

Every request parameter that changes the sampled distribution lives in a persistent tensor indexed
by the request's slot (the same slot that indexes the KV and recurrent pools), written once at
admission. A step gathers its rows' state with the bucket's slot vector, so the sampling step has
fixed shapes per bucket and reads no host data: it can sit inside the captured decode graph. Rows
on the pad slot gather the pad slot's neutral state (no penalty, no bias, no mask) and their count
updates add zero, so padded rows stay inert.

Host work per step is limited to what a grammar needs: the grammar library (llguidance) fills each
constrained row's packed bitmask into a host buffer after the previous token is known, and the
rows are copied to the device buffer before the step (outside any captured region). The host also
decides the step's variant: all-greedy without processing (the argmax op on the raw logits),
processed, and with or without logprobs; each variant has fixed shapes.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from netra.engine.cache import PAD_SLOT
from netra.ops import sampling

if TYPE_CHECKING:
    from netra.engine.grammar import Grammar
    from netra.engine.request import SamplingParams

TOP_LOGPROBS_MAX = 20  # OpenAI's limit for top_logprobs; a step computes this many when any row asks


@dataclass(frozen=True)
class StepVariant:
    """The host's choice for one step: fixed shapes per (bucket, variant)."""

    greedy: bool  # every row is greedy: argmax, no noise
    processed: bool  # some row has a penalty, bias, min-tokens or grammar: run `process_logits`
    logprobs: bool  # some row asked for logprobs: compute TOP_LOGPROBS_MAX of them for every row


@dataclass
class StepResult:
    tokens: torch.Tensor  # [B] int64
    logprob: torch.Tensor | None = None  # [B] FP32
    top_values: torch.Tensor | None = None  # [B, TOP_LOGPROBS_MAX] FP32
    top_ids: torch.Tensor | None = None  # [B, TOP_LOGPROBS_MAX] int64


def needs_processing(p: SamplingParams) -> bool:
    return bool(p.frequency_penalty or p.presence_penalty or p.repetition_penalty != 1.0 or p.min_new_tokens
                or p.logit_bias)


class SlotSampler:
    def __init__(self, num_slots: int, vocab: int, device: torch.device, eos_ids: tuple[int, ...]) -> None:
        self.vocab, self.device, self.eos = vocab, device, tuple(eos_ids)
        words = (vocab + sampling.BITS - 1) // sampling.BITS

        def zeros(*shape: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
            return torch.zeros(*shape, dtype=dtype, device=device)

        self.counts = zeros(num_slots, vocab, dtype=torch.int32)  # output-token counts
        self.bias = zeros(num_slots, vocab)
        self.stop_mask = zeros(num_slots, vocab, dtype=torch.bool)  # tokens min-tokens bans
        self.bits = torch.full((num_slots, words), -1, dtype=torch.int32, device=device)
        self.bits_host = torch.full((num_slots, words), -1, dtype=torch.int32,
                                    pin_memory=device.type == "cuda")
        self.grammar_on = zeros(num_slots, dtype=torch.bool)
        self.temperature = zeros(num_slots)
        self.top_k = torch.full((num_slots,), -1, dtype=torch.int64, device=device)
        self.top_p = torch.ones(num_slots, device=device)
        self.min_p = zeros(num_slots)
        self.seed = zeros(num_slots, dtype=torch.int64)
        self.out_len = zeros(num_slots, dtype=torch.int64)  # tokens generated so far (the noise step)
        self.frequency = zeros(num_slots)
        self.presence = zeros(num_slots)
        self.repetition = torch.ones(num_slots, device=device)
        self.min_tokens = zeros(num_slots, dtype=torch.int64)
        self.grammars: dict[int, Grammar] = {}

    # ---- host side: admission and per-step preparation -----------------------------------------------
    def admit(self, slot: int, params: SamplingParams, seed: int, grammar: Grammar | None) -> None:
        """Write a request's state into its slot (every field, so nothing of the previous owner survives)."""
        if slot == PAD_SLOT:
            raise ValueError("the pad slot holds no request")
        scalars = ((self.temperature, params.temperature), (self.top_k, params.top_k), (self.top_p, params.top_p),
                   (self.min_p, params.min_p), (self.seed, seed), (self.out_len, 0),
                   (self.frequency, params.frequency_penalty), (self.presence, params.presence_penalty),
                   (self.repetition, params.repetition_penalty), (self.min_tokens, params.min_new_tokens),
                   (self.grammar_on, grammar is not None))
        for tensor, value in scalars:
            tensor[slot] = value
        self.counts[slot].zero_()
        self.bias[slot].zero_()
        if params.logit_bias:
            ids = torch.tensor([t for t, _ in params.logit_bias], dtype=torch.int64)
            vals = torch.tensor([v for _, v in params.logit_bias], dtype=torch.float32)
            self.bias[slot].index_copy_(0, ids.to(self.device), vals.to(self.device))
        self.stop_mask[slot].zero_()
        stops = sorted({*self.eos, *params.stop_token_ids})
        if stops:
            self.stop_mask[slot].index_fill_(0, torch.tensor(stops, dtype=torch.int64, device=self.device), True)
        self.bits_host[slot].fill_(-1)
        self.bits[slot].fill_(-1)
        if grammar is not None:
            self.grammars[slot] = grammar
        else:
            self.grammars.pop(slot, None)

    def release(self, slot: int) -> None:
        self.grammars.pop(slot, None)
        self.grammar_on[slot] = False

    def variant(self, params: list[SamplingParams], slots: list[int]) -> StepVariant:
        return StepVariant(greedy=all(p.temperature == 0 for p in params),
                           processed=any(needs_processing(p) for p in params) or any(s in self.grammars for s in slots),
                           logprobs=any(p.return_logprob for p in params))

    def prepare(self, slots: list[int]) -> None:
        """Fill the grammar masks of this step's constrained rows and copy them to the device."""
        rows = [s for s in slots if s in self.grammars]
        if not rows:
            return
        for s in rows:
            self.grammars[s].fill_mask(self.bits_host, s)
        idx = torch.tensor(rows, dtype=torch.int64)
        src = self.bits_host.index_select(0, idx)
        self.bits.index_copy_(0, idx.to(self.device), src.to(self.device, non_blocking=True))

    # ---- device side: the step (fixed shapes, no host synchronisation) -----------------------------
    def step(self, logits: torch.Tensor, slots: torch.Tensor, variant: StepVariant) -> StepResult:
        """Sample one token per row of ``logits [B, V]`` for the rows' ``slots [B]`` and update the
        slots' counts. Graph-safe: every tensor read is persistent or derived from the inputs."""
        x = logits
        if variant.processed:
            x = sampling.process_logits_ref(
                logits, self.counts.index_select(0, slots), self.frequency[slots], self.presence[slots],
                self.repetition[slots], self.out_len[slots] < self.min_tokens[slots],
                self.stop_mask.index_select(0, slots), self.bits.index_select(0, slots), self.grammar_on[slots],
                self.bias.index_select(0, slots))
        if variant.greedy:
            tokens = sampling.greedy(x)
        else:
            tokens = sampling.sample(x, self.temperature[slots], self.top_k[slots], self.top_p[slots],
                                     self.min_p[slots], self.seed[slots], self.out_len[slots])
        result = StepResult(tokens)
        if variant.logprobs:
            result.logprob, result.top_values, result.top_ids = sampling.logprobs_ref(x, tokens, TOP_LOGPROBS_MAX)
        live = (slots != PAD_SLOT).to(torch.int32)
        self.counts.view(-1).scatter_add_(0, slots * self.vocab + tokens, live)
        self.out_len.scatter_add_(0, slots, live.to(torch.int64))
        return result
