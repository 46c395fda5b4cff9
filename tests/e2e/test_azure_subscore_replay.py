"""Fusion replay from an engine's own sub-scores, end to end (issue 28): the reference
backend's Azure AI Search-shaped route (``POST /indexes/{index}/docs/search``,
docs/backend.md) tuned with its values in the request (target.channel: request), the
vector query's weight replayed from the ``@search.documentDebugInfo`` sub-scores of one
``debug: "vector"`` retrieval per trial, and the winner verified live by sending its
weight in the request.

Checked: every trial completes, each explained answer replays exactly at the weight the
request carried (the served-setting check), and each verified weight's live score is
its replayed one; the best trial's live score is what a plain request-mode trial with the
same values scores; a sub-score mapping that reads the wrong vector query is refused by
the served-setting check with a one-line error, and no trial completes on it.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import optuna
import pytest
from support.demo_data import copy_demo_subset
from support.reference_experiment import DROP, copy_backend_config, write_reference_experiment

import numpy as np
from e2e.test_azure_request_channel import BIND, BODY, SPACE

from tuner.config.experiment import load_experiment
from tuner.ops.run import run_experiment
from tuner.study.preflight import PreflightError
from tuner.study.trial.attrs import ATTR_FAIL_REASON, ATTR_REPLAY, ATTR_VARIANT, assignment_of, trial_attr

pytestmark = [pytest.mark.slow, pytest.mark.integration]
optuna.logging.set_verbosity(optuna.logging.WARNING)

N_IN_SCOPE = 30
N_TRIALS = 3
WEIGHT = "fusion.weights.dense"
DEBUG = "@search\\.documentDebugInfo.vectors.subscores"  # the key "@search.documentDebugInfo", then a path
SUBSCORES = {
    "limit": "top",
    "sources": {"text": {"score": f"{DEBUG}.text.searchScore"},
                "dense": {"score": f"{DEBUG}.vectors.0.dense.searchScore"}},
    "fusion": {"method": "rrf", "rrf_k": 60, "combine": "sum"},
}
REPLAY = {"params": {WEIGHT: "weight:dense"}, "request": {"debug": "vector", "top": 3000}, "points": 6,
          "verify_top": 2, "workers": 0, "subscores": SUBSCORES}


def _project(root: Path, data: Path, *, study: str, n_trials: int, replay: dict[str, Any] | None = None,
             **extra: Any) -> Path:
    (root / "data").symlink_to(data, target_is_directory=True)
    config = copy_backend_config(root)
    return write_reference_experiment(
        root, study=study, n_trials=n_trials, storage=f"sqlite:///{root / 'optuna.db'}",
        search_space=str(SPACE), sampler={"type": "random", "seed": 11}, constraints=[],
        target={"channel": "request", "config_files": [],
                "process": {"command": ["{python}", "-m", "fusion_backend", "serve", "--config", str(config),
                                        "--port", "{port}"]},
                "request": {"bind": BIND}},
        evaluation={
            "request": {"url": "http://127.0.0.1:{port}/indexes/catalog/docs/search?api-version=2024-07-01",
                        "body": copy.deepcopy(BODY), "pass_extra": False},
            "response": {"results_path": "value", "doc_id": "id", "score": "@search\\.score", "title": "title",
                         "confidence": DROP, "handoff": DROP, "fallback_level": DROP},
        },
        **({"replay": replay} if replay is not None else {}), **extra)


def _trials(exp_path: Path, **run: Any) -> list[optuna.trial.FrozenTrial]:
    exp = load_experiment(exp_path).bind_port()
    run_experiment(exp, **run)
    return optuna.load_study(study_name=exp.study, storage=exp.storage).get_trials()


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    data = copy_demo_subset(tmp_path_factory.mktemp("azure-replay-data") / "data", N_IN_SCOPE)
    rows = [json.loads(line) for line in (data / "queries.jsonl").read_text().splitlines() if line.strip()]
    (data / "queries.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows if r["scope"] == "in"))
    return data


@pytest.fixture(scope="module")
def replayed(data: Path, tmp_path_factory: pytest.TempPathFactory) -> list[optuna.trial.FrozenTrial]:
    root = tmp_path_factory.mktemp("azure-replay")
    return _trials(_project(root, data, study="azure-replay", n_trials=N_TRIALS, replay=REPLAY))


def test_every_trial_replays_the_weight_from_sub_scores_and_verifies_it_live(
    replayed: list[optuna.trial.FrozenTrial],
) -> None:
    assert [t.state for t in replayed] == [optuna.trial.TrialState.COMPLETE] * N_TRIALS, [
        t.user_attrs.get(ATTR_FAIL_REASON) for t in replayed
    ]
    baseline, *sampled = replayed  # the baseline is production as found: measured, not replayed
    assert baseline.user_attrs.get(ATTR_VARIANT) == "baseline" and trial_attr(baseline, ATTR_REPLAY) is None
    assert assignment_of(baseline)[WEIGHT] == 1.0
    for t in sampled:
        record = trial_attr(t, ATTR_REPLAY)
        assert record["settings"] == 6  # the weight's grid: 6 points of its log range
        assert record["served_check"].endswith("answers replayed exactly at the served setting")
        assert len(record["verified"]) == 2
        for v in record["verified"]:  # each verified weight: its replayed score is its live one
            assert v["live"] == pytest.approx(v["replayed"], abs=1e-9)
            assert v["assignment"][WEIGHT] in [pytest.approx(w) for w in np.geomspace(0.1, 5.0, 6)]
        best = max(record["verified"], key=lambda v: v["live"])
        assert t.value == pytest.approx(best["live"], abs=1e-12)
        assert assignment_of(t)[WEIGHT] == pytest.approx(best["assignment"][WEIGHT])


def test_the_winner_scores_live_what_a_request_mode_trial_with_its_values_scores(
    replayed: list[optuna.trial.FrozenTrial], data: Path, tmp_path_factory: pytest.TempPathFactory,
) -> None:
    best = max((t for t in replayed if t.value is not None), key=lambda t: t.value or 0.0)
    values = assignment_of(best)
    root = tmp_path_factory.mktemp("azure-plain")
    plain = _trials(_project(root, data, study="azure-plain", n_trials=1, baseline=False,
                             shortlist=[{"name": "winner", **values}]))
    assert [t.state for t in plain] == [optuna.trial.TrialState.COMPLETE]
    assert assignment_of(plain[0]) == pytest.approx(values)
    assert plain[0].value == pytest.approx(best.value, abs=1e-12)


def test_a_wrong_sub_score_mapping_is_refused_by_the_served_check(
    data: Path, tmp_path_factory: pytest.TempPathFactory,
) -> None:
    wrong = copy.deepcopy(REPLAY)  # the vector query is vectors.0; vectors.1 is no query at all
    wrong["subscores"]["sources"]["dense"]["score"] = f"{DEBUG}.vectors.1.dense.searchScore"
    root = tmp_path_factory.mktemp("azure-wrong")
    exp_path = _project(root, data, study="azure-wrong", n_trials=2, replay=wrong, baseline=False,
                        failure_budget={"max_consecutive": 2, "max_total": 2})
    with pytest.raises(PreflightError) as refused:  # before the first trial
        _trials(exp_path)
    message = str(refused.value)
    assert "\n" not in message
    assert "fusion replay does not reproduce the backend's own answers at the setting it served" in message
    # and each trial refuses it too, when the preflight is skipped: no replayed number is ever reported
    trials = _trials(exp_path, skip_checks=True)
    assert trials and all(t.state == optuna.trial.TrialState.FAIL for t in trials)
    reason = trials[0].user_attrs[ATTR_FAIL_REASON]
    assert "\n" not in reason
    assert "does not reproduce the backend's own answers at the setting it served" in reason
    assert "ranking differs" in reason or "score at rank" in reason


def test_a_limit_that_names_no_number_of_the_explained_request_is_refused_before_any_trial(
    data: Path, tmp_path_factory: pytest.TempPathFactory,
) -> None:
    from tuner.errors import ConfigError
    from tuner.study.wiring import prepare

    wrong = copy.deepcopy(REPLAY)
    wrong["subscores"]["limit"] = "hybridSearch"  # a mapping, not the cap
    root = tmp_path_factory.mktemp("azure-limit")
    exp = load_experiment(_project(root, data, study="azure-limit", n_trials=1, replay=wrong))
    with pytest.raises(ConfigError, match=r"^replay.subscores.limit: hybridSearch is \{'maxTextRecallSize': 1000\} "
                                          r"in the explained request's body; it must name the number that caps"):
        prepare(exp)
    wrong["subscores"]["limit"] = "top"
    wrong["request"] = {"debug": "vector"}  # top stays the declared "{top_k}": 50, the answer's cap
    exp = load_experiment(_project(tmp_path_factory.mktemp("azure-limit2"), data, study="azure-limit2", n_trials=1,
                                   replay=wrong))
    prepare(exp)  # accepted: the cap is top_k; an answer that long fails its query (tests/evaluation)
