"""SIGTERM of `tuner run` mid-trial and during its preflight (SIGKILL is test_sigkill_run.py's).

The fault backend stretches one trial's phase so the signal lands inside it: a
batch whose searches wait for the test's release file, or a health wait the backend
answers 503 for a few seconds. The first SIGTERM lets the trial end (a batch already under way
is measured to the end; a trial not yet evaluating fails as interrupted, which does
not count against n_trials), restores the config and exits 143; the next run resumes.
A SIGTERM during the preflight aborts its batch at once (no trial would use its numbers):
the backend stops, no trial starts, exit 143.
"""

from __future__ import annotations

import signal
from collections.abc import Callable
from pathlib import Path

import pytest

from faults.faultlib import (
    RELEASE,
    Calibration,
    Done,
    FaultLog,
    Project,
    assert_survived,
    assess,
    fail_reasons,
    judge,
    states,
    wait_until,
)

pytestmark = [pytest.mark.slow]


def sigterm_when(project: Project, ready: str, condition: Callable[[], bool],
                 then: Callable[[], None] = lambda: None) -> tuple[dict[str, bool], list, Done]:
    """Start `tuner run`, SIGTERM it once ``condition()`` holds (and call ``then`` once it
    said so), then resume with one trial. Returns the checks of the signalled run, the
    trials it left and the resumed run."""
    run = project.start("run", "--no-cache")
    try:
        wait_until(lambda: condition() or not run.alive(), ready)
        assert run.alive(), f"the run ended before {ready}"
        patched = project.config.read_bytes() != project.original
        run.send_signal(signal.SIGTERM)
        wait_until(lambda: "SIGTERM" in run.stdout_so_far() or not run.alive(), "the run acknowledged SIGTERM")
        then()
        first = run.wait()
    finally:
        project.release()
        run.kill_quietly()
    assert patched, "the signal did not land while a trial's config was live"
    return stopped_cleanly(project, first), project.trials(), project.tuner("run", "--n-trials", "1", "--no-cache")


def resumed(project: Project, before: list, again: Done) -> dict[str, bool]:
    after = project.trials()
    done_before = {t.number for t in before if t.state.is_finished()}
    new = [t for t in after if t.number not in done_before]  # a trial queued again by the stop runs now
    return {
        "the resumed run exits 0": again.returncode == 0,
        "the resumed run measured one new trial": states(new) == ["COMPLETE"],
        "the baseline was queued once": sum(t.user_attrs.get("variant") == "baseline" for t in after) == 1,
    }


def stopped_cleanly(project: Project, first: Done) -> dict[str, bool]:
    return {
        "exit 143": first.returncode == 143,
        "said SIGTERM and restored": "SIGTERM" in first.stdout and "original config restored" in first.stdout,
        "no restore journal left": not project.journal_left(),
        "locks free after the signal": project.locks_free(),
    }


def test_sigterm_mid_batch_measures_the_trial_to_the_end(tmp_path: Path, calibration: Calibration,
                                                         fault_log: FaultLog) -> None:
    # Trial 1's searches wait for the release file, which the test writes once the run took the signal.
    project = Project.create(tmp_path / "term-batch", study="term-batch", n_trials=6,
                             plan={"3": {"hold_until": RELEASE}})
    stopped, before, again = sigterm_when(project, "trial 1's batch is under way", lambda: project.serving(3),
                                          then=project.release)
    checks = {**stopped,
              "trial 1 was measured to the end, the study stopped": states(before) == ["COMPLETE", "COMPLETE"],
              **resumed(project, before, again)}
    record = fault_log.add(judge("sigterm-runner", assess(project, calibration), checks,
                                 injections={"mid-batch": {}}))
    assert_survived(record)


def test_sigterm_mid_health_wait_fails_the_trial_as_interrupted(tmp_path: Path, calibration: Calibration,
                                                                fault_log: FaultLog) -> None:
    # Trial 1's backend answers /health with 503 for its first 4 s.
    project = Project.create(tmp_path / "term-health", study="term-health", n_trials=6,
                             plan={"3": {"health_delay_s": 4}})
    stopped, before, again = sigterm_when(project, "trial 1's backend started",
                                lambda: any(e["life"] == 3 for e in project.events()))
    reason = fail_reasons(before).get(1, "")
    checks = {**stopped,
              "trial 1 failed as interrupted": states(before) == ["COMPLETE", "FAIL"]
              and reason.startswith("interrupted by SIGTERM"),
              "trial 1's backend never searched": not project.serving(3),
              **resumed(project, before, again)}
    record = fault_log.add(judge("sigterm-runner", assess(project, calibration), checks,
                                 injections={"mid-health-wait": {}}))
    assert_survived(record)


@pytest.mark.parametrize(("sig", "code"), [(signal.SIGTERM, 143), (signal.SIGINT, 130)], ids=["SIGTERM", "SIGINT"])
def test_a_signal_during_the_preflight_aborts_its_batch(tmp_path: Path, calibration: Calibration,
                                                        fault_log: FaultLog, sig: signal.Signals, code: int) -> None:
    # The preflight's backend (life 1) holds every search until the release file exists, which the
    # test writes only after the run ended: the tuner's abort is the only way its batch ends early.
    # Before the abort, each held query took the whole retry schedule (4 attempts of timeout_s) and
    # the run ended on the failed preflight with exit 2.
    project = Project.create(tmp_path / "term-preflight", study="term-preflight", n_trials=4,
                             plan={"1": {"hold_until": RELEASE}})
    run = project.start("run", "--no-cache")
    try:
        wait_until(lambda: project.serving(1) or not run.alive(), "the preflight's batch is under way")
        assert run.alive(), "the run ended before its preflight searched"
        run.send_signal(sig)
        first = run.wait()
    finally:
        run.kill_quietly()
        project.release()
    before, lives = project.trials(), project.lives()
    again = project.tuner("run", "--n-trials", "1", "--no-cache")
    checks = {
        f"exit {code} (128 + {sig.name})": first.returncode == code,
        "no traceback, no error line": "Traceback" not in first.output and "error:" not in first.stderr,
        f"said the preflight was aborted by {sig.name}": "preflight: batch aborted after" in first.stdout
        and f"interrupted by {sig.name}; stopped before the first trial" in first.stdout,
        "stopped by signal, no trial": "stopped by signal" in first.stdout and states(before) == [],
        "the backend was started once, for the preflight": lives == 1,
        "no restore journal left": not project.journal_left(),
        "locks free after the signal": project.locks_free(),
        "the next run measures the baseline": again.returncode == 0 and states(project.trials()) == ["COMPLETE"],
    }
    record = fault_log.add(judge("sigterm-preflight", assess(project, calibration), checks,
                                 injections={f"run, {sig.name}": {}}))
    assert_survived(record)
