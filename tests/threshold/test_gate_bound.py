"""The gate solver's bound (tuner.study.gates.threshold.bound_arrays), which lets a fusion search
skip the exact solve of settings that cannot be among the best: on hostile batches
whose lists never rise, the feasibility is the solver's exactly and the bound is never
below the solved objective (and equal to it without a score cut); where no bound holds
(a rising list, a coverage objective, a constraint on the objective or one called per
row) it says so instead of guessing."""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import numpy as np
import pytest

from threshold.test_solve_vectorised import CUTS, MaxFP, gate_sets, hostile_batch
from tuner.config.objective import Constraint as MetricBound
from tuner.evaluation.result import evaluate_responses
from tuner.study.gates.gate_arrays import HitArrays
from tuner.study.gates.threshold import MIN_SCORE, GateRange, bound_arrays, solve_arrays


def descending_batch(seed: int, **kw: Any) -> Any:
    """A hostile batch whose every list is in score order (ties kept in order), as a replayed one is."""
    qs, qrels, responses, failed, gains = hostile_batch(seed, **kw)
    ordered = []
    for r in responses:
        hits = sorted(r.response.hits, key=lambda h: -(h.score if h.score is not None else math.inf))
        ordered.append(dataclasses.replace(r, response=dataclasses.replace(r.response, hits=tuple(hits))))
    return evaluate_responses(qs, qrels, ordered, failed, gains=gains)


def both(batch: Any, gates: list[GateRange], **kw: Any) -> tuple[Any, Any]:
    arrays = HitArrays.from_batch(batch)
    low = next((g.low for g in gates if g.role == MIN_SCORE), 0.0)
    return (bound_arrays(arrays, gates, retrieved_min_score=low, **kw),
            solve_arrays(arrays, gates, retrieved_min_score=low, full=False, **kw))


CONSTRAINTS = [
    [],
    [MetricBound.parse("OOS_FP_Rate <= 0.3")],
    [MetricBound.parse("OOS_FP_Rate <= 0.1"), MetricBound.parse("Answer_Recall >= 0.5")],
    [MetricBound.parse("OOS_FP_Rate <= -1")],  # infeasible everywhere
]


@pytest.mark.parametrize("seed", range(10))
@pytest.mark.parametrize("objective", ["Primary_Metric_Score", "NDCG@10", "ERR@20", "Recall@50"])
def test_the_bound_never_falls_below_the_solved_objective_and_feasibility_is_exact(seed: int, objective: str) -> None:
    batch = descending_batch(seed, gains="exp" if seed % 3 == 2 else "linear")
    tight = 0
    for gates in gate_sets():
        for constraints in CONSTRAINTS:
            bound, sol = both(batch, gates, objective=objective, constraints=constraints)
            assert bound is not None
            assert bound.feasible == sol.feasible
            if not sol.feasible:
                assert bound.upper == -math.inf
                continue
            assert bound.upper >= sol.objective
            if all(g.role != MIN_SCORE for g in gates):  # nothing is cut: the bound is the objective
                assert bound.upper == pytest.approx(sol.objective + 1e-9, abs=1e-12)
                tight += 1
    assert tight >= 1


def test_a_score_cut_that_costs_relevant_hits_leaves_the_bound_above_the_objective() -> None:
    gaps = []
    for seed in range(10):
        batch = descending_batch(seed)
        gates = [GateRange("citation.min_score", 0.0, 0.8, 0.05)]  # only a cut can keep OOS answers out
        bound, sol = both(batch, gates, constraints=[MetricBound.parse("OOS_FP_Rate <= 0.3")])
        assert bound is not None and bound.feasible == sol.feasible
        if sol.feasible:
            assert bound.upper >= sol.objective
            gaps.append(bound.upper - sol.objective)
    assert len(gaps) >= 3 and max(gaps) > 1e-3  # the case the bound exists for occurs


@pytest.mark.parametrize(("why", "kw"), [
    ("coverage can rise as a list gets shorter", {"objective": "Judged@10"}),
    ("a constraint on the objective itself", {"constraints": [MetricBound.parse("Primary_Metric_Score >= 0.1")]}),
    ("a constraint called row by row", {"constraints": [MaxFP()]}),
])
def test_no_bound_is_given_where_none_holds(why: str, kw: dict[str, Any]) -> None:
    bound, _ = both(descending_batch(3), gate_sets()[0], **kw)
    assert bound is None, why


def test_no_bound_is_given_for_a_list_whose_scores_rise() -> None:
    from tuner.evaluation.result import evaluate_responses as evaluate

    qs, qrels, responses, failed, gains = hostile_batch(5)  # some lists permuted
    batch = evaluate(qs, qrels, responses, failed, gains=gains)
    assert bound_arrays(HitArrays.from_batch(batch), gate_sets()[0], retrieved_min_score=CUTS[0]) is None
    trial = MetricBound.parse("OOS_FP_Rate <= 0.3")
    assert both(descending_batch(5), gate_sets()[0], constraints=[trial])[0] is not None  # a trial's constraints
    assert np.isfinite(both(descending_batch(5), gate_sets()[0])[0].upper)
