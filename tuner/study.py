"""The Optuna study: create or resume it, queue the baseline and the shortlist once,
run trials under a failure budget, stop gracefully, pick the best feasible trial.

`StudyLoop` is the loop over trials (ask -> TrialRunner.run -> tell) with the
failure budget, n-trials / timeout limits and the stop flag; it knows nothing about
files, backends or MLflow. `tuner.session` wires it to an experiment file.
"""

from __future__ import annotations

import math
import time
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import optuna
from optuna.trial import FrozenTrial, TrialState

from tuner import analysis as A
from tuner.errors import StudyError
from tuner.trial import StopFlag, TrialOutcome, TrialRunner

ATTR_ENQUEUED = "tuner.initial_trials_enqueued"
ATTR_ARTIFACT_DIR = "tuner.artifact_dir"
ATTR_OBJECTIVE = "tuner.objective"
ATTR_CONSTRAINTS = "tuner.constraints"
INTERRUPTED = "interrupted"


# ---------------------------------------------------------------- observer


class StudyObserver:
    """Hooks for a progress display; every method is a no-op by default."""

    def study_started(self, study: optuna.Study, *, planned: int | None, timeout: float | None) -> None: ...

    def trial_started(self, number: int, variant: str | None) -> None: ...

    def phase(self, number: int, phase: str) -> None: ...

    def trial_finished(self, outcome: TrialOutcome, best: FrozenTrial | None) -> None: ...

    def note(self, text: str) -> None: ...


# ---------------------------------------------------------------- study set-up


def open_study(
    name: str,
    storage: str | optuna.storages.BaseStorage,
    *,
    sampler: optuna.samplers.BaseSampler | None,
    pruner: optuna.pruners.BasePruner | None = None,
    objective_metric: str = "Primary_Metric_Score",
    maximize: bool = True,
) -> optuna.Study:
    """Create the study, or load it when one of that name exists (resume)."""
    direction = "maximize" if maximize else "minimize"
    try:
        study = optuna.create_study(
            study_name=name,
            storage=storage,
            sampler=sampler,
            pruner=pruner,
            direction=direction,
            load_if_exists=True,
        )
    except (ValueError, RuntimeError, ImportError) as exc:
        raise StudyError(f"study {name!r} in {storage}: cannot open: {exc}; check storage in the experiment file") from exc
    if study.direction.name.lower() != direction:
        raise StudyError(
            f"study {name!r} exists with direction {study.direction.name.lower()}, the experiment asks {direction};"
            " use another study name or fix objective.direction"
        )
    if study.metric_names != [objective_metric]:
        with warnings.catch_warnings():  # experimental since 3.2, stable in practice
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            study.set_metric_names([objective_metric])
    return study


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
        study.enqueue_trial(dict(v.params), user_attrs={A.ATTR_VARIANT: v.name}, skip_if_exists=False)
    study.set_user_attr(ATTR_ENQUEUED, True)
    return len(variants)


def fail_stale_trials(study: optuna.Study) -> list[int]:
    """Mark trials left RUNNING by a killed run as FAIL, so they neither block nor count.

    Assumes one `tuner run` per study at a time (documented); with several workers on
    one study a live trial of another worker would be failed too.
    """
    stale = study.get_trials(deepcopy=False, states=(TrialState.RUNNING,))
    for t in stale:
        study._storage.set_trial_user_attr(t._trial_id, A.ATTR_FAIL_REASON, "stale: left running by an interrupted run")
        study.tell(t.number, state=TrialState.FAIL)
    return [t.number for t in stale]


def is_feasible(trial: FrozenTrial) -> bool:
    return trial.state == TrialState.COMPLETE and all(
        v <= 0 for v in A.named_constraints(trial.constraints).values()
    )


def best_feasible_trial(trials: Sequence[FrozenTrial], *, maximize: bool = True) -> FrozenTrial | None:
    """The best COMPLETE trial whose constraints all hold (None when none does).

    Own selection instead of ``study.best_trial``, which raises when nothing is feasible
    and cannot be asked for 'best but feasible' in reports. Ties: the earlier trial.
    """
    feasible = [t for t in trials if is_feasible(t) and t.values]
    if not feasible:
        return None
    sign = -1.0 if maximize else 1.0
    return min(feasible, key=lambda t: (sign * t.values[0], t.number))


# ---------------------------------------------------------------- failure budget


