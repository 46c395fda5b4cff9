"""Numbers as a person reads them, the one format of every note, card, table and plot
label the tuner writes for people (the JSON, CSV and MLflow records keep full precision).

- `num`: a measured value (a score, a metric, a rate) with 4 digits that count: 4
  decimals below 1, so a column reads alike (``0.0938`` next to ``0.0625``, ``0.3000``,
  never ``0.30000000000000004``; ``0.8534``, not ``0.853448275862069``), 4 significant
  digits from 1 up (``1.067``, ``12.50``), none from 1,000 up; below 0.00005, where 4
  decimals read 0, in scientific notation; ``n/a`` for a missing value.
- `delta`: a change, always signed: ``+0.1076``, ``-0.0030``.
- `value`: a config value (a param, a solved gate, a bound) to 4 significant digits
  without trailing zeros (``0.38``, ``0.5419``), an integer as it is, a list as ``[30, 90]``.
- `rounded`: `num` as a float, for a UI that prints numbers verbatim (optuna-dashboard's cards).
- `worse`: which way a constrained metric gets worse, as a person says it.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

SIGNIFICANT = 4


def _real(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def num(v: Any) -> str:
    """A measured value (module docstring)."""
    if not _real(v) or math.isnan(float(v)):
        return "n/a"
    if isinstance(v, int):
        return str(v)
    f = float(v)
    size = abs(f)
    if math.isinf(f):
        return "inf" if f > 0 else "-inf"
    if size >= 1000:
        return f"{f:.0f}"
    if size >= 1:
        return f"{f:#.{SIGNIFICANT}g}".rstrip(".")
    if size == 0 or size >= 5e-5:
        return f"{f:.{SIGNIFICANT}f}"
    return f"{f:.{SIGNIFICANT - 1}e}"


def delta(v: Any) -> str:
    """A change, always signed (``+0.0000`` for none)."""
    if not _real(v) or math.isnan(float(v)):
        return "n/a"
    return ("-" if float(v) < 0 else "+") + num(abs(v))


def value(v: Any) -> str:
    """A config value (module docstring)."""
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(value(x) for x in v) + "]"
    if isinstance(v, Mapping):
        return "{" + ", ".join(f"{k}: {value(x)}" for k, x in v.items()) + "}"
    if isinstance(v, float):
        return f"{v:.{SIGNIFICANT}g}" if math.isfinite(v) else str(v)
    return str(v)


def rounded(v: float) -> float:
    """`num` of ``v`` as a float (NaN and infinities as they are)."""
    return v if not math.isfinite(v) else float(num(float(v)))


def worse(op: str) -> str:
    """``higher is worse`` for a ``<=`` constraint, ``lower is worse`` for ``>=``."""
    return "higher is worse" if op == "<=" else "lower is worse"
