"""A two-objective study (secondary_objective): the study told both values, and its
feasible Pareto front (tuner.study.pareto) as `tuner best --pareto` and the report show it."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import optuna
import pytest

from study.fakes import oos_rate, score
from study.test_trial_runner import OOS_LIMIT, make_runner
from tuner.config.objective import Objective
from tuner.errors import StudyError
from tuner.study import pareto as par
from tuner.study.loop import StudyLoop
from tuner.study.storage.study_storage import open_study
from tuner.study.trial.attrs import ATTR_ASSIGNMENT, ATTR_VARIANT

optuna.logging.set_verbosity(optuna.logging.WARNING)

MAX_MIN = (True, False)
DIST = {"k": optuna.distributions.IntDistribution(0, 300)}


def trial(number: int, values: list[float] | None, *, violation: float = -0.1, k: int = 0, **attrs: Any) -> Any:
    state = optuna.trial.TrialState.COMPLETE if values is not None else optuna.trial.TrialState.FAIL
    made = optuna.trial.create_trial(
        state=state,
        values=values,
        params={"k": k},
        distributions=DIST,
        system_attrs={"constraints:OOS_FP_Rate": violation, f"user:{ATTR_ASSIGNMENT}": {"rerank.depth": k}},
        user_attrs={ATTR_ASSIGNMENT: {"rerank.depth": k, "fusion.method": "rrf"}, **attrs},
    )
    made.number = number
    return made


def test_dominates_needs_as_good_on_both_and_better_on_one() -> None:
    assert par.dominates([0.5, 10], [0.4, 10], MAX_MIN)
    assert par.dominates([0.5, 9], [0.5, 10], MAX_MIN)
    assert not par.dominates([0.5, 10], [0.5, 10], MAX_MIN)  # equal: neither
    assert not par.dominates([0.6, 11], [0.5, 10], MAX_MIN)  # a trade-off: neither
    assert par.dominates([0.4, 11], [0.5, 12], (False, False))


def test_the_front_is_feasible_non_dominated_and_best_quality_first() -> None:
    trials = [
        trial(0, [0.30, 10.0], k=0),  # fastest
        trial(1, [0.36, 20.0], k=50),
        trial(2, [0.34, 25.0], k=75),  # dominated by 1
        trial(3, [0.41, 31.0], k=150),  # best quality
        trial(4, [0.45, 15.0], violation=0.05, k=25),  # infeasible: dominates 1-3, never on the front
        trial(5, [0.36, 20.0], k=50),  # ties 1: both kept, the earlier first
        trial(6, None),  # failed
        trial(7, [0.50, math.inf], k=300),  # an early-stopped trial's unmeasured latency: not a point
        trial(8, [0.41, 31.0], violation=math.nan),  # a NaN constraint breaks it
    ]
    front = par.feasible_front(trials, maximize=MAX_MIN)
    assert [t.number for t in front] == [3, 1, 5, 0]
    # independently: the feasible finite points no other such point dominates
    pts = {t.number: t.values for t in trials if t.number in (0, 1, 2, 3, 5)}
    expected = {n for n, v in pts.items() if not any(par.dominates(o, v, MAX_MIN) for o in pts.values())}
    assert {t.number for t in front} == expected


def test_rows_and_lines_show_the_differing_config_values_and_mark_the_quality_best_and_the_baseline() -> None:
    front = [trial(3, [0.41, 31.0], k=150), trial(0, [0.3, 10.0], k=0, **{ATTR_VARIANT: "baseline"})]
    names = par.differing_params(front)
    assert names == ["rerank.depth"]  # fusion.method is rrf on both
    rows = par.front_rows(front, names)
    assert rows == [
        {"trial": 3, "quality": 0.41, "secondary": 31.0, "quality_best": True, "baseline": False, "rerank.depth": 150},
        {"trial": 0, "quality": 0.3, "secondary": 10.0, "quality_best": False, "baseline": True, "rerank.depth": 0},
    ]
    lines = par.front_lines(rows, names, ("NDCG@10", "Latency_P95_ms"))
    assert lines == [
        "#3    NDCG@10 0.4100  Latency_P95_ms 31.00  rerank.depth=150  <- quality-best",
        "#0    NDCG@10 0.3000  Latency_P95_ms 10.00  rerank.depth=0  <- baseline",
    ]
    md = par.front_markdown(rows, names, ("NDCG@10", "Latency_P95_ms"))
    assert "| #3 | 0.4100 | 31.00 | 150 | quality-best |" in md and "| #0 | 0.3000 | 10.00 | 0 | baseline |" in md


def test_a_one_objective_study_has_no_front_and_says_how_to_get_one() -> None:
    with pytest.raises(StudyError, match=r"has 1 objective\(s\); a Pareto front needs two: add secondary_objective"):
        par.study_maximize(optuna.create_study(direction="maximize"))
    assert par.study_maximize(optuna.create_study(directions=["maximize", "minimize"])) == MAX_MIN


def test_a_two_objective_study_is_told_both_values_and_keeps_its_directions(tmp_path: Path) -> None:
    storage = f"sqlite:///{tmp_path / 'study.db'}"
    second = Objective(metric="NDCG@20", direction="minimize")
    runner, _, _, _ = make_runner(tmp_path, secondary_objective=second)
    study = open_study(
        "s", storage, sampler=optuna.samplers.TPESampler(seed=3, n_startup_trials=2), secondary=("NDCG@20", False)
    )
    assert study.metric_names == ["Primary_Metric_Score", "NDCG@20"]
    StudyLoop(study, runner).run(n_trials=5, timeout=None)
    done = study.get_trials()
    assert len(done) == 5 and all(t.state.name == "COMPLETE" for t in done)
    for t in done:
        x, k = t.params["x"], t.params["k"]
        assert t.values == [pytest.approx(score(x, k)), pytest.approx(score(x, k) / 2)]
    front = par.feasible_front(done, maximize=MAX_MIN)
    assert front and all(oos_rate(t.params["x"]) <= OOS_LIMIT for t in front)  # the constraint kept
    # the same study resumed, and a one-objective experiment on it refused in one line
    assert open_study("s", storage, sampler=None, secondary=("NDCG@20", False)).directions == study.directions
    with pytest.raises(
        StudyError,
        match=r"exists with directions \['maximize', 'minimize'\], the experiment asks "
        r"\['maximize'\].* and secondary_objective",
    ):
        open_study("s", storage, sampler=None)


def test_tuner_dashboard_points_a_two_objective_study_at_its_pareto_front_plot(tmp_path: Path) -> None:
    from types import SimpleNamespace

    from tuner.cli.dashboard_cmd import _study_headline

    storage = f"sqlite:///{tmp_path / 'study.db'}"
    open_study("s", storage, sampler=None, secondary=("Latency_P95_ms", False))
    exp = SimpleNamespace(
        study="s",
        storage=storage,
        source=tmp_path / "exp.yaml",
        objective=Objective(),
        secondary_objective=Objective(metric="Latency_P95_ms", direction="minimize"),
    )
    assert _study_headline(exp) == (
        f"study s: two objectives: the study page's Pareto Front plot marks the feasible front "
        f"(`tuner best {tmp_path / 'exp.yaml'} --pareto` lists it)"
    )


def test_an_oos_early_stop_tells_the_worst_latency_and_stays_off_the_front(tmp_path: Path) -> None:
    from study.fakes import CONFIG_TEXT, FileBackend, TwoParamSpace, YamlWriter
    from study.test_early_stop_complete import FEASIBLE, OOS, QUERIES, STOPPED, ScriptedEvaluator
    from tuner.config.objective import Constraint
    from tuner.study.trial.pruning import reporter_factory
    from tuner.study.trial.runner import compose_runner

    cfg = tmp_path / "config.yaml"
    cfg.write_text(CONFIG_TEXT)
    backend = FileBackend(cfg)
    evaluator = ScriptedEvaluator(backend)
    constraints = [Constraint.parse(OOS)]
    runner = compose_runner(
        study_name="s",
        space=TwoParamSpace(),
        writer=YamlWriter(cfg),
        target=backend,
        wait_healthy=backend.wait_healthy,
        evaluator=evaluator,
        trials_dir=tmp_path / "trials",
        constraints=constraints,
        secondary_objective=Objective(metric="Judged@10", direction="minimize"),
        reporter_factory=reporter_factory(optuna.pruners.NopPruner(), QUERIES, constraints=constraints),
    )
    study = open_study("s", f"sqlite:///{tmp_path / 'study.db'}", sampler=None, secondary=("Judged@10", False))
    loop = StudyLoop(study, runner)
    for rows, params in ((STOPPED, {"x": 0.3, "k": 40}), (FEASIBLE, {"x": 0.2, "k": 30})):
        evaluator.rows = rows
        study.enqueue_trial(params)
        trial = study.ask()
        loop._tell_once(trial, runner.run(trial))
    stopped, feasible = study.get_trials()
    assert stopped.state.name == feasible.state.name == "COMPLETE"
    assert stopped.values == [pytest.approx((0.9 + 0.7) / 2), math.inf]  # unmeasured: the worst
    assert feasible.values == [pytest.approx(0.3), pytest.approx(0.9)]
    assert [t.number for t in par.feasible_front(study.get_trials(), maximize=MAX_MIN)] == [feasible.number]
