"""The speculative step: draft → verify → accept → commit, one transaction per decode step.

1. **Draft** from committed state only: the drafter proposes T − 1 tokens after each request's pending token.
2. **Verify**: the target runs ``[pending, d1..d(T−1)]`` of every request as a decode-shaped batch of B·T rows
   (`ForwardBatch.spec_tokens`): row (r, i) at position committed + i. Attention writes K/V past the committed
   length (read only after being rewritten, so nothing to undo); each GDN layer runs the block's T decode token
   steps on a copy of its state and keeps its inputs; the drafter's layers are captured.
3. **Accept** on the device (`netra.engine.spec.accept.verify_accept`): greedy rows by the longest-prefix rule
   plus the bonus token, sampled rows by the lossless rule with one-hot drafts; a forced-acceptance schedule
   (`ForcedAcceptance`) overrides the count for cost curves. Requests asking for logprobs or a grammar ride in
   the batch at T = 1 (``t_eff`` 1): their token is the slot sampler's own step on block position 0, as a plain
   decode step draws it (logprobs, grammar mask and all). Near the end of the context a row's ``t_eff`` shrinks
   so that its real rows stay inside it (the rows past ``t_eff`` are written at the last position: never read).
4. **Commit**: ``count`` tokens per request (the pending one and the accepted drafts as inputs; the accepted
   drafts and the bonus as outputs). The GDN layers replay those inputs through the decode token step on the real
   pools (`Model.commit_gdn`), so the committed state is bitwise ``count`` decode steps; the sampler's counts and
   output lengths advance by the committed tokens; the drafter's context takes their hidden states.

Nothing committed changes before step 4, so an abort or an error anywhere before it leaves every request as it
was. Acceptance and commit read no device value on the host; the host reads the counts and tokens once at the
step's end (as a decode step reads its tokens). The scheduler then cuts each row's tokens at EOS, a stop id,
max_tokens or the context's end, as it would token by token.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch

from netra.engine.cache import PAD_SLOT
from netra.engine.model import ForwardBatch
from netra.engine.request import Request
from netra.engine.runner import ModelRunner
from netra.engine.sampler import StepResult, needs_processing
from netra.engine.spec.accept import REJECTED, Accepted, RowSampling, commit_counts, verify_accept
from netra.engine.spec.drafter import Drafter
from netra.engine.spec.oracle import ForcedAcceptance
from netra.ops import sampling


@dataclass
class Launched:
    """A verify step's results on the device, not read yet (`SpecStep.read` reads them)."""

    accepted: Accepted
    rows: int  # real rows (the first ones of the bucket)
    t_eff: list[int]
    solo: list[bool]
    solo_result: StepResult | None


@dataclass
class Verified:
    """One verify step, read back on the host, for the step's ``len(reqs)`` real rows."""

    tokens: list[list[int]]  # each row's committed output tokens (1..t_eff of them)
    offered: list[int]  # drafts each row was offered (t_eff − 1; 0 for the T = 1 rows)
    solo: StepResult | None  # the slot sampler's result on block position 0 (rows at T = 1), when any ran
    solo_rows: list[int]  # rows whose token came from ``solo``


def rides_alone(req: Request) -> bool:
    """A request verified at T = 1 (SGLang's DFlash refuses these): logprobs, or a grammar."""
    return req.params.return_logprob or req.grammar is not None


