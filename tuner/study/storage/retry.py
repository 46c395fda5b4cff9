"""A trial the study's storage failed under, queued again: the same params (and the
same variant name, so a queued baseline or shortlist variant is never lost to a database
restart), as Optuna's heartbeat retry queues a dead worker's trial.

The retry is a WAITING trial made like `optuna.storages.RetryHeartbeatStaleTrialCallback`
makes one: the params as suggested with their distributions, a queued trial's
``fixed_params``, and the ``failed_trial`` / ``retry_history`` system attrs that
callback's ``retried_trial_number`` / ``retry_history`` read. Its bound is the same
``workers.max_retry`` ("retries of one crashed trial before it stays failed"), counted
over both kinds of retry. Which failures count as infrastructure is decided in
tuner.study.trial.failures; the loop (tuner.study.loop) calls `queue_retry` before it tells
the failed trial, so its fail_reason can name the retry.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import optuna
from optuna.trial import TrialState

from tuner.optuna_adapter import FAILED_TRIAL, FIXED_PARAMS, RETRY_HISTORY, storage_of, study_id_of
from tuner.study.trial.attrs import ATTR_VARIANT


@dataclass(frozen=True)
class InfraFailure:
    """A trial failed by the study's storage, and what became of it."""

    number: int
    variant: str | None
    retried_as: int | None = None  # the retry's trial number; None: not retried
    why_not: str | None = None  # why it was not retried

    def describe(self) -> str:
        name = f" ({self.variant})" if self.variant else ""
        if self.retried_as is not None:
            return f"#{self.number}{name} retried as #{self.retried_as}"
        return f"#{self.number}{name} NOT retried ({self.why_not})"


def queue_retry(
    study: optuna.Study, trial_id: int, suggested: Mapping[str, Any], *, max_retry: int | None
) -> InfraFailure:
    """Queue running trial ``trial_id`` again (see the module doc); safe to repeat after a
    lost connection (a retry already queued for it is found, not queued twice)."""
    storage = storage_of(study)
    frozen = storage.get_trial(trial_id)
    variant = frozen.user_attrs.get(ATTR_VARIANT)
    history = [*frozen.system_attrs.get(RETRY_HISTORY, []), frozen.number]
    for t in study.get_trials(deepcopy=False):
        if t.system_attrs.get(RETRY_HISTORY) == history:  # queued by an attempt whose reply was lost
            return InfraFailure(frozen.number, variant, retried_as=t.number)
    if max_retry is not None and len(history) > max_retry:
        return InfraFailure(
            frozen.number,
            variant,
            why_not=(f"it is a retry already, {len(history) - 1} of workers.max_retry={max_retry}"),
        )
    fixed = frozen.system_attrs.get(FIXED_PARAMS)
    # a sampled trial that failed before its params were drawn queues a trial without
    # params: the sampler draws them when it is asked
    params = {n: frozen.params[n] for n in suggested if n in frozen.params and n in frozen.distributions}
    system: dict[str, Any] = {
        FAILED_TRIAL: frozen.system_attrs.get(FAILED_TRIAL, frozen.number),
        RETRY_HISTORY: history,
    }
    if fixed:
        system[FIXED_PARAMS] = fixed
    template = optuna.trial.create_trial(
        state=TrialState.WAITING,
        params=params,
        distributions={n: frozen.distributions[n] for n in params},
        user_attrs={ATTR_VARIANT: variant} if variant else None,
        system_attrs=system,
    )
    new_id = storage.create_new_trial(study_id_of(study), template_trial=template)
    return InfraFailure(frozen.number, variant, retried_as=storage.get_trial_number_from_id(new_id))


def infra_summary(failures: Sequence[InfraFailure]) -> str | None:
    """The end summary's one line on trials the study's storage failed (None: none)."""
    if not failures:
        return None
    return "trials failed for an infrastructure reason (the study's storage, not their config): " + "; ".join(
        f.describe() for f in failures
    )
