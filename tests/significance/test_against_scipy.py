"""Cross-check the paired test and the bootstrap interval against scipy.stats.

scipy's ``permutation_test`` with ``permutation_type="samples"`` on two paired samples
swaps the members of each pair: the sign-flip test on the differences. Its two-sided
p-value is ``2 * min(one-sided)``, which equals our ``P(|sum| >= |observed|)``
because the sign-flip null distribution is symmetric about 0. ``bootstrap`` with
``paired=True, method="percentile"`` resamples queries like ``compare`` does.

scipy is a runtime dependency (significance.py imports it), so no skip is needed.
The data are seeded; the tolerances below are Monte-Carlo error bounds, not fudge.
"""

from __future__ import annotations

import inspect
import math

import numpy as np
import pandas as pd
import pytest
from scipy import stats

from tuner.metrics.significance import compare, sign_flip_test

B = 40_000  # resamples per side: keeps a 4-sd band narrow (see the tolerances)


def seeded(seed: int) -> dict[str, object]:
    """scipy's seed keyword: ``rng`` since 1.15, ``random_state`` before (pyproject allows 1.11)."""
    key = "rng" if "rng" in inspect.signature(stats.bootstrap).parameters else "random_state"
    return {key: np.random.default_rng(seed)}


def paired_scores(seed: int, n: int, delta: float) -> tuple[np.ndarray, np.ndarray]:
    """Per-query scores of a baseline (skewed, like IR metrics) and a candidate ``delta`` better
    on average (not clipped: clipping at 0 would add its own shift to the difference)."""
    rng = np.random.default_rng(seed)
    base = rng.beta(2.0, 5.0, n)
    return base, base + delta + rng.normal(0.0, 0.1, n)


def scipy_p_value(baseline, candidate, n_resamples: float, seed: int) -> float:
    result = stats.permutation_test(
        (candidate, baseline), lambda x, y, axis: np.mean(x - y, axis=axis), permutation_type="samples",
        vectorized=True, n_resamples=n_resamples, alternative="two-sided", **seeded(seed))
    return float(result.pvalue)


def mc_sd(p: float, n_resamples: int) -> float:
    """Standard deviation of a Monte-Carlo p-value estimated from ``n_resamples`` draws."""
    return math.sqrt(p * (1.0 - p) / n_resamples)


def test_exact_sign_flip_equals_scipy_exact_permutation_test():
    a, b = paired_scores(seed=1, n=12, delta=0.04)
    assert np.count_nonzero(b - a) == 12  # all 2^12 sign assignments enumerated on both sides
    ours = sign_flip_test(a, b, n_resamples=10_000)
    theirs = scipy_p_value(a, b, n_resamples=np.inf, seed=0)
    assert ours == pytest.approx(theirs, abs=1e-12)


@pytest.mark.parametrize(("seed", "n", "delta"), [(2, 18, 0.03), (3, 18, 0.0)])
def test_monte_carlo_sign_flip_agrees_with_scipy_exact(seed, n, delta):
    a, b = paired_scores(seed, n, delta)
    theirs = scipy_p_value(a, b, n_resamples=np.inf, seed=0)  # 2^18 assignments: exact
    ours = sign_flip_test(a, b, n_resamples=B, seed=seed)
    # Only our side is random: 4 sd of a binomial share over B draws (+ the 1/(B+1)
    # of the (hits+1)/(B+1) estimate) misses a correct p-value with probability ~6e-5.
    assert ours == pytest.approx(theirs, abs=4 * mc_sd(theirs, B) + 1 / (B + 1))


def test_monte_carlo_sign_flip_agrees_with_scipy_monte_carlo():
    a, b = paired_scores(seed=5, n=60, delta=0.02)
    ours = sign_flip_test(a, b, n_resamples=B, seed=7)
    theirs = scipy_p_value(a, b, n_resamples=B, seed=8)
    assert 0.001 < theirs < 0.5  # a p-value where Monte-Carlo error matters
    # Two independent estimates of the same p: the sd of their difference is
    # sqrt(2) x one estimate's; 4 of those, plus both +1 corrections.
    assert ours == pytest.approx(theirs, abs=4 * math.sqrt(2) * mc_sd(theirs, B) + 2 / (B + 1))


def test_compare_intervals_agree_with_scipy_percentile_bootstrap():
    n, confidence = 100, 0.95
    rng = np.random.default_rng(5)
    baseline = pd.DataFrame({m: rng.beta(2.0, 5.0, n) for m in ("NDCG@10", "ERR@10")})
    candidate = (baseline + rng.normal(0.02, 0.1, (n, 2))).clip(0.0, 1.0)
    # A 0/1 metric: differences in {-1, 0, 1} make a lumpy bootstrap distribution.
    baseline["P@1"], candidate["P@1"] = rng.integers(0, 2, n).astype(float), rng.integers(0, 2, n).astype(float)
    table = compare(baseline, candidate, list(baseline.columns), confidence=confidence, n_resamples=B, seed=9)
    tail = (1.0 - confidence) / 2.0
    for metric in baseline.columns:
        d = (candidate[metric] - baseline[metric]).to_numpy()
        theirs = stats.bootstrap((candidate[metric].to_numpy(), baseline[metric].to_numpy()),
                                 lambda x, y, axis: np.mean(x - y, axis=axis), paired=True, vectorized=True,
                                 n_resamples=B, confidence_level=confidence, method="percentile",
                                 **seeded(10)).confidence_interval
        # A quantile q estimated from B draws has sd sqrt(q(1-q)/B) / f(x_q). The
        # bootstrap mean is close to normal with sd se = std(d)/sqrt(n), so
        # f(x_q) = phi(z_q) / se. Both endpoints come from independent resamples on
        # the two sides (x sqrt(2)); 5 sd leaves room for the normal approximation
        # of a skewed, lumpy bootstrap distribution.
        se = d.std() / math.sqrt(n)
        sd = math.sqrt(tail * (1.0 - tail) / B) / stats.norm.pdf(stats.norm.ppf(tail)) * se
        tolerance = 5 * math.sqrt(2) * sd
        assert table.loc[metric, "ci_low"] == pytest.approx(theirs.low, abs=tolerance), metric
        assert table.loc[metric, "ci_high"] == pytest.approx(theirs.high, abs=tolerance), metric
