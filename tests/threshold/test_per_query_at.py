"""tuner.study.gates.gate_arrays.per_query_at: the solved row of a sweep, query by query.
Its objective's mean and its OOS answers' share are the solver's objective and OOS_FP_Rate
at the chosen gates, on the hostile batches of test_solve_vectorised (ties, failed, empty
and handed-off queries, scores at the cuts), for every gate set."""

from __future__ import annotations

import math

import numpy as np
import pytest

from threshold.test_solve_vectorised import batch_of, constraint_sets, gate_sets
from tuner.study.gates.gate_arrays import HitArrays, per_query_at
from tuner.study.gates.threshold import CONFIDENCE, MIN_SCORE, solve_arrays


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
@pytest.mark.parametrize("gates", range(4))
@pytest.mark.parametrize("objective", ["Primary_Metric_Score", "NDCG@10"])
def test_the_per_query_values_average_to_the_solved_row(seed: int, gates: int, objective: str) -> None:
    arrays = HitArrays.from_batch(batch_of(seed))
    ranges = gate_sets()[gates]
    sol = solve_arrays(arrays, ranges, objective=objective, constraints=constraint_sets()[1])
    scores, answered = per_query_at(
        arrays,
        sol.by_role.get(CONFIDENCE, -math.inf),
        sol.by_role.get(MIN_SCORE, -math.inf),
        objective,
        backend_handoff=not any(g.role == CONFIDENCE for g in ranges),
    )
    assert scores.size == int((~arrays.is_oos).sum()) and answered.size == int(arrays.is_oos.sum())
    assert float(np.mean(scores)) == pytest.approx(sol.objective, abs=1e-12)
    assert float(np.mean(answered)) == pytest.approx(sol.metrics["OOS_FP_Rate"], abs=1e-12)
