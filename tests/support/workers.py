"""Helpers of the multi-worker and study-loop tests: the test PostgreSQL's default DSN, a
plain objective as a loop runner, and which trials retried which (moved out of the
library, which never used them)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import optuna

from tuner.study.trial.attrs import ATTR_FAIL_REASON
from tuner.study.trial.outcome import TrialOutcome

DEFAULT_TEST_DSN = "postgresql://tuner:tuner@127.0.0.1:5432/tuner_test"


class ObjectiveRunner:
    """A plain objective (returns a float, raises TrialPruned) as a loop's runner: for
    tests of the loop without a backend."""

    touched_backend = False

    def __init__(self, objective: Any) -> None:
        self.objective = objective

    def run(self, trial: optuna.Trial) -> TrialOutcome:
        try:
            return TrialOutcome(trial.number, "COMPLETE", float(self.objective(trial)))
        except optuna.TrialPruned as exc:
            return TrialOutcome(trial.number, "PRUNED", fail_reason=str(exc) or None)
        except Exception as exc:  # an objective's failure is the trial's, not the loop's
            reason = f"{type(exc).__name__}: {exc}"
            from tuner.secrets import redact_text

            trial.set_user_attr(ATTR_FAIL_REASON, redact_text(reason))  # counted, like a TrialRunner failure
            return TrialOutcome(trial.number, "FAIL", fail_reason=reason)

    def flush(self) -> None:
        return None


def retries_of(trials: Sequence[optuna.trial.FrozenTrial]) -> dict[int, list[int]]:
    """Failed trial number -> numbers of the trials that retried it."""
    out: dict[int, list[int]] = {}
    for t in trials:
        if "failed_trial" in t.system_attrs:
            out.setdefault(int(t.system_attrs["failed_trial"]), []).append(t.number)
    return out
