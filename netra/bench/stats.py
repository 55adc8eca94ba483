"""Statistics of the A/B gate: Welch's t, an exact permutation test, the interval, and the verdict.

All differences are ``mean(B) - mean(A)`` (B is the candidate, A the control).

The verdict rule (also written into every comparison record):

* the Welch 95% confidence interval of ``mean(B) - mean(A)`` must exclude zero, and
* the exact two-sided permutation p-value of the same difference must be ``<= alpha`` (0.05) —
  or, when the design is too small for any split to reach ``alpha`` (3 vs 3 runs: 20 splits, the
  smallest two-sided p is 2/20 = 0.10), it must equal the smallest achievable p, i.e. the two arms
  are completely separated;

then the verdict is ``better`` when the difference goes the good way for the metric (up for
throughput, down for latency) and ``worse`` otherwise. In every other case it is
``indistinguishable``. The two tests guard each other: Welch's interval assumes near-normal run
means, the permutation test assumes only exchangeability under "no difference".
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

ALPHA = 0.05
# Above this many splits the permutation distribution is sampled (seeded), never at the sizes
# compare runs (C(16, 8) = 12,870 for 8 runs per arm).
EXACT_LIMIT = 200_000

VERDICT_RULE = (
    "better/worse when the Welch 95% CI of mean(B)-mean(A) excludes 0 AND the exact two-sided permutation "
    "p <= 0.05 (or, when no split can reach 0.05, p equals its smallest achievable value: complete "
    "separation); direction by the metric (higher throughput, lower latency is better); otherwise "
    "indistinguishable"
)


class StatsError(ValueError):
    pass


@dataclass(frozen=True)
class Welch:
    diff: float
    se: float
    t: float
    df: float
    p: float
    ci_low: float
    ci_high: float


def _check(a: Sequence[float], b: Sequence[float]) -> None:
    if len(a) < 2 or len(b) < 2:
        raise StatsError(f"each arm needs at least 2 runs (got {len(a)} and {len(b)})")
    if not all(math.isfinite(x) for x in (*a, *b)):
        raise StatsError("every run value must be finite")


def welch(a: Sequence[float], b: Sequence[float], level: float = 0.95) -> Welch:
    """Welch's unequal-variance t test and interval for mean(b) - mean(a)."""
    from scipy import stats as sps

    _check(a, b)
    xa, xb = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    na, nb = xa.size, xb.size
    va, vb = xa.var(ddof=1) / na, xb.var(ddof=1) / nb
    diff = float(xb.mean() - xa.mean())
    se = math.sqrt(va + vb)
    if se == 0.0:
        # Both arms constant: the difference is exact (zero-width interval).
        return Welch(diff, 0.0, 0.0 if diff == 0 else math.copysign(math.inf, diff), float(na + nb - 2),
                     1.0 if diff == 0 else 0.0, diff, diff)
    df = (va + vb) ** 2 / (va**2 / (na - 1) + vb**2 / (nb - 1))
    t = diff / se
    p = float(2.0 * sps.t.sf(abs(t), df))
    half = float(sps.t.ppf(0.5 + level / 2.0, df)) * se
    return Welch(diff, se, t, float(df), p, diff - half, diff + half)


@dataclass(frozen=True)
class Permutation:
    diff: float
    p: float
    splits: int
    exact: bool
    p_min: float  # smallest two-sided p any split could give


def permutation_test(a: Sequence[float], b: Sequence[float], seed: int = 0,
                     samples: int = 200_000) -> Permutation:
    """Two-sided permutation test of mean(b) - mean(a), enumerating every split of the pooled runs.

    p = (number of splits whose |difference| >= the observed one) / (number of splits), the observed
    split included; ties within 1e-12 relative count as at least as extreme.
    """
    _check(a, b)
    pooled = np.asarray([*a, *b], dtype=np.float64)
    na, n = len(a), len(a) + len(b)
    total = pooled.sum()
    obs = float(np.mean(b) - np.mean(a))
    splits = math.comb(n, na)
    tol = 1e-12 * max(1.0, float(np.abs(pooled).max()))

    def diff_of(sum_a: np.ndarray) -> np.ndarray:
        return (total - sum_a) / (n - na) - sum_a / na

    if splits <= EXACT_LIMIT:
        idx = np.fromiter(itertools.chain.from_iterable(itertools.combinations(range(n), na)), dtype=np.int64,
                          count=splits * na).reshape(splits, na)
        diffs = diff_of(pooled[idx].sum(axis=1))
        exact = True
    else:
        rng = np.random.default_rng(seed)
        sums = np.array([pooled[rng.permutation(n)[:na]].sum() for _ in range(samples)])
        diffs = np.concatenate([[obs], diff_of(sums)])
        exact = False
    count = int(np.sum(np.abs(diffs) >= abs(obs) - tol))
    # The smallest p: only the observed split and its mirror image (when one exists) are as extreme.
    p_min = (2 if na == n - na else 1) / splits
    return Permutation(obs, count / diffs.size, splits, exact, p_min)


def verdict(a: Sequence[float], b: Sequence[float], higher_is_better: bool = True,
            alpha: float = ALPHA) -> dict[str, Any]:
    """The named verdict for candidate B against control A, with every number that decided it."""
    w = welch(a, b)
    perm = permutation_test(a, b)
    perm_alpha = max(alpha, perm.p_min)
    ci_excludes_zero = w.ci_low > 0 or w.ci_high < 0
    significant = ci_excludes_zero and perm.p <= perm_alpha + 1e-12
    if not significant:
        name = "indistinguishable"
    else:
        up = w.diff > 0
        name = "better" if up == higher_is_better else "worse"
    mean_a = float(np.mean(a))
    return {
        "verdict": name, "rule": VERDICT_RULE, "alpha": alpha, "permutation_alpha_effective": perm_alpha,
        "n_a": len(a), "n_b": len(b), "mean_a": mean_a, "mean_b": float(np.mean(b)),
        "sd_a": float(np.std(a, ddof=1)), "sd_b": float(np.std(b, ddof=1)),
        "diff": w.diff, "rel_diff": w.diff / mean_a if mean_a else None,
        "ci95": [w.ci_low, w.ci_high], "welch": asdict(w), "permutation": asdict(perm),
        "higher_is_better": higher_is_better,
    }
