"""Optuna distributions of a search space: asking a trial for one, cleaning a stepped
float, widening one so a value outside the space can still be recorded, and reading
which params a queued trial was given."""

from __future__ import annotations

import math
from collections.abc import Mapping
from decimal import Decimal
from typing import Any

import optuna
from optuna.distributions import (
    BaseDistribution,
    CategoricalDistribution,
    FloatDistribution,
    IntDistribution,
)

from tuner.optuna_adapter import contains
from tuner.optuna_adapter import queued_params as queued


def _decimals_of(step: float) -> int:
    return max(0, -Decimal(repr(step)).normalize().as_tuple().exponent)  # type: ignore[operator]  # a finite step: an int


def clean_float(value: float, step: float | None) -> float:
    """Drop the binary noise a stepped float picks up (0.30000000000000004 -> 0.3)."""
    return round(value, _decimals_of(step)) if step else value


def suggest_one(trial: optuna.trial.BaseTrial, name: str, dist: BaseDistribution) -> Any:
    """Ask ``trial`` for the Optuna param ``name`` drawn from ``dist``."""
    if isinstance(dist, IntDistribution):
        return trial.suggest_int(name, dist.low, dist.high, step=dist.step, log=dist.log)
    if isinstance(dist, FloatDistribution):
        value = trial.suggest_float(name, dist.low, dist.high, step=dist.step, log=dist.log)
        return clean_float(value, dist.step)
    if isinstance(dist, CategoricalDistribution):
        return trial.suggest_categorical(name, dist.choices)
    raise TypeError(f"unsupported distribution {dist!r}")


def widened(dist: BaseDistribution, value: Any) -> BaseDistribution:
    """``dist`` with its numeric range stretched (on its step grid) to contain ``value``."""
    if isinstance(dist, IntDistribution | FloatDistribution) and not contains(dist, value):
        low, high = min(dist.low, value), max(dist.high, value)
        if dist.step is not None and not dist.log:
            # Keep the grid: move the new bound onto it.
            span = math.ceil((high - low) / dist.step - 1e-9) * dist.step
            low, high = (value, value + span) if value < dist.low else (low, low + span)
        if isinstance(dist, IntDistribution):
            return IntDistribution(int(low), int(high), log=dist.log, step=dist.step)
        return FloatDistribution(low, high, log=dist.log, step=dist.step)
    return dist


def queued_params(trial: optuna.trial.BaseTrial) -> Mapping[str, Any]:
    """The params ``study.enqueue_trial`` fixed for ``trial`` (an optuna.Trial); empty otherwise."""
    return queued(trial)
