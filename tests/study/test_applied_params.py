"""Every applied config value recorded as an Optuna param under its config key
(tuner.study.trial.applied_params), on a real search space and real Optuna trials."""

from __future__ import annotations

import textwrap
from pathlib import Path
from typing import Any

import optuna
import pytest
from optuna.distributions import FloatDistribution, IntDistribution
from optuna.search_space import intersection_search_space
from optuna.trial import TrialState

from tuner.config.space.loading import load_space
from tuner.config.space.searchspace import SearchSpace
from tuner.config.flatten import flatten
from tuner.study.trial.applied_params import applied_params, record_applied_params

optuna.logging.set_verbosity(optuna.logging.WARNING)
pytestmark = pytest.mark.filterwarnings("ignore::optuna.exceptions.ExperimentalWarning")

GATE = "confidence.threshold"
GATE_DIST = FloatDistribution(0.2, 0.8, step=0.05)
CONFIG = """\
fusion:
  method: rrf
  rrf_k: 60
  weights: {bm25: 0.5, dense: 0.5}
confidence:
  threshold: 0.6
fallback:
  windows_days: [30, 90]
"""
SPACE = """\
params:
  fusion.method: {type: categorical, choices: [rrf, linear]}
  fusion.rrf_k: {type: int, low: 1, high: 200}
  fusion.weights: {type: simplex, components: [bm25, dense]}
  confidence.threshold: {type: float, low: 0.2, high: 0.8, step: 0.05, post_retrieval: true}
  fallback.windows_days:
    type: ordered
    length: 2
    first: {low: 7, high: 60}
    gap: {low: 7, high: 300}
"""
DERIVED = ["fallback.windows_days.0", "fallback.windows_days.1", "fusion.weights.bm25", "fusion.weights.dense"]


@pytest.fixture
def space(tmp_path: Path) -> SearchSpace:
    cfg = tmp_path / "config.yaml"
    cfg.write_text(CONFIG)
    (tmp_path / "space.yaml").write_text(textwrap.dedent(SPACE))
    return load_space(tmp_path / "space.yaml", [cfg])


def test_flatten_names_mapping_keys_and_list_positions() -> None:
    assert flatten({"fusion.weights": {"bm25": 0.3, "dense": 0.7}, "fallback.windows_days": [39, 111],
                    "nested": {"a": [1, {"b": 2}]}, "fusion.method": "rrf"}) == {
        "fusion.weights.bm25": 0.3, "fusion.weights.dense": 0.7,
        "fallback.windows_days.0": 39, "fallback.windows_days.1": 111,
        "nested.a.0": 1, "nested.a.1.b": 2, "fusion.method": "rrf",
    }
    assert flatten({}) == {}


def test_derived_values_get_one_point_distributions_and_a_gate_its_declared_one(space: SearchSpace) -> None:
    assignment = {"fusion.method": "rrf", "fusion.rrf_k": 60, "fusion.weights": {"bm25": 0.3, "dense": 0.7},
                  "fallback.windows_days": [39, 111], GATE: 0.55, "flag": True}
    sampled = {"fusion.method": "rrf", "fusion.rrf_k": 60, "fusion.weights:bm25": 0.4,
               "fallback.windows_days:first": 39, "fallback.windows_days:gap1": 72}
    out = applied_params(assignment, sampled, space.distributions())
    assert out == {
        "fusion.weights.bm25": (0.3, FloatDistribution(0.3, 0.3)),
        "fusion.weights.dense": (0.7, FloatDistribution(0.7, 0.7)),
        "fallback.windows_days.0": (39, IntDistribution(39, 39)),
        "fallback.windows_days.1": (111, IntDistribution(111, 111)),
        GATE: (0.55, GATE_DIST),
    }  # not: the sampled names (fusion.rrf_k), strings, booleans
    # A gate value outside its declared range keeps the distribution's kind and grid, widened to hold it.
    (value, dist), = applied_params({GATE: 0.9}, {}, space.distributions()).values()
    assert isinstance(dist, FloatDistribution) and dist.step == GATE_DIST.step
    assert dist.low == GATE_DIST.low and dist.high == pytest.approx(0.9) and value == 0.9


