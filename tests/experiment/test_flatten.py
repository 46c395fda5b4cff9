"""One assignment flattener (tuner.config.flatten) with one rule for lists: every place
that names a trial's values (the applied values recorded as Optuna params, MLflow
params, the `tuner best` / `tuner report` trials frame, a replay trial's fusion sweep)
names them alike."""

from __future__ import annotations

from types import SimpleNamespace

from optuna.trial import TrialState

from tuner.config.flatten import flatten, leaves
from tuner.ops.analysis import PARAM_PREFIX, trials_frame
from tuner.report.mlflow_values import flat_params
from tuner.study.replay.fusion_search import Scored, sweep_frame
from tuner.study.trial.applied_params import applied_params

ASSIGNMENT = {
    "fusion.method": "rrf",
    "fusion.weights": {"bm25": 0.3, "dense": 0.7},
    "fallback.windows_days": [30, 90],
    "recency.half_life_days": 14,
}
NAMES = {
    "fusion.method",
    "fusion.weights.bm25",
    "fusion.weights.dense",
    "fallback.windows_days.0",
    "fallback.windows_days.1",
    "recency.half_life_days",
}


def test_mappings_by_key_lists_by_position_and_an_empty_one_stays() -> None:
    assert set(flatten(ASSIGNMENT)) == NAMES
    assert flatten({"fallback.windows_days": [], "extra": {}}) == {"fallback.windows_days": [], "extra": {}}
    assert list(leaves({"a.b": [{"c": 1}]})) == [(("a.b", "0", "c"), 1)]  # a dotted key stays one key


def test_every_user_names_an_assignment_by_the_one_rule() -> None:
    # applied params: numeric values only, the sampled ones left out
    assert set(applied_params(ASSIGNMENT, {}, {})) == NAMES - {"fusion.method"}
    assert set(flat_params(ASSIGNMENT)) == NAMES
    trial = SimpleNamespace(
        number=0, state=TrialState.COMPLETE, values=[0.5], user_attrs={}, system_attrs={}, constraints={},
        params={}, distributions={},
    )
    trial.user_attrs["assignment"] = ASSIGNMENT
    frame = trials_frame([trial])
    assert {c.removeprefix(PARAM_PREFIX) for c in frame.columns if c.startswith(PARAM_PREFIX)} == NAMES
    assert frame.loc[0, PARAM_PREFIX + "fallback.windows_days.1"] == 90
    scored = Scored(ASSIGNMENT, 0.5, -0.1)
    assert NAMES <= set(sweep_frame([scored], [scored]).columns)
