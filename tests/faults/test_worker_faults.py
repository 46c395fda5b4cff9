"""SIGKILL and SIGTERM of a `tuner worker` mid-trial, SIGTERM in its preflight (PostgreSQL storage).

One worker (replica 0) runs the study; trial 1's searches wait for the test's release
file, so the signal lands while the replica's config copy holds that trial's values.

- SIGKILL: the worker's reaper stops its backend and restores the replica's copy; the
  next start of the replica fails the dead trial by heartbeat, retries it with the same
  params and completes the study.
- SIGTERM: the worker finishes the trial under way, restores its copy, stops its
  backend and exits 143 (stopped by SIGTERM); the next start completes the study.
- SIGTERM during the replica's preflight: its batch is aborted at once, the backend
  stopped, no trial starts, exit 143 (class sigterm-preflight, as `tuner run`'s).

The original config is never patched by a worker; it and the replica copy must both
equal the original at the end.
"""

from __future__ import annotations

import signal
from pathlib import Path

import pytest
from optuna.trial import TrialState

from faults.faultlib import (
    RELEASE,
    Calibration,
    FaultLog,
    Project,
    all_gone,
    assert_survived,
    assess,
    judge,
    states,
    wait_until,
)

pytestmark = [pytest.mark.slow, pytest.mark.integration]
WORKER = ("worker", "--replica", "0", "--heartbeat", "1", "--grace", "3")
N_TRIALS = 4


def held_project(tmp_path: Path, study: str, storage: str) -> Project:
    return Project.create(tmp_path / study, study=study, n_trials=N_TRIALS, storage=storage,
                          plan={"3": {"hold_until": RELEASE}})


def replica_copy(project: Project) -> Path:
    return project.config.with_name("config.replica-0.yaml")


def running_trials(project: Project) -> list[int]:
    return [t.number for t in project.trials() if t.state == TrialState.RUNNING]


def test_sigkill_of_a_worker_mid_trial(tmp_path: Path, pg_storage: tuple[str, str], calibration: Calibration,
                                       fault_log: FaultLog) -> None:
    from support.workers import retries_of

    project = held_project(tmp_path, "kill-worker", pg_storage[0])
    # unbuffered: what the worker printed before the SIGKILL reaches its log (a diagnosis's only source)
    worker = project.start(*WORKER, env={"PYTHONUNBUFFERED": "1"})
    try:
        wait_until(lambda: project.serving(3) or not worker.alive(), "trial 1 is evaluating")
        # A precondition, not the fault: the worker must still be at work when life 3 serves.
        assert worker.alive(), (f"the worker ended (exit {worker.proc.returncode}) before trial 1 was evaluating; "
                                f"backend lives {project.lives()}; its stderr:\n{worker.err_path.read_text()[-3000:]}")
        killed = running_trials(project)
        patched_at_kill = replica_copy(project).read_bytes() != project.original
        worker.send_signal(signal.SIGKILL)
        worker.wait()
    finally:
        worker.kill_quietly()
        project.release()
    # The reaper's job, before any new start could cover for it (a start re-copies the original).
    reaped = all_gone(str(project.root))
    copy_after_kill = replica_copy(project).read_bytes()
    again = project.tuner(*WORKER)
    trials = {t.number: t for t in project.trials()}
    retries = retries_of(list(trials.values()))

    def retried_with_its_params(k: int) -> bool:
        again_as = retries.get(k, [])
        return (len(again_as) == 1 and trials[again_as[0]].state == TrialState.COMPLETE
                # its draw (the retry adds the applied values, recorded as params when it completes)
                and bool(trials[k].params) and trials[k].params.items() <= trials[again_as[0]].params.items())

    record = fault_log.add(judge("sigkill-worker", assess(project, calibration), {
        # The pipelined worker ends a trial on a helper thread while it measures the next, and
        # begins the next early: trial 0 may still be ending (not told yet) and trial 2 begun;
        # they are RUNNING at the kill too, and each must come back like trial 1.
        f"killed while trial 1 ran on a patched copy (running at the kill: {killed}, copy patched: "
        f"{patched_at_kill}, states after: {[(n, t.state.name) for n, t in sorted(trials.items())]})":
        1 in killed and set(killed) <= {0, 1, 2} and patched_at_kill,
        "the reaper stopped the backend and ended": reaped,
        "the reaper restored the replica's copy": copy_after_kill == project.original,
        "the next worker exits 0": again.returncode == 0,
        "the killed trials are FAIL": killed != [] and all(trials[k].state == TrialState.FAIL for k in killed),
        f"each was retried once with its params and completed (retries: {retries})":
        killed != [] and all(retried_with_its_params(k) for k in killed),
        "the study reached n_trials": states(list(trials.values())).count("COMPLETE") == N_TRIALS,
        "the original config was never patched": project.config.read_bytes() == project.original,
        "locks free": project.locks_free(),
    }))
    assert_survived(record)


