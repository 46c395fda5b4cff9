"""The fusion search inside a trial (tuner.study.fusion_search), without a backend: the
grid honours the space's conditions and bounds, a grid too large goes to a seeded
optimiser that is reproducible, the ranking puts feasible settings first, and a
``replay:`` section that cannot be replayed is refused with its fix."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from tuner.config.replay import ReplayConfig
from tuner.config.space.loading import load_space
from tuner.errors import ConfigError
from tuner.evaluation.fusion_replay import FusionSetting
from tuner.study.fusion_search import ReplayPlan, Scored, ranked, sweep_frame

REPO = Path(__file__).resolve().parents[2]
FUSION = {"fusion.method": "method", "fusion.rrf_k": "rrf_k", "fusion.weights": "weights",
          "fusion.normalization": "normalization"}


@pytest.fixture(scope="module")
def space():  # type: ignore[no-untyped-def]
    return load_space(REPO / "search_space" / "reference_full.yaml", [REPO / "backend" / "config.yaml"])


def plan(space, **config):  # type: ignore[no-untyped-def]
    return ReplayPlan(space, ReplayConfig(**{"params": FUSION, **config}))


def test_the_grid_varies_k_only_for_rrf_and_the_normalisation_only_for_linear(space) -> None:
    grid = plan(space).grid({})
    assert grid is not None
    rrf = [s for s in grid if s["fusion.method"] == "rrf"]
    linear = [s for s in grid if s["fusion.method"] == "linear"]
    assert all("fusion.normalization" not in s and 1 <= s["fusion.rrf_k"] <= 200 for s in rrf)
    assert all("fusion.rrf_k" not in s and s["fusion.normalization"] in ("minmax", "z") for s in linear)
    ks = sorted({s["fusion.rrf_k"] for s in rrf})
    assert ks[0] == 1 and ks[-1] == 200 and len(ks) == 12  # a geometric grid of 12 on the log range
    splits = {tuple(s["fusion.weights"].values()) for s in grid}
    assert len(splits) == 21 and all(math.isclose(sum(w), 1.0) and min(w) >= 0 for w in splits)
    assert len(rrf) == 21 * 12 and len(linear) == 21 * 2
    assert len({repr(sorted(s.items())) for s in grid}) == len(grid)  # no setting twice


def test_a_queued_value_is_kept_and_only_the_rest_is_searched(space) -> None:
    p = plan(space)
    grid = p.grid({"fusion.method": "linear"})
    assert grid is not None and len(grid) == 21 * 2 and all("fusion.method" not in s for s in grid)
    assert p.to_solve({"fusion.method": "linear"}) == ["fusion.weights", "fusion.normalization"]
    every = {"fusion.method": "rrf", "fusion.rrf_k": 20, "fusion.weights": {"bm25": 0.7, "dense": 0.3}}
    assert p.to_solve(every) == []  # a fully queued variant (the baseline) is measured as it is


def test_a_grid_over_max_settings_is_searched_by_a_seeded_optimiser(space) -> None:
    p = plan(space, max_settings=30)
    assert p.grid({}) is None

    def score(a: dict) -> Scored:  # a smooth made-up objective: the bm25 share near 0.3 is best
        return Scored(a, -abs(a["fusion.weights"]["bm25"] - 0.3), 0.0)

    first, how = p.search(score, given={}, seed=5)
    again, _ = p.search(score, given={}, seed=5)
    other, _ = p.search(score, given={}, seed=6)
    assert "TPE, 30 proposals (seed 5)" in how
    assert [s.assignment for s in first] == [s.assignment for s in again]
    assert [s.assignment for s in first] != [s.assignment for s in other]
    assert 1 < len(first) <= 30
    assert ranked(first)[0].objective > -0.15


def test_ranking_puts_feasible_first_then_objective_then_least_violation(space) -> None:
    a = Scored({"x": 1}, 0.9, 0.05)  # best objective, infeasible
    b = Scored({"x": 2}, 0.5, -0.1)
    c = Scored({"x": 3}, 0.6, 0.0)  # feasible on the bound
    d = Scored({"x": 4}, 0.95, 0.01)  # infeasible, but less so than a
    assert [s.assignment["x"] for s in ranked([a, b, c, d])] == [3, 2, 4, 1]
    assert [s.assignment["x"] for s in ranked([a, b, c, d], maximize=False)] == [2, 3, 4, 1]
    frame = sweep_frame([a, b, c, d], ranked([a, b, c, d]))
    assert frame["x"].tolist() == [3, 2, 4, 1] and frame["rank"].tolist() == [1, 2, 3, 4]


def test_settings_put_replayed_values_in_their_roles_over_what_was_served(space) -> None:
    p = plan(space)
    served = FusionSetting(method="rrf", weights={"bm25": 0.5, "dense": 0.5}, rrf_k=60, recency_weight=0.4, top_m=3)
    s = p.setting({"fusion.method": "linear", "fusion.weights": {"bm25": 0.2, "dense": 0.8},
                   "fusion.normalization": "z"}, served)
    assert (s.method, s.normalization, dict(s.weights)) == ("linear", "z", {"bm25": 0.2, "dense": 0.8})
    assert (s.rrf_k, s.recency_weight, s.top_m) == (60, 0.4, 3)  # not replayed: as served
    assert p.retrieval_values() == {"fusion.weights": {"bm25": 0.5, "dense": 0.5}}  # every source returns


@pytest.mark.parametrize(("params", "expected"), [
    ({"fusion.nope": "method"}, "fusion.nope is not a param of the search space"),
    ({"confidence.threshold": "recency_weight"}, "is a post-retrieval gate"),
    ({"fusion.method": "weights"}, "is a categorical param, but role weights needs simplex"),
    ({"fusion.rrf_k": "method"}, "is a int param, but role method needs categorical"),
    ({"fusion.method": "method"}, r"fusion.rrf_k is sampled but depends on replayed \['fusion.method'\]"),
])
def test_a_replay_section_that_cannot_be_replayed_is_refused_with_the_fix(space, params, expected) -> None:
    with pytest.raises(ConfigError, match=expected):
        ReplayPlan(space, ReplayConfig(params=params))


def test_one_param_per_role() -> None:
    with pytest.raises(ValueError, match="both have role rrf_k"):
        ReplayConfig(params={"fusion.rrf_k": "rrf_k", "other.k": "rrf_k"})


def test_declared_grid_values_replace_the_generated_ones_and_are_checked(space) -> None:
    p = plan(space, grid={"fusion.rrf_k": [1, 5, 60, 5], "fusion.weights": [{"bm25": 3, "dense": 1}, [1, 1]],
                          "fusion.method": ["rrf"]})
    grid = p.grid({})
    assert grid is not None and len(grid) == 3 * 2  # k 1, 5, 60 (repeat dropped) x 2 weightings, rrf only
    assert {s["fusion.rrf_k"] for s in grid} == {1, 5, 60}
    assert {tuple(s["fusion.weights"].values()) for s in grid} == {(0.75, 0.25), (0.5, 0.5)}  # normalised
    for bad, expected in [({"fusion.rrf_k": [0]}, r"grid.fusion.rrf_k: 0 is not a number in \[1, 200\]"),
                          ({"fusion.rrf_k": [2.5]}, "2.5 is not a whole number"),
                          ({"fusion.method": ["borda"]}, "'borda' is not one of the choices"),
                          ({"fusion.weights": [{"bm25": 1}]}, "weights must name exactly the components"),
                          ({"recency.weight": [0.1]}, "recency.weight is not a replayed param"),
                          ({"fusion.rrf_k": []}, "an empty grid")]:
        with pytest.raises(ConfigError, match=expected):
            plan(space, grid=bad)
