"""SIGKILL between Optuna and MLflow (issue 27, item 3): a `tuner run` killed after a
trial was told to Optuna (COMPLETE) but before its MLflow run was logged -- that is
bookkeeping, done after ``tell`` on a background thread. The next start must complete
that run from Optuna's record (FINISHED, with the objective), never fail it.

The window is held open without touching the tuner: once trial 1's MLflow run exists,
the test locks the MLflow SQLite store (``BEGIN EXCLUSIVE``, as test_mlflow_faults.py
does), so the bookkeeping that would log the run waits on the lock; Optuna's study is
another database and records the trial. When Optuna has trial 1 COMPLETE, the run is
killed, the lock released, and the study run again.
"""

from __future__ import annotations

import signal
import sqlite3
from pathlib import Path
from typing import Any

import pytest

from faults.faultlib import Calibration, FaultLog, Project, assert_survived, assess, judge, wait_until
from tuner.report.mlflow_values import trial_run_name

pytestmark = [pytest.mark.slow]

KILLED_TRIAL = 1  # measured on backend life 3 (life 1 is the preflight, life 2 trial 0)


def mlflow_trial_runs(db: sqlite3.Connection, study: str) -> dict[int, dict[str, Any]]:
    """Trial number -> {status, name, params (count), metrics, tags} of the study's trial runs, read straight
    from MLflow's tables (so it works on the connection that holds the lock)."""
    rows = db.execute(
        "SELECT r.run_uuid, r.status, r.name, n.value FROM runs r"
        " JOIN tags s ON s.run_uuid = r.run_uuid AND s.key = 'tuner.study_name' AND s.value = ?"
        " JOIN tags n ON n.run_uuid = r.run_uuid AND n.key = 'tuner.trial_number'"
        " WHERE r.lifecycle_stage = 'active'", (study,)).fetchall()
    runs: dict[int, dict[str, Any]] = {}
    for run_id, status, name, number in rows:
        params = db.execute("SELECT count(*) FROM params WHERE run_uuid = ?", (run_id,)).fetchone()[0]
        metrics = dict(db.execute("SELECT key, value FROM latest_metrics WHERE run_uuid = ?", (run_id,)).fetchall())
        tags = dict(db.execute("SELECT key, value FROM tags WHERE run_uuid = ?", (run_id,)).fetchall())
        runs[int(number)] = {"status": status, "name": name, "params": params, "metrics": metrics, "tags": tags}
    return runs


def read(store: Path, study: str) -> dict[int, dict[str, Any]]:
    db = sqlite3.connect(store, timeout=60)
    try:
        return mlflow_trial_runs(db, study)
    except sqlite3.OperationalError:  # no tables yet
        return {}
    finally:
        db.close()


def test_a_run_killed_between_optuna_and_mlflow_is_completed_from_the_optuna_record(
        tmp_path: Path, calibration: Calibration, fault_log: FaultLog) -> None:
    from optuna.trial import TrialState

    project = Project.create(tmp_path / "ml-kill", study="ml-kill", n_trials=4, tracking={"enabled": True},
                             plan={str(KILLED_TRIAL + 2): {"stall_s": 0.5}})
    store = project.root / "mlruns" / "mlflow.db"
    first = project.start("run", "--no-cache")
    try:
        # Trial 1 is measured and its run made (with its params: the trial waits for that).
        wait_until(lambda: not first.alive() or (project.serving(KILLED_TRIAL + 2)
                                                 and read(store, project.study).get(KILLED_TRIAL, {}).get("params")),
                   "trial 1 is measured and its MLflow run exists")
        assert first.alive(), first.stdout_so_far()
        lock = sqlite3.connect(store, isolation_level=None, timeout=60)
        try:
            lock.execute("BEGIN EXCLUSIVE")  # the bookkeeping after tell waits here
            wait_until(lambda: not first.alive() or any(
                t.number == KILLED_TRIAL and t.state == TrialState.COMPLETE for t in project.trials()),
                "Optuna has trial 1 COMPLETE")
            first.send_signal(signal.SIGKILL)
            killed = first.wait()
            at_kill = mlflow_trial_runs(lock, project.study)
        finally:
            lock.close()
    finally:
        first.kill_quietly()
    optuna_at_kill = {t.number: t.state.name for t in project.trials()}
    window_hit = optuna_at_kill.get(KILLED_TRIAL) == "COMPLETE" and at_kill[KILLED_TRIAL]["status"] == "RUNNING"

    second = project.tuner("run", "--no-cache")
    trials = project.trials()
    runs = read(store, project.study)
    complete = [t for t in trials if t.state == TrialState.COMPLETE]
    counted = [t for t in trials if t.state.is_finished() and not str(t.user_attrs.get("fail_reason", "")).startswith(
        ("stale", "interrupted"))]
    checks = {
        "the kill came after tell, before the MLflow run was logged": killed.returncode == -signal.SIGKILL
        and window_hit,
        "the next run ends 0": second.returncode == 0,
        "it says trial 1 was completed from the Optuna record": any(
            line.startswith("MLflow runs left open by a killed run: trials [")
            and f"{KILLED_TRIAL}" in line.split("completed from the Optuna record")[0]
            for line in second.stdout.splitlines()),
        "every COMPLETE trial's run is FINISHED with its objective": all(
            runs.get(t.number, {}).get("status") == "FINISHED"
            and runs[t.number]["metrics"].get("objective") == pytest.approx(t.value) for t in complete),
        "no COMPLETE trial's run is FAILED": not [t.number for t in complete
                                                   if runs.get(t.number, {}).get("status") == "FAILED"],
        "MLflow has a run for every trial that ran to the end": {t.number for t in counted} <= set(runs),
        "no MLflow run left RUNNING": not [n for n, r in runs.items() if r["status"] == "RUNNING"],
        "the study finished its trials": len(complete) >= 4,
        "locks free": project.locks_free(),
    }
    record = fault_log.add(judge("sigkill-runner-mlflow", assess(project, calibration), checks,
                                 injections={"SIGKILL after tell, before the MLflow run was logged": {}}))
    assert_survived(record)
    # Its run is the one the live path would have logged: the trial's verdict and files.
    killed_run = runs[KILLED_TRIAL]
    assert killed_run["tags"]["tuner.state"] == "COMPLETE" and killed_run["tags"]["tuner.recovered"] == "optuna-record"
    value = next(t.value for t in trials if t.number == KILLED_TRIAL)
    feasible = killed_run["tags"]["tuner.feasible"] == "true"
    assert killed_run["name"] == trial_run_name(KILLED_TRIAL, "COMPLETE", value, feasible)
    assert "Logged from the Optuna trial at the next start" in killed_run["tags"]["mlflow.note.content"]
