"""A trial's duration is one number (issue 26, item 5): the trial line the run prints,
trials.csv's duration_s, the trial's ``duration_s`` attribute and its MLflow run's
duration agree, and the phases of its record add up to it -- in the pipelined loop, where
Optuna's own start-to-complete span of a trial also covers its neighbours."""

from __future__ import annotations

import csv
import re
import threading
import time
from pathlib import Path
from typing import Any

import optuna
import pytest
from mlflow import MlflowClient
from rich.console import Console
from study.test_pipeline import Recording, study_at
from study.test_trial_runner import make_runner

from tuner.cli.progress import RichProgress
from tuner.ops import analysis
from tuner.report.resilient import ResilientTracker
from tuner.report.tracker import TrialRecord
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
    started = {int(r.data.tags[TAG_TRIAL]): r.info.start_time for r in runs}

    assert set(printed) == set(stored) == set(tracked) == {t.number for t in trials}
    for t in trials:
        n, duration = t.number, stored[t.number]
        assert duration > 0 and t.user_attrs["duration_s"] == duration
        assert printed[n] == pytest.approx(duration, abs=0.05 + 1e-9), n  # the line shows one decimal
        assert tracked[n] == pytest.approx(duration, abs=0.001 + 1e-9), n  # MLflow keeps milliseconds
        # the run starts with its trial (after the ask, before the tell), not when it was logged
        assert t.datetime_start.timestamp() * 1000 - 1 <= started[n] <= t.datetime_complete.timestamp() * 1000, n
        phases = trial_attr(t, ATTR_PHASES)
        assert {"suggest", "render", "patch", "restart", "health", "evaluate", "complete"} <= set(phases)
        assert sum(v for k, v in phases.items() if k not in NOT_IN_DURATION) == pytest.approx(duration, abs=0.001)
        # Optuna's span runs from the ask (while the trial before was measured) to the tell
        # (while the trial after was): it holds the trial's own steps and more
        assert duration <= t.duration.total_seconds()


def test_runs_logged_late_after_an_outage_start_and_end_with_their_trials(tracking_uri: str) -> None:
    """A store that was down when the trials ran gets their calls later (tuner.report.resilient):
    each run still starts when its trial began and lasts the trial's duration, whether it
    was made by its queued start or, that start refused, by its record."""
    inner = MlflowTracker(tracking_uri, "fusion-tuner")
    down = threading.Event()
    refuse = {9: 3}  # trial 9's start is refused while the store answers, until given up
    create_run = inner.client.create_run

    def flaky_create_run(*args: Any, **kwargs: Any) -> Any:
        if down.is_set():
            raise ConnectionError("connection refused")
        name = str(kwargs.get("run_name") or "")
        number = int(name.removeprefix("trial-")) if name.startswith("trial-") else None
        if number in refuse and refuse[number] > 0:
            refuse[number] -= 1
            raise ValueError("refused")
        return create_run(*args, **kwargs)

    def probe() -> None:
        if down.is_set():
            raise ConnectionError("no /health")

    inner.client.create_run = flaky_create_run  # type: ignore[method-assign]
    tracker = ResilientTracker(inner, probe=probe, on_note=lambda line: None, where="the test store",
                               probe_every_s=0.05, run_id_wait_s=0.0, drain_s=60.0)
    tracker.start_study("s", params={}, tags={})
    down.set()
    began, durations = {}, {}
    for n in (7, 8, 9):
        began[n], durations[n] = round(time.time() * 1000), 0.25 + n / 100
        tracker.start_trial(n, {"x": n}, start_time=began[n])
        tracker.finish_trial(None, TrialRecord(number=n, state="COMPLETE", params={"x": n}, value=0.5, feasible=True,
                                               duration_s=durations[n], started_ms=began[n]))
    time.sleep(0.05)  # the store comes back after every trial began: a run made now would start later
    back = round(time.time() * 1000)
    down.clear()
    assert tracker.close() is None  # everything logged

    runs = MlflowClient(tracking_uri).search_runs([inner.experiment_id], filter_string=f"tags.`{TAG_TRIAL}` != ''")
    by_number = {int(r.data.tags[TAG_TRIAL]): r.info for r in runs}
    assert sorted(by_number) == [7, 8, 9]
    for n, info in by_number.items():
        assert info.start_time == began[n] < back, n
        assert info.end_time - info.start_time == round(durations[n] * 1000), n
        assert info.status == "FINISHED", n
