"""Every value `tuner apply` would write, recorded as an Optuna param under its config key.

A trial's Optuna params are what the sampler drew: a simplex's free coordinates
(``fusion.weights:bm25``), an ordered list's first value and gaps
(``fallback.windows_days:gap1``); the solved gates (tuner.study.gates.threshold) are not drawn
at all. The dashboards show params, so without this the Best Trial card, the parallel
coordinates and the slice plots would miss the values that decide the score.

`applied_params` (pure) flattens the assignment (tuner.config.flatten: ``fusion.weights``
{bm25, dense} -> ``fusion.weights.bm25`` / ``.dense``, ``fallback.windows_days`` [39, 111]
-> ``.0`` / ``.1``) and keeps the numeric values that are not already params under the
same name. Each gets the distribution it is recorded under:

- a param the space declares (a solved gate: ``confidence.threshold``) keeps its
  declared distribution, widened to hold the value. It is then an ordinary param in
  every trial: the dashboards' importance and plots rank it, and the samplers see it
  as they see any param of the study;
- a derived component gets a one-point distribution (low = high = the value). Optuna's
  samplers leave it alone (one-point distributions, and distributions that differ
  between trials, are outside every sampler's search space), while optuna-dashboard
  merges the points into one axis per name.

`record_applied_params` writes them on a running trial through its storage, in one
transaction (tuner.optuna_adapter.add_trial_params; ``BaseStorage.set_trial_param`` each
on a storage without one); a value Optuna refuses (the name was recorded with another
kind before) is skipped and returned, never raised into the trial.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from optuna.distributions import BaseDistribution, CategoricalDistribution, FloatDistribution, IntDistribution

from tuner.config.flatten import flatten
from tuner.config.space.distributions import widened
from tuner.optuna_adapter import add_trial_params


def applied_params(
    assignment: Mapping[str, Any],
    sampled: Mapping[str, Any],
    declared: Mapping[str, BaseDistribution],
) -> dict[str, tuple[Any, BaseDistribution]]:
    """Name -> (value, distribution) for each numeric applied value not in ``sampled``
    (the trial's own params), and each categorical one the space declares (a fusion param
    replayed per trial). ``declared``: the space's Optuna distributions by name."""
    out: dict[str, tuple[Any, BaseDistribution]] = {}
    for name, value in flatten(assignment).items():
        if name in sampled:
            continue
        dist = declared.get(name)
        if isinstance(dist, CategoricalDistribution) and value in dist.choices:
            out[name] = (value, dist)  # a replayed categorical (fusion.method): under its declared choices
            continue
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            continue
        if isinstance(dist, (FloatDistribution, IntDistribution)):
            out[name] = (value, widened(dist, value))
        elif isinstance(value, int):
            out[name] = (value, IntDistribution(value, value))
        else:
            out[name] = (float(value), FloatDistribution(float(value), float(value)))
    return out


def record_applied_params(
    trial: Any, assignment: Mapping[str, Any], declared: Mapping[str, BaseDistribution]
) -> list[str]:
    """Record `applied_params` on the running ``optuna.Trial``, but the names it has
    (its drawn params; safe to repeat), in one storage transaction
    (tuner.optuna_adapter.add_trial_params); returns the names skipped."""
    values = applied_params(assignment, {}, declared)  # the trial's own names are left out when added
    return add_trial_params(
        trial, {name: (dist.to_internal_repr(value), dist) for name, (value, dist) in values.items()}
    )
