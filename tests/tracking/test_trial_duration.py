"""A trial's duration is one number (issue 26, item 5): the trial line the run prints,
trials.csv's duration_s, the trial's ``duration_s`` attribute and its MLflow run's
duration agree, and the phases of its record add up to it -- in the pipelined loop, where
Optuna's own start-to-complete span of a trial also covers its neighbours."""

from __future__ import annotations

import csv
import re
from pathlib import Path

import optuna
import pytest
from mlflow import MlflowClient
from rich.console import Console
from study.test_pipeline import Recording, study_at
from study.test_trial_runner import make_runner

from tuner.cli.progress import RichProgress
from tuner.ops import analysis
from tuner.report.tracking import TAG_TRIAL, MlflowTracker
from tuner.study.loop import StudyLoop
from tuner.study.trial.attrs import ATTR_PHASES, trial_attr
from tuner.study.trial.bookkeeping import Bookkeeper
from tuner.study.trial.outcome import NOT_IN_DURATION

optuna.logging.set_verbosity(optuna.logging.WARNING)
N_TRIALS = 5


def test_the_printed_stored_and_tracked_durations_of_a_trial_agree(tmp_path: Path, tracking_uri: str) -> None:
    tracker = MlflowTracker(tracking_uri, "fusion-tuner")
    tracker.start_study("s", params={}, tags={})
    runner, _, evaluator, _ = make_runner(tmp_path, tracker=tracker, bookkeeper=Bookkeeper(threaded=True))
    study = study_at(tmp_path)
    # measured while the next trial is begun (the pipeline's overlap made visible)
    runner.measurer.evaluator = Recording(evaluator, study)
    console = Console(record=True, width=200)
    result = StudyLoop(study, runner, pipeline=True, observer=RichProgress(console)).run(n_trials=N_TRIALS,
                                                                                         timeout=None)
    assert len(result.ran) == N_TRIALS

    printed = {int(m[1]): float(m[2]) for m in re.finditer(r"^#(\d+)\s.*?\s(\d+\.\d)s\b", console.export_text(),
                                                            re.MULTILINE)}
    trials = study.get_trials()
    paths = analysis.write_study_report(analysis.trials_frame(trials), tmp_path / "report", study_name="s",
                                        objective="Primary_Metric_Score", maximize=True, importances={})
    stored = {int(r["number"]): float(r["duration_s"]) for r in csv.DictReader(paths.csv.open())}
    runs = MlflowClient(tracking_uri).search_runs([tracker.experiment_id], filter_string=f"tags.`{TAG_TRIAL}` != ''")
    tracked = {int(r.data.tags[TAG_TRIAL]): (r.info.end_time - r.info.start_time) / 1000 for r in runs}

    assert set(printed) == set(stored) == set(tracked) == {t.number for t in trials}
    for t in trials:
        n, duration = t.number, stored[t.number]
        assert duration > 0 and t.user_attrs["duration_s"] == duration
        assert printed[n] == pytest.approx(duration, abs=0.05 + 1e-9), n  # the line shows one decimal
        assert tracked[n] == pytest.approx(duration, abs=0.001 + 1e-9), n  # MLflow keeps milliseconds
        phases = trial_attr(t, ATTR_PHASES)
        assert {"suggest", "render", "patch", "restart", "health", "evaluate", "complete"} <= set(phases)
        assert sum(v for k, v in phases.items() if k not in NOT_IN_DURATION) == pytest.approx(duration, abs=0.001)
        # Optuna's span runs from the ask (while the trial before was measured) to the tell
        # (while the trial after was): it holds the trial's own steps and more
        assert duration <= t.duration.total_seconds()
