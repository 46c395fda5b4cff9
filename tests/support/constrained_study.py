"""A study of trials told ``(value, OOS_FP_Rate violation)`` as the trial runner records
them: ``set_constraint`` for the samplers and the legacy ``constraints`` list that
optuna-dashboard reads. A violation > 0 breaks the constraint (the trial is infeasible)."""

from __future__ import annotations

from collections.abc import Sequence

import optuna

CONSTRAINT = "OOS_FP_Rate <= 0.1"


def constrained_study(url: str, name: str, scores: Sequence[tuple[float, float]]) -> optuna.Study:
    from tuner.optuna_adapter import set_legacy_constraints

    study = optuna.create_study(storage=url, study_name=name, direction="maximize")
    for value, violation in scores:
        trial = study.ask()
        trial.suggest_int("fusion.rrf_k", 1, 200)
        trial.set_constraint(CONSTRAINT, violation)
        set_legacy_constraints(trial, [violation])
        study.tell(trial, value)
    return study
