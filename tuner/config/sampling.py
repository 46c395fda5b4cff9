"""The ``sampler:`` and ``pruner:`` sections: which optuna sampler and pruner a study uses.

Public API::

    SamplerConfig (tpe | random | gp | nsgaii | cmaes | qmc, by ``type``)
        .ignores_constraints -> bool; .create() -> optuna sampler
    PrunerConfig (none | median | percentile | wilcoxon, by ``type``)
        .create() -> optuna pruner
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Iterator
from typing import Annotated, ClassVar, Literal, Union

import optuna
from pydantic import Field, PositiveInt

from tuner.config.strict import StrictModel


@contextlib.contextmanager
def _quiet_experimental() -> Iterator[None]:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        yield


class _SamplerBase(StrictModel):
    seed: int | None = None

    #: CMA-ES, random and QMC never read trial constraints (optuna 5).
    _ignores_constraints: ClassVar[bool] = False

    @property
    def ignores_constraints(self) -> bool:
        return self._ignores_constraints


class TPESamplerConfig(_SamplerBase):
    type: Literal["tpe"] = "tpe"
    multivariate: bool = True
    group: bool = True  # with conditional params, multivariate TPE needs group=True to model them jointly
    n_startup_trials: int = Field(default=10, ge=0)
    constant_liar: bool = False  # set true with several parallel workers

    def create(self) -> optuna.samplers.BaseSampler:
        with _quiet_experimental():  # multivariate/group are a deliberate, documented choice
            return optuna.samplers.TPESampler(
                seed=self.seed,
                multivariate=self.multivariate,
                group=self.group and self.multivariate,
                n_startup_trials=self.n_startup_trials,
                constant_liar=self.constant_liar,
            )


class RandomSamplerConfig(_SamplerBase):
    type: Literal["random"]
    _ignores_constraints: ClassVar[bool] = True

    def create(self) -> optuna.samplers.BaseSampler:
        return optuna.samplers.RandomSampler(seed=self.seed)


class GPSamplerConfig(_SamplerBase):
    type: Literal["gp"]
    n_startup_trials: int = Field(default=10, ge=0)

    def create(self) -> optuna.samplers.BaseSampler:
        return optuna.samplers.GPSampler(seed=self.seed, n_startup_trials=self.n_startup_trials)


class NSGAIISamplerConfig(_SamplerBase):
    type: Literal["nsgaii"]
    population_size: int = Field(default=50, ge=2)

    def create(self) -> optuna.samplers.BaseSampler:
        return optuna.samplers.NSGAIISampler(seed=self.seed, population_size=self.population_size)


class CmaEsSamplerConfig(_SamplerBase):
    type: Literal["cmaes"]
    n_startup_trials: int = Field(default=1, ge=0)
    _ignores_constraints: ClassVar[bool] = True

    def create(self) -> optuna.samplers.BaseSampler:
        return optuna.samplers.CmaEsSampler(seed=self.seed, n_startup_trials=self.n_startup_trials)


class QMCSamplerConfig(_SamplerBase):
    type: Literal["qmc"]
    qmc_type: Literal["sobol", "halton"] = "sobol"
    scramble: bool = True
    _ignores_constraints: ClassVar[bool] = True

    def create(self) -> optuna.samplers.BaseSampler:
        return optuna.samplers.QMCSampler(seed=self.seed, qmc_type=self.qmc_type, scramble=self.scramble)


SamplerConfig = Annotated[
    Union[  # noqa: UP007
        TPESamplerConfig,
        RandomSamplerConfig,
        GPSamplerConfig,
        NSGAIISamplerConfig,
        CmaEsSamplerConfig,
        QMCSamplerConfig,
    ],
    Field(discriminator="type"),
]


class NoPrunerConfig(StrictModel):
    type: Literal["none"] = "none"

    def create(self) -> optuna.pruners.BasePruner:
        return optuna.pruners.NopPruner()


class MedianPrunerConfig(StrictModel):
    type: Literal["median"]
    n_startup_trials: int = Field(default=5, ge=0)
    n_warmup_steps: int = Field(default=0, ge=0)
    interval_steps: PositiveInt = 1

    def create(self) -> optuna.pruners.BasePruner:
        return optuna.pruners.MedianPruner(self.n_startup_trials, self.n_warmup_steps, self.interval_steps)


class PercentilePrunerConfig(StrictModel):
    type: Literal["percentile"]
    percentile: float = Field(default=25.0, ge=0, le=100)
    n_startup_trials: int = Field(default=5, ge=0)
    n_warmup_steps: int = Field(default=0, ge=0)
    interval_steps: PositiveInt = 1

    def create(self) -> optuna.pruners.BasePruner:
        return optuna.pruners.PercentilePruner(
            self.percentile, self.n_startup_trials, self.n_warmup_steps, self.interval_steps
        )


class WilcoxonPrunerConfig(StrictModel):
    type: Literal["wilcoxon"]
    p_threshold: float = Field(default=0.1, gt=0, lt=1)
    n_startup_steps: int = Field(default=2, ge=0)

    def create(self) -> optuna.pruners.BasePruner:
        with _quiet_experimental():
            return optuna.pruners.WilcoxonPruner(p_threshold=self.p_threshold, n_startup_steps=self.n_startup_steps)


PrunerConfig = Annotated[
    Union[NoPrunerConfig, MedianPrunerConfig, PercentilePrunerConfig, WilcoxonPrunerConfig],  # noqa: UP007
    Field(discriminator="type"),
]
