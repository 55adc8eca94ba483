"""Speculative decoding is lossless under sampling, end to end (tiny preset, CPU): a statistical test.

Many requests with one prompt and different seeds sample through the speculative engine (T = 3, a drafter that
proposes the target's own likely tokens, so drafts are accepted and rejected at every position); the histogram
of the tokens at each output position is tested against the exact marginal distribution of sequential sampling,
computed from the target's distributions (`accept.filtered_logprobs`, the sampler's own filters) over every
prefix that can occur. Threshold: Pearson's chi-square goodness of fit with p > 1e-3 at each position (expected
counts under 5 pooled). The seeds are fixed, so the test is deterministic; with these samples the same test
rejects the last position's marginal at temperature 0.5 instead of 0.8 at p < 1e-6, which shows its power.

Lossless is not "the same tokens as plain decoding with the same seed": the acceptance uniforms are extra
randomness, so a row's tokens depend on the drafts it was offered (netra/engine/spec/accept.py).
"""

from __future__ import annotations

import random

import torch

from netra.engine.engine import Engine, build_engine
from netra.engine.model import prefill_batch
from netra.engine.options import EngineOptions
from netra.engine.request import Request, SamplingParams
from netra.engine.spec.accept import filtered_logprobs
from netra.engine.spec.step import SpecStep

N = 200  # requests (seeds), in one batch
POSITIONS = 3  # output positions tested (a fourth token lets the second draft of a block be accepted)
TOP_K, TEMPERATURE = 5, 0.8
PARAMS = SamplingParams(max_new_tokens=POSITIONS + 1, temperature=TEMPERATURE, top_k=TOP_K, ignore_eos=True)
PROMPT = [5, 17, 99, 3, 250, 7]


def _distributions(e: Engine, prefixes: list[tuple[int, ...]], temperature: float) -> torch.Tensor:
    """The sampler's distribution after ``PROMPT + prefix`` for each prefix ``[n, V]`` float64 (one prefill batch,
    one slot each, from zero state)."""
    m = e.model
    m.pools.ssm.zero_()
    m.pools.conv.zero_()
    logits = m.forward(prefill_batch(m.device, [(i + 1, PROMPT + list(p), 0, True) for i, p in enumerate(prefixes)]))
    n = len(prefixes)

    def full(v: float, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        return torch.full((n,), v, dtype=dtype)

    return filtered_logprobs(logits, full(temperature), full(TOP_K, torch.int64), full(1.0), full(0.0)).double().exp()


def _marginals(e: Engine, temperature: float) -> tuple[list[torch.Tensor], dict[tuple[int, ...], torch.Tensor]]:
    """Exact marginals of output positions 0..POSITIONS-1 under sequential sampling, and the conditional
    distribution after every prefix of positive probability."""
    level: dict[tuple[int, ...], float] = {(): 1.0}
    marginals, conditional = [], {}
    for _ in range(POSITIONS):
        prefixes = list(level)
        dists = _distributions(e, prefixes, temperature)
        marginal = torch.zeros(dists.shape[1], dtype=torch.float64)
        nxt: dict[tuple[int, ...], float] = {}
        for prefix, d in zip(prefixes, dists, strict=True):
            conditional[prefix] = d
            marginal += level[prefix] * d
            for tok in torch.nonzero(d > 0).flatten().tolist():
                nxt[(*prefix, tok)] = level[prefix] * float(d[tok])
        marginals.append(marginal)
        level = nxt
    return marginals, conditional


class LikelyDrafter:
    """Drafts from the target's exact conditionals: its argmax or a draw, half the time each (a good drafter,
    not a perfect one)."""

    capture_layers: tuple[int, ...] = ()

    def __init__(self, conditional: dict[tuple[int, ...], torch.Tensor]) -> None:
        self.cond, self.reqs = conditional, {}
        self.rng, self.gen = random.Random(0), torch.Generator().manual_seed(0)

    def admit(self, slot: int, request: Request) -> None:
        self.reqs[slot] = request

    def release(self, slot: int) -> None:
        self.reqs.pop(slot, None)

    def extend(self, slots: torch.Tensor, features: torch.Tensor, counts: torch.Tensor) -> None:
        pass

    def propose(self, slots: torch.Tensor, pending: torch.Tensor, steps: int) -> torch.Tensor:
        rows = []
        for slot in slots.tolist():
            req = self.reqs.get(slot)
            prefix: tuple[int, ...] | None = tuple(req.output) if req is not None else None
            row = []
            for _ in range(steps - 1):
                d = self.cond.get(prefix) if prefix is not None else None
                if d is None:
                    row.append(0)
                    prefix = None
                    continue
                tok = int(d.argmax()) if self.rng.random() < 0.5 else int(torch.multinomial(d.float(), 1,
                                                                                            generator=self.gen))
                row.append(tok)
                prefix = (*prefix, tok) if prefix is not None else None
            rows.append(row)
        return torch.tensor(rows, dtype=torch.int64).view(len(rows), steps - 1)


def _goodness_of_fit(counts: torch.Tensor, probs: torch.Tensor) -> float:
    """Pearson's chi-square p-value of ``counts`` against ``probs`` (bins expecting fewer than 5 pooled)."""
    expected = probs * counts.sum()
    big = expected >= 5
    obs = torch.cat([counts[big], counts[~big].sum()[None]])
    exp = torch.cat([expected[big], expected[~big].sum()[None]])
    keep = exp > 0
    obs, exp = obs[keep], exp[keep]
    chi2 = ((obs - exp) ** 2 / exp).sum()
    df = torch.tensor((obs.numel() - 1) / 2, dtype=torch.float64)
    return float(torch.special.gammaincc(df, chi2 / 2))


def test_sampled_tokens_follow_the_target_distribution_at_every_position() -> None:
    e = build_engine(EngineOptions(context_length=64, max_running_requests=N))
    marginals, conditional = _marginals(e, TEMPERATURE)
    wrong, _ = _marginals(e, 0.5)
    e.scheduler.speculate(SpecStep(e.scheduler.runner, LikelyDrafter(conditional), 3))
    out: dict[str, list[int]] = {}
    for s in range(N):
        e.scheduler.submit(Request(f"s{s}", PROMPT, PARAMS, lambda o: out.setdefault(o.rid, []).extend(o.new_ids),
                                   seed=7919 * s + 1))
    e.scheduler.run_until_idle()
    st = e.scheduler.stats
    assert st.accepted_per_pos.get(0, 0) > N // 4 and st.accepted_per_pos.get(1, 0) > N // 20, st.accepted_per_pos
    assert st.accepted_tokens < st.draft_tokens  # rejections happen too
    for pos in range(POSITIONS):
        counts = torch.zeros(marginals[pos].shape[0], dtype=torch.float64)
        for rid in out:
            counts[out[rid][pos]] += 1
        assert counts.sum() == N
        p = _goodness_of_fit(counts, marginals[pos])
        assert p > 1e-3, (pos, p)
        if pos == POSITIONS - 1:  # the same samples tell the marginals of another temperature apart
            assert _goodness_of_fit(counts, wrong[pos]) < 1e-6
