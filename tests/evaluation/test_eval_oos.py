import numpy as np
import pytest

from tuner.evaluation.oos import (
    answered_mask,
    fallback_histogram,
    handoff_metrics,
    threshold_grid,
    threshold_sweep,
)

DEFAULT_GRID = threshold_grid([0.3, 0.9])


def test_the_default_grid_spans_zero_to_one_in_steps_of_002():
    assert len(DEFAULT_GRID) == 51
    assert DEFAULT_GRID[0] == 0.0 and DEFAULT_GRID[-1] == 1.0 and 0.4 in DEFAULT_GRID and 0.62 in DEFAULT_GRID
    assert np.allclose(np.diff(DEFAULT_GRID), 0.02)
    assert threshold_grid([]) == DEFAULT_GRID  # no confidence seen: still [0, 1]


def test_the_default_grid_reaches_the_observed_confidences_with_a_bounded_number_of_points():
    assert threshold_grid([0.2, 1.3])[-1] == 1.3
    wide = threshold_grid([-3.0, 37.2, None, float("nan")])
    assert wide[0] <= -3.0 and wide[-1] >= 37.2 and len(wide) <= 101
    assert np.allclose(np.diff(wide), 0.5)  # a round step


def test_a_declared_range_and_the_threshold_in_effect_make_the_grid():
    grid = threshold_grid([0.95], sweep_range=(0.0, 0.9, 0.01), include=[0.29])
    assert len(grid) == 91 and grid[0] == 0.0 and grid[-1] == 0.9 and grid.count(0.29) == 1
    # a solved value off the grid is a row of its own, as given
    odd = threshold_grid(sweep_range=(0.2, 0.8, 0.05), include=[0.333, None])
    assert 0.333 in odd and len(odd) == 14 and list(odd) == sorted(odd)
    with pytest.raises(ValueError, match="low <= high"):
        threshold_grid(sweep_range=(0.5, 0.1, 0.01))


def test_answered_uses_handoff_flag_else_non_empty_results():
    assert answered_mask([True, False, None, None], [5, 0, 3, 0]).tolist() == [False, True, True, False]


def test_handoff_metrics_formulas():
    #            in     in     in     in     oos    oos    oos
    is_oos = [False, False, False, False, True, True, True]
    answered = [True, True, True, False, True, False, False]
    m = handoff_metrics(is_oos, answered)
    tp = 2  # OOS handed off
    fp = 1  # in-scope handed off
    n_oos, n_in = 3, 4
    assert m["OOS_FP_Rate"] == pytest.approx(1 / n_oos)
    assert m["InScope_Handoff_Rate"] == pytest.approx(fp / n_in)
    p, r = tp / (tp + fp), tp / n_oos
    assert m["Handoff_Precision"] == pytest.approx(p)
    assert m["Handoff_Recall"] == pytest.approx(r)
    assert m["Handoff_F1"] == pytest.approx(2 * p * r / (p + r))
    ans_in, ans_oos = 3, 1
    ap, ar = ans_in / (ans_in + ans_oos), ans_in / n_in
    assert m["Answer_Precision"] == pytest.approx(ap)
    assert m["Answer_Recall"] == pytest.approx(ar)
    assert m["Answer_F1"] == pytest.approx(2 * ap * ar / (ap + ar))


def test_empty_denominators_are_zero_not_nan():
    m = handoff_metrics([False, False], [True, True])  # no OOS, no handoff
    assert m["OOS_FP_Rate"] == 0.0 and m["Handoff_Precision"] == 0.0 and m["Handoff_F1"] == 0.0
    assert m["Answer_Recall"] == 1.0


def _brute_force_row(is_oos, conf, n_results, t):
    rows = [(o, c >= t - 1e-12 and n > 0) for o, c, n in zip(is_oos, conf, n_results) if c is not None]
    tp = sum(1 for o, a in rows if o and not a)
    fp = sum(1 for o, a in rows if not o and not a)
    n_oos = sum(1 for o, _ in rows if o)
    n_in = len(rows) - n_oos
    answered_oos = sum(1 for o, a in rows if o and a)
    prec = tp / (tp + fp) if tp + fp else 0.0
    rec = tp / n_oos if n_oos else 0.0
    return {
        "n_handoff": tp + fp,
        "OOS_FP_Rate": answered_oos / n_oos if n_oos else 0.0,
        "InScope_Handoff_Rate": fp / n_in if n_in else 0.0,
        "Handoff_Precision": prec,
        "Handoff_Recall": rec,
        "Handoff_F1": 2 * prec * rec / (prec + rec) if prec + rec else 0.0,
    }


def test_threshold_sweep_matches_a_brute_force_loop():
    rng = np.random.default_rng(7)
    n = 60
    is_oos = (rng.random(n) < 0.3).tolist()
    conf = [None if i % 13 == 0 else float(rng.choice([0.5, 0.62, rng.random()])) for i in range(n)]
    n_results = rng.integers(0, 3, n).tolist()
    sweep = threshold_sweep(is_oos, conf, n_results)
    assert sweep is not None and sweep.index.tolist() == list(DEFAULT_GRID)
    assert (sweep["n"] == sum(c is not None for c in conf)).all()
    for t in DEFAULT_GRID:
        for name, value in _brute_force_row(is_oos, conf, n_results, t).items():
            assert sweep.loc[t, name] == pytest.approx(value), (t, name)


def test_threshold_sweep_primary_score_uses_raw_scores_when_answered():
    is_oos = [False, False, False, True]
    conf = [0.45, 0.70, None, 0.9]
    raw = [0.8, 0.6, 0.5, np.nan]
    observed = [0.8, 0.6, 0.0, np.nan]  # the query without confidence failed
    sweep = threshold_sweep(is_oos, conf, [5, 5, 0, 5], raw, observed_scores=observed)
    assert sweep.loc[0.40, "Primary_Metric_Score"] == pytest.approx((0.8 + 0.6 + 0.0) / 3)
    assert sweep.loc[0.50, "Primary_Metric_Score"] == pytest.approx((0.0 + 0.6 + 0.0) / 3)
    assert sweep.loc[0.80, "Primary_Metric_Score"] == pytest.approx(0.0)


def test_no_confidence_no_sweep():
    assert threshold_sweep([False], [None], [3]) is None


def test_fallback_histogram_per_query_type():
    hist = fallback_histogram(["short", "short", "temporal", "temporal", "temporal"], ["0", "1", "2", "10", None])
    assert hist.columns.tolist() == ["0", "1", "2", "10"]  # numeric order, not text order
    assert hist.loc["short"].tolist() == [1, 1, 0, 0]
    assert hist.loc["temporal"].tolist() == [0, 0, 1, 1]
    assert hist.loc["all"].tolist() == [1, 1, 1, 1]
    assert fallback_histogram(["a"], [None]) is None
