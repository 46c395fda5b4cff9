"""One feasibility rule and one "best feasible trial" (tuner.study.feasibility): the trials
as Optuna holds them, the same trials as `tuner best` / `tuner report` read them (the
trials frame of tuner.ops.analysis), a trial's outcome as the run prints it
(tuner.study.trial.outcome) and the study note must agree on every trial: ties, an
infeasible top scorer, NaN and missing constraints, states other than COMPLETE, both
directions."""

from __future__ import annotations

import math

import optuna
import pytest
from optuna.trial import TrialState, create_trial

from tuner.ops import analysis
from tuner.study import feasibility
from tuner.study.notes import dashboard_headline, study_note
from tuner.study.replay.fusion_search import Scored
from tuner.study.trial.attrs import named_constraints
from tuner.study.trial.outcome import TrialOutcome

NAME = "OOS_FP_Rate <= 0.1"


def _complete(value: float, *, constraint: float | None = None, legacy: list[float] | None = None):
    system = {"constraints": legacy} if legacy is not None else {}
    constraints = {NAME: constraint} if constraint is not None else None
    return create_trial(state=TrialState.COMPLETE, value=value, system_attrs=system, constraints=constraints)


def _trials() -> list[optuna.trial.FrozenTrial]:
    trials = [
        _complete(0.50, constraint=-0.10),  # 0 feasible
        _complete(0.90, constraint=0.20),  # 1 the top scorer, infeasible
        _complete(0.70, constraint=-0.05),  # 2 feasible, tied with 3
        _complete(0.70, constraint=0.0),  # 3 feasible (a constraint at its bound holds), tied with 2
        _complete(0.80, legacy=[math.nan]),  # 4 a NaN constraint (a legacy record): infeasible
        _complete(0.60),  # 5 no constraint recorded: nothing to break
        create_trial(state=TrialState.PRUNED, constraints={NAME: -1.0}),  # 6 not COMPLETE
        create_trial(state=TrialState.FAIL),  # 7
        _complete(0.20, legacy=[0.2, math.nan]),  # 8 broken twice, once by a NaN
        _complete(0.10, constraint=0.30),  # 9 infeasible, the minimizing top scorer
    ]
    for number, t in enumerate(trials):
        t.number = number
    return trials


@pytest.mark.parametrize(
    ("maximize", "ranked"),
    [(True, [2, 3, 5, 0]), (False, [0, 5, 2, 3])],
    ids=["maximize", "minimize"],
)
def test_every_path_ranks_the_same_feasible_trials_the_same_way(maximize: bool, ranked: list[int]) -> None:
    trials = _trials()
    frame = analysis.trials_frame(trials)

    assert [t.number for t in feasibility.feasible_ranked(trials, maximize=maximize)] == ranked
    assert list(analysis.feasible_ranked(frame, maximize=maximize)["number"]) == ranked
    best = feasibility.best_feasible_trial(trials, maximize=maximize)
    row = analysis.best_feasible(frame, maximize=maximize)
    assert best is not None and row is not None
    assert best.number == int(row["number"]) == ranked[0]  # the tie goes to the earlier trial
    assert feasibility.summary_of(trials, maximize=maximize)["best_feasible_trial"] == ranked[0]
    note = study_note(trials, study_name="s", objective="score", maximize=maximize)
    assert f"**Best feasible: trial #{ranked[0]}, score" in note
    table = [line for line in note.splitlines() if line.startswith("| #")]
    assert [int(line.split()[1].lstrip("#")) for line in table] == ranked


def test_every_path_calls_the_same_trials_feasible() -> None:
    trials = _trials()
    frame = analysis.trials_frame(trials).set_index("number")
    expected = {0: True, 1: False, 2: True, 3: True, 4: False, 5: True, 6: False, 7: False, 8: False, 9: False}
    for t in trials:
        outcome = TrialOutcome(t.number, t.state.name, value=t.value, constraints=named_constraints(t.constraints))
        got = (feasibility.is_feasible(t), bool(frame.loc[t.number, "feasible"]), outcome.feasible)
        assert got == (expected[t.number],) * 3, t.number


def test_a_nan_constraint_breaks_the_trial_worst_wherever_it_stands() -> None:
    trials = _trials()
    # least violating first; a NaN breaks as +inf whichever constraint of the trial it is
    # (Constraint.violation's rule for a NaN metric), not as the next one's value
    assert list(analysis.infeasible_trials(analysis.trials_frame(trials))["number"]) == [1, 9, 4, 8]
    assert analysis.worst_violation([0.2, math.nan]) == analysis.worst_violation([math.nan, 0.2]) == math.inf
    assert math.isnan(analysis.worst_violation([]))


def test_the_rule_on_constraint_values() -> None:
    assert feasibility.constraints_hold([]) and feasibility.constraints_hold([-1.0, 0.0])
    assert not feasibility.constraints_hold([-1.0, 1e-12]) and not feasibility.constraints_hold([math.nan])
    assert feasibility.feasible("COMPLETE", []) and not feasibility.feasible("PRUNED", [-1.0])
    # a replayed fusion setting, scored exactly, holds by the same rule
    assert Scored({}, 0.5, 0.0).feasible and not Scored({}, 0.5, math.nan).feasible


def test_no_feasible_trial_is_none_in_every_path() -> None:
    trials = [t for t in _trials() if not feasibility.is_feasible(t)]
    assert feasibility.best_feasible_trial(trials) is None
    assert analysis.best_feasible(analysis.trials_frame(trials)) is None
    note = study_note(trials, study_name="s", objective="score", maximize=True)
    assert "**No feasible trial yet**" in note and "the Best Trial card stays empty" in note
    line = dashboard_headline(trials, study_name="s", objective="score", maximize=True)
    assert line.startswith("study s: no feasible trial yet (4 completed, every one breaks a constraint)")
    assert "the Best Trial card stays empty" in line


def test_the_dashboard_headline_and_the_note_name_the_best_feasible_trial_not_the_top_scorer() -> None:
    trials = _trials()
    line = dashboard_headline(trials, study_name="s", objective="score", maximize=True)
    assert line == "study s: best feasible trial #2, score 0.7000 (the Best Trial card)"
    note = study_note(trials, study_name="s", objective="score", maximize=True)
    assert "⚠ The highest score, #1 (0.9000), is **infeasible**" in note and "do not apply it" in note
    assert dashboard_headline([], study_name="s", objective="score", maximize=True).endswith(
        "no completed trial yet; the Best Trial card stays empty"
    )
