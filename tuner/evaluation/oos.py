"""Out-of-scope analysis: did the backend answer what it should and hand off the rest?

Pure functions over per-query arrays. A query is *answered* when the response says
``handoff: false`` or, when the response has no handoff field, when it returned at
least one result. Handoff detection is scored as a binary classifier whose positive
prediction is "hand off" and whose positive class is "out of scope":

- OOS_FP_Rate = answered OOS queries / OOS queries (the constraint the tuner keeps low)
- InScope_Handoff_Rate = handed-off in-scope queries / in-scope queries
- Handoff_Precision / Recall / F1, and the mirror view Answer_Precision / Recall / F1
  (positive prediction "answer", positive class "in scope").

A ratio with an empty denominator is 0.0 (the scikit-learn ``zero_division=0``
convention), so every value is a finite number a gate or a constraint can compare;
the counts that explain a 0.0 sit next to it in the scorecard (N_OOS_Queries, ...).
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable, Sequence

import numpy as np
import pandas as pd
from numpy.typing import ArrayLike

#: step of the default sweep grid (0.00, 0.02, ..., 1.00 for confidences in [0, 1])
DEFAULT_STEP = 0.02
#: the default grid grows its step past DEFAULT_STEP to stay within this many points
MAX_DEFAULT_POINTS = 101

OOS_METRICS: tuple[str, ...] = (
    "OOS_FP_Rate",
    "InScope_Handoff_Rate",
    "Handoff_Precision",
    "Handoff_Recall",
    "Handoff_F1",
    "Answer_Precision",
    "Answer_Recall",
    "Answer_F1",
)


def answered_mask(handoff: Sequence[bool | None], n_results: Sequence[int]) -> np.ndarray:
    """Per query: True when the backend answered (see module doc)."""
    counts = np.asarray(n_results, dtype=np.int64)
    flags = np.array([h if h is not None else c == 0 for h, c in zip(handoff, counts, strict=True)], dtype=bool)
    return ~flags


def _ratio(num: np.ndarray | float, den: np.ndarray | float) -> np.ndarray:
    num_a, den_a = np.asarray(num, dtype=float), np.asarray(den, dtype=float)
    return np.divide(num_a, den_a, out=np.zeros(np.broadcast(num_a, den_a).shape), where=den_a > 0)


def _f1(precision: np.ndarray, recall: np.ndarray) -> np.ndarray:
    return _ratio(2 * precision * recall, precision + recall)


def oos_rates(is_oos: np.ndarray, answered: np.ndarray) -> dict[str, np.ndarray]:
    """The OOS metrics for one answered-mask (1-D) or several stacked (2-D, one row each)."""
    oos, ins = is_oos.astype(bool), ~is_oos.astype(bool)
    handoff = ~answered
    n_oos, n_in = oos.sum(), ins.sum()
    tp = (handoff & oos).sum(axis=-1)  # OOS handed off
    fp = (handoff & ins).sum(axis=-1)  # in-scope handed off
    ans_in = (answered & ins).sum(axis=-1)
    ans_oos = (answered & oos).sum(axis=-1)
    h_p, h_r = _ratio(tp, tp + fp), _ratio(tp, n_oos)
    a_p, a_r = _ratio(ans_in, ans_in + ans_oos), _ratio(ans_in, n_in)
    return {
        "OOS_FP_Rate": _ratio(ans_oos, n_oos),
        "InScope_Handoff_Rate": _ratio(fp, n_in),
        "Handoff_Precision": h_p,
        "Handoff_Recall": h_r,
        "Handoff_F1": _f1(h_p, h_r),
        "Answer_Precision": a_p,
        "Answer_Recall": a_r,
        "Answer_F1": _f1(a_p, a_r),
    }


def handoff_metrics(is_oos: ArrayLike, answered: ArrayLike) -> dict[str, float]:
    """The OOS / handoff scorecard for one batch."""
    rates = oos_rates(np.asarray(is_oos, dtype=bool), np.asarray(answered, dtype=bool))
    return {name: float(value) for name, value in rates.items()}


def threshold_grid(
    confidences: Iterable[float | None] = (),
    *,
    sweep_range: tuple[float, float, float] | None = None,
    include: Iterable[float | None] = (),
) -> tuple[float, ...]:
    """The thresholds a sweep covers, ascending, each rounded so it prints and compares exactly.

    With ``sweep_range`` ``(low, high, step)`` (a solved gate's declared range): low,
    low+step, ..., high. Without: 0 .. max(1, highest confidence) (from the lowest one
    when it is negative) in DEFAULT_STEP steps, a coarser round step when that would
    exceed MAX_DEFAULT_POINTS. Each finite value of ``include`` (the threshold in effect)
    is a point as given, replacing a grid point within 1e-9 of it.
    """
    if sweep_range is not None:
        low, high, step = (float(v) for v in sweep_range)
        if not (math.isfinite(low) and math.isfinite(high) and math.isfinite(step)) or high < low or step <= 0:
            raise ValueError(
                f"threshold sweep range {sweep_range!r}: pass (low, high, step) with low <= high, step > 0"
            )
        grid = _grid(low, high, step)
    else:
        seen = np.array([c for c in confidences if c is not None], dtype=float)
        seen = seen[np.isfinite(seen)]
        top, bottom = max(1.0, float(seen.max(initial=1.0))), min(0.0, float(seen.min(initial=0.0)))
        step = DEFAULT_STEP
        if (top - bottom) / step + 1 > MAX_DEFAULT_POINTS:
            step = _round_step((top - bottom) / (MAX_DEFAULT_POINTS - 2))
        grid = _grid(math.floor(bottom / step + 1e-9) * step, math.ceil(top / step - 1e-9) * step, step)
    for value in include:
        if value is not None and math.isfinite(value):
            grid = np.append(grid[np.abs(grid - value) > 1e-9], float(value))
    return tuple(float(t) for t in np.sort(grid))


def _grid(low: float, high: float, step: float) -> np.ndarray:
    n = math.floor((high - low) / step + 1e-9) + 1
    decimals = max(0, -math.floor(math.log10(step))) + 3
    return np.unique(np.round(np.append(low + step * np.arange(n), high), decimals))


def _round_step(at_least: float) -> float:
    """The smallest of 1, 2, 2.5, 5 times a power of ten that is >= ``at_least``."""
    power = 10.0 ** math.floor(math.log10(at_least))
    return next(m * power for m in (1, 2, 2.5, 5, 10) if m * power >= at_least - 1e-12)


def threshold_sweep(
    is_oos: ArrayLike,
    confidence: Sequence[float | None],
    n_results: Sequence[int],
    primary_scores: ArrayLike | None = None,
    thresholds: Sequence[float] | None = None,
    *,
    observed_scores: ArrayLike | None = None,
) -> pd.DataFrame | None:
    """What the OOS metrics would be if the backend answered exactly when
    ``confidence >= t`` (and it has results), for each threshold ``t``.

    Queries without a confidence value (e.g. failed requests) take no part in the
    classification counts. ``primary_scores`` (per query, on the raw ranking, NaN for
    OOS) adds the in-scope mean Primary_Metric_Score each threshold would give (a
    handed-off query scores 0); queries without confidence contribute their
    ``observed_scores`` (default: ``primary_scores``) at every threshold.
    ``thresholds`` defaults to ``threshold_grid`` over the observed confidences.
    Returns None when no query carries a confidence value.
    """
    conf = np.array([np.nan if c is None else c for c in confidence], dtype=float)
    has = ~np.isnan(conf)
    if not has.any():
        return None
    oos = np.asarray(is_oos, dtype=bool)
    results = np.asarray(n_results, dtype=np.int64) > 0
    ts = np.asarray(threshold_grid(conf[has]) if thresholds is None else thresholds, dtype=float)
    answer = (conf[has][None, :] >= ts[:, None] - 1e-12) & results[has][None, :]
    frame = pd.DataFrame(oos_rates(oos[has], answer), index=pd.Index(ts, name="threshold"))
    frame.insert(0, "n_handoff", (~answer).sum(axis=1))
    frame.insert(0, "n", int(has.sum()))
    if primary_scores is not None:
        raw = np.nan_to_num(np.asarray(primary_scores, dtype=float))
        seen = raw if observed_scores is None else np.nan_to_num(np.asarray(observed_scores, dtype=float))
        per = np.tile(seen, (len(ts), 1))
        per[:, has] = np.where(answer, raw[has][None, :], 0.0)
        ins = ~oos
        frame["Primary_Metric_Score"] = per[:, ins].mean(axis=1) if ins.any() else 0.0
    return frame


def fallback_histogram(query_types: Sequence[str], levels: Sequence[str | None]) -> pd.DataFrame | None:
    """Counts of fallback levels per query_type (rows) and level (columns), plus an
    ``all`` row; None when no response carried a fallback level."""
    # Counted with a Counter rather than pd.crosstab: the same table in a tenth of
    # the time, and it runs after a trial's last answer.
    # a missing level comes as None or, out of a pandas string column, as NaN (lv != lv)
    counts = Counter((qt, lv) for qt, lv in zip(query_types, levels, strict=True) if lv is not None and lv == lv)
    if not counts:
        return None
    rows = sorted({qt for qt, _ in counts})
    columns = sorted({lv for _, lv in counts}, key=_level_key)
    values = np.array([[counts.get((qt, lv), 0) for lv in columns] for qt in rows], dtype=np.int64)
    table = pd.DataFrame(
        values, index=pd.Index(rows, name="query_type"), columns=pd.Index(columns, name="fallback_level")
    )
    table.loc["all"] = table.sum(axis=0)
    return table.astype(int)


def _level_key(level: str) -> tuple[int, float | str]:
    """Numeric levels in numeric order, then names alphabetically."""
    try:
        return (0, float(level))
    except ValueError:
        return (1, level)
