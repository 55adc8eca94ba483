"""The A/B gate's statistics against hand-computed values and scipy's reference implementations."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
from scipy import stats as sps

from netra.bench import stats


def test_welch_hand_computed() -> None:
    # a = 1,2,3 ; b = 4,5,6: means 2 and 5, sample variances 1 and 1.
    w = stats.welch([1, 2, 3], [4, 5, 6])
    se = math.sqrt(1 / 3 + 1 / 3)
    assert w.diff == pytest.approx(3.0)
    assert w.se == pytest.approx(se)
    assert w.t == pytest.approx(3.0 / se)
    assert w.df == pytest.approx(4.0)  # (2/3)^2 / ((1/3)^2/2 * 2)
    half = sps.t.ppf(0.975, 4.0) * se  # t_{0.975, 4} = 2.776445
    assert sps.t.ppf(0.975, 4.0) == pytest.approx(2.776445, abs=1e-6)
    assert (w.ci_low, w.ci_high) == pytest.approx((3.0 - half, 3.0 + half))
    assert w.p == pytest.approx(0.021312, abs=1e-5)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_welch_matches_scipy_unequal_variances(seed: int) -> None:
    rng = np.random.default_rng(seed)
    a = rng.normal(100, 3, size=4)
    b = rng.normal(103, 9, size=5)
    w = stats.welch(a, b)
    ref = sps.ttest_ind(b, a, equal_var=False)
    assert w.t == pytest.approx(ref.statistic)
    assert w.p == pytest.approx(ref.pvalue)
    ci = ref.confidence_interval(0.95)
    assert (w.ci_low, w.ci_high) == pytest.approx((ci.low, ci.high))


def test_permutation_hand_computed_three_by_three() -> None:
    # 20 splits of 6 values; only the observed split and its mirror reach |diff| = 3.
    p = stats.permutation_test([1, 2, 3], [4, 5, 6])
    assert (p.splits, p.exact) == (20, True)
    assert p.diff == pytest.approx(3.0)
    assert p.p == pytest.approx(2 / 20)
    assert p.p_min == pytest.approx(2 / 20)
    # Overlapping arms: enumerate by hand.
    a, b = [1.0, 4.0, 2.0], [3.0, 5.0, 2.5]
    pooled = a + b
    obs = np.mean(b) - np.mean(a)
    count = 0
    for comb in itertools.combinations(range(6), 3):
        sa = [pooled[i] for i in comb]
        sb = [pooled[i] for i in range(6) if i not in comb]
        count += abs(np.mean(sb) - np.mean(sa)) >= abs(obs) - 1e-12
    assert stats.permutation_test(a, b).p == pytest.approx(count / 20)


@pytest.mark.parametrize("sizes", [(3, 3), (4, 4), (3, 5)])
def test_permutation_matches_scipy_exact(sizes: tuple[int, int]) -> None:
    rng = np.random.default_rng(sum(sizes))
    a, b = rng.normal(0, 1, sizes[0]), rng.normal(0.8, 1, sizes[1])
    ref = sps.permutation_test((b, a), lambda x, y: np.mean(x) - np.mean(y), permutation_type="independent",
                               alternative="two-sided", n_resamples=np.inf)
    assert stats.permutation_test(a, b).p == pytest.approx(ref.pvalue)


def test_verdicts_follow_the_rule() -> None:
    a = [1000.0, 1004.0, 998.0, 1001.0]
    up = [1100.0, 1103.0, 1098.0, 1101.0]
    assert stats.verdict(a, up)["verdict"] == "better"
    assert stats.verdict(up, a)["verdict"] == "worse"
    assert stats.verdict(a, up, higher_is_better=False)["verdict"] == "worse"  # latency up is worse
    noise = [1001.0, 999.0, 1003.0, 1000.0]
    v = stats.verdict(a, noise)
    assert v["verdict"] == "indistinguishable" and v["ci95"][0] < 0 < v["ci95"][1]
    # 3 vs 3 completely separated and Welch-significant: better at the smallest achievable p (0.1).
    v3 = stats.verdict([10.0, 10.2, 9.9], [11.0, 11.1, 10.9])
    assert v3["verdict"] == "better" and v3["permutation"]["p"] == pytest.approx(0.1)
    assert v3["permutation_alpha_effective"] == pytest.approx(0.1)
    # Separated but so noisy that Welch's interval includes zero: indistinguishable.
    assert stats.verdict([1.0, 2.0, 30.0], [31.0, 32.0, 60.0])["verdict"] == "indistinguishable"
    # Overlap: one B run below an A run -> permutation p > p_min -> indistinguishable.
    assert stats.verdict([10.0, 10.2, 9.9], [11.0, 11.1, 10.1])["verdict"] == "indistinguishable"


def test_stats_reject_too_few_runs() -> None:
    with pytest.raises(stats.StatsError, match="at least 2 runs"):
        stats.verdict([1.0], [2.0, 3.0])
    with pytest.raises(stats.StatsError, match="finite"):
        stats.welch([1.0, math.nan], [2.0, 3.0])
