"""Parallel trials on one backend end to end (issue 28): `tuner run --parallel 4` with
``target.channel: request`` against the reference backend, which takes the fusion values
in each request's ``overrides``.

The proof of isolation is a comparison, as in test_request_channel.py: the same fixed
fusion settings (the baseline and eight shortlist variants, each scoring differently)
are measured once one trial at a time and once four at a time on one backend; each
trial of the parallel run must score exactly what its setting scored alone. That it
really ran in parallel is read from what the backend saw: a logging proxy in front of
it records every search request's arrival and answer, and requests carrying different
trials' values were in flight at the same moment (an outcome, never a speed).
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
from mlflow import MlflowClient
from optuna.trial import TrialState
from support.demo_data import copy_demo_subset
from support.reference_experiment import FUSION_SPACE, copy_backend_config, write_reference_experiment
from support.request_log import RequestLogProxy, overlapping

from e2e.test_request_channel import request_overrides
from tuner.config.experiment import free_port, load_experiment
from tuner.errors import ConfigError
from tuner.ops.run import run_experiment
from tuner.report.tracking import TAG_ROLE, TAG_TRIAL
from tuner.study.storage.transient import RIDE_ENV
from tuner.study.trial.attrs import ATTR_VARIANT, assignment_of

pytestmark = [pytest.mark.slow, pytest.mark.integration]
N_IN_SCOPE = 60
PARALLEL = 4

VARIANTS = [
    {"name": "rrf-k20-bm25-heavy", "fusion.method": "rrf", "fusion.rrf_k": 20,
     "fusion.weights": {"bm25": 0.7, "dense": 0.3}},
    {"name": "rrf-k5-dense-heavy", "fusion.method": "rrf", "fusion.rrf_k": 5,
     "fusion.weights": {"bm25": 0.2, "dense": 0.8}},
    {"name": "rrf-k150-balanced", "fusion.method": "rrf", "fusion.rrf_k": 150,
     "fusion.weights": {"bm25": 0.5, "dense": 0.5}},
    {"name": "rrf-k2-bm25-only-ish", "fusion.method": "rrf", "fusion.rrf_k": 2,
     "fusion.weights": {"bm25": 0.95, "dense": 0.05}},
    {"name": "linear-z-balanced", "fusion.method": "linear", "fusion.normalization": "z",
     "fusion.weights": {"bm25": 0.5, "dense": 0.5}},
    {"name": "linear-minmax-bm25-heavy", "fusion.method": "linear", "fusion.normalization": "minmax",
     "fusion.weights": {"bm25": 0.8, "dense": 0.2}},
    {"name": "linear-minmax-dense-heavy", "fusion.method": "linear", "fusion.normalization": "minmax",
     "fusion.weights": {"bm25": 0.1, "dense": 0.9}},
    {"name": "linear-z-dense-only-ish", "fusion.method": "linear", "fusion.normalization": "z",
     "fusion.weights": {"bm25": 0.05, "dense": 0.95}},
]
N_TRIALS = 1 + len(VARIANTS)  # the baseline and every variant


@pytest.fixture(scope="module")
def demo_data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return copy_demo_subset(tmp_path_factory.mktemp("demo-parallel") / "data", N_IN_SCOPE)


def project(root: Path, data: Path, study: str, *, search_url: str = "http://127.0.0.1:{port}/search",
            port: int | str = "auto") -> Path:
    """The request-channel study of test_request_channel.py over this module's variants,
    with no constraint (no OOS early stop: every trial's value covers the whole batch)
    and MLflow on."""
    (root / "data").symlink_to(data, target_is_directory=True)
    copy_backend_config(root)
    (root / "shortlist.json").write_text(json.dumps(VARIANTS))
    overrides = request_overrides(root)
    overrides["target"]["port"] = port
    overrides["evaluation"]["request"]["url"] = search_url
    return write_reference_experiment(
        root, study=study, n_trials=N_TRIALS, storage=f"sqlite:///{root / 'optuna.db'}", shortlist="shortlist.json",
        sampler={"type": "random", "seed": 1}, search_space=str(FUSION_SPACE), constraints=[],
        tracking={"enabled": True, "mlflow_uri": f"sqlite:///{root / 'mlflow.db'}"}, **overrides)


def by_variant(exp: Any) -> dict[str, optuna.trial.FrozenTrial]:
    trials = optuna.load_study(study_name=exp.study, storage=exp.storage).get_trials()
    return {t.user_attrs[ATTR_VARIANT]: t for t in trials}


@pytest.fixture(scope="module")
def runs(demo_data: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    alone_root, parallel_root = tmp_path_factory.mktemp("alone"), tmp_path_factory.mktemp("parallel")
    alone = load_experiment(project(alone_root, demo_data, "alone")).bind_port()
    run_experiment(alone)

    port = free_port()
    proxy = RequestLogProxy(f"http://127.0.0.1:{port}").start()
    try:
        path = project(parallel_root, demo_data, "parallel", search_url=f"{proxy.url}/search", port=port)
        exp = load_experiment(path).bind_port()
        summary = run_experiment(exp, parallel=PARALLEL)
    finally:
        proxy.close()
    return {"alone": by_variant(alone), "parallel": by_variant(exp), "exp": exp, "summary": summary,
            "log": [e for e in proxy.entries if e.path == "/search"]}


def test_each_trial_scores_what_its_values_score_alone(runs: dict[str, Any]) -> None:
    alone, parallel = runs["alone"], runs["parallel"]
    names = {"baseline", *(v["name"] for v in VARIANTS)}
    assert set(alone) == names and set(parallel) == names
    for name in sorted(names):
        a, p = alone[name], parallel[name]
        assert a.state == p.state == TrialState.COMPLETE, name
        assert assignment_of(p) == assignment_of(a), name  # its own params
        assert math.isclose(p.value, a.value, rel_tol=1e-9, abs_tol=1e-12), (name, p.value, a.value)
    # the settings score differently: a trial scored on another's values would show
    assert len({round(t.value, 9) for t in alone.values()}) >= 6


def test_the_backend_saw_different_trials_values_at_the_same_moment(runs: dict[str, Any]) -> None:
    log = runs["log"]
    sent = {json.dumps(e.body.get("overrides"), sort_keys=True) for e in log}
    assert len(sent) == N_TRIALS  # every trial's values (the baseline's are the declared request's)
    pairs = overlapping(log, lambda e: json.dumps(e.body.get("overrides"), sort_keys=True))
    assert pairs, "no two trials' requests were in flight at once: the run was not parallel"
    assert all(e.status == 200 for e in log)


def test_the_run_ends_as_a_sequential_one_does(runs: dict[str, Any]) -> None:
    summary, exp, parallel = runs["summary"], runs["exp"], runs["parallel"]
    assert summary.error is None and summary.result.stopped_by == "n_trials"
    assert len(summary.result.ran) == N_TRIALS and summary.n_trials_total == N_TRIALS  # n_trials exact
    assert summary.best is not None and summary.best.value == max(t.value for t in parallel.values())
    # MLflow: one child run per trial, with that trial's own params and score
    client = MlflowClient(exp.tracking.mlflow_uri)
    experiment = client.get_experiment_by_name(exp.study)
    runs_ = client.search_runs([experiment.experiment_id], f"tags.`{TAG_ROLE}` = 'trial'")
    by_trial = {int(r.data.tags[TAG_TRIAL]): r for r in runs_}
    assert sorted(by_trial) == sorted(t.number for t in parallel.values())
    for t in parallel.values():
        run = by_trial[t.number]
        assert run.info.run_id == t.user_attrs["mlflow_run_id"] and run.info.status == "FINISHED"
        assert run.data.metrics["Primary_Metric_Score"] == pytest.approx(t.value, rel=1e-12)
        assert run.data.params["fusion.method"] == assignment_of(t)["fusion.method"]
        # the trial's report shows the request it sent (its own values), not the declared one
        report = json.loads((exp.state_dir / "trials" / exp.study / str(t.number) / "report.json").read_text())
        sent = report["context"]["spec"]["request"]["body"]["overrides"]["fusion"]
        assert sent["method"] == assignment_of(t)["fusion.method"]
        assert sent["weights"] == pytest.approx(assignment_of(t)["fusion.weights"])


def test_parallel_trials_through_a_config_file_are_refused_with_the_fix(demo_data: Path, tmp_path: Path) -> None:
    (tmp_path / "data").symlink_to(demo_data, target_is_directory=True)
    copy_backend_config(tmp_path)
    path = write_reference_experiment(tmp_path, study="by-file", n_trials=2, storage=f"sqlite:///{tmp_path / 'o.db'}")
    with pytest.raises(ConfigError, match=r"--parallel 2 needs target\.channel: request .*tuner worker") as info:
        run_experiment(load_experiment(path), parallel=2)
    assert "\n" not in str(info.value)
    assert not (tmp_path / "o.db").exists()  # refused before anything was opened
    # the CLI: one line, exit 2
    done = subprocess.run([sys.executable, "-m", "tuner", "run", str(path), "--parallel", "2"], capture_output=True,
                          text=True, timeout=300, env={**os.environ, "COLUMNS": "200"})
    lines = [ln for ln in done.stderr.splitlines() if ln.strip()]
    assert done.returncode == 2 and len(lines) == 1 and "needs target.channel: request" in lines[0], done.stderr


def test_a_bad_storage_ride_is_refused_before_anything_is_opened(demo_data: Path, tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    # it was read at the first retried storage call: after the preflight had started the backend
    (tmp_path / "data").symlink_to(demo_data, target_is_directory=True)
    copy_backend_config(tmp_path)
    path = write_reference_experiment(tmp_path, study="ride", n_trials=1, storage=f"sqlite:///{tmp_path / 'o.db'}")
    monkeypatch.setenv(RIDE_ENV, "soon")
    with pytest.raises(ConfigError, match=rf"{RIDE_ENV}='soon': not a number of seconds .* unset it") as info:
        run_experiment(load_experiment(path))
    assert "\n" not in str(info.value)
    assert not (tmp_path / "o.db").exists() and not (tmp_path / ".tuner").exists()