def _run_trial(study: optuna.Study, space: SearchSpace, number: int) -> list[str]:
    """One trial as the runner makes it: the space's draw without the gate, the gate
    "solved" afterwards, every applied value recorded; returns the names skipped."""
    trial = study.ask()
    assignment: dict[str, Any] = dict(space.suggest(trial, skip_post_retrieval=True))
    assignment[GATE] = round(0.2 + 0.05 * (number % 13), 2)
    skipped = record_applied_params(trial, assignment, space.distributions())
    weights, windows = assignment["fusion.weights"], assignment["fallback.windows_days"]
    study.tell(trial, weights["bm25"] - abs(assignment[GATE] - 0.5) - windows[0] / 1000)
    return skipped


def test_a_real_trial_records_simplex_ordered_and_solved_gate_values(space: SearchSpace) -> None:
    study = optuna.create_study(direction="maximize")
    assert _run_trial(study, space, 3) == []
    frozen = study.trials[0]
    params, dists = frozen.params, frozen.distributions
    weights = {c: params[f"fusion.weights.{c}"] for c in ("bm25", "dense")}
    assert weights["bm25"] + weights["dense"] == pytest.approx(1.0)
    first, gap = params["fallback.windows_days:first"], params["fallback.windows_days:gap1"]
    assert (params["fallback.windows_days.0"], params["fallback.windows_days.1"]) == (first, first + gap)
    for name in DERIVED:
        assert dists[name].single() and dists[name].low == params[name], name  # one point: never sampled
    assert params[GATE] == pytest.approx(0.35) and dists[GATE] == GATE_DIST
    assert "fusion.weights:bm25" in params  # the sampler's own params stay


def test_a_multivariate_tpe_study_still_samples_and_leaves_the_derived_params_alone(space: SearchSpace) -> None:
    sampler = optuna.samplers.TPESampler(seed=5, multivariate=True, n_startup_trials=4)
    study = optuna.create_study(direction="maximize", sampler=sampler)
    for number in range(12):
        assert _run_trial(study, space, number) == []
    trials = study.get_trials(deepcopy=False)
    assert [t.state for t in trials] == [TrialState.COMPLETE] * 12
    assert len({t.params["fusion.weights:bm25"] for t in trials}) == 12  # drawn afresh each time
    joint = intersection_search_space(trials)
    assert GATE in joint and joint[GATE] == GATE_DIST  # a gate is an ordinary param of the study
    assert not set(DERIVED) & set(joint)  # one point per trial: outside every sampler's search space
    assert {"fusion.weights:bm25", "fallback.windows_days:first", "fallback.windows_days:gap1"} <= set(joint)
    # The model the multivariate sampler fits covers the gate, not the derived values.
    relative = sampler.infer_relative_search_space(study, trials[-1])
    assert GATE in relative and not set(DERIVED) & set(relative)


@pytest.mark.parametrize("storage", ["memory", "sqlite"])
def test_a_value_optuna_refuses_is_skipped_not_raised(tmp_path: Path, storage: str) -> None:
    url = optuna.storages.InMemoryStorage() if storage == "memory" else f"sqlite:///{tmp_path / 'study.db'}"
    study = optuna.create_study(direction="maximize", storage=url)
    first = study.ask()
    assert record_applied_params(first, {"fallback.windows_days": [30, 90], "x": 0.5}, {}) == []
    study.tell(first, 1.0)
    # The same names, now floats: Optuna refuses another distribution kind under a name it knows.
    second = study.ask()
    skipped = record_applied_params(second, {"fallback.windows_days": [30.5, 90], "x": 0.25}, {})
    assert skipped == ["fallback.windows_days.0"]
    study.tell(second, 0.5)
    frozen = study.trials[1]
    assert frozen.state == TrialState.COMPLETE
    assert frozen.params == {"fallback.windows_days.1": 90, "x": 0.25}


