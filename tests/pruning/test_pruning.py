"""Per-query reporting, shard means, and the exact OOS early stop."""

from __future__ import annotations

import itertools
import random

import numpy as np
import optuna
import pytest

from tuner.data.dataset import Query
from tuner.evaluation.mapping import Hit, ParsedResponse
from tuner.evaluation.outcomes import FailedQuery, QueryResponse
from tuner.evaluation.result import query_record
from tuner.study.trial.pruning import (
    OOSBudget,
    OOSBudgetExceeded,
    QueryReporter,
    mode_for,
    oos_budget,
    query_steps,
    trial_order_seed,
)

pytestmark = pytest.mark.filterwarnings("ignore::optuna.exceptions.ExperimentalWarning")


class RecordingTrial:
    """A trial that records reports and never prunes (real optuna trials are used below)."""

    number = 0

    def __init__(self) -> None:
        self.reports: list[tuple[int, float]] = []

    def report(self, value: float, step: int) -> None:
        self.reports.append((step, value))

    def should_prune(self) -> bool:
        return False


def test_query_steps_are_stable_and_unique():
    ids = ["q10", "q2", "a", "z9"]
    steps = query_steps(ids)
    assert steps == query_steps(list(reversed(ids)))
    assert sorted(steps.values()) == list(range(len(ids)))
    assert steps["a"] == 0 and steps["z9"] == 3
    with pytest.raises(ValueError):
        query_steps(["a", "a"])


def test_trial_order_seed_is_reproducible_and_differs_per_trial():
    assert trial_order_seed(7, 3) == trial_order_seed(7, 3)
    assert len({trial_order_seed(7, n) for n in range(50)}) == 50
    assert trial_order_seed(7, 3) != trial_order_seed(8, 3)


def test_mode_for_pruners():
    assert mode_for(optuna.pruners.WilcoxonPruner()) == "per_query"
    assert mode_for(optuna.pruners.MedianPruner()) == "shard_mean"
    assert mode_for(optuna.pruners.PercentilePruner(25.0)) == "shard_mean"
    assert mode_for(optuna.pruners.NopPruner()) == "none"


@pytest.mark.parametrize("bound", [0.0, 0.1, 0.2, 1 / 3, 0.5, 1.0])
def test_oos_early_stop_is_exact(bound):
    """Exhaustive over all answer patterns of 6 OOS queries: the stop fires exactly at the
    first prefix after which no completion of the batch can meet the constraint."""
    n = 6
    for pattern in itertools.product((False, True), repeat=n):
        budget = OOSBudget(bound, n)
        stopped_at = None
        for i, answered in enumerate(pattern, start=1):
            budget.observe(answered)
            if budget.exceeded():
                stopped_at = i
                break
        # The best completion answers none of the remaining queries.
        feasible_after = [sum(pattern[:i]) / n <= bound + 1e-12 for i in range(1, n + 1)]
        first_hopeless = next((i for i, ok in enumerate(feasible_after, start=1) if not ok), None)
        assert stopped_at == first_hopeless, (pattern, stopped_at, first_hopeless)


def test_oos_budget_counts():
    assert oos_budget(0.1, 30) == 3  # 0.1 * 30 in floats is 3.0000000000000004 or 2.9999...
    assert oos_budget(0.1, 29) == 2
    assert oos_budget(0.0, 10) == 0


def _record(query: Query, hits, conf, handoff, qrels, failed=False):
    outcome = (FailedQuery(query.query_id, "r", "timeout") if failed else
               QueryResponse(query.query_id, "r", ParsedResponse(tuple(hits), conf, handoff, "0")))
    return query_record(query, outcome, qrels)


def test_reporter_per_query_reports_stable_steps_and_skips_oos():
    qs = [Query("b", "t", "x", "s", "in"), Query("a", "t", "x", "s", "in"), Query("o", "t", "x", "s", "oos")]
    qrels = {"a": {"d1": 3}, "b": {"d2": 2}}
    steps = query_steps([q.query_id for q in qs])
    trial = RecordingTrial()
    reporter = QueryReporter(trial, steps, mode="per_query")
    recs = {
        "b": _record(qs[0], [Hit("d2", 1.0)], 0.9, False, qrels),
        "a": _record(qs[1], [Hit("d1", 1.0)], 0.1, True, qrels),  # handed off: scores 0
        "o": _record(qs[2], [Hit("d9", 1.0)], 0.9, False, qrels),
    }
    for qid in ["o", "b", "a"]:
        reporter(qid, recs[qid])
    assert trial.reports == [(steps["b"], recs["b"]["Primary_Metric_Score"]), (steps["a"], 0.0)]
    assert recs["b"]["Primary_Metric_Score"] > 0
    assert reporter.evaluated == 3


