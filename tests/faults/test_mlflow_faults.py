"""MLflow store unavailable: tracking is bookkeeping, so the study must record its
trials all the same (with a warning), whether the store is gone when the run starts
or goes away mid-study.

Three shapes: tracking.mlflow_uri at an HTTP server nobody runs; a SQLite path that
cannot be created (its parent is a file); the default SQLite store locked by another
process mid-study (``BEGIN EXCLUSIVE`` held until the tuner has warned). The HTTP case
runs with ``MLFLOW_HTTP_REQUEST_MAX_RETRIES=0``: MLflow's own retry policy (7 retries,
backoff factor 2) makes every request to a dead server take about four minutes,
which would say nothing more here.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from faults.faultlib import Calibration, FaultLog, Project, assert_survived, assess, judge, states, wait_until

pytestmark = [pytest.mark.slow]

FAST_MLFLOW_HTTP = {"MLFLOW_HTTP_REQUEST_MAX_RETRIES": "0", "MLFLOW_HTTP_REQUEST_TIMEOUT": "5"}


def records_trials_untracked(project: Project, done) -> dict[str, bool]:
    return {
        "exit 0": done.returncode == 0,
        "every trial COMPLETE": states(project.trials()) == ["COMPLETE"] * 3,
        "a warning names MLflow": "mlflow" in done.output.lower() and "warning" in done.output.lower(),
        "no traceback": "Traceback" not in done.output,
        "locks free": project.locks_free(),
    }


def test_an_unreachable_mlflow_server_does_not_stop_the_study(tmp_path: Path, calibration: Calibration,
                                                              fault_log: FaultLog) -> None:
    from tuner.config.experiment import free_port

    dead = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    project = Project.create(tmp_path / "ml-http", study="ml-http", n_trials=3,
                             tracking={"enabled": True, "mlflow_uri": dead})
    done = project.tuner("run", "--no-cache", env=FAST_MLFLOW_HTTP)
    record = fault_log.add(judge("mlflow-unavailable", assess(project, calibration),
                                 records_trials_untracked(project, done), injections={"server unreachable": {}}))
    assert_survived(record)


def test_an_unwritable_mlflow_sqlite_store_does_not_stop_the_study(tmp_path: Path, calibration: Calibration,
                                                                   fault_log: FaultLog) -> None:
    root = tmp_path / "ml-sqlite"
    project = Project.create(root, study="ml-sqlite", n_trials=3,
                             tracking={"enabled": True, "mlflow_uri": f"sqlite:///{root}/not-a-dir/mlflow.db"})
    (root / "not-a-dir").write_text("a file where the store's directory should be\n")
    done = project.tuner("run", "--no-cache")
    record = fault_log.add(judge("mlflow-unavailable", assess(project, calibration),
                                 records_trials_untracked(project, done), injections={"sqlite unwritable": {}}))
    assert_survived(record)


def test_an_mlflow_store_locked_mid_study_only_costs_bookkeeping(tmp_path: Path, calibration: Calibration,
                                                                 fault_log: FaultLog) -> None:
    # Trial 1's searches take 1 s each, so the store is locked while a trial runs.
    project = Project.create(tmp_path / "ml-locked", study="ml-locked", n_trials=4, plan={"3": {"stall_s": 1}},
                             tracking={"enabled": True})
    store = project.root / "mlruns" / "mlflow.db"
    run = project.start("run", "--no-cache")
    try:
        wait_until(lambda: project.serving(3) or not run.alive(), "trial 1 is evaluating")
        lock = sqlite3.connect(store, isolation_level=None, timeout=60)
        try:
            lock.execute("BEGIN EXCLUSIVE")
            warned = wait_until(lambda: "warning: bookkeeping" in run.stdout_so_far() or not run.alive(),
                                "the tuner warned about its bookkeeping")
        finally:
            lock.close()  # the store is back: later trials are tracked again
        done = run.wait()
    finally:
        run.kill_quietly()
    checks = {
        "exit 0": done.returncode == 0,
        "warned about the bookkeeping while locked": warned and "database is locked" in done.stdout,
        "every trial COMPLETE": states(project.trials()) == ["COMPLETE"] * 4,
        "locks free": project.locks_free(),
    }
    record = fault_log.add(judge("mlflow-unavailable", assess(project, calibration), checks,
                                 injections={"store locked mid-study": {}}))
    assert_survived(record)
