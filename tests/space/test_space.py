"""Search spaces sampled by real Optuna studies."""

from __future__ import annotations

import math
import textwrap
from pathlib import Path
from typing import Any

import optuna
import pytest
from scipy import stats

from tuner.config.space.loading import load_space
from tuner.config.space.searchspace import SearchSpace
from tuner.config.space.simplex import shares_to_sticks, sticks_to_shares
from tuner.errors import ConfigError

optuna.logging.set_verbosity(optuna.logging.WARNING)
pytestmark = pytest.mark.filterwarnings("ignore::optuna.exceptions.ExperimentalWarning")

CONFIG = {
    "fusion": {"method": "rrf", "rrf_k": 60, "weights": {"bm25": 1.0, "dense": 1.0, "sparse": 2.0},
               "normalization": "minmax"},
    "confidence": {"threshold": 0.6, "top_m": 3},
    "fallback": {"windows_days": [30, 90, 365]},
    "recency": {"half_life_days": 30, "weight": 0.0},
    "sources": {"bm25": {"depth": 100}},
}

SPACE = """
params:
  fusion.method: {type: categorical, choices: [rrf, linear]}
  fusion.rrf_k: {type: int, low: 1, high: 200, log: true, when: {fusion.method: rrf}}
  fusion.normalization: {type: categorical, choices: [minmax, z], when: {fusion.method: linear}}
  fusion.weights: {type: simplex, components: [bm25, dense, sparse]}
  confidence.threshold: {type: float, low: 0.0, high: 0.9, step: 0.05, post_retrieval: true}
  fallback.windows_days:
    type: ordered
    length: 3
    first: {low: 7, high: 60}
    gap: {low: 1, high: 200}
  recency.half_life_days: {type: int, low: 7, high: 365, log: true, when: {fusion.method: [rrf, linear]}}
fixed:
  sources.bm25.depth: 150
"""


def write(tmp_path: Path, text: str, name: str = "space.yaml") -> Path:
    path = tmp_path / name
    path.write_text(textwrap.dedent(text))
    return path


@pytest.fixture
def space(tmp_path: Path) -> SearchSpace:
    return load_space(write(tmp_path, SPACE))


def run_study(space: SearchSpace, n: int, sampler: optuna.samplers.BaseSampler) -> list[dict[str, Any]]:
    study = optuna.create_study(sampler=sampler)
    out = []
    for _ in range(n):
        trial = study.ask()
        a = space.suggest(trial)
        out.append(a)
        # An objective that depends on the assignment so TPE has something to model.
        study.tell(trial, a["fusion.weights"]["bm25"] + (a["fusion.method"] == "rrf") * 0.1)
    return out


def test_conditional_params_appear_only_when_active(space: SearchSpace) -> None:
    sampler = optuna.samplers.TPESampler(seed=3, multivariate=True, group=True, n_startup_trials=5)
    assignments = run_study(space, 40, sampler)
    methods = {a["fusion.method"] for a in assignments}
    assert methods == {"rrf", "linear"}
    for a in assignments:
        assert ("fusion.rrf_k" in a) == (a["fusion.method"] == "rrf")
        assert ("fusion.normalization" in a) == (a["fusion.method"] == "linear")
        assert "recency.half_life_days" in a  # condition listing every choice is always active
        assert a["sources.bm25.depth"] == 150  # fixed values ride along
        assert space.edits(a)[0]["sources.bm25.depth"] == 150


def test_inactive_params_are_not_even_asked(space: SearchSpace) -> None:
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=0))
    study.enqueue_trial({"fusion.method": "linear"})
    trial = study.ask()
    space.suggest(trial)
    assert "fusion.rrf_k" not in trial.params
    assert "fusion.normalization" in trial.params


def test_simplex_weights_sum_to_one_and_cover_the_simplex(space: SearchSpace) -> None:
    n = 400
    assignments = run_study(space, n, optuna.samplers.RandomSampler(seed=11))
    weights = [a["fusion.weights"] for a in assignments]
    for w in weights:
        assert list(w) == ["bm25", "dense", "sparse"]
        assert math.isclose(sum(w.values()), 1.0, abs_tol=1e-9)
        assert all(v >= 0 for v in w.values())
    # A flat Dirichlet over 3 components: each share is Beta(1, 2), CDF 1 - (1 - x)^2.
    for comp in ("bm25", "dense", "sparse"):
        xs = [w[comp] for w in weights]
        assert stats.kstest(xs, lambda x: 1 - (1 - x) ** 2).pvalue > 0.001
        assert max(xs) > 0.8 and min(xs) < 0.02  # reaches the corners and the faces


