from __future__ import annotations

import torch

from netra.ops import sampling


def _run(logits: torch.Tensor, temp: float, top_k: int = -1, top_p: float = 1.0, min_p: float = 0.0,
         seeds: list[int] | None = None, step: int = 0) -> torch.Tensor:
    b = logits.shape[0]
    seeds = seeds if seeds is not None else list(range(b))
    return sampling.sample(logits, torch.full((b,), temp), torch.full((b,), top_k), torch.full((b,), top_p),
                           torch.full((b,), min_p), torch.tensor(seeds), torch.full((b,), step))


def test_greedy_and_top_k_one_are_argmax() -> None:
    logits = torch.randn(9, 300, generator=torch.Generator().manual_seed(0))
    assert torch.equal(sampling.greedy(logits), logits.argmax(-1))
    assert torch.equal(_run(logits, 0.0), logits.argmax(-1))
    assert torch.equal(_run(logits, 1.3, top_k=1), logits.argmax(-1))


def test_mixed_rows_and_seed_determinism_independent_of_batch() -> None:
    logits = torch.randn(6, 100, generator=torch.Generator().manual_seed(1))
    temps = torch.tensor([0.0, 1.0, 0.7, 0.0, 2.0, 1.0])
    args = (torch.full((6,), -1), torch.ones(6), torch.zeros(6), torch.arange(100, 106), torch.full((6,), 3))
    out = sampling.sample(logits, temps, *args)
    assert out[0] == logits[0].argmax() and out[3] == logits[3].argmax()
    for i in range(6):
        alone = sampling.sample(logits[i:i + 1], temps[i:i + 1], *(a[i:i + 1] for a in args))
        assert alone[0] == out[i]
    # a different step or seed draws fresh noise
    draws = {int(_run(logits[1:2], 1.0, seeds=[7], step=s)[0]) for s in range(40)}
    assert len(draws) > 5


def test_frequencies_follow_the_tempered_distribution() -> None:
    logits = torch.tensor([[2.0, 1.0, 0.5, 0.0, -1.0]])
    n = 4000
    picks = _run(logits.repeat(n, 1), 0.8, seeds=list(range(n)))
    freq = torch.bincount(picks, minlength=5).double() / n
    expect = torch.softmax(logits[0].double() / 0.8, -1)
    assert (freq - expect).abs().max() < 0.03


def test_top_p_and_min_p_restrict_support() -> None:
    probs = torch.tensor([0.5, 0.3, 0.15, 0.05])
    logits = probs.log()[None].repeat(2000, 1)
    seeds = list(range(2000))
    assert set(_run(logits, 1.0, top_p=0.7, seeds=seeds).tolist()) == {0, 1}
    assert set(_run(logits, 1.0, top_p=0.5, seeds=seeds).tolist()) == {0}
    assert set(_run(logits, 1.0, min_p=0.4, seeds=seeds).tolist()) == {0, 1}
    assert set(_run(logits, 1.0, top_k=3, seeds=seeds).tolist()) == {0, 1, 2}
    noise = sampling.uniform_noise_ref(torch.tensor([1, -5, 2**62]), torch.tensor([0, 1, 2]),
                                       torch.arange(1000).repeat(3, 1))
    assert bool(((noise > 0) & (noise < 1)).all())
    assert abs(float(noise.mean()) - 0.5) < 0.03


def test_noise_never_reaches_one_and_a_masked_token_is_never_sampled() -> None:
    """The hash of (seed 0, step 0, token 45124) is the largest 24-bit value: its uniform once rounded to
    exactly 1 in FP32 (Gumbel noise +inf), and that token won over any logit, -inf included."""
    ids = torch.arange(248320)[None]
    noise = sampling.uniform_noise_ref(torch.tensor([0]), torch.tensor([0]), ids)
    assert float(noise.max()) == 1.0 - 2.0 ** -24 and float(noise[0, 45124]) == 1.0 - 2.0 ** -24
    logits = torch.zeros(1, 248320)
    logits[0, 45124] = float("-inf")
    assert int(_run(logits, 1.0, seeds=[0])[0]) != 45124

