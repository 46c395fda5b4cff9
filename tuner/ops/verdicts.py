"""Constraint verdicts a person reads: a trial's metric against its bound
(``0.0938 ✓ ≤ 0.10``, ``0.1250 ✗ > 0.10 by 0.0250``), never the signed violation
Optuna stores (negative for a feasible trial). Used by `tuner best` and the study report.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeGuard

from tuner.config.objective import Constraint
from tuner.numbers import num
from tuner.study.feasibility import constraints_hold

if TYPE_CHECKING:  # `tuner best` reads plain rows (tuner.ops.trial_rows) without pandas
    import pandas as pd

CONSTRAINT_PREFIX = "constraint:"  # the trials frame's column per constraint (tuner.ops.analysis)
JUDGED = "Judged@10"
EARLY_STOP_METRIC = "OOS_FP_Rate"  # the metric an early stop bounds from below (tuner.study.trial.runner)


def parse_constraint(name: str) -> Constraint | None:
    """The constraint a study records under ``name`` ("OOS_FP_Rate <= 0.1"); None for a
    name that is not ``METRIC OP NUMBER`` (the legacy positional "0", "1", ...)."""
    try:
        return Constraint.parse(name)
    except ValueError:
        return None


@dataclass(frozen=True)
class Verdict:
    """One constraint on one trial, for people: the metric's value against its bound,
    never the signed violation Optuna stores."""

    name: str
    constraint: Constraint | None
    value: float | None  # the metric (None: not recorded); for an early stop, a lower bound
    violation: float  # Optuna's: <= 0 feasible, NaN when the trial has no value for it
    lower_bound: bool = False

    @property
    def known(self) -> bool:
        return not math.isnan(self.violation)

    @property
    def ok(self) -> bool:
        return self.known and constraints_hold([self.violation])

    def text(self, *, excess: bool = True) -> str:
        """``0.0938 ✓ ≤ 0.10`` or ``0.1250 ✗ > 0.10 by 0.0250`` (``excess``: the "by")."""
        if not self.known:
            return "-"
        c, at_least = self.constraint, "≥" if self.lower_bound else ""
        value = "" if self.value is None else at_least + _num(self.value) + " "
        if c is None:
            return "✓" if self.ok else f"✗ by {at_least}{_num(self.violation)}"
        bound = f"{c.bound:.2f}" if round(c.bound, 2) == c.bound else f"{c.bound:g}"
        if self.ok:
            return f"{value}✓ {'≤' if c.op == '<=' else '≥'} {bound}"
        by = f" by {at_least}{_num(self.violation)}" if excess else ""
        return f"{value}✗ {'>' if c.op == '<=' else '<'} {bound}{by}"


def verdicts(row: Mapping[str, Any] | pd.Series) -> list[Verdict]:
    """A verdict per ``constraint:`` key of a trial's row (tuner.ops.trial_rows) or
    column of a trials-frame row, in their order."""
    out = []
    # keys(): a pandas Series iterates its values, not its labels
    for col in [c for c in row.keys() if c.startswith(CONSTRAINT_PREFIX)]:  # noqa: SIM118
        name = col.removeprefix(CONSTRAINT_PREFIX)
        c = parse_constraint(name)
        value = row.get(c.metric) if c is not None else None
        violation = float(row[col]) if _is_number(row[col]) else math.nan
        stopped = row.get("early_stop")
        early = isinstance(stopped, str) and bool(stopped) and c is not None and c.metric == EARLY_STOP_METRIC
        out.append(Verdict(name, c, float(value) if _is_number(value) else None, violation, early))
    return out


def _num(value: float) -> str:
    return num(value)


def _is_number(value: Any) -> TypeGuard[float]:
    return isinstance(value, numbers.Real) and not isinstance(value, bool) and not math.isnan(float(value))
