"""The ``ordered`` kind: a strictly increasing list (e.g. fallback windows).

Encoded as ``NAME:first`` then ``NAME:gapI`` (next = previous + gap > 0) or
``NAME:ratioI`` (next = previous * ratio, ratio > 1), so an unordered list is never
proposed.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from typing import Any, ClassVar, Literal

from optuna.distributions import BaseDistribution, FloatDistribution, IntDistribution
from pydantic import BaseModel, ConfigDict, Field, model_validator

from tuner.config.space.kind import ParamKind, check_bounds, coordinate
from tuner.config.space.values import kind_of


class Range(BaseModel):
    """The bounds of ``first``, ``gap`` or ``ratio``."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    low: float
    high: float
    log: bool = False
    step: float | None = Field(default=None, gt=0)

    @model_validator(mode="after")
    def _bounds(self) -> Range:
        check_bounds(self.low, self.high, self.log, self.step)
        return self

    def distribution(self, integer: bool) -> BaseDistribution:
        if integer:
            return IntDistribution(int(self.low), int(self.high), log=self.log, step=int(self.step or 1))
        return FloatDistribution(self.low, self.high, log=self.log, step=self.step)


class OrderedParam(ParamKind):
    """A strictly increasing list: ``first``, then each next = previous + gap (or * ratio)."""

    type: Literal["ordered"]
    length: int = Field(ge=2)
    first: Range
    gap: Range | None = None
    ratio: Range | None = None
    integer: bool = True

    conditionable: ClassVar[bool] = False

    @model_validator(mode="after")
    def _shape(self) -> OrderedParam:
        if (self.gap is None) == (self.ratio is None):
            raise ValueError("give exactly one of gap (next = previous + gap) or ratio (next = previous * ratio)")
        if self.gap is not None and self.gap.low <= 0:
            raise ValueError(f"gap.low must be > 0 so the list stays strictly increasing, got {self.gap.low}")
        if self.ratio is not None and self.ratio.low <= 1:
            raise ValueError(f"ratio.low must be > 1 so the list stays strictly increasing, got {self.ratio.low}")
        if self.ratio is not None and self.first.low <= 0:
            raise ValueError(f"ratio needs first.low > 0, got {self.first.low}")
        if self.integer:
            for label, rng in (("first", self.first), ("gap", self.gap)):
                if rng is not None and not all(float(x).is_integer() for x in (rng.low, rng.high)):
                    raise ValueError(f"{label} bounds must be whole numbers when integer: true")
        return self

    def distributions(self, name: str) -> dict[str, BaseDistribution]:
        out = {coordinate(name, "first"): self.first.distribution(self.integer)}
        step_kind, rng = ("gap", self.gap) if self.gap is not None else ("ratio", self.ratio)
        assert rng is not None
        for i in range(1, self.length):
            out[coordinate(name, f"{step_kind}{i}")] = rng.distribution(self.integer and step_kind == "gap")
        return out

    def decode(self, raw: Sequence[Any]) -> list[float | int]:
        out: list[float | int] = [int(raw[0]) if self.integer else float(raw[0])]
        for step in raw[1:]:
            prev = out[-1]
            if self.gap is not None:
                nxt: float | int = prev + step
            else:
                nxt = prev * step
                if self.integer:
                    nxt = max(int(prev) + 1, round(nxt))
            out.append(nxt)
        return out

    def encode(self, name: str, value: Any) -> dict[str, Any]:
        if isinstance(value, str) or not isinstance(value, Sequence) or len(value) != self.length:
            raise ValueError(f"expected a list of {self.length} numbers, got {value!r}")
        vals = [float(v) for v in value]
        if any(b <= a for a, b in itertools.pairwise(vals)):
            raise ValueError(f"{list(value)} is not strictly increasing (ordered groups only propose increasing lists)")
        out: dict[str, Any] = {coordinate(name, "first"): int(vals[0]) if self.integer else vals[0]}
        for i in range(1, self.length):
            if self.gap is not None:
                gap = vals[i] - vals[i - 1]
                out[coordinate(name, f"gap{i}")] = int(gap) if self.integer else gap
            else:
                if vals[i - 1] <= 0:
                    raise ValueError(f"ratio encoding needs positive values, got {list(value)}")
                out[coordinate(name, f"ratio{i}")] = vals[i] / vals[i - 1]
        return out

    def from_config(self, value: Any) -> list[float | int]:
        return [int(v) if self.integer and float(v).is_integer() else float(v) for v in value]

    def type_problem(self, value: Any) -> str | None:
        if not isinstance(value, list | tuple):
            return f"config has {kind_of(value)}, an ordered group needs a list of numbers"
        kinds = {kind_of(v) for v in value}
        if not kinds <= {"int", "float"}:
            return f"config list holds {sorted(kinds)}, an ordered group needs numbers"
        if self.integer and "float" in kinds:
            return "config list holds floats, space declares integer: true (set integer: false)"
        # integer: false over an int list is allowed: floats where ints were is an explicit choice.
        return None

    def range_warning(self, value: Any) -> str | None:
        if isinstance(value, list | tuple) and len(value) != self.length:
            return f"current list has {len(value)} values, the space proposes {self.length}"
        return None
