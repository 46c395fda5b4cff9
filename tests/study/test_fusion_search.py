"""The fusion search inside a trial (tuner.study.replay.fusion_search), without a backend: the
grid honours the space's conditions and bounds, a grid too large goes to a seeded
optimiser that is reproducible, the ranking puts feasible settings first, and a
``replay:`` section that cannot be replayed is refused with its fix."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

from tuner.config.replay import ReplayConfig
from tuner.config.space.loading import load_space
from tuner.errors import ConfigError
from tuner.evaluation.fusion_replay import FusionSetting
from tuner.study.replay.fusion_search import ReplayPlan, Scored, ranked, sweep_frame

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


# ---------------------------------------------------------------- the bounded grid


def _fake(grid, *, seed: int, slack: float = 0.0, infeasible_every: int = 7):  # type: ignore[no-untyped-def]
    """Exact scores for the grid (some tied, some infeasible) and bounds at or above them."""
    import numpy as np

    from tuner.study.gates.threshold import GateBound

    rng = np.random.default_rng(seed)
    values = np.round(rng.random(len(grid)), 2)  # two decimals: many exact ties
    key = {repr(sorted(a.items())): i for i, a in enumerate(grid)}
    calls: list[int] = []

    def index(a) -> int:  # type: ignore[no-untyped-def]
        return key[repr(sorted(a.items()))]

    def score_many(assignments):  # type: ignore[no-untyped-def]
        out = []
        for a in assignments:
            i = index(a)
            calls.append(i)
            bad = i % infeasible_every == 0
            out.append(Scored(a, float(values[i]), 0.3 if bad else -0.01, {"n": float(i)}))
        return out

    def bound_many(assignments):  # type: ignore[no-untyped-def]
        out = []
        for a in assignments:
            i = index(a)
            feasible = i % infeasible_every != 0
            upper = float(values[i]) + slack * float(rng.random()) if feasible else -math.inf
            out.append(GateBound(feasible, upper))
        return out

    return score_many, bound_many, calls


@pytest.mark.parametrize("keep", [1, 2, 3])
@pytest.mark.parametrize("slack", [0.0, 0.05])
def test_a_bounded_grid_finds_the_best_settings_that_scoring_every_one_finds(space, keep: int, slack: float) -> None:
    p = plan(space, weight_step=0.1, points=5)
    grid = p.grid({})
    assert grid is not None
    for seed in range(5):
        score_many, bound_many, calls = _fake(grid, seed=seed, slack=slack)
        full, how_full = p.search(None, given={}, seed=0, score_many=score_many)
        assert how_full == f"grid of {len(grid)}"
        calls.clear()
        bounded, how = p.search(None, given={}, seed=0, score_many=score_many, bound_many=bound_many, keep=keep)
        assert how.startswith(f"grid of {len(grid)}, bounded; {len(calls)} scored exactly")
        assert len(bounded) == len(grid) and len(calls) < len(grid) // 2  # most settings never scored exactly
        want = ranked(full)[:keep]
        got = ranked(bounded)[:keep]
        assert [(s.assignment, s.objective) for s in got] == [(s.assignment, s.objective) for s in want]
        assert all(s.exact for s in got)
        for s in bounded:
            if not s.exact:
                assert math.isnan(s.objective) and s.bound is not None and s.bound < want[-1].objective
                assert s.feasible == (s.bound > -math.inf)


def test_a_bound_below_an_exact_score_is_caught_and_every_setting_scored(space) -> None:
    from tuner.study.gates.threshold import GateBound

    p = plan(space, weight_step=0.25, points=3)
    grid = p.grid({})
    assert grid is not None
    score_many, bound_many, calls = _fake(grid, seed=1)

    def lying(assignments):  # type: ignore[no-untyped-def]
        return [GateBound(b.feasible, b.upper - 0.5) if b.feasible else b for b in bound_many(assignments)]

    scored, how = p.search(None, given={}, seed=0, score_many=score_many, bound_many=lying, keep=2)
    assert "against a bound" in how and how.endswith("; every setting scored)")
    assert len(scored) == len(grid) and all(s.exact for s in scored)

    def blind(assignments):  # type: ignore[no-untyped-def]  # says nothing is feasible
        return [GateBound(False, -math.inf) for _ in assignments]

    scored, how = p.search(None, given={}, seed=0, score_many=score_many, bound_many=blind, keep=2)
    assert "fewer than 2 settings meet the constraints" in how and all(s.exact for s in scored)

    def one(assignments):  # type: ignore[no-untyped-def]  # one feasible setting: the runner-up is infeasible
        return [GateBound(i == 3, 1.0 if i == 3 else -math.inf) for i, _ in enumerate(assignments)]

    scored, how = p.search(None, given={}, seed=0, score_many=score_many, bound_many=one, keep=2)
    assert "fewer than 2 settings meet the constraints" in how and all(s.exact for s in scored)

    scored, how = p.search(None, given={}, seed=0, score_many=score_many,
                           bound_many=lambda xs: [None] * len(xs), keep=2)
    assert "no bound holds" in how and all(s.exact for s in scored)


def test_the_sweep_table_says_which_settings_were_bounded(space) -> None:
    p = plan(space, weight_step=0.25, points=3)
    grid = p.grid({})
    assert grid is not None
    score_many, bound_many, calls = _fake(grid, seed=2, slack=0.01)
    scored, _ = p.search(None, given={}, seed=0, score_many=score_many, bound_many=bound_many, keep=2)
    table = sweep_frame(scored, ranked(scored))
    assert table["exact"].sum() == len(calls) and len(table) == len(grid)
    assert table["exact"].iloc[:2].all() and not table["exact"].iloc[-1]
    assert table.loc[~table["exact"], "objective"].isna().all()
    assert table.loc[table["exact"], "objective_bound"].isna().all()


def test_a_setting_without_an_objective_ranks_after_those_with_one() -> None:
    a = Scored({"w": 1}, math.nan, -0.1)
    b = Scored({"w": 2}, 0.2, -0.1)
    c = Scored({"w": 3}, 0.1, -0.1)
    assert ranked([a, b, c]) == [b, c, a]
    assert ranked([a, b, c], maximize=False) == [c, b, a]


AZURE_SPACE = REPO / "search_space" / "azure_hybrid.yaml"
AZURE_SUBSCORES = {"sources": {"text": {"score": "t"}, "dense": {"score": "d"}},
                   "fusion": {"method": "rrf", "rrf_k": 60, "combine": "sum"}}


def test_a_weight_role_sets_one_sources_weight_and_the_request_gives_the_served_setting() -> None:
    """``weight:<source>``: a scalar param that is one source's weight (Azure's vector query
    weight; the text query keeps its 1.0); the setting served by a request is the declared
    fusion with the request's value in that role."""
    azure = load_space(AZURE_SPACE)
    p = ReplayPlan(azure, ReplayConfig(params={"fusion.weights.dense": "weight:dense"}, request={"debug": "vector"},
                                       subscores=AZURE_SUBSCORES, points=4))
    assert p.grid({}) == [{"fusion.weights.dense": round(float(w), 10)} for w in np.geomspace(0.1, 5.0, 4)]
    assert p.retrieval_values() == {}  # the explained retrieval keeps the request's own weight
    config = ReplayConfig(params={"fusion.weights.dense": "weight:dense"}, request={"x": 1}, subscores=AZURE_SUBSCORES)
    assert config.subscores is not None
    request = {"fusion": {"weights": {"dense": 2.5}}, "sources": {"dense": {"k": 50}, "text": {"max_recall": 1000}}}
    served = p.served_by_request(request, config.subscores.fusion)
    assert served == FusionSetting(method="rrf", weights={"dense": 2.5}, rrf_k=60.0, plain_sum=True)
    assert p.setting({"fusion.weights.dense": 0.5}, served).weights == {"dense": 0.5}
    text_weighed = FusionSetting(weights={"text": 2.0, "dense": 1.0})
    assert p.setting({"fusion.weights.dense": 0.5}, text_weighed).weights == {"text": 2.0, "dense": 0.5}


def test_a_weight_role_must_stay_above_zero(tmp_path: Path) -> None:
    text = AZURE_SPACE.read_text().replace("low: 0.1\n    high: 5.0\n    log: true", "low: 0.0\n    high: 5.0")
    (tmp_path / "space.yaml").write_text(text)
    zero = load_space(tmp_path / "space.yaml")
    with pytest.raises(ConfigError, match=r"replay.params: fusion.weights.dense \(role weight:dense\) reaches 0.0; a "
                                          r"source's weight must stay above 0"):
        ReplayPlan(zero, ReplayConfig(params={"fusion.weights.dense": "weight:dense"}))
