"""The scalar parameter kinds: ``float``, ``int``, ``categorical`` and ``fixed``.

A scalar is encoded as one Optuna param of the same name and value (a fixed one as
none: it is written, never sampled).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, ClassVar, Literal

import optuna
from optuna.distributions import (
    BaseDistribution,
    CategoricalDistribution,
    FloatDistribution,
    IntDistribution,
)
from pydantic import Field, PositiveInt, field_validator, model_validator

from tuner.config.space.kind import ParamKind, check_bounds
from tuner.config.space.values import Scalar, family, kind_of, same
from tuner.config.yamlfile import did_you_mean


class _Number(ParamKind):
    """What ``float`` and ``int`` share: a ``low..high`` range of one Optuna param."""

    if TYPE_CHECKING:  # declared by each subclass, with its own types
        type: str
        low: float
        high: float

    def decode(self, raw: Sequence[Any]) -> Any:
        return raw[0]

    def type_problem(self, value: Any) -> str | None:
        have = kind_of(value)
        if have not in ("int", "float", "null"):
            return f"config has {have}, space declares {self.type} (point the key at a number or change the type)"
        return None

    def range_warning(self, value: Any) -> str | None:
        if isinstance(value, int | float) and not isinstance(value, bool) and not self.low <= value <= self.high:
            return (
                f"current value {value} lies outside [{self.low}, {self.high}]; "
                "the baseline trial is enqueued outside the space"
            )
        return None


class FloatParam(_Number):
    type: Literal["float"]
    low: float
    high: float
    log: bool = False
    step: float | None = Field(default=None, gt=0)

    gateable: ClassVar[bool] = True

    @model_validator(mode="after")
    def _bounds(self) -> FloatParam:
        check_bounds(self.low, self.high, self.log, self.step)
        return self

    def distributions(self, name: str) -> dict[str, BaseDistribution]:
        return {name: FloatDistribution(self.low, self.high, log=self.log, step=self.step)}

    def encode(self, name: str, value: Any) -> dict[str, Any]:
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ValueError(f"{value!r} is not a number")
        return {name: float(value)}


class IntParam(_Number):
    type: Literal["int"]
    low: int
    high: int
    log: bool = False
    step: PositiveInt = 1

    @model_validator(mode="after")
    def _bounds(self) -> IntParam:
        check_bounds(self.low, self.high, self.log, self.step)
        return self

    def distributions(self, name: str) -> dict[str, BaseDistribution]:
        return {name: IntDistribution(self.low, self.high, log=self.log, step=self.step)}

    def encode(self, name: str, value: Any) -> dict[str, Any]:
        if isinstance(value, bool) or not isinstance(value, int | float) or not float(value).is_integer():
            raise ValueError(f"{value!r} is not a whole number")
        return {name: int(value)}

    def type_problem(self, value: Any) -> str | None:
        problem = super().type_problem(value)
        if problem is None and kind_of(value) == "float" and not float(value).is_integer():
            return f"config has float {value}, space declares int (use type: float)"
        return problem


class CategoricalParam(ParamKind):
    type: Literal["categorical"]
    choices: list[Scalar] = Field(min_length=1)

    @field_validator("choices")
    @classmethod
    def _unique(cls, v: list[Scalar]) -> list[Scalar]:
        seen = [repr(c) for c in v]
        dup = {c for c in seen if seen.count(c) > 1}
        if dup:
            raise ValueError(f"duplicate choices {sorted(dup)} (list each choice once)")
        return v

    def distributions(self, name: str) -> dict[str, BaseDistribution]:
        return {name: CategoricalDistribution(self.choices)}

    def decode(self, raw: Sequence[Any]) -> Any:
        return raw[0]

    def encode(self, name: str, value: Any) -> dict[str, Any]:
        for choice in self.choices:
            if same(value, choice):
                return {name: choice}
        raise ValueError(f"{value!r} is not one of the choices {self.choices} (add it to choices)")

    def type_problem(self, value: Any) -> str | None:
        have = kind_of(value)
        kinds = sorted({kind_of(c) for c in self.choices})
        if have != "null" and any(family(k) != family(have) for k in kinds):
            return (
                f"config has {have}, space declares categorical of {'/'.join(kinds)} (make the choices {have} values)"
            )
        return None

    def range_warning(self, value: Any) -> str | None:
        if value is not None and not any(same(value, c) for c in self.choices):
            return f"current value {value!r} is not among the choices {self.choices}; the baseline cannot be enqueued"
        return None

    def condition_problem(self, value: Any) -> str | None:
        if not any(same(value, c) for c in self.choices):
            return (
                f"{value!r} is not one of its choices "
                f"{self.choices}{did_you_mean(str(value), [str(c) for c in self.choices])}"
            )
        return None


class FixedParam(ParamKind):
    """A value the space writes as is (the ``fixed:`` section): never sampled."""

    type: Literal["fixed"]
    value: Any

    tuned: ClassVar[bool] = False

    def distributions(self, name: str) -> dict[str, BaseDistribution]:
        return {}

    def suggest(self, trial: optuna.trial.BaseTrial, name: str) -> Any:
        return self.value

    def encode(self, name: str, value: Any) -> dict[str, Any]:
        if not (same(value, self.value) or value == self.value):
            raise ValueError(f"is fixed to {self.value!r} by the space; a variant cannot set {value!r}")
        return {}

    def type_problem(self, value: Any) -> str | None:
        have, want = kind_of(value), kind_of(self.value)
        if have != "null" and want != "null" and family(want) != family(have):
            return f"config has {have}, fixed value {self.value!r} is {want} (write a {have} value)"
        return None
