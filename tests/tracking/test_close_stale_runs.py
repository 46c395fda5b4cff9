"""Closing the MLflow runs a killed `tuner run` left RUNNING (real SQLite store in tmp_path)."""

from __future__ import annotations

from pathlib import Path

import pytest
from mlflow import MlflowClient

from tuner.config.experiment import resolve_sqlite
from tuner.report.tracking import (
    INTERRUPTED,
    TAG_FAIL_REASON,
    TAG_INTERRUPTED,
    TAG_STATE,
    TAG_TRIAL,
    MlflowTracker,
    NullTracker,
)


def tracker_at(tmp_path: Path) -> MlflowTracker:
    return MlflowTracker(resolve_sqlite("sqlite:///mlruns/mlflow.db", tmp_path), "fusion-tuner")


def killed_run(tmp_path: Path, study: str, trials: int) -> tuple[str, dict[int, str]]:
    """What a SIGKILLed run leaves: the parent and ``trials`` trial runs, all RUNNING."""
    tracker = tracker_at(tmp_path)
    parent = tracker.start_study(study, params={"sampler": "tpe"}, tags={})
    return parent, {n: tracker.start_trial(n, {"fusion.k": 10 + n}) for n in range(trials)}


@pytest.mark.usefixtures("tracking_uri")  # tables made (conftest)
def test_runs_of_dead_trials_are_closed_as_failed_and_live_ones_kept(tmp_path: Path) -> None:
    parent, runs = killed_run(tmp_path, "s", trials=2)
    other_parent, other_runs = killed_run(tmp_path, "other", trials=1)
    tracker = tracker_at(tmp_path)
    client = MlflowClient(tracker.tracking_uri)

    assert tracker.close_stale_runs("s", live_trials={1}).interrupted == (0,)

    dead = client.get_run(runs[0])
    assert dead.info.status == "FAILED" and dead.info.end_time is not None
    assert dead.data.tags[TAG_STATE] == "FAIL" and dead.data.tags[TAG_FAIL_REASON] == INTERRUPTED
    assert dead.data.tags[TAG_TRIAL] == "0"
    live = client.get_run(runs[1])
    assert live.info.status == "RUNNING" and live.data.tags[TAG_STATE] == "RUNNING"
    # A live trial means a live run owns the study: its parent run is left open.
    assert client.get_run(parent).info.status == "RUNNING"
    # Another study's runs are not touched.
    assert client.get_run(other_runs[0]).info.status == "RUNNING"
    assert client.get_run(other_parent).info.status == "RUNNING"


@pytest.mark.usefixtures("tracking_uri")  # tables made (conftest)
def test_with_no_live_trial_the_parent_is_closed_and_reopened_by_the_next_run(tmp_path: Path) -> None:
    parent, runs = killed_run(tmp_path, "s", trials=2)
    tracker = tracker_at(tmp_path)
    client = MlflowClient(tracker.tracking_uri)

    assert tracker.close_stale_runs("s", live_trials=set()).interrupted == (0, 1)
    assert {client.get_run(r).info.status for r in runs.values()} == {"FAILED"}
    closed = client.get_run(parent)
    assert closed.info.status == "FAILED" and closed.data.tags[TAG_INTERRUPTED] == "1"
    assert not tracker.close_stale_runs("s", live_trials=set())  # nothing left open

    # The next run resumes the study in the same parent run.
    assert tracker.start_study("s", params={"sampler": "tpe"}, tags={}) == parent
    assert client.get_run(parent).info.status == "RUNNING"
    # Called after start_study, the parent this tracker reopened stays open.
    assert not tracker.close_stale_runs("s", live_trials=set())
    assert client.get_run(parent).info.status == "RUNNING"
    tracker.end_study(status="FINISHED", summary={})
    finished = client.get_run(parent)
    assert finished.info.status == "FINISHED" and finished.data.tags[TAG_INTERRUPTED] == "1"


def test_null_tracker_has_nothing_to_close() -> None:
    assert not NullTracker().close_stale_runs("s", live_trials=set())
