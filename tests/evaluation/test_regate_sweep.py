"""The threshold sweep of a re-gated batch covers the threshold in effect (issue 13,
item 5): its row at the solved threshold is the batch's own score, and the grid spans
the gate's declared range, or without one the observed confidences (not 0.40..0.80)."""

from __future__ import annotations

import numpy as np
import pytest

from evaluation.test_regate import LOW_M, LOW_T, retrieved_at_low_end
from tuner.evaluation.regate import regate
from tuner.study.gates.threshold import CONFIDENCE_PARAM, MIN_SCORE_PARAM, GateRange, solve_batch

GATES = [GateRange(CONFIDENCE_PARAM, 0.0, 0.9, 0.01), GateRange(MIN_SCORE_PARAM, 0.0, 0.5, 0.01)]


class MaxFP:
    def violation(self, metrics):
        return metrics["OOS_FP_Rate"] - 0.3


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_the_sweep_row_at_the_solved_threshold_is_the_regated_batchs_score(seed: int) -> None:
    batch = retrieved_at_low_end(seed)
    sol = solve_batch(batch, GATES, constraints=[MaxFP()])
    t, m = sol.by_role["confidence"], sol.by_role["min_score"]
    g = GATES[0]
    gated = regate(batch, confidence_threshold=t, min_score=m, sweep_range=(g.low, g.high, g.step))
    assert gated.threshold_in_effect == t
    sweep = gated.threshold_sweep
    assert sweep is not None and t in sweep.index
    assert sweep.index[0] == 0.0 and sweep.index[-1] == 0.9 and len(sweep) == 91
    row = sweep.loc[t]
    assert row["Primary_Metric_Score"] == pytest.approx(gated.metrics["Primary_Metric_Score"], abs=1e-12)
    assert row["Primary_Metric_Score"] == pytest.approx(sol.objective, abs=1e-12)
    assert row["OOS_FP_Rate"] == pytest.approx(gated.metrics["OOS_FP_Rate"], abs=1e-12)  # the failed query is in scope


@pytest.mark.parametrize("t", [0.333, 0.29, 0.95])
def test_a_threshold_off_the_grid_or_outside_the_range_is_a_row_of_its_own(t: float) -> None:
    batch = retrieved_at_low_end(3)
    gated = regate(batch, confidence_threshold=t, min_score=0.1, sweep_range=(0.2, 0.8, 0.05))
    sweep = gated.threshold_sweep
    assert list(sweep.index).count(t) == 1 and sweep.index.is_monotonic_increasing
    assert sweep.index.min() <= 0.2 and sweep.index.max() >= 0.8
    assert sweep.loc[t, "Primary_Metric_Score"] == pytest.approx(gated.metrics["Primary_Metric_Score"], abs=1e-12)


def test_without_a_range_the_grid_spans_the_observed_confidences_and_the_threshold() -> None:
    batch = retrieved_at_low_end(4)
    gated = regate(batch, confidence_threshold=0.29, min_score=None)
    sweep = gated.threshold_sweep
    conf = batch.per_query["confidence"].dropna()
    assert sweep.index.min() <= min(0.0, conf.min()) and sweep.index.max() >= max(1.0, conf.max())
    assert 0.29 in sweep.index and np.allclose(np.diff(sweep.index)[:10], 0.02)
    assert sweep.loc[0.29, "Primary_Metric_Score"] == pytest.approx(gated.metrics["Primary_Metric_Score"], abs=1e-12)
    # the raw batch: no threshold in effect, the same default grid (no longer 0.40..0.80)
    assert batch.threshold_in_effect is None and batch.threshold_sweep.index.min() == 0.0


def test_only_a_min_score_keeps_the_threshold_in_effect_unknown_and_the_identity_holds() -> None:
    batch = retrieved_at_low_end(5)
    assert regate(batch, confidence_threshold=None, min_score=0.3).threshold_in_effect is None
    same = regate(batch, confidence_threshold=LOW_T, min_score=LOW_M)
    assert same.metrics == pytest.approx(batch.metrics, abs=1e-12, nan_ok=True)
    assert same.threshold_in_effect == LOW_T
    # a second regate without a confidence gate keeps the first one's threshold in effect
    again = regate(same, confidence_threshold=None, min_score=0.2, sweep_range=(0.0, 0.5, 0.1))
    assert again.threshold_in_effect == LOW_T and LOW_T in again.threshold_sweep.index
