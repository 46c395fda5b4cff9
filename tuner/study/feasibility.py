"""Which trials are feasible (COMPLETE, every constraint holding), the best feasible
one, the trial a command picks (the best feasible or a given COMPLETE one), and the
study's summary numbers for the MLflow parent run.

The one feasibility rule and the one ranking live here, as pure functions on plain
values, and every other place calls them: a trial's outcome (tuner.study.trial.outcome),
the trials frame of `tuner best` / `tuner report` (tuner.ops.analysis), the study note
(tuner.study.notes), a replayed fusion setting (tuner.study.replay.fusion_search).

- `constraints_hold`: every constraint value <= 0 (Optuna's convention: a constraint's
  value is its violation). A NaN value holds nothing, so it breaks the trial; a trial
  without constraint values has nothing to break.
- `feasible`: COMPLETE and `constraints_hold`.
- `rank_key`: best first is the better objective value (``maximize`` or not), ties to
  the earlier trial; a trial without a finite value is never ranked (`rankable`).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING

from tuner.errors import StudyError
from tuner.study.trial.attrs import named_constraints

if TYPE_CHECKING:  # the rule itself needs no Optuna: a trial's outcome imports it
    import optuna
    from optuna.trial import FrozenTrial


def constraints_hold(values: Iterable[float]) -> bool:
    """The feasibility rule on constraint values (module docstring)."""
    return all(float(v) <= 0 for v in values)  # NaN <= 0 is False: a NaN breaks


def feasible(state: str, constraints: Iterable[float]) -> bool:
    """A trial in ``state`` (a TrialState's name) with these constraint values."""
    return state == "COMPLETE" and constraints_hold(constraints)


def rankable(value: float | None) -> bool:
    """A value the ranking can place: a number, not NaN."""
    return value is not None and not math.isnan(float(value))


def rank_key(value: float, number: int, *, maximize: bool) -> tuple[float, int]:
    """Sort key, best first: the better value, then the lower trial number."""
    return (-float(value) if maximize else float(value), int(number))


def is_feasible(trial: FrozenTrial) -> bool:
    return feasible(trial.state.name, named_constraints(trial.constraints).values())


def feasible_ranked(trials: Iterable[FrozenTrial], *, maximize: bool = True) -> list[FrozenTrial]:
    """The feasible trials with a value, best first (`rank_key`)."""
    ranked = [t for t in trials if is_feasible(t) and t.values and rankable(t.values[0])]
    return sorted(ranked, key=lambda t: rank_key(t.values[0], t.number, maximize=maximize))


def best_feasible_trial(trials: Sequence[FrozenTrial], *, maximize: bool = True) -> FrozenTrial | None:
    """The best COMPLETE trial whose constraints all hold (None when none does).

    Own selection instead of ``study.best_trial``, which raises when nothing is feasible
    and cannot be asked for 'best but feasible' in reports. Ties: the earlier trial.
    """
    ranked = feasible_ranked(trials, maximize=maximize)
    return ranked[0] if ranked else None


def pick_trial(
    study: optuna.Study,
    trial_number: int | None,
    *,
    maximize: bool,
    choose: Callable[[optuna.Study], FrozenTrial | None] | None = None,
) -> FrozenTrial:
    """Trial ``trial_number``, or without one the trial the study's selection rule picks:
    ``choose`` (tuner.study.query_scores.trial_chooser: ``selection: robust``), else the
    best feasible trial."""
    trials = study.get_trials(deepcopy=False)
    if trial_number is None:
        best = choose(study) if choose is not None else best_feasible_trial(trials, maximize=maximize)
        if best is None:
            raise StudyError(
                f"study {study.study_name!r} has no feasible trial yet; pick one with --trial N or run more trials"
            )
        return best
    found = next((t for t in trials if t.number == trial_number), None)
    if found is None:
        raise StudyError(f"study {study.study_name!r} has no trial #{trial_number} (trials 0..{len(trials) - 1})")
    if found.state.name != "COMPLETE":
        raise StudyError(f"trial #{trial_number} is {found.state.name}, not COMPLETE; pick a completed trial")
    return found


def summary_metrics(study: optuna.Study, *, maximize: bool) -> dict[str, float]:
    """Numbers for the parent run: trials by state and the best feasible value."""
    return summary_of(study.get_trials(deepcopy=False), maximize=maximize)


def summary_of(trials: Sequence[FrozenTrial], *, maximize: bool) -> dict[str, float]:
    """`summary_metrics` of these trials."""
    out = {f"trials_{s.lower()}": float(sum(t.state.name == s for t in trials)) for s in ("COMPLETE", "FAIL", "PRUNED")}
    best = best_feasible_trial(trials, maximize=maximize)
    out["feasible_trials"] = float(sum(is_feasible(t) for t in trials))
    if best is not None:
        out["best_feasible_value"] = float(best.values[0])
        out["best_feasible_trial"] = float(best.number)
    else:
        out["best_feasible_value"] = math.nan
    return out
