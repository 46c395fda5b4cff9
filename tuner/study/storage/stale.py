"""A worker's trials left RUNNING by a dead worker that never recorded a heartbeat.

Optuna's heartbeat rule (``optuna.storages.fail_stale_trials``) fails a RUNNING trial
whose heartbeat row is older than the grace period, and its retry callback queues a
copy. A trial with *no* heartbeat row is never stale to it. A worker asks a trial,
records its replica, and only then starts the trial's heartbeat thread (its first beat
at once): a worker killed in that window (the pipelined loop asks the next trial while
one is measured, so the window is hit) left a trial RUNNING that no rule ever failed. It
was counted as running by every worker, so the study ended one trial short with it
still RUNNING.

The rule here stands the first sighting in for the missing heartbeat: a RUNNING trial
that this process did not ask and that has had no heartbeat row for longer than the
grace period, as this process has watched it, is stale. It is clock-free across hosts
(only this process's monotonic clock is read) and never fails a live worker's trial
sooner than the heartbeat rule would: a live worker writes the first beat within
moments of the ask, and from then on the heartbeat rule alone applies. A stale one is
failed with ``fail_reason`` ``stale: ...`` (never counted, like a trial a killed run
left) and its params are queued again (tuner.study.storage.retry.queue_retry, within
``workers.max_retry``), under a storage-wide lock so two workers never fail and queue
the same trial twice.

Optuna has no public read of a trial's heartbeat: ``heartbeat_rows`` (tuner.optuna_adapter) reads Optuna's
``trial_heartbeats`` table through the RDB storage's engine.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Collection
from dataclasses import dataclass, field

import optuna
from optuna.trial import FrozenTrial, TrialState

from tuner.optuna_adapter import heartbeat_grace, heartbeat_rows, storage_of, trial_id_of
from tuner.study.storage.queue import STALE
from tuner.study.storage.retry import queue_retry
from tuner.study.storage.study_storage import storage_lock
from tuner.study.trial.attrs import ATTR_FAIL_REASON


@dataclass
class Unbeaten:
    """The watch over RUNNING trials without a heartbeat, for one worker process; see
    the module docstring. ``fail_overdue`` is called between trials and while the worker
    waits for other workers' last trials."""

    max_retry: int | None = 2
    clock: Callable[[], float] = time.monotonic
    #: trial id -> when this process first saw it RUNNING without a heartbeat row
    first_seen: dict[int, float] = field(default_factory=dict)

    def fail_overdue(self, study: optuna.Study, *, own: Collection[int] = ()) -> list[int]:
        """Fail (and queue again) the RUNNING trials not in ``own`` (trial ids this
        process asked and has not told) that have had no heartbeat for longer than the
        grace period; returns their numbers. Nothing without heartbeats (then no trial
        has one, and a dead worker's trials can never be told apart)."""
        grace = heartbeat_grace(study)
        if grace is None:
            return []
        running = {
            trial_id_of(t): t
            for t in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,))
            if trial_id_of(t) not in own
        }
        unbeaten = set(running) - heartbeat_rows(study, running)
        now = self.clock()
        self.first_seen = {i: self.first_seen.get(i, now) for i in unbeaten}
        overdue = [running[i] for i in sorted(unbeaten) if now - self.first_seen[i] > grace]
        if not overdue:
            return []
        failed: list[int] = []
        # one worker at a time: a trial is failed, and its params queued, once
        with storage_lock(storage_of(study), f"stale:{study.study_name}"):
            still = {trial_id_of(t) for t in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,))}
            beaten = heartbeat_rows(study, still)
            for trial in overdue:
                if trial_id_of(trial) in still and trial_id_of(trial) not in beaten:
                    self._fail(study, trial, grace)
                    failed.append(trial.number)
                self.first_seen.pop(trial_id_of(trial), None)
        return failed

    def _fail(self, study: optuna.Study, trial: FrozenTrial, grace: float) -> None:
        retry = queue_retry(study, trial_id_of(trial), trial.params, max_retry=self.max_retry)
        reason = f"{STALE}: left running by a worker that ended before its first heartbeat (none in {grace:g} s)"
        if retry.retried_as is not None:
            reason += f"; its params queued again as trial #{retry.retried_as}"
        else:
            reason += f"; not queued again: {retry.why_not}"
        storage = storage_of(study)
        try:
            storage.set_trial_user_attr(trial_id_of(trial), ATTR_FAIL_REASON, reason)
            storage.set_trial_state_values(trial_id_of(trial), state=TrialState.FAIL)
        except optuna.exceptions.UpdateFinishedTrialError:
            # its worker was alive after all and told it in this instant (silent for the
            # whole grace period, as the heartbeat rule also assumes it dead): the queued
            # copy runs those params once more, nothing is lost
            pass
