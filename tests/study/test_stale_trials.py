"""A trial a killed worker left RUNNING before its first heartbeat (tuner.study.storage.stale).

The pipelined worker asks the next trial while one is measured; a SIGKILL right after
that ask leaves a RUNNING trial with no heartbeat row, with or without its replica
recorded (the fault class sigkill-worker lost one so, 1 of 3 CI runs). Here the kill
is made deterministic: a second storage (another process's cache) asks the queued
baseline and does nothing more, on a real SQLite study with heartbeats.
"""

from __future__ import annotations

import threading
import time
import warnings
from pathlib import Path

import optuna
import pytest
from optuna.trial import TrialState
from support.workers import ObjectiveRunner, retries_of

from tuner.config.workers import WorkerSettings
from tuner.study.loop import StudyLoop, StudyObserver, heartbeat
from tuner.study.stop import StopFlag
from tuner.study.storage.queue import Variant, count_counted, enqueue_initial
from tuner.optuna_adapter import heartbeat_rows
from tuner.study.storage.stale import Unbeaten
from tuner.study.storage.study_storage import ATTR_REPLICA, make_storage
from tuner.study.trial.attrs import ATTR_FAIL_REASON, ATTR_VARIANT

optuna.logging.set_verbosity(optuna.logging.WARNING)

GRACE_S = 2


def storage(tmp_path: Path, grace: int = GRACE_S) -> optuna.storages.RDBStorage:
    return make_storage(
        f"sqlite:///{tmp_path / 'study.db'}", WorkerSettings(heartbeat_interval_s=1, grace_period_s=grace)
    )


def study_with_baseline(tmp_path: Path, grace: int = GRACE_S) -> optuna.Study:
    study = optuna.create_study(study_name="s", storage=storage(tmp_path, grace), direction="maximize")
    enqueue_initial(study, [Variant("baseline", {"x": 0.5})])
    return study


def ask_elsewhere(tmp_path: Path, replica: int | None, grace: int = GRACE_S) -> optuna.Trial:
    """Another worker process's ask (its own storage and cache), its replica recorded or not."""
    other = optuna.load_study(study_name="s", storage=storage(tmp_path, grace))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # optuna: heartbeats are meant for optimize
        trial = other.ask()
    if replica is not None:
        other._storage.set_trial_system_attr(trial._trial_id, ATTR_REPLICA, replica)
    return trial


def run_worker(study: optuna.Study, *, total: int, deadline_s: float = 60.0) -> tuple[StudyLoop, object]:
    """A restarted replica 0 running the study to ``total``; stopped at ``deadline_s`` so a
    wait for ever fails the test instead of hanging it."""
    stop = StopFlag()
    timer = threading.Timer(deadline_s, stop.set, ["the test's deadline"])
    timer.start()
    loop = StudyLoop(study, ObjectiveRunner(lambda t: t.suggest_float("x", 0, 1)), stop=stop, study_total=total,
                     replica=0)
    try:
        return loop, loop.run(n_trials=None, timeout=None)
    finally:
        timer.cancel()


@pytest.mark.parametrize("replica", [None, 0, 1], ids=["before-its-replica", "this-replica", "another-replica"])
def test_a_trial_killed_before_its_first_heartbeat_is_failed_and_its_params_run_again(tmp_path, replica):
    study = study_with_baseline(tmp_path)
    orphan = ask_elsewhere(tmp_path, replica)  # then SIGKILL: no heartbeat, ever
    assert orphan.number == 0 and heartbeat_rows(study, [orphan._trial_id]) == set()

    _, result = run_worker(study, total=3)

    trials = study.get_trials()
    dead = trials[0]
    assert dead.state == TrialState.FAIL, "the killed trial is failed, not left RUNNING"
    assert dead.user_attrs[ATTR_FAIL_REASON].startswith("stale: left running by a worker that ended before its "
                                                        "first heartbeat")
    retried = retries_of(trials).get(0, [])
    assert len(retried) == 1, "its params are queued again once"
    assert f"queued again as trial #{retried[0]}" in dead.user_attrs[ATTR_FAIL_REASON]
    again = trials[retried[0]]
    assert again.state == TrialState.COMPLETE and again.params == {"x": 0.5}
    assert again.user_attrs[ATTR_VARIANT] == "baseline", "a queued variant is never lost"
    assert result.stopped_by == "n_trials" and 0 in result.stale_failed
    assert [t.state for t in trials].count(TrialState.COMPLETE) == 3 and count_counted(study) == 3
    assert not [t.number for t in trials if t.state == TrialState.RUNNING]


