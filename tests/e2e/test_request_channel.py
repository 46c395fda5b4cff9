"""The request channel end to end (issue 28): the reference backend takes fusion
overrides in each search request (POST /search ``overrides``), so a study with
``target.channel: request`` patches no file and never restarts the backend.

The proof that the values took effect is a comparison: the same fixed variants (the
baseline and three fusion settings) are measured once through the config file, a
restart per trial, and once through the request; the same backend on the same data must
score each of them the same. The config file is byte-identical after the request study,
its mtime unchanged, and the backend was started once.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import optuna
import pytest
from support.demo_data import copy_demo_subset
from support.reference_experiment import FUSION_SPACE, copy_backend_config, write_reference_experiment

from tuner.config.experiment import load_experiment
from tuner.errors import ConfigError
from tuner.ops.run import run_experiment
from tuner.study.feasibility import best_feasible_trial
from tuner.study.trial.attrs import ATTR_APPLIED, ATTR_EARLY_STOP, ATTR_VARIANT, assignment_of

pytestmark = [pytest.mark.slow, pytest.mark.integration]
N_IN_SCOPE = 60

VARIANTS = [
    {"name": "rrf-k20-bm25-heavy", "fusion.method": "rrf", "fusion.rrf_k": 20,
     "fusion.weights": {"bm25": 0.7, "dense": 0.3}},
    {"name": "rrf-k5-dense-heavy", "fusion.method": "rrf", "fusion.rrf_k": 5,
     "fusion.weights": {"bm25": 0.2, "dense": 0.8}},
    {"name": "linear-z-balanced", "fusion.method": "linear", "fusion.normalization": "z",
     "fusion.weights": {"bm25": 0.5, "dense": 0.5}},
]
# the production values, as the backend's config.yaml holds them and the request declares them
DECLARED = {"method": "rrf", "rrf_k": 60, "weights": {"bm25": 1.0, "dense": 1.0}, "normalization": "minmax"}
BIND = {key: f"body.overrides.{key}" for key in (
    "fusion.method", "fusion.rrf_k", "fusion.weights.bm25", "fusion.weights.dense", "fusion.normalization")}


@pytest.fixture(scope="module")
def demo_data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return copy_demo_subset(tmp_path_factory.mktemp("demo-request") / "data", N_IN_SCOPE)


def project(root: Path, data: Path, study: str, **overrides: Any) -> Path:
    (root / "data").symlink_to(data, target_is_directory=True)
    copy_backend_config(root)
    (root / "shortlist.json").write_text(json.dumps(VARIANTS))
    return write_reference_experiment(root, study=study, n_trials=1 + len(VARIANTS),
                                      storage=f"sqlite:///{root / 'optuna.db'}", shortlist="shortlist.json",
                                      sampler={"type": "random", "seed": 1}, **overrides)


def request_overrides(root: Path) -> dict[str, Any]:
    return {
        "target": {"channel": "request", "config_files": [],
                   "process": {"command": ["{python}", "-m", "fusion_backend", "serve", "--config",
                                           str(root / "backend" / "config.yaml"), "--port", "{port}"]},
                   "request": {"bind": dict(BIND)}},
        "evaluation": {"request": {"body": {"query": "{query}", "top_k": "{top_k}",
                                            "overrides": {"fusion": DECLARED}}}},
    }


def values_by_variant(exp_path: Path) -> tuple[dict[str, Any], list[optuna.trial.FrozenTrial]]:
    """Variant -> its value, or "stopped early" for a trial the OOS constraint stopped
    (its value is of the queries answered by then, which the concurrency decides)."""
    exp = load_experiment(exp_path).bind_port()
    run_experiment(exp)
    trials = optuna.load_study(study_name=exp.study, storage=exp.storage).get_trials()
    return {t.user_attrs[ATTR_VARIANT]: "stopped early" if t.user_attrs.get(ATTR_EARLY_STOP) else t.value
            for t in trials if t.state.name == "COMPLETE"}, trials


@pytest.fixture(scope="module")
def both(demo_data: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    file_root, request_root = tmp_path_factory.mktemp("by-file"), tmp_path_factory.mktemp("by-request")
    by_file, _ = values_by_variant(project(file_root, demo_data, "by-file", search_space=str(FUSION_SPACE)))
    exp_path = project(request_root, demo_data, "by-request", search_space=str(FUSION_SPACE),
                       **request_overrides(request_root))
    config = request_root / "backend" / "config.yaml"
    before = (config.read_bytes(), config.stat().st_mtime_ns)
    by_request, trials = values_by_variant(exp_path)
    return {"file": by_file, "request": by_request, "trials": trials, "config": config, "before": before,
            "root": request_root}


def test_the_request_channel_scores_each_variant_as_the_config_file_does(both: dict[str, Any]) -> None:
    names = {"baseline", *(v["name"] for v in VARIANTS)}
    assert set(both["file"]) == names and set(both["request"]) == names
    for name in sorted(names):
        by_file, by_request = both["file"][name], both["request"][name]
        if "stopped early" in (by_file, by_request):
            assert by_file == by_request, name  # the same config breaks the constraint either way
        else:
            assert math.isclose(by_request, by_file, rel_tol=1e-9, abs_tol=1e-12), name
    # the variants differ among themselves: the values reached the backend
    measured = [v for v in both["request"].values() if v != "stopped early"]
    assert len(measured) >= 3 and len({round(v, 9) for v in measured}) > 1


def test_nothing_was_patched_and_nothing_restarted(both: dict[str, Any]) -> None:
    config: Path = both["config"]
    assert (config.read_bytes(), config.stat().st_mtime_ns) == both["before"]
    assert [t.user_attrs.get(ATTR_APPLIED) for t in both["trials"]] == ["request"] * len(both["trials"])
    assert not list((both["root"] / "backend").glob("*.tuner-*"))  # no temp or backup file beside it


def test_a_tuned_key_without_a_place_in_the_request_stops_before_any_trial(demo_data: Path, tmp_path: Path) -> None:
    overrides = request_overrides(tmp_path)
    del overrides["target"]["request"]["bind"]["fusion.rrf_k"]
    exp_path = project(tmp_path, demo_data, "unbound", search_space=str(FUSION_SPACE), **overrides)
    with pytest.raises(ConfigError, match=r"fusion\.rrf_k: target\.request\.bind has no place for fusion\.rrf_k"):
        run_experiment(load_experiment(exp_path).bind_port())
    assert not (tmp_path / "optuna.db").exists() or not optuna.get_all_study_summaries(
        f"sqlite:///{tmp_path / 'optuna.db'}")


def test_apply_shows_the_request_fragment_and_writes_nothing(both: dict[str, Any]) -> None:
    root: Path = both["root"]
    done = subprocess.run([str(Path(sys.executable).with_name("tuner")), "apply", str(root / "experiment.yaml")],
                          capture_output=True, text=True, timeout=300, env={**os.environ, "COLUMNS": "200"})
    assert done.returncode == 0, done.stderr
    best = best_feasible_trial(both["trials"], maximize=True)
    assert best is not None
    assert f"trial #{best.number} (" in done.stdout and "there is no file to write" in done.stdout
    fragment = json.loads(done.stdout[done.stdout.index("{"):])
    sent = fragment["body"]["overrides"]["fusion"]
    chosen = assignment_of(best)
    assert sent["method"] == chosen["fusion.method"]
    assert sent["weights"] == pytest.approx(chosen["fusion.weights"])
    if chosen["fusion.method"] == "rrf":
        assert sent["rrf_k"] == chosen["fusion.rrf_k"]
    config: Path = both["config"]
    assert (config.read_bytes(), config.stat().st_mtime_ns) == both["before"]
