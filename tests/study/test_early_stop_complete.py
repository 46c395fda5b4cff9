"""The OOS early stop ends a trial COMPLETE and infeasible (not PRUNED): a real Optuna
trial, the real per-query reporter (tuner.study.trial.pruning) and `TrialRunner`; only the
search engine is scripted (the per-query rows a batch would produce)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import optuna
import pytest
from optuna.trial import TrialState

from study.fakes import CONFIG_TEXT, FakeResult, FileBackend, FormulaEvaluator, TwoParamSpace, YamlWriter, run_one
from tuner.config.objective import Constraint
from tuner.data.dataset import Query, QuerySet
from tuner.optuna_adapter import LEGACY_CONSTRAINTS_ATTR
from tuner.study.trial.attrs import ATTR_EARLY_STOP, ATTR_FAIL_REASON, ATTR_FEASIBLE, metrics_of, named_constraints
from tuner.study.trial.pruning import reporter_factory
from tuner.study.trial.runner import TrialRunner, compose_runner

optuna.logging.set_verbosity(optuna.logging.WARNING)

OOS = "OOS_FP_Rate <= 0.1"
JUDGED = "Judged@10 >= 0.5"
N_IN, N_OOS = 4, 10  # OOS_FP_Rate <= 0.1 over 10 OOS queries: at most 1 may be answered
QUERIES = QuerySet("d", "h", tuple([Query(f"q{i}", "t", "x", "s", "in") for i in range(N_IN)]
                                   + [Query(f"o{i}", "t", "x", "s", "oos") for i in range(N_OOS)]))


def in_scope(qid: str, score: float) -> tuple[str, dict[str, Any]]:
    return qid, {"scope": "in", "Primary_Metric_Score": score}


def oos(qid: str, answered: bool) -> tuple[str, dict[str, Any]]:
    return qid, {"scope": "oos", "answered": answered, "status": "ok"}


@dataclass
class ScriptedEvaluator(FormulaEvaluator):
    """Feeds ``rows`` (query id, per-query record) to the reporter in order; the batch's
    metrics are those of the rows. ``sent``: how many rows went out in the last batch."""

    rows: list[tuple[str, dict[str, Any]]] = field(default_factory=list)
    sent: int = 0

    def evaluate(self, *, order_seed: int, on_result) -> FakeResult:
        self.calls += 1
        self.sent = 0
        for qid, record in self.rows:
            self.sent += 1
            if on_result is not None:
                on_result(qid, record)
        scores = [r["Primary_Metric_Score"] for _, r in self.rows if r["scope"] == "in"]
        answered = sum(bool(r.get("answered")) for _, r in self.rows if r["scope"] == "oos")
        return FakeResult({"Primary_Metric_Score": sum(scores) / len(scores), "OOS_FP_Rate": answered / N_OOS,
                           "Judged@10": 0.9, "Failed_Queries": 0.0})


def make_runner(tmp_path: Path) -> tuple[TrialRunner, ScriptedEvaluator]:
    cfg = tmp_path / "config.yaml"
    cfg.write_text(CONFIG_TEXT)
    backend = FileBackend(cfg)
    evaluator = ScriptedEvaluator(backend)
    constraints = [Constraint.parse(OOS), Constraint.parse(JUDGED)]
    runner = compose_runner(
        study_name="s", space=TwoParamSpace(), writer=YamlWriter(cfg), target=backend,
        wait_healthy=backend.wait_healthy, evaluator=evaluator, trials_dir=tmp_path / "trials",
        constraints=constraints,
        reporter_factory=reporter_factory(optuna.pruners.NopPruner(), QUERIES, constraints=constraints),
    )
    return runner, evaluator


# Two OOS answers of a budget of 1: the batch stops at o1, the 4th of its 14 queries.
STOPPED = [in_scope("q0", 0.9), oos("o0", True), in_scope("q1", 0.7), oos("o1", True),
           in_scope("q2", 0.0), in_scope("q3", 0.0), *(oos(f"o{i}", False) for i in range(2, N_OOS))]
# No OOS answer: feasible, and it scores less than the stopped trial's running mean.
FEASIBLE = [*(in_scope(f"q{i}", 0.3) for i in range(N_IN)), *(oos(f"o{i}", False) for i in range(N_OOS))]


def test_an_oos_early_stop_is_a_complete_infeasible_trial_the_best_trial_skips(tmp_path: Path) -> None:
    runner, evaluator = make_runner(tmp_path)
    study = optuna.create_study(direction="maximize")

    evaluator.rows = STOPPED
    outcome, stopped = run_one(study, runner, {"x": 0.3, "k": 40})
    assert evaluator.sent == 4 < len(STOPPED)  # stopped before the last query
    assert outcome.state == "COMPLETE" and stopped.state == TrialState.COMPLETE
    assert stopped.value == pytest.approx((0.9 + 0.7) / 2)  # the running mean of the in-scope queries measured
    lower_bound = 2 / N_OOS
    violation = pytest.approx(lower_bound - 0.1)
    assert named_constraints(stopped.constraints) == {OOS: violation, JUDGED: 0.0}
    assert named_constraints(stopped.constraints)[OOS] > 0
    assert stopped.system_attrs[LEGACY_CONSTRAINTS_ATTR] == [violation, 0.0]
    assert stopped.user_attrs[ATTR_FEASIBLE] is False
    assert stopped.user_attrs["OOS_FP_Rate"] == pytest.approx(lower_bound)
    assert metrics_of(stopped)["OOS_FP_Rate"] == pytest.approx(lower_bound)
    early_stop = stopped.user_attrs[ATTR_EARLY_STOP]  # a short table column: the bound and when
    assert "OOS_FP_Rate >= 0.2" in early_stop and "after 4 queries" in early_stop
    assert ATTR_FAIL_REASON not in stopped.user_attrs
    # its completion (constraints and attrs written to the study) is timed: part of its duration
    assert "complete" in outcome.phase_seconds and stopped.user_attrs["duration_s"] == round(outcome.duration_s, 3)
    with pytest.raises(ValueError):
        study.best_trial  # noqa: B018 - constraint-aware: no feasible trial yet

    evaluator.rows = FEASIBLE
    outcome, feasible = run_one(study, runner, {"x": 0.2, "k": 30})
    assert evaluator.sent == len(FEASIBLE) and feasible.user_attrs[ATTR_FEASIBLE] is True
    assert ATTR_EARLY_STOP not in feasible.user_attrs
    assert feasible.value == pytest.approx(0.3) and feasible.value < stopped.value
    assert study.best_trial.number == feasible.number  # the stopped trial scores higher, but is infeasible


def test_a_stop_before_any_in_scope_query_is_valued_at_the_worst(tmp_path: Path) -> None:
    runner, evaluator = make_runner(tmp_path)
    study = optuna.create_study(direction="maximize")
    evaluator.rows = [oos("o0", True), oos("o1", True), *FEASIBLE]
    outcome, stopped = run_one(study, runner, {"x": 0.3, "k": 40})
    assert evaluator.sent == 2 and stopped.state == TrialState.COMPLETE
    assert stopped.value == 0.0 and stopped.user_attrs[ATTR_FEASIBLE] is False
    assert "after 2 queries" in stopped.user_attrs[ATTR_EARLY_STOP]
