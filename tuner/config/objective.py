"""What a study optimises and tolerates: the ``objective:``, ``constraints:`` and
``failure_budget:`` sections. These are the one Objective, Constraint and FailureBudget
of the tuner: the study scores a trial by them (tuner.study.trial), solves gates under
them (tuner.study.gates.threshold) and counts failed trials against the budget
(tuner.study.loop.FailureTally) as parsed here, with no second type built from them.

Public API::

    Objective(metric=..., direction="maximize").maximize -> bool
    Constraint.parse("OOS_FP_Rate <= 0.10") -> Constraint; .violation(metrics) -> float
    FailureBudget(max_consecutive=3, max_total=10)
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from typing import Literal

from pydantic import PositiveInt

from tuner.config.strict import StrictModel
from tuner.errors import ConfigError


class Objective(StrictModel):
    metric: str = "Primary_Metric_Score"
    direction: Literal["maximize", "minimize"] = "maximize"

    @property
    def maximize(self) -> bool:
        return self.direction == "maximize"


_CONSTRAINT_RE = re.compile(r"^\s*([A-Za-z_][\w@.\-]*)\s*(<=|>=)\s*([-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?)\s*$")


class Constraint(StrictModel):
    """``metric op bound``; ``violation`` <= 0 means feasible (optuna's convention)."""

    metric: str
    op: Literal["<=", ">="]
    bound: float

    @classmethod
    def parse(cls, text: str) -> Constraint:
        m = _CONSTRAINT_RE.match(text)
        if not m:
            raise ValueError(
                f"cannot parse constraint {text!r}: write 'METRIC <= NUMBER' or 'METRIC >= NUMBER', "
                "e.g. 'OOS_FP_Rate <= 0.10'"
            )
        return cls(metric=m.group(1), op=m.group(2), bound=float(m.group(3)))

    @property
    def name(self) -> str:
        return f"{self.metric} {self.op} {self.bound:g}"

    def violation(self, metrics: Mapping[str, float]) -> float:
        """How far ``metrics`` break the constraint (<= 0: feasible; NaN metric: +inf)."""
        if self.metric not in metrics:
            raise ConfigError(
                f"constraint {self.name!r}: metric {self.metric} is not in the report "
                f"(known: {', '.join(sorted(metrics))}); fix the constraint's metric name"
            )
        value = float(metrics[self.metric])
        if math.isnan(value):
            return math.inf
        return value - self.bound if self.op == "<=" else self.bound - value


class FailureBudget(StrictModel):
    """How many failed trials a run tolerates: in a row, and in all (the loop's
    tuner.study.loop.FailureTally counts them)."""

    max_consecutive: PositiveInt = 3
    max_total: PositiveInt = 10
