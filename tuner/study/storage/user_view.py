"""The study as people see it: every param under its config key, no sampler coordinate.

A trial's Optuna params hold two kinds of names. The sampler's coordinates
(tuner.config.space.kind.is_coordinate: a simplex's stick-breaking ``fusion.weights:bm25``,
equal to the weight only for two sources; an ordered list's ``fallback.windows_days:first``
and ``:gap1``) are what the samplers model and must stay in the storage. The values the
trial applied, under their config keys (``fusion.weights.bm25``, ``fallback.windows_days.0``:
tuner.study.trial.applied_params), are what a person reads, and each trial records them
under its own one-point distribution.

`UserView(storage)` is an Optuna storage that reads and writes through to ``storage`` and
serves every trial with its coordinates left out and each config key under one
distribution for all the trials it returns together (their envelope): Optuna's importance
evaluators and plots only rank a param whose distribution is the same in every trial.
optuna-dashboard is served this view (tuner.ops.dashboard_server), and `tuner report`
ranks importances over it (tuner.ops.analysis.param_importances), so the importance plot,
the trial table and the plots list config keys only, with the values written to the
config. The samplers, which run on the storage itself, never see it.

Its best trial is the best *feasible* one (tuner.study.feasibility, the one rule):
optuna-dashboard's Best Trial card and badge come from ``get_best_trial``, which Optuna's
storages answer by value alone, constraints ignored. With no feasible trial the view
answers as Optuna does (the best value: the dashboard fails the whole study page when it
raises), and `is_feasible_trial` tells; tuner.ops.dashboard_server then leaves the card empty.
"""

from __future__ import annotations

from collections.abc import Container, Sequence
from typing import Any

import optuna
from optuna.distributions import BaseDistribution, CategoricalDistribution, FloatDistribution, IntDistribution
from optuna.storages import BaseStorage
from optuna.study import StudyDirection
from optuna.trial import FrozenTrial, TrialState

from tuner.config.space.kind import is_coordinate
from tuner.numbers import rounded
from tuner.optuna_adapter import storage_of, trial_id_of
from tuner.study.feasibility import best_feasible_trial, is_feasible


def user_trial(
    trial: FrozenTrial, distributions: dict[str, BaseDistribution] | None = None, *, display: bool = False
) -> FrozenTrial:
    """``trial`` without its sampler coordinates; each remaining param under
    ``distributions[name]`` where given (it must contain the value), else its own. With
    ``display``, its values, float params and float user attributes to 4 significant
    digits (tuner.numbers.rounded), as a person reads them on a card."""
    names = [n for n in trial.params if not is_coordinate(n)]
    shared = distributions or {}
    dists = {n: shared.get(n, trial.distributions[n]) for n in names}
    params = {n: trial.params[n] for n in names}
    values, user_attrs = trial.values, trial.user_attrs
    if display:
        params = {n: rounded(v) if isinstance(dists[n], FloatDistribution) else v for n, v in params.items()}
        values = None if values is None else [rounded(v) for v in values]
        user_attrs = {k: rounded(v) if type(v) is float else v for k, v in user_attrs.items()}
    return FrozenTrial(
        number=trial.number,
        state=trial.state,
        value=None,
        values=values,
        datetime_start=trial.datetime_start,
        datetime_complete=trial.datetime_complete,
        params=params,
        distributions=dists,
        user_attrs=user_attrs,
        system_attrs=trial.system_attrs,
        intermediate_values=trial.intermediate_values,
        trial_id=trial_id_of(trial),
    )


def envelope(dists: Sequence[BaseDistribution]) -> BaseDistribution | None:
    """One distribution holding every value of ``dists`` (all of one kind): the same one
    when they agree, else the numeric range around them all (no step: the trials' grids
    may differ) or the union of the categorical choices. None for mixed kinds."""
    first = dists[0]
    if all(d == first for d in dists):
        return first
    if all(isinstance(d, FloatDistribution) for d in dists):
        floats = [d for d in dists if isinstance(d, FloatDistribution)]
        log = all(d.log for d in floats)
        return FloatDistribution(min(d.low for d in floats), max(d.high for d in floats), log=log)
    if all(isinstance(d, IntDistribution) for d in dists):
        ints = [d for d in dists if isinstance(d, IntDistribution)]
        log = all(d.log for d in ints)
        return IntDistribution(min(d.low for d in ints), max(d.high for d in ints), log=log)
    if all(isinstance(d, CategoricalDistribution) for d in dists):
        choices: list[Any] = []
        for d in dists:
            assert isinstance(d, CategoricalDistribution)
            choices += [c for c in d.choices if c not in choices]
        return CategoricalDistribution(choices)
    return None


