"""Paired comparison of two systems over the same queries: is the difference real?

Both systems are scored on the same queries, so every statistic here works on the
per-query differences ``d_q = candidate_q - baseline_q`` (a paired design removes the
query-difficulty variance, which dwarfs the system difference in IR evaluation).

- **Interval**: percentile bootstrap of ``mean(d)``; queries are resampled with
  replacement, the same resamples for every metric so the intervals of one comparison
  are coherent. With ``n`` queries and ``B`` resamples the cost is ``O(B * n)`` per
  metric, done in blocks to bound memory.
- **Test**: the paired randomisation (sign-flip) test of Fisher / Pitman, the test
  Smucker, Allan & Carterette (CIKM 2007) recommend for IR: under H0 each ``d_q`` is
  equally likely to be ``+|d_q|`` or ``-|d_q|``; the two-sided p-value is the share of
  sign assignments whose ``|mean|`` is at least the observed one. It is exact (all
  ``2^m`` assignments, ``m`` = non-zero differences) when ``2^m <= n_resamples``;
  otherwise Monte Carlo with the ``(hits + 1) / (B + 1)`` estimate, which never
  returns 0 and keeps the test valid. ``test="wilcoxon"`` uses scipy's Wilcoxon
  signed-rank test instead (ranks, not means: robust to a few huge differences,
  but it tests the median, not the mean that the metrics report).
- **Many metrics**: ``compare`` adds Holm-adjusted p-values across the metrics of one
  comparison, so "some metric moved" is not over-claimed.

Everything is seeded and pure (numpy in, numbers out). pandas is imported by `compare`
alone: `compare_arrays` is the same comparison on arrays (the cross-validation of `tuner
best` runs it without loading pandas).
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Literal

import numpy as np

if TYPE_CHECKING:
    import pandas as pd
    from numpy.typing import ArrayLike

Test = Literal["permutation", "wilcoxon"]
_BLOCK = 1_000  # resamples per block: bounds memory at _BLOCK * n floats
_EXACT_LIMIT_BITS = 20  # never enumerate more than 2^20 sign assignments


@dataclass(frozen=True)
class PairedResult:
    """One metric of a paired comparison (delta = candidate - baseline)."""

    metric: str
    n: int
    baseline: float
    candidate: float
    delta: float
    ci_low: float
    ci_high: float
    p_value: float
    wins: int
    losses: int
    ties: int
    test: str

    def significant(self, alpha: float = 0.05) -> bool:
        return self.p_value < alpha

    def verdict(self, alpha: float = 0.05) -> Literal["better", "worse", "no difference"]:
        if not self.significant(alpha) or self.delta == 0:
            return "no difference"
        return "better" if self.delta > 0 else "worse"


def _diffs(baseline: ArrayLike, candidate: ArrayLike) -> np.ndarray:
    a = np.asarray(baseline, dtype=float)
    b = np.asarray(candidate, dtype=float)
    if a.shape != b.shape or a.ndim != 1:
        raise ValueError(f"paired scores must be two 1-d arrays of equal length, got {a.shape} and {b.shape}")
    if a.size == 0:
        raise ValueError("paired comparison of zero queries")
    if not (np.isfinite(a).all() and np.isfinite(b).all()):
        raise ValueError("paired scores contain NaN or inf; score every query (a handed-off query scores 0)")
    return b - a


def bootstrap_means(diffs: np.ndarray, *, n_resamples: int, seed: int) -> np.ndarray:
    """``n_resamples`` means of ``diffs`` resampled with replacement (rows = resamples).

    ``diffs`` may be 1-d (one metric) or 2-d (queries x metrics); every metric sees
    the same resampled query indices.
    """
    d = np.asarray(diffs, dtype=float)
    d2 = d.reshape(d.shape[0], -1)
    n = d2.shape[0]
    rng = np.random.default_rng(seed)
    out = np.empty((n_resamples, d2.shape[1]))
    for start in range(0, n_resamples, _BLOCK):
        stop = min(start + _BLOCK, n_resamples)
        idx = rng.integers(0, n, size=(stop - start, n))
        out[start:stop] = d2[idx].mean(axis=1)
    return out if d.ndim == 2 else out[:, 0]


def sign_flip_test(baseline: ArrayLike, candidate: ArrayLike, *, n_resamples: int = 10_000, seed: int = 0) -> float:
    """Two-sided p-value of the paired randomisation test on ``mean(candidate - baseline)``."""
    d = _diffs(baseline, candidate)
    nonzero = d[d != 0.0]
    if nonzero.size == 0:
        return 1.0
    observed = abs(nonzero.sum())
    # Compare sums (not means) with a relative tolerance: floating-point sums of the
    # same numbers in another order must still count as "as extreme".
    tol = 1e-9 * max(1.0, float(np.abs(nonzero).sum()))
    m = nonzero.size
    if m <= _EXACT_LIMIT_BITS and 2**m <= n_resamples:
        signs = np.array(list(itertools.product((1.0, -1.0), repeat=m)))
        sums = np.abs(signs @ nonzero)
        return float(np.mean(sums >= observed - tol))
    rng = np.random.default_rng(seed)
    hits = 0
    for start in range(0, n_resamples, _BLOCK):
        size = min(_BLOCK, n_resamples - start)
        signs = rng.choice((-1.0, 1.0), size=(size, m))
        hits += int(np.count_nonzero(np.abs(signs @ nonzero) >= observed - tol))
    return (hits + 1) / (n_resamples + 1)


def wilcoxon_test(baseline: ArrayLike, candidate: ArrayLike) -> float:
    """Two-sided p-value of scipy's Wilcoxon signed-rank test (zero differences dropped)."""
    from scipy import stats  # a second of imports, for this test only

    d = _diffs(baseline, candidate)
    if np.count_nonzero(d) == 0:
        return 1.0
    return float(stats.wilcoxon(d, zero_method="wilcox", alternative="two-sided").pvalue)