def test_a_live_workers_trial_is_waited_for_never_failed(tmp_path):
    """Another live worker's trial, even one recording the same replica number (two hosts
    given the same --replica), is waited for until it ends: its heartbeat beats. The
    grace is generous: a busy machine must not delay a beat past it (then the heartbeat
    rule would rightly take the trial for dead)."""
    grace = 8
    study = study_with_baseline(tmp_path, grace)
    live = ask_elsewhere(tmp_path, replica=0, grace=grace)
    beating = heartbeat(storage(tmp_path, grace), live._trial_id)
    beating.__enter__()
    beaten_by = time.monotonic() + 30  # its first beat is on the database before the loop looks
    while not heartbeat_rows(study, [live._trial_id]) and time.monotonic() < beaten_by:
        time.sleep(0.05)
    waiting = threading.Event()

    class Notes(StudyObserver):
        def note(self, text: str) -> None:
            if "waiting for trial(s)" in text:
                waiting.set()

    def live_worker() -> None:  # tells its trial once the loop has waited for it past the grace
        if waiting.wait(60):
            time.sleep(grace + 3)
        beating.__exit__(None, None, None)
        optuna.load_study(study_name="s", storage=storage(tmp_path, grace)).tell(live.number, 1.0)

    teller = threading.Thread(target=live_worker)
    teller.start()
    try:
        result = StudyLoop(study, ObjectiveRunner(lambda t: t.suggest_float("x", 0, 1)), observer=Notes(),
                           study_total=3, replica=0).run(n_trials=None, timeout=None)
    finally:
        teller.join()
    trials = study.get_trials()
    assert waiting.is_set(), "the loop waited for the live trial"
    assert trials[live.number].state == TrialState.COMPLETE, trials[live.number].user_attrs
    assert result.stale_failed == [] and retries_of(trials) == {}
    assert [t.state for t in trials] == [TrialState.COMPLETE] * 3


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_the_grace_runs_from_the_first_sighting_and_a_first_heartbeat_ends_it(tmp_path):
    study = study_with_baseline(tmp_path)
    slow = ask_elsewhere(tmp_path, replica=1)  # its first beat comes late, but within the grace
    dead = ask_elsewhere(tmp_path, replica=None)
    mine = ask_elsewhere(tmp_path, replica=0)  # this process's own (asked, not told): never
    clock = Clock()
    watch = Unbeaten(clock=clock)
    own = {mine._trial_id}

    assert watch.fail_overdue(study, own=own) == []  # first sighting of both at 0
    clock.now = GRACE_S - 0.1
    assert watch.fail_overdue(study, own=own) == []
    storage(tmp_path).record_heartbeat(slow._trial_id)
    clock.now = GRACE_S + 0.1
    assert watch.fail_overdue(study, own=own) == [dead.number]
    clock.now = 100 * GRACE_S
    assert watch.fail_overdue(study, own=own) == [], "a beaten trial is the heartbeat rule's; the failed one is done"
    states = {t.number: t.state for t in study.get_trials()}
    assert states[slow.number] == states[mine.number] == TrialState.RUNNING
    assert states[dead.number] == TrialState.FAIL


def test_no_heartbeats_configured_means_no_trial_is_ever_stale(tmp_path):
    study = optuna.create_study(study_name="s", storage=f"sqlite:///{tmp_path / 'plain.db'}")
    study.ask()
    clock = Clock()
    watch = Unbeaten(clock=clock)
    assert watch.fail_overdue(study) == []
    clock.now = 1e6
    assert watch.fail_overdue(study) == []
    assert [t.state for t in study.get_trials()] == [TrialState.RUNNING]
