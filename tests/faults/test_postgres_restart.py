"""PostgreSQL restarted mid-study, as the tuner's processes see it: every connection
they hold is cut.

The shared server is not restarted (other suites use it); instead the test ends the
connections of its own fresh database/schema, picked out by the application name the
storage URL gives every tuner connection (conftest.pg_storage), with
``pg_terminate_backend`` -- what a restart does to a client, minus the seconds the
server is away. Cut once while trial 1 evaluates (its searches wait for the test's
release file) and once while the backend restarts on the original config at the end
(the restore life answers /health 503 for a few seconds).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from faults.faultlib import (
    RELEASE,
    Calibration,
    FaultLog,
    Project,
    assert_survived,
    assess,
    fail_reasons,
    judge,
    states,
    terminate_connections,
    wait_until,
)

pytestmark = [pytest.mark.slow, pytest.mark.integration]
N_TRIALS = 4
RESTORE_LIFE = N_TRIALS + 2  # the preflight's start, one per trial, then the restore


def cut_twice(tmp_path: Path, pg_storage: tuple[str, str], study: str, command: tuple[str, ...]) -> dict[str, Any]:
    """Run ``command`` on a held project; cut its connections mid-trial 1 and at the restore."""
    url, app = pg_storage
    project = Project.create(tmp_path / study, study=study, n_trials=N_TRIALS, storage=url,
                             plan={"3": {"hold_until": RELEASE},
                                   str(RESTORE_LIFE): {"health_delay_s": 3}})
    proc = project.start(*command)
    try:
        wait_until(lambda: project.serving(3) or not proc.alive(), "trial 1 is evaluating")
        mid_trial = terminate_connections(url, app)
        project.release()
        wait_until(lambda: project.lives() >= RESTORE_LIFE or not proc.alive(), "the restore restart")
        at_restore = terminate_connections(url, app) if proc.alive() else 0
        done = proc.wait()
    finally:
        proc.kill_quietly()
        project.release()
    return {"project": project, "done": done, "cut": (mid_trial, at_restore)}


def cut_mid_trial(tmp_path: Path, pg_storage: tuple[str, str], study: str, command: tuple[str, ...]) -> dict[str, Any]:
    url, app = pg_storage
    project = Project.create(tmp_path / study, study=study, n_trials=N_TRIALS, storage=url,
                             plan={"3": {"hold_until": RELEASE}})
    proc = project.start(*command)
    try:
        wait_until(lambda: project.serving(3) or not proc.alive(), "trial 1 is evaluating")
        cut = terminate_connections(url, app)
        project.release()
        done = proc.wait()
    finally:
        proc.kill_quietly()
        project.release()
    return {"project": project, "done": done, "cut": cut}


def test_a_worker_rides_through_postgres_restarts(tmp_path: Path, pg_storage: tuple[str, str],
                                                  calibration: Calibration, fault_log: FaultLog) -> None:
    run = cut_twice(tmp_path, pg_storage, "pg-worker", ("worker", "--replica", "0", "--heartbeat", "1", "--grace", "3"))
    project, done = run["project"], run["done"]
    mid_trial, at_restore = run["cut"]
    record = fault_log.add(judge("postgres-restart", assess(project, calibration), {
        "exit 0": done.returncode == 0,
        "no traceback": "Traceback" not in done.stderr,
        "locks free": project.locks_free(),
    }, injections={
        "worker, mid-trial": {"connections cut": mid_trial > 0,
                              "every trial COMPLETE": states(project.trials()) == ["COMPLETE"] * N_TRIALS},
        "worker, at the restore": {"connections cut": at_restore > 0},
    }))
    assert_survived(record)


def test_a_run_survives_a_postgres_restart_mid_trial(tmp_path: Path, pg_storage: tuple[str, str],
                                                     calibration: Calibration, fault_log: FaultLog) -> None:
    # Survived as defined: the trial whose recording hit the cut may fail (one line,
    # under the failure budget); nothing is lost, the study goes on.
    run = cut_mid_trial(tmp_path, pg_storage, "pg-run", ("run", "--no-cache"))
    project, done = run["project"], run["done"]
    trials = project.trials()
    reason = fail_reasons(trials).get(1, "")
    record = fault_log.add(judge("postgres-restart", assess(project, calibration), {
        "connections cut": run["cut"] > 0,
        "exit 0": done.returncode == 0,
        "no traceback": "Traceback" not in done.stderr,
        "trial 1 COMPLETE, or FAIL with a one-line reason": states(trials)[1] == "COMPLETE"
        or (reason != "" and "\n" not in reason),
        "the other trials COMPLETE": [s for i, s in enumerate(states(trials)) if i != 1] == ["COMPLETE"] * 3,
        "locks free": project.locks_free(),
    }, injections={"run, mid-trial": {}}))
    assert_survived(record)


def test_a_run_survives_a_postgres_restart_at_the_restore(tmp_path: Path, pg_storage: tuple[str, str],
                                                          calibration: Calibration, fault_log: FaultLog) -> None:
    url, app = pg_storage
    project = Project.create(tmp_path / "pg-run-end", study="pg-run-end", n_trials=N_TRIALS, storage=url,
                             plan={str(RESTORE_LIFE): {"health_delay_s": 3}})
    proc = project.start("run", "--no-cache")
    try:
        wait_until(lambda: project.lives() >= RESTORE_LIFE or not proc.alive(), "the restore restart")
        cut = terminate_connections(url, app) if proc.alive() else 0
        done = proc.wait()
    finally:
        proc.kill_quietly()
    record = fault_log.add(judge("postgres-restart", assess(project, calibration), {
        "connections cut": cut > 0,
        "exit 0": done.returncode == 0,
        "no traceback": "Traceback" not in done.stderr,
        "every trial COMPLETE": states(project.trials()) == ["COMPLETE"] * N_TRIALS,
        "locks free": project.locks_free(),
    }, injections={"run, at the restore": {}}))
    assert_survived(record)