def test_reporter_shard_means_are_running_means():
    trial = RecordingTrial()
    ids = [f"q{i}" for i in range(10)]
    reporter = QueryReporter(trial, query_steps(ids), mode="shard_mean", shard_size=3)
    values = [0.1 * i for i in range(10)]
    for qid, v in zip(ids, values):
        reporter(qid, {"scope": "in", "Primary_Metric_Score": v})
    assert [s for s, _ in trial.reports] == [1, 2, 3]
    assert [v for _, v in trial.reports] == pytest.approx([np.mean(values[: 3 * k]) for k in (1, 2, 3)])


def test_reporter_raises_oos_stop_with_lower_bound():
    trial = RecordingTrial()
    reporter = QueryReporter(trial, {}, mode="none", oos=OOSBudget(0.25, 8))
    rec = {"scope": "oos", "answered": True, "status": "ok"}
    reporter("q1", {"scope": "in", "Primary_Metric_Score": 0.8})
    for _ in range(2):
        reporter("o", rec)
    reporter("q2", {"scope": "in", "Primary_Metric_Score": 0.4})
    with pytest.raises(OOSBudgetExceeded) as info:
        reporter("o", rec)
    assert isinstance(info.value, optuna.TrialPruned)
    assert info.value.fp_rate_lower_bound == 3 / 8 > 0.25
    # what the trial runner records the stopped trial with (COMPLETE, infeasible)
    assert info.value.running_mean == pytest.approx(0.6) and info.value.evaluated == 5
    assert str(info.value).startswith("OOS early stop: 3 of 8 OOS queries answered")


def test_reporter_with_solved_threshold_counts_only_answers_at_the_top_of_the_range():
    reporter = QueryReporter(RecordingTrial(), {}, mode="none", oos=OOSBudget(0.0, 3), oos_threshold_max=0.8)
    # answered at the trial's own threshold, but handed off at 0.8: the solver may still pick 0.8
    reporter("o1", {"scope": "oos", "answered": True, "status": "ok", "confidence": 0.7, "n_results": 5})
    with pytest.raises(OOSBudgetExceeded):
        reporter("o2", {"scope": "oos", "answered": True, "status": "ok", "confidence": 0.85, "n_results": 5})


def test_wilcoxon_pruner_prunes_a_clearly_worse_trial_with_per_query_reports():
    """A real study: the second trial is worse on every query and gets pruned early."""
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    ids = [f"q{i}" for i in range(60)]
    steps = query_steps(ids)
    rng = np.random.default_rng(0)
    base = rng.uniform(0.3, 0.9, len(ids))
    study = optuna.create_study(direction="maximize", pruner=optuna.pruners.WilcoxonPruner(p_threshold=0.05))
    evaluated = []

    def objective(trial):
        shift = trial.suggest_float("shift", -0.2, 0.0)
        scores = np.clip(base + shift + rng.normal(0, 0.01, len(ids)), 0, 1)
        order = ids[:]
        random.Random(trial_order_seed(1, trial.number)).shuffle(order)
        reporter = QueryReporter(trial, steps, mode="per_query")
        try:
            for qid in order:
                reporter(qid, {"scope": "in", "Primary_Metric_Score": scores[ids.index(qid)]})
        finally:
            evaluated.append(reporter.evaluated)
        return float(scores.mean())

    study.enqueue_trial({"shift": 0.0})
    study.enqueue_trial({"shift": -0.2})
    study.optimize(objective, n_trials=2)
    states = [t.state for t in study.trials]
    assert states == [optuna.trial.TrialState.COMPLETE, optuna.trial.TrialState.PRUNED]
    assert evaluated[0] == len(ids) and evaluated[1] < len(ids) // 2
    assert study.best_trial.number == 0


def test_reporter_factory_wires_pruner_mode_and_oos_budget():
    from tuner.config.objective import Constraint
    from tuner.data.dataset import QuerySet
    from tuner.study.trial.pruning import oos_bound, reporter_factory

    qs = QuerySet("d", "h", tuple([Query(f"q{i}", "t", "x", "s", "in") for i in range(6)]
                                  + [Query(f"o{i}", "t", "x", "s", "oos") for i in range(10)]))
    constraints = [Constraint.parse("OOS_FP_Rate <= 0.2"), Constraint.parse("OOS_FP_Rate <= 0.1"),
                   Constraint.parse("Judged@10 >= 0.5")]
    assert oos_bound(constraints) == 0.1 and oos_bound(constraints[2:]) is None
    assert reporter_factory(optuna.pruners.NopPruner(), qs) is None
    stop_only = reporter_factory(optuna.pruners.NopPruner(), qs, constraints=constraints, threshold_max=0.8)
    reporter = stop_only(RecordingTrial())
    assert reporter.mode == "none" and reporter.oos.budget == 1 and reporter.oos_threshold_max == 0.8
    wilcoxon = reporter_factory(optuna.pruners.WilcoxonPruner(), qs, objective="NDCG@20")(RecordingTrial())
    assert wilcoxon.mode == "per_query" and wilcoxon.oos is None and wilcoxon.objective == "NDCG@20"
    assert wilcoxon.steps == query_steps(qs.query_ids)