def test_stick_breaking_is_one_to_one() -> None:
    for shares in ([0.2, 0.3, 0.5], [1.0, 0.0, 0.0], [0.0, 0.0, 1.0], [0.25, 0.25, 0.25, 0.25]):
        us = shares_to_sticks(shares)
        assert len(us) == len(shares) - 1
        back = sticks_to_shares(us)
        assert back == pytest.approx(shares, abs=1e-12)
    # Scalings of the same weights encode identically: the sampler cannot propose them twice.
    assert shares_to_sticks([2.0, 6.0]) == shares_to_sticks([0.25, 0.75])


def test_ordered_windows_are_always_strictly_increasing(tmp_path: Path) -> None:
    path = write(tmp_path, """
        params:
          a: {type: ordered, length: 3, first: {low: 7, high: 60}, gap: {low: 1, high: 30}}
          b: {type: ordered, length: 3, first: {low: 7, high: 60}, ratio: {low: 1.01, high: 4}}
          c: {type: ordered, length: 2, integer: false, first: {low: 0.5, high: 2}, ratio: {low: 1.5, high: 3}}
        """)
    space = load_space(path)
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=5))
    for _ in range(300):
        a = space.suggest(study.ask())
        for key in ("a", "b", "c"):
            w = a[key]
            assert all(x < y for x, y in zip(w, w[1:])), (key, w)
        assert all(isinstance(x, int) for x in a["a"] + a["b"])
        assert 7 <= a["a"][0] <= 60 and a["a"][2] <= 60 + 2 * 30
        assert all(isinstance(x, float) for x in a["c"])


def test_params_for_round_trips_through_enqueue_trial(space: SearchSpace) -> None:
    source = run_study(space, 60, optuna.samplers.RandomSampler(seed=2))
    study = optuna.create_study()
    for a in source:
        study.enqueue_trial(space.params_for(a))
    for a in source:
        trial = study.ask()
        again = space.suggest(trial)
        assert again.keys() == a.keys()
        for key, value in a.items():
            if isinstance(value, dict):
                assert again[key] == pytest.approx(value, abs=1e-4)
            else:
                assert again[key] == value
        study.tell(trial, 0.0)


@pytest.mark.filterwarnings("ignore:Fixed parameter")
def test_baseline_is_the_current_config_and_partial_variants_are_filled(space: SearchSpace) -> None:
    baseline = space.current_assignment(CONFIG)
    assert baseline["fusion.method"] == "rrf" and baseline["fusion.rrf_k"] == 60
    assert "fusion.normalization" not in baseline  # inactive under rrf
    assert baseline["fusion.weights"] == {"bm25": 1.0, "dense": 1.0, "sparse": 2.0}  # as the file has them
    assert baseline["fallback.windows_days"] == [30, 90, 365]
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=1))
    study.enqueue_trial(space.params_for(baseline))
    study.enqueue_trial(space.params_for({"fusion.method": "linear", "confidence.threshold": 0.3}))
    first = space.suggest(study.ask())
    # the sampler's rendering normalises the weights; as_found gives back the file's own
    assert first["fusion.weights"] == {"bm25": 0.25, "dense": 0.25, "sparse": 0.5}
    assert {k: v for k, v in space.as_found(first, CONFIG).items() if k in baseline} == baseline
    second = space.suggest(study.ask())
    assert second["fusion.method"] == "linear" and second["confidence.threshold"] == 0.3
    assert "fusion.normalization" in second  # sampled by Optuna


def test_distributions_allow_create_trial_even_outside_the_space(space: SearchSpace) -> None:
    # The current windows [30, 90, 365] need a gap of 275 > gap.high=200.
    baseline = space.current_assignment(CONFIG)
    params = space.params_for(baseline)
    assert params["fallback.windows_days:gap2"] == 365 - 90
    study = optuna.create_study()
    study.add_trial(
        optuna.trial.create_trial(params=params, distributions=space.distributions_for(params), value=0.5)
    )
    assert study.trials[0].params == params
    # The widened distributions stay compatible with what suggest() asks for later.
    for name, dist in space.distributions_for(params).items():
        optuna.distributions.check_distribution_compatibility(dist, space.distributions()[name])
    trial = study.ask()
    space.suggest(trial)


@pytest.mark.parametrize(
    ("variant", "needle"),
    [
        ({"fusion.method": "bm25"}, "fusion.method: 'bm25' is not one of the choices"),
        ({"fusion.method": "linear", "fusion.rrf_k": 30}, "fusion.rrf_k: inactive when fusion.method='linear'"),
        ({"sources.bm25.depth": 10}, "sources.bm25.depth: is fixed to 150"),
        ({"fallback.windows_days": [90, 30, 400]}, "not strictly increasing"),
        ({"fusion.rrf_kk": 30}, "not a parameter of this space (did you mean fusion.rrf_k?)"),
        ({"fusion.weights": {"bm25": 1.0}}, "exactly the components"),
    ],
)
def test_params_for_refuses_unrepresentable_values(space: SearchSpace, variant: dict, needle: str) -> None:
    with pytest.raises(ConfigError) as exc:
        space.params_for(variant)
    assert needle in str(exc.value)
    assert "space.yaml" in str(exc.value)


