"""MLflow store unavailable: tracking is bookkeeping, so the study must record its
trials all the same (with a warning), whether the store is gone when the run starts
or goes away mid-study.

Shapes: tracking.mlflow_uri at an HTTP server nobody runs; a SQLite path that cannot be
created (its parent is a file); the default SQLite store locked by another process
mid-study (``BEGIN EXCLUSIVE`` held until the tuner has warned). The first HTTP case
runs with ``MLFLOW_HTTP_REQUEST_MAX_RETRIES=0`` (the start-of-run probe turns MLflow off
there before any MLflow call, so the retry policy says nothing more).

Then a real ``mlflow server`` that dies after the run's start-of-run probe, with
MLflow's DEFAULT retry environment (7 retries, backoff factor 2, 120 s timeout: about
four minutes per request to a dead server, which made every trial wait that long and a
SIGTERM hang): killed (SIGKILL: connections refused) or stopped (SIGSTOP: it accepts
connections and never answers). The run must complete every trial, say once that
tracking is behind, and either log everything when the server comes back or name at
the end what MLflow is missing; a SIGTERM while the server is dead ends the run within
the documented bound, exit 143, config restored (tuner.report.resilient).

The runs wait on MLflow less than the defaults (tracking.waits): a call is stuck after 8 s
(15), a dead store is probed every second (5) and, where the server is dead at the end,
the end of the run gives the queue 5 s (20). The outcomes asserted are the same; what the
defaults are is tests/tracking/test_resilient_tracker.py's.
"""

from __future__ import annotations

import os
import re
import signal
import sqlite3
import subprocess
import sys
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
    judge,
    states,
    wait_until,
)

pytestmark = [pytest.mark.slow]

FAST_MLFLOW_HTTP = {"MLFLOW_HTTP_REQUEST_MAX_RETRIES": "0", "MLFLOW_HTTP_REQUEST_TIMEOUT": "5"}
# what the run says (tuner.report.resilient)
BEHIND = "warning: MLflow tracking is behind"
CAUGHT_UP = "MLflow tracking caught up"
# tracking.waits: short, but far above what a live store takes for a call on a busy machine
SHORT_WAITS = {"stuck_s": 8.0, "probe_every_s": 1.0}
# ... and where the store is dead at the end (what it misses is listed, not waited for)
SHORT_DRAIN = {**SHORT_WAITS, "drain_s": 5.0}
MISSING = re.compile(r"warning: MLflow at \S+ is missing (?:trials? (?P<trials>#[-#\d, ]+))?")


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
                             tracking={"enabled": True, "waits": SHORT_WAITS})
    store = project.root / "mlruns" / "mlflow.db"
    run = project.start("run", "--no-cache")
    try:
        wait_until(lambda: project.serving(3) or not run.alive(), "trial 1 is evaluating")
        lock = sqlite3.connect(store, isolation_level=None, timeout=60)
        try:
            lock.execute("BEGIN EXCLUSIVE")
            warned = wait_until(lambda: "warning: MLflow tracking is behind" in run.stdout_so_far()
                                or not run.alive(), "the tuner warned that tracking is behind")
        finally:
            lock.close()  # the store is back: later trials are tracked again
        done = run.wait()
    finally:
        run.kill_quietly()
    # A locked store blocks MLflow's calls (no error): tracking is behind once a call has
    # waited stuck_s, and catches up once the lock is gone.
    trials, runs = project.trials(), store_trial_runs(f"sqlite:///{store}", project.study)
    checks = {
        "exit 0": done.returncode == 0,
        "said tracking is behind while locked, then caught up": bool(warned) and BEHIND in done.stdout
        and CAUGHT_UP in done.stdout,
        "every trial COMPLETE": states(trials) == ["COMPLETE"] * 4,
        "every trial logged in MLflow once": all(len(runs.get(t.number, [])) == 1 and logged(runs[t.number][0], t)
                                                 for t in trials),
        "locks free": project.locks_free(),
    }
    record = fault_log.add(judge("mlflow-unavailable", assess(project, calibration), checks,
                                 injections={"store locked mid-study": {}}))
    assert_survived(record)


# ---------------------------------------------------------------- a real server that dies mid-run

SIGTERM_DEADLINE_S = 90.0  # generous; the bound is the trial's stop grace + the restore + tracking's 20 s