def test_a_replayed_categorical_is_recorded_under_its_declared_choices(space: SearchSpace) -> None:
    """Fusion replay solves fusion.method inside the trial (not sampled): the dashboards
    still get it as a param, with the space's categorical distribution; a value outside
    the choices, or one the trial sampled itself, is left alone."""
    from optuna.distributions import CategoricalDistribution

    declared = space.distributions()
    out = applied_params({"fusion.method": "linear", "fusion.rrf_k": 7}, {}, declared)
    assert out["fusion.method"] == ("linear", CategoricalDistribution(["rrf", "linear"]))
    assert applied_params({"fusion.method": "borda"}, {}, declared) == {}
    assert applied_params({"fusion.method": "linear"}, {"fusion.method": "rrf"}, declared) == {}
    study = optuna.create_study()
    trial = study.ask()
    assert record_applied_params(trial, {"fusion.method": "linear"}, declared) == []
    study.tell(trial, 0.0)
    assert study.trials[0].params["fusion.method"] == "linear"


@pytest.mark.parametrize("storage", ["memory", "sqlite"])
def test_recording_twice_adds_nothing_and_keeps_the_drawn_params(tmp_path: Path, storage: str) -> None:
    url = optuna.storages.InMemoryStorage() if storage == "memory" else f"sqlite:///{tmp_path / 'study.db'}"
    study = optuna.create_study(direction="maximize", storage=url)
    trial = study.ask()
    trial.suggest_float("x", 0.0, 1.0)
    assignment = {"x": 0.75, "fallback.windows_days": [30, 90]}
    assert record_applied_params(trial, assignment, {}) == []
    assert record_applied_params(trial, assignment, {}) == []  # a retried record: no duplicate rows, no error
    study.tell(trial, 1.0)
    frozen = study.trials[0]
    assert frozen.distributions["x"] == optuna.distributions.FloatDistribution(0.0, 1.0)  # the drawn one stays
    assert {k: frozen.params[k] for k in ("fallback.windows_days.0", "fallback.windows_days.1")} == {
        "fallback.windows_days.0": 30, "fallback.windows_days.1": 90}


def test_one_transaction_records_what_optuna_records_one_param_at_a_time(tmp_path: Path) -> None:
    """The oracle: Optuna's own set_trial_param, one call per param, into a second study;
    both studies end with the same params and distributions in every trial, the same
    names skipped, also for a name only an earlier run (another storage object, whose
    cache layer never saw it) recorded under another kind."""
    from optuna.distributions import FloatDistribution

    from tuner.study.trial.applied_params import applied_params

    def one_by_one(trial: optuna.Trial, assignment: dict[str, object], declared: dict[str, object]) -> list[str]:
        have, skipped = trial.storage.get_trial(trial._trial_id).params, []
        for name, (value, dist) in applied_params(assignment, have, declared).items():  # type: ignore[arg-type]
            try:
                trial.storage.set_trial_param(trial._trial_id, name, dist.to_internal_repr(value), dist)
            except ValueError:
                skipped.append(name)
        return skipped

    declared = {GATE: FloatDistribution(0.0, 1.0)}
    runs = [
        ({"fallback.windows_days": [30, 90], "w": {"a": 0.25, "b": 0.75}, GATE: 0.4}, []),
        ({"fallback.windows_days": [31, 95], "w": {"a": 0.5, "b": 0.5}, GATE: 1.5}, []),  # the gate's range widened
        ({"fallback.windows_days": [30.5, 90], "w": {"a": 1, "b": 0.0}, GATE: 0.2},  # floats, then an int: refused
         ["fallback.windows_days.0", "w.a"]),
    ]
    studies = {}
    for how, record in (("new", record_applied_params), ("optuna", one_by_one)):
        url = f"sqlite:///{tmp_path / how}.db"
        for i, (assignment, skipped) in enumerate(runs):
            # every trial in a run of its own: a fresh storage object, its cache layer empty
            study = optuna.create_study(study_name="s", storage=url, load_if_exists=True,
                                        sampler=optuna.samplers.RandomSampler(seed=i))
            trial = study.ask()
            trial.suggest_int("drawn", 0, 10)
            assert record(trial, assignment, declared) == skipped, (how, i)
            study.tell(trial, float(i))
        studies[how] = optuna.load_study(study_name="s", storage=url).trials
    assert [(t.params, t.distributions) for t in studies["new"]] == [
        (t.params, t.distributions) for t in studies["optuna"]]
