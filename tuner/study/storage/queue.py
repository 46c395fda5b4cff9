"""A study's trial queue and its count: the baseline and shortlist queued once
(``enqueue_initial``, under the storage lock for workers starting together:
``enqueue_once``), trials a killed run left RUNNING failed (``fail_stale_trials``), and
which trials use up the study's ``n_trials`` (``counts_toward_total`` and the counts
built on it).
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import optuna
from optuna.trial import FrozenTrial, TrialState

from tuner.optuna_adapter import storage_of, trial_id_of
from tuner.study.storage.retry import queue_retry
from tuner.study.storage.study_storage import ATTR_ENQUEUED, storage_lock
from tuner.study.trial.attrs import ATTR_FAIL_REASON, ATTR_REPLAY, ATTR_VARIANT, trial_attr
from tuner.study.trial.failures import is_retried_infrastructure

INTERRUPTED = "interrupted"
STALE = "stale"


@dataclass(frozen=True)
class Variant:
    """A fixed parameter set queued before the sampler takes over."""

    name: str
    params: Mapping[str, Any]  # Optuna params (SearchSpace.params_for(assignment))


def enqueue_initial(study: optuna.Study, variants: Sequence[Variant]) -> int:
    """Queue the baseline and the shortlist once per study; a resumed study already has
    them (a study user attr marks it). Returns how many were queued now."""
    if study.user_attrs.get(ATTR_ENQUEUED):
        return 0
    for v in variants:
        study.enqueue_trial(dict(v.params), user_attrs={ATTR_VARIANT: v.name}, skip_if_exists=False)
    study.set_user_attr(ATTR_ENQUEUED, True)
    return len(variants)


def fail_stale_trials(
    study: optuna.Study,
    *,
    requeued: dict[int, int] | None = None,
    keep: Collection[int] = (),
    why: str = "left running by an interrupted run",
) -> list[int]:
    """Mark trials left RUNNING by a killed run as FAIL, so they neither block nor count;
    returns their numbers.

    A queued baseline or shortlist variant among them is queued again (same params and
    variant name, as tuner.study.storage.retry queues a trial the storage failed under), so a
    SIGKILL never loses it: its number and its retry's go into ``requeued``. A sampled
    trial is not: the sampler proposes again. Only for a process holding the study lock
    exclusively (tuner.study.storage.locks): then no other process has a live trial. Workers fail
    stale trials by heartbeat instead (Optuna's retry callback queues a copy of each).
    ``keep``: trial ids of this process's own live trials, left alone; ``why``: the reason's
    wording after ``stale:``.
    """
    stale = [t for t in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)) if trial_id_of(t) not in keep]
    for t in stale:
        reason = f"{STALE}: {why}"
        if t.user_attrs.get(ATTR_VARIANT):
            retry = queue_retry(study, trial_id_of(t), t.params, max_retry=None)
            if retry.retried_as is not None:
                reason += f" (variant {retry.variant} queued again as trial #{retry.retried_as})"
                if requeued is not None:
                    requeued[t.number] = retry.retried_as
        storage_of(study).set_trial_user_attr(trial_id_of(t), ATTR_FAIL_REASON, reason)
        study.tell(t.number, state=TrialState.FAIL)
    return [t.number for t in stale]


def enqueue_once(study: optuna.Study, enqueue: Callable[[optuna.Study], int]) -> int:
    """Run ``enqueue(study)`` (e.g. enqueue_initial) under the storage lock, so
    workers that start together do not interleave; ``enqueue`` itself checks the
    study's "already enqueued" attribute. Returns what it returned."""
    with storage_lock(storage_of(study), f"enqueue:{study.study_name}"):
        return enqueue(study)


def counts_toward_total(trial: FrozenTrial) -> bool:
    """Whether a trial uses up one of the study's ``n_trials``: COMPLETE and PRUNED
    ones, and FAILed ones the trial runner failed for a reason. Interrupted trials
    (Ctrl-C, a killed run or worker; no reason, or ``interrupted``/``stale``) never
    ran to the end and are not counted: their retries are. Nor is a trial the study's
    storage failed under whose params were queued again (tuner.study.trial.failures): its retry is."""
    if trial.state in (TrialState.COMPLETE, TrialState.PRUNED):
        return True
    if trial.state != TrialState.FAIL:
        return False
    reason = str(trial.user_attrs.get(ATTR_FAIL_REASON, ""))
    return bool(reason) and not reason.startswith((INTERRUPTED, STALE)) and not is_retried_infrastructure(reason)


def count_finished(study: optuna.Study) -> int:
    """Trials that count against the study's n_trials (see counts_toward_total)."""
    return sum(counts_toward_total(t) for t in study.get_trials(deepcopy=False))


def count_counted(study: optuna.Study) -> int:
    """Counted trials plus those running now (in this or another process)."""
    trials = study.get_trials(deepcopy=False)
    return sum(counts_toward_total(t) or t.state == TrialState.RUNNING for t in trials)


def remaining_trials(study: optuna.Study, total: int | None) -> int | None:
    if total is None:
        return None
    return max(0, total - count_finished(study))


def replay_trials_left(study: optuna.Study, space: Any, replayed: frozenset[str]) -> int | None:
    """How many more trials can tell anything new when every tuned param of ``space`` is
    replayed per trial or solved per retrieval (tuner.config.replay): the queued ones and
    one replay trial (none once a replay trial completed), since a later replay trial
    would retrieve the same config and score the same grid again. None when the sampler
    still has params to search."""
    if any(p.spec.tuned and not p.spec.post_retrieval and p.name not in replayed for p in space.params):
        return None
    trials = study.get_trials(deepcopy=False)
    waiting = sum(t.state == TrialState.WAITING for t in trials)
    replayed_once = any(t.state == TrialState.COMPLETE and trial_attr(t, ATTR_REPLAY) for t in trials)
    return waiting + (0 if replayed_once else 1)