@dataclass
class FailureBudget:
    """Stop the study after too many failed trials (in this run)."""

    max_consecutive: int | None = 3
    max_total: int | None = 10
    consecutive: int = 0
    total: int = 0
    last_reason: str | None = None

    def record(self, outcome: TrialOutcome) -> None:
        if outcome.state == "COMPLETE":
            self.consecutive = 0
            return
        if outcome.interrupted:
            return
        self.consecutive += 1
        self.total += 1
        self.last_reason = outcome.fail_reason

    def exceeded(self) -> str | None:
        """Why the budget is spent, or None."""
        if self.max_consecutive is not None and self.consecutive >= self.max_consecutive:
            return f"{self.consecutive} consecutive failed trials (failure_budget.max_consecutive={self.max_consecutive})"
        if self.max_total is not None and self.total >= self.max_total:
            return f"{self.total} failed trials in this run (failure_budget.max_total={self.max_total})"
        return None


# ---------------------------------------------------------------- the loop


@dataclass
class RunResult:
    """What one `tuner run` did."""

    study_name: str
    ran: list[TrialOutcome] = field(default_factory=list)
    stopped_by: str = "n_trials"  # n_trials | timeout | signal | failure_budget
    stale_failed: list[int] = field(default_factory=list)
    elapsed_s: float = 0.0


class Clock(Protocol):
    def __call__(self) -> float: ...


@dataclass
class StudyLoop:
    study: optuna.Study
    runner: TrialRunner
    budget: FailureBudget = field(default_factory=FailureBudget)
    stop: StopFlag = field(default_factory=StopFlag)
    observer: StudyObserver = field(default_factory=StudyObserver)
    maximize: bool = True
    clock: Clock = time.monotonic

    def run(self, *, n_trials: int | None, timeout: float | None) -> RunResult:
        """Run up to ``n_trials`` trials (None: until stopped) for at most ``timeout`` s.

        Raises StudyError when the failure budget is spent (after the failing trial is
        recorded); the caller restores the config in a ``finally``.
        """
        result = RunResult(self.study.study_name)
        started = self.clock()
        self.observer.study_started(self.study, planned=n_trials, timeout=timeout)
        while True:
            if self.stop.is_set():
                result.stopped_by = "signal"
                break
            if n_trials is not None and len(result.ran) >= n_trials:
                result.stopped_by = "n_trials"
                break
            if timeout is not None and self.clock() - started >= timeout:
                result.stopped_by = "timeout"
                break
            outcome = self._one_trial()
            result.ran.append(outcome)
            self.budget.record(outcome)
            why = self.budget.exceeded()
            if why is not None:
                result.stopped_by = "failure_budget"
                result.elapsed_s = self.clock() - started
                raise StudyError(
                    f"study {self.study.study_name!r} stopped: {why}; last failure: {self.budget.last_reason};"
                    " fix the backend or the search space, then `tuner run` resumes the study"
                )
        result.elapsed_s = self.clock() - started
        return result

    def _one_trial(self) -> TrialOutcome:
        trial = self.study.ask()
        variant = trial.user_attrs.get(A.ATTR_VARIANT)
        self.observer.trial_started(trial.number, variant)
        try:
            outcome = self.runner.run(trial)
        except KeyboardInterrupt:
            self.study.tell(trial, state=TrialState.FAIL)
            raise
        if outcome.state == "COMPLETE":
            assert outcome.value is not None
            self.study.tell(trial, outcome.value)
        else:
            self.study.tell(trial, state=TrialState.FAIL)
        best = best_feasible_trial(self.study.get_trials(deepcopy=False), maximize=self.maximize)
        self.observer.trial_finished(outcome, best)
        return outcome


def count_finished(study: optuna.Study) -> int:
    """Trials that count against the study's n_trials: finished, except interrupted ones
    (they never ran)."""
    n = 0
    for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE, TrialState.FAIL, TrialState.PRUNED)):
        reason = str(t.user_attrs.get(A.ATTR_FAIL_REASON, ""))
        if not reason.startswith(INTERRUPTED):
            n += 1
    return n


def remaining_trials(study: optuna.Study, total: int | None) -> int | None:
    if total is None:
        return None
    return max(0, total - count_finished(study))


def summary_metrics(study: optuna.Study, *, maximize: bool) -> dict[str, float]:
    """Numbers for the parent run: trials by state and the best feasible value."""
    trials = study.get_trials(deepcopy=False)
    out = {f"trials_{s.name.lower()}": float(sum(t.state == s for t in trials)) for s in
           (TrialState.COMPLETE, TrialState.FAIL, TrialState.PRUNED)}
    best = best_feasible_trial(trials, maximize=maximize)
    out["feasible_trials"] = float(sum(is_feasible(t) for t in trials))
    if best is not None:
        out["best_feasible_value"] = float(best.values[0])
        out["best_feasible_trial"] = float(best.number)
    else:
        out["best_feasible_value"] = math.nan
    return out