def test_post_retrieval_flags_and_file_indices(space: SearchSpace) -> None:
    assert space.post_retrieval == frozenset({"confidence.threshold"})
    assert space.file_indices == frozenset({0})


def test_suggest_can_leave_post_retrieval_params_to_the_solver_unless_queued(space: SearchSpace) -> None:
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=0))
    study.enqueue_trial(space.params_for({"confidence.threshold": 0.35}))
    queued, free = study.ask(), study.ask()
    # A queued gate value (the baseline, a shortlist variant) is measured as given ...
    assert space.suggest(queued, skip_post_retrieval=True)["confidence.threshold"] == 0.35
    # ... any other trial leaves it out (and Optuna records no such param).
    assigned = space.suggest(free, skip_post_retrieval=True)
    assert "confidence.threshold" not in assigned and "confidence.threshold" not in free.params
    assert set(assigned) == set(space.suggest(optuna.trial.FixedTrial(free.params | {"confidence.threshold": 0.5}))) - {
        "confidence.threshold"}


# ---------------------------------------------------------------- validation errors


@pytest.mark.parametrize(
    ("params", "needle"),
    [
        ("fusion.rrf_kk: {type: int, low: 1, high: 10}",
         "fusion.rrf_kk: no such key in config file 0 (did you mean fusion.rrf_k?)"),
        ("fusion.method: {type: categorical, choices: [1, 2]}",
         "fusion.method: type mismatch: config has str, space declares categorical of int"),
        ("fusion.method: {type: float, low: 0, high: 1}",
         "fusion.method: type mismatch: config has str, space declares float"),
        ("fusion.weights: {type: simplex, components: [bm25, dens]}",
         "component dens is not a key of the config mapping"),
        ("fallback.windows_days: {type: ordered, length: 2, integer: false, first: {low: 1, high: 2}, gap: {low: 1, high: 2}}",
         None),
        ("confidence.top_m: {type: int, low: 1, high: 2, when: {fusion.method: rrf}}",
         "when: fusion.method is not a parameter of this space"),
    ],
)
def test_validation_errors_name_file_line_key_and_fix(tmp_path: Path, params: str, needle: str | None) -> None:
    path = write(tmp_path, f"params:\n  {params}\n")
    if needle is None:  # valid: an int list may be tuned as floats on purpose
        load_space(path).validate_against(CONFIG)
        return
    with pytest.raises(ConfigError) as exc:
        load_space(path).validate_against(CONFIG)
    message = str(exc.value)
    assert "\n" not in message
    assert message.startswith(f"{path}:2: ") or message.startswith("space.yaml:2: ")
    assert needle in message


@pytest.mark.parametrize(
    ("params", "needle"),
    [
        ("a: {type: int, low: 200, high: 5}", "params.a: inverted bounds low=200 > high=5, swap them"),
        ("a: {type: float, low: 0, high: 5, log: true}", "log scale needs low > 0"),
        ("a: {type: categorical, choices: []}", "at least 1 item"),
        ("a: {type: int, low: 1, high: 5, lo: 2}", "params.a.lo: unknown key"),
        ("a: {type: integer, low: 1, high: 5}", "does not match any of the expected tags"),
        ("a: {type: ordered, length: 2, first: {low: 1, high: 2}, gap: {low: 0, high: 2}}", "gap.low must be > 0"),
        ("a: {type: ordered, length: 2, first: {low: 1, high: 2}}", "give exactly one of gap"),
        ("a: {type: categorical, choices: [x, y]}\n  b: {type: int, low: 1, high: 2, when: {a: z}}",
         "b: when: a: 'z' is not one of its choices"),
        ("a: {type: int, low: 1, high: 2, when: {b: 1}}\n  b: {type: int, low: 1, high: 2, when: {a: 1}}",
         "conditions form a cycle"),
    ],
)
def test_bad_space_files_are_refused_at_load(tmp_path: Path, params: str, needle: str) -> None:
    path = write(tmp_path, f"params:\n  {params}\n")
    with pytest.raises(ConfigError) as exc:
        load_space(path)
    assert needle in str(exc.value)
    assert "\n" not in str(exc.value)
    assert "space.yaml:" in str(exc.value)