def test_sigterm_of_a_worker_mid_trial(tmp_path: Path, pg_storage: tuple[str, str], calibration: Calibration,
                                       fault_log: FaultLog) -> None:
    project = held_project(tmp_path, "term-worker", pg_storage[0])
    worker = project.start(*WORKER)
    try:
        wait_until(lambda: project.serving(3) or not worker.alive(), "trial 1 is evaluating")
        worker.send_signal(signal.SIGTERM)
        wait_until(lambda: "stopping after the current trial" in worker.err_path.read_text() or not worker.alive(),
                   "the worker acknowledged the signal")
        project.release()
        done = worker.wait()
    finally:
        worker.kill_quietly()
        project.release()
    before = project.trials()
    stopped = {
        "exit 143 (128 + SIGTERM, as tuner run)": done.returncode == 143,
        "trial 1 was measured to the end, the worker stopped": states(before) == ["COMPLETE", "COMPLETE"],
        "the replica's copy restored": replica_copy(project).read_bytes() == project.original,
        "no backend or reaper left": all_gone(str(project.root)),
        "locks free": project.locks_free(),
    }
    again = project.tuner(*WORKER)
    record = fault_log.add(judge("sigterm-worker", assess(project, calibration), {
        **stopped,
        "the next worker exits 0": again.returncode == 0,
        "the study reached n_trials": states(project.trials()) == ["COMPLETE"] * N_TRIALS,
        "the original config was never patched": project.config.read_bytes() == project.original,
    }))
    assert_survived(record)


def test_sigterm_of_a_worker_during_its_preflight(tmp_path: Path, pg_storage: tuple[str, str],
                                                  calibration: Calibration, fault_log: FaultLog) -> None:
    # The replica's preflight backend (life 1) holds every search until the release file exists, which
    # the test writes only after the worker ended: only the tuner's abort ends that batch early.
    project = Project.create(tmp_path / "term-worker-preflight", study="term-worker-preflight", n_trials=N_TRIALS,
                             storage=pg_storage[0], plan={"1": {"hold_until": RELEASE}})
    worker = project.start(*WORKER)
    try:
        wait_until(lambda: project.serving(1) or not worker.alive(), "the replica's preflight batch is under way")
        assert worker.alive(), "the worker ended before its preflight searched"
        worker.send_signal(signal.SIGTERM)
        done = worker.wait()
    finally:
        worker.kill_quietly()
        project.release()
    before, lives = project.trials(), project.lives()
    again = project.tuner(*WORKER)
    record = fault_log.add(judge("sigterm-preflight", assess(project, calibration), {
        "exit 143 (128 + SIGTERM, as tuner run)": done.returncode == 143,
        "said the preflight was aborted by the signal": "preflight: batch aborted after" in done.output
        and "stopped before the first trial" in done.output,
        "no trial ran, the backend started once": states(before) == [] and lives == 1,
        "the replica's copy as found": replica_copy(project).read_bytes() == project.original,
        "locks free": project.locks_free(),
        "the next worker exits 0": again.returncode == 0,
        "the study reached n_trials": states(project.trials()) == ["COMPLETE"] * N_TRIALS,
    }, injections={"worker preflight": {}}))
    assert_survived(record)