class MlflowServer:
    """``mlflow server`` on a SQLite store outside the project (so it is never taken for
    the project's orphan), in its own process group: SIGKILL, SIGSTOP and SIGCONT reach
    the server and its uvicorn worker alike."""

    def __init__(self, root: Path) -> None:
        from tuner.config.experiment import free_port

        root.mkdir(parents=True, exist_ok=True)
        self.root, self.db = root, root / "mlflow.db"
        self.url = f"http://127.0.0.1:{free_port()}"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> MlflowServer:
        env = {k: v for k, v in os.environ.items() if not k.startswith("MLFLOW_HTTP_REQUEST")}  # MLflow's defaults
        with open(self.root / "server.log", "ab") as log:
            self.proc = subprocess.Popen(
                [str(Path(sys.executable).with_name("mlflow")), "server", "--backend-store-uri", f"sqlite:///{self.db}",
                 "--host", "127.0.0.1", "--port", self.url.rsplit(":", 1)[1], "--workers", "1"],
                cwd=self.root, stdout=log, stderr=log, stdin=subprocess.DEVNULL, start_new_session=True,
                env={**env, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"})
        wait_until(self.healthy, f"mlflow server at {self.url} answers /health")
        return self

    def healthy(self) -> bool:
        import httpx

        try:
            return httpx.get(self.url + "/health", timeout=2).status_code == 200
        except httpx.HTTPError:
            return False

    def signal(self, sig: signal.Signals) -> None:
        assert self.proc is not None
        os.killpg(self.proc.pid, sig)

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.signal(signal.SIGCONT)
            self.signal(signal.SIGKILL)
            self.proc.wait()

    def trial_runs(self, study: str) -> dict[int, list[Any]]:
        """Trial number -> its runs in the store (read from the SQLite file: the server may be dead)."""
        return store_trial_runs(f"sqlite:///{self.db}", study)


def store_trial_runs(uri: str, study: str) -> dict[int, list[Any]]:
    """Trial number -> its runs in the MLflow store at ``uri`` (experiment named after the study)."""
    from mlflow import MlflowClient

    from tuner.report.tracker import TAG_ROLE, TAG_TRIAL

    client = MlflowClient(tracking_uri=uri)
    experiment = client.get_experiment_by_name(study)
    runs: dict[int, list[Any]] = {}
    if experiment is None:
        return runs
    for run in client.search_runs([experiment.experiment_id], f"tags.`{TAG_ROLE}` = 'trial'", max_results=1000):
        runs.setdefault(int(run.data.tags[TAG_TRIAL]), []).append(run)
    return runs


def listed_missing(output: str) -> set[int]:
    """The trial numbers the end-of-run line says MLflow is missing."""
    found = MISSING.search(output)
    if found is None or not found.group("trials"):
        return set()
    numbers: set[int] = set()
    for part in found.group("trials").replace("#", "").split(","):
        low, _, high = part.strip().partition("-")
        numbers |= set(range(int(low), int(high or low) + 1))
    return numbers


def logged(run: Any, trial: Any) -> bool:
    """The run holds the trial as Optuna recorded it: FINISHED, with its objective."""
    return run.info.status == "FINISHED" and run.data.metrics.get("objective") == pytest.approx(trial.value)


def nothing_lost_silently(project: Project, server: MlflowServer, output: str) -> bool:
    """Every finished trial is in MLflow (one FINISHED run with its value) or named at the end."""
    runs, missing = server.trial_runs(project.study), listed_missing(output)
    return all(t.number in missing or (len(runs.get(t.number, [])) == 1 and logged(runs[t.number][0], t))
               for t in project.trials() if t.state.name == "COMPLETE")


def tracked_project(root: Path, study: str, n_trials: int, server: MlflowServer, plan: dict[str, Any],
                    waits: dict[str, float]) -> Project:
    return Project.create(root, study=study, n_trials=n_trials, plan=plan,
                          tracking={"enabled": True, "mlflow_uri": server.url, "waits": waits})


def test_an_mlflow_server_killed_mid_run_costs_no_trial_time(tmp_path: Path, calibration: Calibration,
                                                             fault_log: FaultLog) -> None:
    # Trial 1's batch waits for the release file; the server is killed under it. Before the
    # resilient tracker every later trial waited about four minutes for its MLflow run id.
    server = MlflowServer(tmp_path / "mlflow-killed").start()
    project = tracked_project(tmp_path / "ml-killed", "ml-killed", 5, server, {"3": {"hold_until": RELEASE}},
                              SHORT_DRAIN)
    run = project.start("run", "--no-cache")
    try:
        wait_until(lambda: project.serving(3) or not run.alive(), "trial 1's batch is under way")
        server.kill()
        project.release()
        done = run.wait(240)
    finally:
        project.release()
        run.kill_quietly()
        server.kill()
    checks = {
        "exit 0": done.returncode == 0,
        "every trial COMPLETE": states(project.trials()) == ["COMPLETE"] * 5,
        "said once that tracking is behind": done.stdout.count(BEHIND) == 1,
        "named what MLflow is missing": bool(listed_missing(done.stdout)),
        "nothing lost silently": nothing_lost_silently(project, server, done.stdout),
        "no traceback": "Traceback" not in done.output,
        "locks free": project.locks_free(),
    }
    record = fault_log.add(judge("mlflow-unavailable", assess(project, calibration), checks,
                                 injections={"server killed mid-run": {}}))
    assert_survived(record)


def test_an_mlflow_server_that_hangs_and_comes_back_gets_every_trial(tmp_path: Path, calibration: Calibration,
                                                                     fault_log: FaultLog) -> None:
    # SIGSTOP under trial 1's batch: the server accepts connections and never answers. It
    # comes back (SIGCONT) while trial 3's batch waits; the queued calls are replayed.
    server = MlflowServer(tmp_path / "mlflow-hung").start()
    second = tmp_path / "release-second"
    project = tracked_project(tmp_path / "ml-hung", "ml-hung", 5, server,
                              {"3": {"hold_until": RELEASE}, "5": {"hold_until": str(second)}}, SHORT_WAITS)
    run = project.start("run", "--no-cache")
    try:
        wait_until(lambda: project.serving(3) or not run.alive(), "trial 1's batch is under way")
        server.signal(signal.SIGSTOP)
        project.release()
        wait_until(lambda: (BEHIND in run.stdout_so_far() and project.serving(5)) or not run.alive(),
                   "the run said tracking is behind and trial 3's batch is under way")
        behind_under_way = run.alive()
        server.signal(signal.SIGCONT)
        wait_until(lambda: CAUGHT_UP in run.stdout_so_far() or not run.alive(), "tracking caught up")
        second.write_text("go\n")
        done = run.wait(240)
    except BaseException:
        server.kill()  # a stopped server is never left behind
        raise
    finally:
        project.release()
        second.write_text("go\n")
        run.kill_quietly()
    try:
        runs = server.trial_runs(project.study)
    finally:
        server.kill()
    trials = project.trials()
    checks = {
        "exit 0": done.returncode == 0,
        "every trial COMPLETE": states(trials) == ["COMPLETE"] * 5,
        "behind while the trials went on": behind_under_way,
        "said once behind, once caught up": done.stdout.count(BEHIND) == 1 and done.stdout.count(CAUGHT_UP) == 1,
        "nothing listed as missing": MISSING.search(done.stdout) is None,
        "no MLflow link chatter in the tuner's output": "View run" not in done.output
        and "View experiment" not in done.output,
        "one logged MLflow run per trial": all(len(runs.get(t.number, [])) == 1 and logged(runs[t.number][0], t)
                                               for t in trials),
        "no traceback": "Traceback" not in done.output,
        "locks free": project.locks_free(),
    }
    record = fault_log.add(judge("mlflow-unavailable", assess(project, calibration), checks,
                                 injections={"server hung mid-run, then back": {}}))
    assert_survived(record)


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGSTOP], ids=["killed", "hung"])
def test_sigterm_while_the_mlflow_server_is_dead_ends_the_run(tmp_path: Path, calibration: Calibration,
                                                              fault_log: FaultLog, sig: signal.Signals) -> None:
    # The server dies under trial 1's batch; SIGTERM comes while trial 2's batch runs. Before
    # the resilient tracker the run was still alive minutes later, waiting on MLflow.
    server = MlflowServer(tmp_path / "mlflow-term").start()
    project = tracked_project(tmp_path / "ml-term", "ml-term", 6, server, {"3": {"hold_until": RELEASE}}, SHORT_DRAIN)
    run = project.start("run", "--no-cache")
    try:
        wait_until(lambda: project.serving(3) or not run.alive(), "trial 1's batch is under way")
        server.signal(sig)
        project.release()
        wait_until(lambda: project.serving(4) or not run.alive(), "trial 2's batch is under way")
        run.send_signal(signal.SIGTERM)
        done = run.wait(SIGTERM_DEADLINE_S)
    finally:
        project.release()
        run.kill_quietly()
        server.kill()  # (a stopped one is let go first) before its store is read
    checks = {
        "exit 143": done.returncode == 143,
        "said SIGTERM and restored": "SIGTERM" in done.stdout and "original config restored" in done.stdout,
        "no restore journal left": not project.journal_left(),
        "trials 0-2 recorded, trial 2 measured to the end": states(project.trials()) == ["COMPLETE"] * 3,
        "said once that tracking is behind": done.stdout.count(BEHIND) == 1,
        "nothing lost silently": nothing_lost_silently(project, server, done.stdout),
        "locks free": project.locks_free(),
    }
    record = fault_log.add(judge("mlflow-unavailable", assess(project, calibration), checks,
                                 injections={f"SIGTERM, server {'killed' if sig == signal.SIGKILL else 'hung'}": {}}))
    assert_survived(record)