def test_unknown_top_level_key_suggests_the_right_one(tmp_path: Path) -> None:
    path = write(tmp_path, "params:\n  a: {type: int, low: 1, high: 2}\nfixd:\n  b: 1\n")
    with pytest.raises(ConfigError, match=r"space.yaml:3: fixd: unknown key \(did you mean fixed\?\)"):
        load_space(path)


def test_out_of_range_current_value_is_a_warning_not_an_error(tmp_path: Path) -> None:
    path = write(tmp_path, "params:\n  fusion.rrf_k: {type: int, low: 1, high: 50}\n")
    warnings_ = load_space(path).validate_against(CONFIG)
    assert len(warnings_) == 1 and "current value 60 lies outside [1, 50]" in warnings_[0]


def test_params_may_target_another_config_file(tmp_path: Path) -> None:
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    files = [tmp_path / "a" / "config.yaml", tmp_path / "b" / "replica.yaml"]
    path = write(tmp_path, """
        params:
          fusion.rrf_k: {type: int, low: 1, high: 100}
          replica_k: {path: fusion.rrf_k, file: b/replica.yaml, type: int, low: 1, high: 100}
          replica_m: {path: confidence.top_m, file: 1, type: int, low: 1, high: 5}
        """)
    space = load_space(path, files)
    assert space.validate_against([CONFIG, CONFIG], ["a", "b"]) == []
    edits = space.edits({"fusion.rrf_k": 5, "replica_k": 7, "replica_m": 2})
    assert edits == {0: {"fusion.rrf_k": 5}, 1: {"fusion.rrf_k": 7, "confidence.top_m": 2}}
    bad = write(tmp_path, "params:\n  x: {path: fusion.rrf_k, file: c.yaml, type: int, low: 1, high: 2}\n", "bad.yaml")
    with pytest.raises(ConfigError, match="file: c.yaml matches none of target.config_files"):
        load_space(bad, files)


def test_stepped_floats_are_written_clean(tmp_path: Path) -> None:
    path = write(tmp_path, "params:\n  x: {type: float, low: 0.0, high: 1.0, step: 0.1}\n")
    space = load_space(path)
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=0))
    values = {space.suggest(study.ask())["x"] for _ in range(60)}
    assert values <= {round(i * 0.1, 1) for i in range(11)}


def test_fixed_keys_are_validated_like_params(tmp_path: Path) -> None:
    path = write(tmp_path, "params:\n  fusion.rrf_k: {type: int, low: 1, high: 9}\nfixed:\n  sources.bm25.dept: 10\n")
    with pytest.raises(ConfigError, match=r"space.yaml:4: sources.bm25.dept: no such key .*did you mean sources.bm25.depth"):
        load_space(path).validate_against(CONFIG)
    path = write(tmp_path, "params:\n  fusion.rrf_k: {type: int, low: 1, high: 9}\nfixed:\n  fusion.method: 3\n")
    with pytest.raises(ConfigError, match="type mismatch: config has str, fixed value 3 is int"):
        load_space(path).validate_against(CONFIG)
    with pytest.raises(ConfigError, match="is both tuned .params. and fixed"):
        load_space(write(tmp_path, "params:\n  a: {type: int, low: 1, high: 2}\nfixed:\n  a: 1\n"))


@pytest.mark.filterwarnings("ignore:Fixed parameter")
def test_the_baseline_trial_carries_the_files_values_and_only_unchanged_keys_do(space: SearchSpace) -> None:
    """Issue 26 item 4: the baseline's weights 1.0/1.0/2.0 are not rewritten as the
    simplex's 0.25/0.25/0.5; a trial that changes a key keeps its own value."""
    baseline = space.current_assignment(CONFIG)
    study = optuna.create_study()
    study.enqueue_trial(space.params_for(baseline))
    found = space.as_found(space.suggest(study.ask()), CONFIG)
    assert found["fusion.weights"] == {"bm25": 1.0, "dense": 1.0, "sparse": 2.0}
    assert found["fallback.windows_days"] == [30, 90, 365] and found["fusion.rrf_k"] == 60
    # Proportional is not equal: weights the simplex does not propose for the file stay what they are.
    other = {"fusion.weights": {"bm25": 2.0, "dense": 2.0, "sparse": 4.0}, "fusion.rrf_k": 61}
    assert space.as_found(other, CONFIG) == other
    moved = {"fusion.weights": {"bm25": 0.3, "dense": 0.2, "sparse": 0.5}}
    assert space.as_found(moved, CONFIG) == moved
    # A name the config no longer holds (or a fixed key) passes through untouched.
    assert space.as_found({"sources.bm25.depth": 150}, CONFIG) == {"sources.bm25.depth": 150}
