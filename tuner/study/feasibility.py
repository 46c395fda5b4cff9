"""Which trials are feasible (COMPLETE, every constraint holding), the best feasible
one, the trial a command picks (the best feasible or a given COMPLETE one), and the
study's summary numbers for the MLflow parent run.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import optuna
from optuna.trial import FrozenTrial, TrialState

from tuner.errors import StudyError
from tuner.study.trial.attrs import named_constraints


def is_feasible(trial: FrozenTrial) -> bool:
    return trial.state == TrialState.COMPLETE and all(v <= 0 for v in named_constraints(trial.constraints).values())


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


def pick_trial(study: optuna.Study, trial_number: int | None, *, maximize: bool) -> FrozenTrial:
    trials = study.get_trials(deepcopy=False)
    if trial_number is None:
        best = best_feasible_trial(trials, maximize=maximize)
        if best is None:
            raise StudyError(
                f"study {study.study_name!r} has no feasible trial yet; pick one with --trial N or run more trials"
            )
        return best
    found = next((t for t in trials if t.number == trial_number), None)
    if found is None:
        raise StudyError(f"study {study.study_name!r} has no trial #{trial_number} (trials 0..{len(trials) - 1})")
    if found.state != TrialState.COMPLETE:
        raise StudyError(f"trial #{trial_number} is {found.state.name}, not COMPLETE; pick a completed trial")
    return found


def summary_metrics(study: optuna.Study, *, maximize: bool) -> dict[str, float]:
    """Numbers for the parent run: trials by state and the best feasible value."""
    return summary_of(study.get_trials(deepcopy=False), maximize=maximize)


def summary_of(trials: Sequence[FrozenTrial], *, maximize: bool) -> dict[str, float]:
    """`summary_metrics` of these trials."""
    out = {
        f"trials_{s.name.lower()}": float(sum(t.state == s for t in trials))
        for s in (TrialState.COMPLETE, TrialState.FAIL, TrialState.PRUNED)
    }
    best = best_feasible_trial(trials, maximize=maximize)
    out["feasible_trials"] = float(sum(is_feasible(t) for t in trials))
    if best is not None:
        out["best_feasible_value"] = float(best.values[0])
        out["best_feasible_trial"] = float(best.number)
    else:
        out["best_feasible_value"] = math.nan
    return out