def user_trials(trials: Sequence[FrozenTrial], *, display: bool = False) -> list[FrozenTrial]:
    """`user_trial` of each, each config key under the envelope of its distributions."""
    seen: dict[str, list[BaseDistribution]] = {}
    for t in trials:
        for name, dist in t.distributions.items():
            if not is_coordinate(name):
                seen.setdefault(name, []).append(dist)
    shared = {n: e for n, ds in seen.items() if (e := envelope(ds)) is not None}
    return [user_trial(t, shared, display=display) for t in trials]


class UserView(BaseStorage):
    """``storage`` with its trials as `user_trials` makes them (see the module doc);
    ``display``: numbers to 4 significant digits too (optuna-dashboard's view only: `tuner
    report`'s importances read the values as measured)."""

    def __init__(self, storage: BaseStorage, *, display: bool = False) -> None:
        self.inner = storage
        self.display = display

    # -- trials, as people see them
    def get_trial(self, trial_id: int) -> FrozenTrial:
        return user_trial(self.inner.get_trial(trial_id), display=self.display)

    def get_all_trials(
        self, study_id: int, deepcopy: bool = True, states: Container[TrialState] | None = None
    ) -> list[FrozenTrial]:
        return user_trials(self.inner.get_all_trials(study_id, deepcopy=deepcopy, states=states), display=self.display)

    def get_best_trial(self, study_id: int) -> FrozenTrial:
        """The best feasible trial; with none feasible, the best value as Optuna's storages
        answer (ValueError when no trial is complete, RuntimeError for several objectives)."""
        fallback = self.inner.get_best_trial(study_id)
        maximize = self.inner.get_study_directions(study_id)[0] == StudyDirection.MAXIMIZE
        done = self.inner.get_all_trials(study_id, deepcopy=False, states=(TrialState.COMPLETE,))
        best = best_feasible_trial(done, maximize=maximize)
        return self.get_trial(trial_id_of(best if best is not None else fallback))

    def is_feasible_trial(self, trial_id: int) -> bool:
        """The one feasibility rule (tuner.study.feasibility) on trial ``trial_id``."""
        return is_feasible(self.inner.get_trial(trial_id))

    # -- everything else, unchanged
    def create_new_study(self, directions: Sequence[StudyDirection], study_name: str | None = None) -> int:
        return self.inner.create_new_study(directions, study_name)

    def delete_study(self, study_id: int) -> None:
        self.inner.delete_study(study_id)

    def set_study_user_attr(self, study_id: int, key: str, value: Any) -> None:
        self.inner.set_study_user_attr(study_id, key, value)

    def set_study_system_attr(self, study_id: int, key: str, value: Any) -> None:
        self.inner.set_study_system_attr(study_id, key, value)

    def get_study_id_from_name(self, study_name: str) -> int:
        return self.inner.get_study_id_from_name(study_name)

    def get_study_name_from_id(self, study_id: int) -> str:
        return self.inner.get_study_name_from_id(study_id)

    def get_study_directions(self, study_id: int) -> list[StudyDirection]:
        return self.inner.get_study_directions(study_id)

    def get_study_user_attrs(self, study_id: int) -> dict[str, Any]:
        return self.inner.get_study_user_attrs(study_id)

    def get_study_system_attrs(self, study_id: int) -> dict[str, Any]:
        return self.inner.get_study_system_attrs(study_id)

    def get_all_studies(self) -> list[Any]:  # FrozenStudy, which Optuna does not export
        return self.inner.get_all_studies()

    def create_new_trial(self, study_id: int, template_trial: FrozenTrial | None = None) -> int:
        return self.inner.create_new_trial(study_id, template_trial)

    def set_trial_param(
        self, trial_id: int, param_name: str, param_value_internal: float, distribution: BaseDistribution
    ) -> None:
        self.inner.set_trial_param(trial_id, param_name, param_value_internal, distribution)

    def get_trial_id_from_study_id_trial_number(self, study_id: int, trial_number: int) -> int:
        return self.inner.get_trial_id_from_study_id_trial_number(study_id, trial_number)

    def set_trial_state_values(self, trial_id: int, state: TrialState, values: Sequence[float] | None = None) -> bool:
        return self.inner.set_trial_state_values(trial_id, state, values)

    def set_trial_intermediate_value(self, trial_id: int, step: int, intermediate_value: float) -> None:
        self.inner.set_trial_intermediate_value(trial_id, step, intermediate_value)

    def set_trial_user_attr(self, trial_id: int, key: str, value: Any) -> None:
        self.inner.set_trial_user_attr(trial_id, key, value)

    def set_trial_system_attr(self, trial_id: int, key: str, value: Any) -> None:
        self.inner.set_trial_system_attr(trial_id, key, value)

    def remove_session(self) -> None:
        self.inner.remove_session()


def user_study(study: optuna.Study) -> optuna.Study:
    """``study`` read through a `UserView` of its storage."""
    return optuna.load_study(study_name=study.study_name, storage=UserView(storage_of(study)))
