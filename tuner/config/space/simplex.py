"""The ``simplex`` kind: weights on a simplex, and their stick-breaking encoding.

A simplex of n components is n-1 Optuna params ``NAME:COMPONENT`` uniform in [0, 1],
decoded by stick-breaking with Beta(1, n-1-i) inverse CDFs. That maps the unit cube onto
the simplex *uniformly* (a flat Dirichlet) and one-to-one, so two proposals never differ
only by a scaling of the weights.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar, Literal

from optuna.distributions import BaseDistribution, FloatDistribution
from pydantic import Field, field_validator

from tuner.config.space.kind import ParamKind, coordinate
from tuner.config.space.values import kind_of
from tuner.config.yamlfile import did_you_mean


def sticks_to_shares(us: Sequence[float], total: float = 1.0, decimals: int | None = None) -> list[float]:
    """Stick-breaking: n-1 uniforms -> n shares of a flat Dirichlet, summing to ``total``."""
    n = len(us) + 1
    rest = 1.0
    shares: list[float] = []
    for i, u in enumerate(us):
        v = 1.0 - (1.0 - min(max(u, 0.0), 1.0)) ** (1.0 / (n - 1 - i))
        shares.append(rest * v)
        rest -= rest * v
    shares.append(max(rest, 0.0))
    shares = [s * total for s in shares]
    if decimals is not None:
        head = [round(s, decimals) for s in shares[:-1]]
        # The last share absorbs rounding so the written weights sum to total exactly.
        shares = [*head, max(round(total - sum(head), decimals), 0.0)]
    return shares


def shares_to_sticks(shares: Sequence[float]) -> list[float]:
    """Inverse of :func:`sticks_to_shares` (input need not be normalised)."""
    s = [float(x) for x in shares]
    if any(x < 0 for x in s) or sum(s) <= 0:
        raise ValueError(f"weights must be >= 0 with a positive sum, got {list(shares)}")
    total = sum(s)
    n = len(s)
    rest = 1.0
    us: list[float] = []
    for i in range(n - 1):
        share = s[i] / total
        v = min(share / rest, 1.0) if rest > 1e-15 else 0.0
        us.append(1.0 - (1.0 - v) ** (n - 1 - i))
        rest -= share
    return us


class SimplexParam(ParamKind):
    """Weights on a simplex: one share per component, written normalised to ``total``;
    the baseline (and any trial that keeps the file's proportions as this simplex
    proposes them) carries the file's weights as they are (:meth:`as_found`)."""

    type: Literal["simplex"]
    components: list[str] = Field(min_length=2)
    total: float = Field(default=1.0, gt=0)
    decimals: int = Field(default=4, ge=1, le=12)

    conditionable: ClassVar[bool] = False

    @field_validator("components")
    @classmethod
    def _unique(cls, v: list[str]) -> list[str]:
        if len(set(v)) != len(v):
            raise ValueError(f"duplicate components in {v} (list each once)")
        return v

    def distributions(self, name: str) -> dict[str, BaseDistribution]:
        return {coordinate(name, c): FloatDistribution(0.0, 1.0) for c in self.components[:-1]}

    def decode(self, raw: Sequence[Any]) -> dict[str, float]:
        shares = sticks_to_shares(list(raw), self.total, self.decimals)
        return dict(zip(self.components, shares, strict=True))

    def encode(self, name: str, value: Any) -> dict[str, Any]:
        us = shares_to_sticks(self._weights(value))
        return {coordinate(name, c): u for c, u in zip(self.components[:-1], us, strict=True)}

    def _weights(self, value: Any) -> list[float]:
        if isinstance(value, Mapping):
            missing = [c for c in self.components if c not in value]
            extra = [k for k in value if k not in self.components]
            if missing or extra:
                raise ValueError(f"weights must name exactly the components {self.components}, got {list(value)}")
            return [float(value[c]) for c in self.components]
        if isinstance(value, Sequence) and not isinstance(value, str) and len(value) == len(self.components):
            return [float(v) for v in value]
        raise ValueError(f"expected a mapping of {self.components} to weights, got {value!r}")

    def from_config(self, value: Any) -> dict[str, float]:
        """The file's weights as they are, not normalised: the baseline is the config as
        found, and a backend that does not divide by the weight sum scores 1.0/1.0
        differently from 0.5/0.5."""
        if self._listed(value):  # a list of weights (an engine's JSON: weights: [0.3, 0.7])
            return {c: float(value[i]) for i, c in enumerate(self.components)}
        return {c: float(value[c]) for c in self.components}

    def _listed(self, value: Any) -> bool:
        """A list of weights, its components named by position (0, 1, ...)."""
        return isinstance(value, list) and self.components == [str(i) for i in range(len(self.components))]

    def to_config(self, value: Any) -> Any:
        """Index components (0, 1, ...) are a list of weights in the config: written as one."""
        if isinstance(value, Mapping) and self.components == [str(i) for i in range(len(self.components))]:
            return [value[c] for c in self.components]
        return value

    def as_found(self, value: Any, found: Any) -> Any:
        """The file's weights when ``value`` is what this simplex proposes for them: its
        shares at ``total`` (the baseline's enqueued coordinates decode to those) or the
        weights themselves. Any other value, proportional or not, is a change."""
        if isinstance(value, Mapping) and isinstance(found, Mapping) and value.keys() == found.keys():
            try:
                shares: Mapping[str, Any] = self.decode(shares_to_sticks(self._weights(found)))
            except ValueError:  # weights that sum to 0: no shares to compare with
                shares = found
            for proposed in (found, shares):
                if all(
                    math.isclose(float(value[c]), float(proposed[c]), rel_tol=0.0, abs_tol=1e-12)
                    for c in self.components
                ):
                    return found
        return value

    def type_problem(self, value: Any) -> str | None:
        if isinstance(value, list):
            if not self._listed(value) or len(value) != len(self.components):
                return (
                    f"config has a list of {len(value)}: a simplex over a list of weights names its components "
                    f"by position, components: {[str(i) for i in range(len(value))]}"
                )
            if any(kind_of(v) not in ("int", "float") for v in value):
                return "config weights are not all numbers"
            return None
        if not isinstance(value, Mapping):
            return f"config has {kind_of(value)}, a simplex needs a mapping of component -> weight"
        for c in self.components:
            if c not in value:
                return f"component {c} is not a key of the config mapping {list(value)}{did_you_mean(c, value)}"
            if kind_of(value[c]) not in ("int", "float"):
                return f"config weight {c} is {kind_of(value[c])}, expected a number"
        return None