def paired_test(
    baseline: ArrayLike,
    candidate: ArrayLike,
    *,
    test: Test = "permutation",
    n_resamples: int = 10_000,
    seed: int = 0,
) -> float:
    if test == "permutation":
        return sign_flip_test(baseline, candidate, n_resamples=n_resamples, seed=seed)
    if test == "wilcoxon":
        return wilcoxon_test(baseline, candidate)
    raise ValueError(f"unknown paired test {test!r}; use 'permutation' or 'wilcoxon'")


def holm(p_values: Sequence[float]) -> np.ndarray:
    """Holm step-down adjusted p-values (family-wise error control, any dependence)."""
    p = np.asarray(p_values, dtype=float)
    order = np.argsort(p, kind="stable")
    m = p.size
    adjusted = np.empty(m)
    running = 0.0
    for rank, i in enumerate(order):
        running = max(running, min(1.0, (m - rank) * p[i]))
        adjusted[i] = running
    return adjusted


def compare(
    baseline: pd.DataFrame,
    candidate: pd.DataFrame,
    metrics: Sequence[str] | None = None,
    *,
    confidence: float = 0.95,
    n_resamples: int = 10_000,
    seed: int = 0,
    test: Test = "permutation",
) -> pd.DataFrame:
    """Paired comparison per metric of two per-query score frames (index = query_id).

    Rows are aligned on the query ids both frames share (a query missing from either
    is an error: a paired test needs every pair). Returns one row per metric with the
    ``PairedResult`` fields plus ``p_holm``.
    """
    import pandas as pd

    _check_confidence(confidence)
    metrics = list(metrics if metrics is not None else [c for c in baseline.columns if c in candidate.columns])
    missing = set(baseline.index) ^ set(candidate.index)
    if missing:
        raise ValueError(f"paired comparison needs the same queries on both sides; unmatched: {sorted(missing)[:5]}")
    cand = candidate.loc[baseline.index]
    a = baseline[metrics].to_numpy(dtype=float)
    b = cand[metrics].to_numpy(dtype=float)
    results = compare_arrays(a, b, metrics, confidence=confidence, n_resamples=n_resamples, seed=seed, test=test)
    rows = [asdict(r) for r in results]
    frame = pd.DataFrame(rows).set_index("metric")
    frame["p_holm"] = holm(frame["p_value"].to_numpy()) if len(frame) else []
    frame.attrs.update(confidence=confidence, n_resamples=n_resamples, seed=seed, test=test)
    return frame


def compare_arrays(
    baseline: np.ndarray,
    candidate: np.ndarray,
    metrics: Sequence[str],
    *,
    confidence: float = 0.95,
    n_resamples: int = 10_000,
    seed: int = 0,
    test: Test = "permutation",
) -> list[PairedResult]:
    """`compare` on score arrays already paired row by row (queries x metrics, one
    column per name in ``metrics``): a `PairedResult` per metric, no Holm adjustment."""
    _check_confidence(confidence)
    a = np.asarray(baseline, dtype=float)
    b = np.asarray(candidate, dtype=float)
    d = _diffs(a.ravel(), b.ravel()).reshape(a.shape)
    boot = bootstrap_means(d, n_resamples=n_resamples, seed=seed)
    tail = (1.0 - confidence) / 2.0
    lows, highs = np.quantile(boot, [tail, 1.0 - tail], axis=0)
    out = []
    for j, name in enumerate(metrics):
        p = paired_test(a[:, j], b[:, j], test=test, n_resamples=n_resamples, seed=seed + j)
        out.append(
            PairedResult(
                metric=name,
                n=len(d),
                baseline=float(a[:, j].mean()),
                candidate=float(b[:, j].mean()),
                delta=float(d[:, j].mean()),
                ci_low=float(lows[j]),
                ci_high=float(highs[j]),
                p_value=p,
                wins=int((d[:, j] > 0).sum()),
                losses=int((d[:, j] < 0).sum()),
                ties=int((d[:, j] == 0).sum()),
                test=test,
            )
        )
    return out


def _check_confidence(confidence: float) -> None:
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence must be in (0, 1), got {confidence}; e.g. 0.95")
