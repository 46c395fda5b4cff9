"""Paired bootstrap intervals and paired tests: coverage, size, power, exact values."""

from __future__ import annotations

import itertools

import numpy as np
import pandas as pd
import pytest

from tuner.metrics.significance import (
    compare,
    holm,
    paired_test,
    sign_flip_test,
    wilcoxon_test,
)


def paired_sample(rng, n, delta, noise=0.08):
    base = rng.uniform(0.2, 0.8, n)
    return base, base + delta + rng.normal(0.0, noise, n)


def interval(baseline, candidate, **kwargs):
    """compare()'s bootstrap interval of one metric: (ci_low, ci_high)."""
    row = compare(pd.DataFrame({"m": baseline}), pd.DataFrame({"m": candidate}), ["m"], **kwargs).loc["m"]
    return row["ci_low"], row["ci_high"]


def test_bootstrap_ci_covers_true_delta_at_about_nominal_rate():
    rng = np.random.default_rng(11)
    reps, n, true_delta, nominal = 300, 50, 0.02, 0.95
    covered = 0
    for r in range(reps):
        a, b = paired_sample(rng, n, true_delta)
        low, high = interval(a, b, confidence=nominal, n_resamples=2000, seed=r)
        covered += low <= true_delta <= high
    rate = covered / reps
    # Binomial sd of the rate at the nominal level; percentile bootstrap under-covers a
    # little for n=50, so allow 3.5 sd below and 3 sd above.
    sd = np.sqrt(nominal * (1 - nominal) / reps)
    assert nominal - 3.5 * sd <= rate <= nominal + 3 * sd, rate


def test_bootstrap_ci_contains_observed_mean_and_shrinks_with_n():
    rng = np.random.default_rng(3)
    a, b = paired_sample(rng, 400, 0.05)
    low, high = interval(a, b, seed=1)
    assert low < np.mean(b - a) < high
    a2, b2 = a[:40], b[:40]
    low2, high2 = interval(a2, b2, seed=1)
    # The width scales like 1/sqrt(n): 10x the queries, about sqrt(10)x narrower.
    assert (high2 - low2) / (high - low) == pytest.approx(np.sqrt(10), rel=0.35)


def test_exact_sign_flip_p_value_is_the_enumerated_share():
    d = np.array([0.1, 0.2, 0.3])
    sums = [abs(np.dot(s, d)) for s in itertools.product((1, -1), repeat=3)]
    expected = np.mean([x >= abs(d.sum()) - 1e-12 for x in sums])
    assert sign_flip_test(np.zeros(3), d) == pytest.approx(expected)  # = 2/8


def test_monte_carlo_p_value_approximates_exact_one():
    rng = np.random.default_rng(5)
    d = rng.normal(0.03, 0.1, 14)
    enumerated = np.array([abs(np.dot(s, d)) for s in itertools.product((1, -1), repeat=14)])
    exact = np.mean(enumerated >= abs(d.sum()) - 1e-12)
    mc = sign_flip_test(np.zeros(14), d, n_resamples=20_000, seed=2)
    assert mc == pytest.approx(exact, abs=4 * np.sqrt(exact * (1 - exact) / 20_000) + 1e-4)


def test_zero_differences_are_ignored_and_all_zero_gives_one():
    a = np.array([0.5, 0.5, 0.2, 0.9])
    assert sign_flip_test(a, a) == 1.0
    assert wilcoxon_test(a, a) == 1.0
    with_zeros = sign_flip_test(np.zeros(5), np.array([0.0, 0.0, 0.1, 0.2, 0.3]))
    assert with_zeros == sign_flip_test(np.zeros(3), np.array([0.1, 0.2, 0.3]))


@pytest.mark.parametrize("test", ["permutation", "wilcoxon"])
def test_tests_hold_their_size_under_h0_and_have_power(test):
    rng = np.random.default_rng(21)
    reps, alpha = 300, 0.05
    null_rejects = sum(
        paired_test(*paired_sample(rng, 40, 0.0), test=test, n_resamples=2000, seed=r) < alpha for r in range(reps)
    )
    sd = np.sqrt(alpha * (1 - alpha) / reps)
    assert null_rejects / reps <= alpha + 3 * sd
    power = np.mean([
        paired_test(*paired_sample(rng, 40, 0.06), test=test, n_resamples=2000, seed=r) < alpha for r in range(100)
    ])
    assert power >= 0.9


def test_holm_matches_step_down_formula():
    p = [0.01, 0.04, 0.03]
    # sorted 0.01, 0.03, 0.04 -> 3*0.01, max(., 2*0.03), max(., 1*0.04)
    expected = [3 * 0.01, max(3 * 0.01, 2 * 0.03, 0.04), max(3 * 0.01, 2 * 0.03)]
    assert holm(p) == pytest.approx(expected)
    assert holm([0.9, 0.8]).max() <= 1.0


def test_compare_aligns_queries_and_reports_counts():
    ids = [f"q{i}" for i in range(30)]
    rng = np.random.default_rng(8)
    base = pd.DataFrame({"A": rng.uniform(size=30), "B": rng.uniform(size=30)}, index=ids)
    cand = base.copy()
    cand["A"] += np.where(np.arange(30) % 3 == 0, 0.1, 0.0)
    cand = cand.iloc[::-1]  # other order: must be aligned by query id
    table = compare(base, cand, ["A", "B"], n_resamples=2000, seed=4)
    assert table.loc["A", "delta"] == pytest.approx(0.1 * 10 / 30)
    assert (table.loc["A", "wins"], table.loc["A", "losses"], table.loc["A", "ties"]) == (10, 0, 20)
    assert table.loc["B", "delta"] == 0 and table.loc["B", "p_value"] == 1.0
    assert table.loc["A", "ci_low"] <= table.loc["A", "delta"] <= table.loc["A", "ci_high"]
    assert table.loc["A", "p_value"] < 0.01
    assert list(table["p_holm"]) == pytest.approx(list(holm(table["p_value"])))
    with pytest.raises(ValueError, match="same queries"):
        compare(base, cand.iloc[1:], ["A"])


def test_bad_inputs_are_rejected():
    with pytest.raises(ValueError, match="NaN"):
        interval([0.1, np.nan], [0.2, 0.3])
    with pytest.raises(ValueError, match="equal length"):
        sign_flip_test([0.1], [0.2, 0.3])
    with pytest.raises(ValueError, match="confidence"):
        interval([0.1], [0.2], confidence=95)
