"""`tuner apply` against production: every constraint of the study re-checked on the
re-measured batch (a violation rolls back, naming it), hand edits since the study
stop it (drift) unless --force, and a run whose every trial failed exits non-zero."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from ruamel.yaml import YAML
from support.reference_experiment import DROP

from e2e.test_study_e2e import demo_data, make_project  # noqa: F401  (module fixture reused)
from tuner.config.experiment import load_experiment
from tuner.errors import StudyError
from tuner.ops.apply import apply_plan, plan_apply
from tuner.ops.run import run_experiment

pytestmark = [pytest.mark.slow, pytest.mark.integration]


@pytest.fixture(scope="module")
def two_trials(demo_data: Path, tmp_path_factory: pytest.TempPathFactory) -> dict:  # noqa: F811
    """The baseline and the first shortlist variant (rrf k 20, bm25-heavy), measured."""
    root = tmp_path_factory.mktemp("apply-safety")
    exp_path = make_project(root, demo_data, study="apply", n_trials=2, constraints=["OOS_FP_Rate <= 1.0"],
                            tracking={"enabled": False})
    summary = run_experiment(load_experiment(exp_path))
    assert summary.error is None, summary.error
    config = root / "backend" / "config.yaml"
    return {"root": root, "exp_path": exp_path, "config": config, "original": config.read_bytes()}


def _with_constraint(exp_path: Path, constraint: str) -> object:
    return load_experiment(exp_path).model_copy(update={"constraints": [type(
        load_experiment(exp_path).constraints[0]).parse(constraint)]})


def test_apply_rolls_back_a_config_that_breaks_a_constraint(two_trials: dict) -> None:
    config, original = two_trials["config"], two_trials["original"]
    # The study's constraint now asks for no OOS answer at all; the variant answers some.
    exp = _with_constraint(two_trials["exp_path"], "OOS_FP_Rate <= 0.0")
    plan = plan_apply(exp, trial_number=1)
    try:
        result = apply_plan(plan, tolerance=1.0)  # the objective alone would pass
        assert result.rolled_back and not result.applied, result.message
        assert "constraint violated on the re-measured batch: OOS_FP_Rate = " in result.message
        assert "breaks OOS_FP_Rate <= 0" in result.message and "\n" not in result.message
        assert config.read_bytes() == original
    finally:
        config.write_bytes(original)


def test_apply_stops_on_a_key_edited_since_the_study_unless_forced(two_trials: dict) -> None:
    config, original = two_trials["config"], two_trials["original"]
    exp = load_experiment(two_trials["exp_path"])
    yaml = YAML()
    doc = yaml.load(original.decode())
    assert doc["fusion"]["rrf_k"] != 20
    text = original.decode().replace(f"rrf_k: {doc['fusion']['rrf_k']}", "rrf_k: 33", 1)
    assert text != original.decode()
    config.write_text(text)  # a hand edit of a key trial #1 writes (rrf_k: 20)
    try:
        plan = plan_apply(exp, trial_number=1)
        assert [(name, now, new) for name, _, now, new in plan.drift] == [("fusion.rrf_k", 33, 20)]
        with pytest.raises(StudyError, match=r"fusion.rrf_k: study saw \d+, now 33, trial writes 20.*--force"):
            apply_plan(plan, tolerance=1.0)
        assert config.read_text() == text  # nothing written
        forced = apply_plan(plan, tolerance=1.0, force=True)
        assert forced.applied, forced.message
        assert YAML(typ="safe").load(config.read_text())["fusion"]["rrf_k"] == 20
    finally:
        config.write_bytes(original)


def test_a_run_whose_every_trial_fails_exits_non_zero(demo_data: Path, tmp_path: Path) -> None:  # noqa: F811
    space = tmp_path / "space.yaml"
    space.write_text("params:\n  confidence.top_m: {type: int, low: 0, high: 0}   # the backend wants >= 1\n")
    exp_path = make_project(tmp_path, demo_data, study="allfail", n_trials=2, search_space=space, shortlist=DROP,
                            baseline=False, failure_budget={"max_consecutive": 5, "max_total": 5},
                            tracking={"enabled": False})
    config = tmp_path / "backend" / "config.yaml"
    original = config.read_bytes()
    done = subprocess.run([sys.executable, "-m", "tuner", "run", str(exp_path)], capture_output=True, text=True,
                          timeout=600, env={**os.environ, "COLUMNS": "200"})
    assert done.returncode == 1, done.stdout + done.stderr
    out = done.stdout + done.stderr
    assert "every trial of this run failed (2)" in out and "BackendExited" in out
    assert config.read_bytes() == original


def test_a_config_tag_the_tuner_cannot_write_back_stops_the_run_before_trial_0(demo_data: Path,  # noqa: F811
                                                                                tmp_path: Path) -> None:
    exp_path = make_project(tmp_path, demo_data, study="tag", n_trials=2, tracking={"enabled": False})
    config = tmp_path / "backend" / "config.yaml"
    config.write_text(config.read_text() + "vault_secret: !vault abc\n")
    original = config.read_bytes()
    done = subprocess.run([sys.executable, "-m", "tuner", "run", str(exp_path)], capture_output=True, text=True,
                          timeout=300, env={**os.environ, "COLUMNS": "200"})
    assert done.returncode == 2, done.stdout + done.stderr
    assert "!vault" in done.stderr and "every trial would fail on it" in done.stderr
    assert config.read_bytes() == original
    assert not (tmp_path / ".tuner" / "restore-journal.json").exists()