class SpecStep:
    def __init__(self, runner: ModelRunner, drafter: Drafter, steps: int,
                 forced: ForcedAcceptance | None = None) -> None:
        if steps < 2:
            raise ValueError(f"speculative steps of {steps} tokens: need at least 2 (the pending token and a draft)")
        self.runner, self.drafter, self.steps, self.forced = runner, drafter, steps, forced
        self.model = runner.model

    def verify(self, reqs: list[Request]) -> Launched:
        """Draft, verify, accept and commit one block for every request of ``reqs`` (each decoding, its pending
        token ``output[-1]`` not yet run), on the device; nothing of a request moves on the host (the scheduler
        reads the result with `read` after its wait, and appends the tokens)."""
        run, t = self.runner, self.steps
        n = len(reqs)
        bucket = run.bucket(n) if run.use_graphs else n
        pad = bucket - n
        ctx = run.pools.context_length
        solo = [rides_alone(r) for r in reqs]
        t_eff = [1 if s else max(1, min(t, ctx - 1 - r.cached)) for r, s in zip(reqs, solo, strict=True)] + [1] * pad
        limit = [max(1, r.params.max_new_tokens - len(r.output)) for r in reqs] + [1] * pad
        cached = [r.cached for r in reqs] + [0] * pad
        slots = run.dev([r.slot for r in reqs] + [PAD_SLOT] * pad)
        pending = run.dev([r.output[-1] for r in reqs] + [0] * pad)
        drafts = self.drafter.propose(slots, pending, t)
        fb = self._batch(slots, pending, drafts, run.dev(cached), min(ctx, max(cached) + t))
        out = run.run(fb, self.drafter.capture_layers)
        logits = out.logits.view(bucket, t, -1)

        sampler = run.sampler
        tm, cm = time.perf_counter(), time.thread_time()
        rows = RowSampling.gather(sampler, slots)
        params = [r.params for r in reqs]
        acc = verify_accept(logits, drafts, rows, run.dev(limit), run.dev(t_eff),
                            greedy=all(p.temperature == 0 for p in params),
                            processed=any(needs_processing(p) for p in params))
        if self.forced is not None:
            acc = self._force(acc, logits, drafts, run.dev(self.forced.accepts(reqs) + [0] * pad),
                              run.dev(t_eff), run.dev(limit))
        solo_mask = run.dev([int(x) for x in solo] + [0] * pad) != 0
        res = None
        if any(solo):
            alone = [r for r, s in zip(reqs, solo, strict=True) if s]
            sampler.prepare([r.slot for r in alone])
            variant = sampler.variant([r.params for r in alone], [r.slot for r in alone])
            res = sampler.step(logits[:, 0], torch.where(solo_mask, slots, PAD_SLOT), variant)
            tokens = acc.tokens.clone()
            tokens[:, 0] = torch.where(solo_mask, res.tokens, acc.tokens[:, 0])
            count = torch.where(solo_mask, 1, acc.count)
            j = torch.arange(t, device=tokens.device)[None, :]
            acc = Accepted(count, torch.where(j < count[:, None], tokens, REJECTED))
        live = slots != PAD_SLOT
        committed = torch.where(live, acc.count, 0)
        assert out.gdn_stash is not None
        self.model.commit_gdn(out.gdn_stash, slots, committed, t)
        commit_counts(sampler.counts, sampler.out_len, slots, acc, live & ~solo_mask)
        if self.drafter.capture_layers:
            assert out.features is not None
            self.drafter.extend(slots, out.features.view(bucket, t, -1), committed)
        run.stats.sample_s += time.perf_counter() - tm
        run.stats.sample_cpu_s += time.thread_time() - cm
        return Launched(acc, n, t_eff, solo, res)

    def _batch(self, slots: torch.Tensor, pending: torch.Tensor, drafts: torch.Tensor, cached: torch.Tensor,
               max_len: int) -> ForwardBatch:
        """The verify batch: B blocks of T decode rows, row (r, i) at position ``cached[r] + i`` (at most the
        context's last position), its slot's length one past it."""
        t, dev = self.steps, slots.device
        b = slots.shape[0]
        ids = torch.cat([pending[:, None], drafts], dim=1).reshape(-1)
        pos = (cached[:, None] + torch.arange(t, device=dev)[None, :]).clamp(max=self.runner.pools.context_length - 1)
        pos = pos.reshape(-1)
        row_slots = slots.repeat_interleave(t)
        return ForwardBatch(decode=True, input_ids=ids, positions=pos, token_slots=row_slots, slots=row_slots,
                            seq_lens=pos + 1, max_len=max_len, logits_rows=torch.arange(b * t, device=dev),
                            seq_slots=[], seq_starts=[], q_lens=[], spec_tokens=t)

    @staticmethod
    def _force(acc: Accepted, logits: torch.Tensor, drafts: torch.Tensor, accept: torch.Tensor,
               t_eff: torch.Tensor, limit: torch.Tensor) -> Accepted:
        """Forced acceptance: ``accept`` drafts (at most t_eff − 1) then the target's greedy token after them."""
        b, t, v = logits.shape
        f = torch.minimum(accept, t_eff - 1)
        argmax = sampling.greedy(logits.reshape(b * t, v)).view(b, t)
        j = torch.arange(t, device=logits.device)[None, :]
        padded = torch.cat([drafts, torch.zeros_like(drafts[:, :1])], dim=1)
        tokens = torch.where(j < f[:, None], padded, argmax.gather(1, f[:, None]))
        count = torch.minimum(f + 1, limit)
        return Accepted(count, torch.where(j < count[:, None], tokens, REJECTED))

    @staticmethod
    def read(launched: Launched) -> Verified:
        """The committed tokens on the host (the caller has waited for the device)."""
        n, acc = launched.rows, launched.accepted
        counts: list[int] = acc.count[:n].tolist()
        tokens: list[list[int]] = acc.tokens[:n].tolist()
        offered = [0 if s else te - 1 for te, s in zip(launched.t_eff[:n], launched.solo, strict=True)]
        return Verified([row[:c] for row, c in zip(tokens, counts, strict=True)], offered, launched.solo_result,
                        [i for i, s in enumerate(launched.solo) if s])
