"""Which trials keep full report files (tuner.study.trial.records): the baseline and the best
feasible trial so far; a superseded best is rewritten slim in place (its hard links in
the artifact store see the slim bytes); every trial when the experiment asks
(``tracking.report_detail: full``). Real Optuna trials, the fake backend, whose
evaluator writes the detail it was asked for into report.json."""

from __future__ import annotations

import json
from pathlib import Path

import optuna
import pytest
from optuna.artifacts import get_all_artifact_meta

from study.fakes import run_one
from study.test_trial_runner import make_runner
from tuner.study.trial.attrs import ATTR_VARIANT, reports_of
from tuner.study.trial.bookkeeping import Bookkeeper, OptunaArtifacts

optuna.logging.set_verbosity(optuna.logging.WARNING)


def detail_of(trial: optuna.trial.FrozenTrial) -> str:
    """The detail of the trial's report files as they are on disk now."""
    return json.loads(Path(reports_of(trial)["json"]).read_text())["detail"]


def run(study: optuna.Study, runner, x: float, k: int, variant: str | None = None) -> optuna.trial.FrozenTrial:
    if variant is not None:
        study.enqueue_trial({"x": x, "k": k}, user_attrs={ATTR_VARIANT: variant})
        _, frozen = run_one(study, runner)
    else:
        _, frozen = run_one(study, runner, {"x": x, "k": k})
    runner.flush()
    return frozen


def test_only_the_best_feasible_trial_so_far_keeps_full_reports(tmp_path: Path) -> None:
    runner, _, _, _ = make_runner(tmp_path)
    study = optuna.create_study(direction="maximize")
    first = run(study, runner, 0.25, 30)       # feasible, the first: the best so far
    assert detail_of(first) == "full"
    worse = run(study, runner, 0.1, 10)        # feasible, worse
    assert [detail_of(t) for t in (first, worse)] == ["full", "slim"]
    better = run(study, runner, 0.45, 40)      # feasible, a new best: the first is demoted
    infeasible = run(study, runner, 0.7, 40)   # scores highest, but OOS_FP_Rate 0.14 > 0.10
    assert infeasible.value > better.value > first.value > worse.value
    assert [detail_of(t) for t in (first, worse, better, infeasible)] == ["slim", "slim", "full", "slim"]
    assert runner.bookkeeper.errors == []


def test_a_demoted_best_is_rewritten_in_place_so_its_artifact_links_see_the_slim_bytes(tmp_path: Path) -> None:
    store = tmp_path / "artifacts"
    runner, _, _, _ = make_runner(tmp_path, artifacts=OptunaArtifacts(store), bookkeeper=Bookkeeper(threaded=True))
    storage = optuna.storages.InMemoryStorage()
    study = optuna.create_study(direction="maximize", storage=storage)
    first = run(study, runner, 0.25, 30)
    report = Path(reports_of(first)["json"])
    inode = report.stat().st_ino
    (meta,) = [m for m in get_all_artifact_meta(first, storage=storage) if m.filename == "report.json"]
    linked = store / meta.artifact_id
    assert linked.stat().st_ino == inode and json.loads(linked.read_text())["detail"] == "full"

    run(study, runner, 0.45, 40)  # a new best
    assert report.stat().st_ino == inode == linked.stat().st_ino
    assert json.loads(linked.read_text())["detail"] == "slim" == detail_of(first)
    assert runner.bookkeeper.errors == []


@pytest.mark.parametrize("x", [0.25, 0.7], ids=["feasible", "infeasible"])
def test_the_baseline_keeps_full_reports(tmp_path: Path, x: float) -> None:
    runner, _, _, _ = make_runner(tmp_path)
    study = optuna.create_study(direction="maximize")
    run(study, runner, 0.45, 40)  # a better feasible trial first: the baseline is not a new best
    baseline = run(study, runner, x, 20, variant="baseline")
    run(study, runner, 0.5, 40)  # a new best later does not demote the baseline
    assert baseline.user_attrs[ATTR_VARIANT] == "baseline" and detail_of(baseline) == "full"


def test_the_experiment_can_ask_for_full_reports_of_every_trial(tmp_path: Path) -> None:
    runner, _, _, _ = make_runner(tmp_path, report_detail="full")
    study = optuna.create_study(direction="maximize")
    trials = [run(study, runner, 0.25, 30), run(study, runner, 0.1, 10), run(study, runner, 0.45, 40),
              run(study, runner, 0.7, 40)]
    assert [detail_of(t) for t in trials] == ["full"] * 4
