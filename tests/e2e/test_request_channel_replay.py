"""Fusion replay with the request channel on the reference backend's own route (``POST
/search`` with per-request ``overrides`` and ``explain``, docs/backend.md): the explained
retrieval carries the trial's request, the backend's explanation says which fusion it
served, the grid is scored from it, and the winner is verified live by sending its
values in the request. Nothing is patched: the config file keeps its bytes."""

from __future__ import annotations

import json
from pathlib import Path

import optuna
import pytest
from e2e.test_request_channel import BIND, DECLARED
from support.demo_data import copy_demo_subset
from support.reference_experiment import copy_backend_config, write_reference_experiment

from tuner.config.experiment import load_experiment
from tuner.ops.run import run_experiment
from tuner.study.trial.attrs import ATTR_APPLIED, ATTR_FAIL_REASON, ATTR_REPLAY, assignment_of, trial_attr

pytestmark = [pytest.mark.slow, pytest.mark.integration]
optuna.logging.set_verbosity(optuna.logging.WARNING)

FUSION = {"fusion.method": "method", "fusion.rrf_k": "rrf_k", "fusion.weights": "weights",
          "fusion.normalization": "normalization"}


def test_a_request_channel_study_replays_the_fusion_from_explain_and_verifies_it_in_the_request(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    data = copy_demo_subset(tmp_path_factory.mktemp("request-replay-data") / "data", 40)
    root = tmp_path_factory.mktemp("request-replay")
    (root / "data").symlink_to(data, target_is_directory=True)
    config = copy_backend_config(root)
    before = config.read_bytes()
    exp_path = write_reference_experiment(
        root, study="request-replay", n_trials=2, storage=f"sqlite:///{root / 'optuna.db'}",
        sampler={"type": "random", "seed": 1}, constraints=["OOS_FP_Rate <= 0.10"],
        target={"channel": "request", "config_files": [],
                "process": {"command": ["{python}", "-m", "fusion_backend", "serve", "--config", str(config),
                                        "--port", "{port}"]},
                "request": {"bind": dict(BIND)}},
        evaluation={"request": {"body": {"query": "{query}", "top_k": "{top_k}",
                                         "overrides": {"fusion": json.loads(json.dumps(DECLARED))}}}},
        replay={"params": FUSION, "points": 3, "weight_step": 0.5, "verify_top": 2, "workers": 0})
    exp = load_experiment(exp_path).bind_port()
    run_experiment(exp)
    trials = optuna.load_study(study_name=exp.study, storage=exp.storage).get_trials()
    assert [t.state for t in trials] == [optuna.trial.TrialState.COMPLETE] * 2, [
        t.user_attrs.get(ATTR_FAIL_REASON) for t in trials]
    assert [t.user_attrs.get(ATTR_APPLIED) for t in trials] == ["request", "request"]
    record = trial_attr(trials[1], ATTR_REPLAY)
    assert record["settings"] == 3 * 3 + 3 * 2  # 3 weight splits x (3 RRF k + 2 linear normalisations)
    assert record["served_check"].endswith("answers replayed exactly at the served setting")
    for v in record["verified"]:
        assert v["live"] == pytest.approx(v["replayed"], abs=1e-9)
    best = max(record["verified"], key=lambda v: v["live"])
    assert trials[1].value == pytest.approx(best["live"], abs=1e-12)
    chosen = assignment_of(trials[1])
    for key, value in best["assignment"].items():  # weights as found keep the request's scale (1.0/1.0 = 0.5/0.5)
        if key == "fusion.weights":
            total = sum(chosen[key].values())
            assert {c: w / total for c, w in chosen[key].items()} == pytest.approx(value)
        else:
            assert chosen[key] == value
    assert config.read_bytes() == before
