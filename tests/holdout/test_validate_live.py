"""`tuner validate` against the real reference backend (process target, demo data).

A/A on the live service through the CLI: the "best" trial has the baseline's
assignment, so every holdout delta must be exactly 0 and nothing significant; the
config is restored byte for byte and the held-out queries are exactly the split's
holdout part.
"""

from __future__ import annotations

import json
import subprocess
import sys

import optuna
import pytest
from support.reference_experiment import copy_backend_config, write_reference_experiment

from tuner.errors import StudyError
from tuner.evaluation.holdout import HoldoutConfig, record_split, split_queries
from tuner.ops.validate import validate_holdout
from tuner.study.trial.attrs import ATTR_ASSIGNMENT, ATTR_VARIANT, set_record


@pytest.fixture
def setup(tmp_path):
    from support.demo_data import copy_demo_data
    from tuner.config.experiment import load_experiment
    from tuner.study.wiring import prepare

    copy_demo_data(tmp_path / "data")
    config = copy_backend_config(tmp_path)
    path = write_reference_experiment(tmp_path, study="validate-test", n_trials=3,
                                      storage=f"sqlite:///{tmp_path / 'optuna.db'}")
    exp = load_experiment(path)
    prepared = prepare(exp)
    baseline = prepared.space.current_assignment(prepared.patcher.documents())
    study = optuna.create_study(study_name=exp.study, storage=exp.storage, direction="maximize")
    for variant, value in (("baseline", 0.4), ("", 0.5)):
        trial = study.ask()
        set_record(trial, ATTR_ASSIGNMENT, baseline)
        if variant:
            trial.set_user_attr(ATTR_VARIANT, variant)
        trial.set_constraint("OOS_FP_Rate <= 0.1", -0.05)
        study.tell(trial, value)
    return exp, prepared, study, config


def test_aa_on_the_live_backend_shows_no_difference_and_restores_the_config(setup):
    exp, prepared, study, config = setup
    original = config.read_bytes()
    holdout = HoldoutConfig(fraction=0.3, seed=4)
    split = split_queries(prepared.queries, holdout)
    record_split(study, split)
    proc = subprocess.run([sys.executable, "-m", "tuner", "validate", str(exp.source), "--fraction", "0.3",
                           "--seed", "4", "--resamples", "500"], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "| Primary_Metric_Score |" in proc.stdout and "no significant difference" in proc.stdout
    data = json.loads((exp.state_dir / "reports" / exp.study / "holdout.json").read_text())
    assert (data["baseline_trial"], data["best_trial"]) == (0, 1)
    in_scope_holdout = [q for q in split.holdout if prepared.queries[q].scope == "in"]
    assert data["holdout_query_ids"] == list(split.holdout)
    assert (data["n_queries"], data["n_in_scope"]) == (len(split.holdout), len(in_scope_holdout))
    assert set(split.holdout).isdisjoint(split.tune)
    assert all(row["delta"] == 0.0 and row["p_value"] == 1.0 for row in data["metrics"])
    assert data["judged"]["baseline"] == data["judged"]["best"]
    assert config.read_bytes() == original
    assert "Holdout validation" in (exp.state_dir / "reports" / exp.study / "holdout.md").read_text()


def test_validation_refuses_a_split_other_than_the_one_the_study_tuned_on(setup):
    exp, prepared, study, config = setup
    record_split(study, split_queries(prepared.queries, HoldoutConfig(seed=1)))
    with pytest.raises(StudyError, match="holdout seed 1"):
        validate_holdout(exp, holdout=HoldoutConfig(seed=2), n_resamples=100)
