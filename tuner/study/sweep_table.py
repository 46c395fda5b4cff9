"""A trial's solve grid, slimmed for its threshold_sweep.csv (pure).

tuner.study.threshold.solve scores every pair of gate values (``ThresholdSolution.table``:
on the demo 91 confidence thresholds x 51 min_scores = 4,641 rows, about 600 KB a
trial). ``slim_sweep`` keeps the rows that say why the solution won:

- for each value of the first gate, its best row (the profile over that gate), picked
  by the solver's own rule (feasible first, else the least violation; best objective;
  lowest violation; the middle of a tied plateau);
- every row at the chosen value of the first gate (the cross through the solution);
- a ``chosen`` column, True on the solution's row.

With a single gate every row is kept (one row per grid value). Every float keeps
SIGNIFICANT_DIGITS (10, as the slim per-query CSV): the file stays small, and a value
read back matches the trial's to 1e-10 (0.43072374433968735 -> 0.4307237443).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import pandas as pd

#: significant digits kept of every float (gate values are grid values: exact)
SIGNIFICANT_DIGITS = 10
_ATOL = 1e-9  # gate values are rounded grid values; the solver compares scores to 1e-9 as well
CHOSEN = "chosen"


def slim_sweep(
    table: pd.DataFrame, chosen: Mapping[str, float], names: Sequence[str], *, objective: str | None = None,
) -> pd.DataFrame:
    """The rows of ``table`` (tuner.study.threshold.ThresholdSolution.table) described in
    the module doc, in grid order, plus ``chosen``. ``chosen``: the solved values by
    gate key (``ThresholdSolution.values``); ``names``: the gate keys, the first one
    profiled; ``objective``: the objective column (default: the one after the gates,
    where tuner.study.threshold.sweep puts it)."""
    gates = list(names)
    if not gates or (absent := [n for n in gates if n not in table.columns or n not in chosen]):
        missing = absent if gates else ["(none given)"]
        raise ValueError(f"slim_sweep: gate columns {missing} are not in the table or the chosen values; "
                         "pass ThresholdSolution.values and the keys of the gates that were solved")
    objective = objective or next(c for c in table.columns if c not in gates)
    frame = table.reset_index(drop=True)
    at = {n: np.isclose(frame[n].to_numpy(dtype=float), float(chosen[n]), rtol=0, atol=_ATOL) for n in gates}
    is_chosen = np.logical_and.reduce(list(at.values()))
    if len(gates) == 1:
        keep = frame.index.to_numpy()
    else:
        best = [_best(part, objective) for _, part in frame.groupby(gates[0], sort=True)]
        keep = np.union1d(np.asarray(best, dtype=np.int64), np.flatnonzero(at[gates[0]] | is_chosen))
    out = frame.loc[keep].copy()
    out[CHOSEN] = is_chosen[keep]
    for column in out.columns:
        if column != CHOSEN and pd.api.types.is_float_dtype(out[column]):
            out[column] = _significant(out[column], SIGNIFICANT_DIGITS)
    return out.reset_index(drop=True)


def _best(part: pd.DataFrame, objective: str) -> int:
    """The row the solver would pick in ``part``: the rule of tuner.study.threshold._pick
    (kept in step with it; tests/threshold/test_sweep_table.py checks the chosen row)."""
    violation = part["violation"] if "violation" in part else pd.Series(0.0, index=part.index)
    feasible = violation <= 0
    pool = part[feasible] if feasible.any() else part[violation == violation.min()]
    top = pool[objective].max()
    tied = pool[np.isclose(pool[objective], top, rtol=0, atol=1e-12)]
    tied_violation = violation.loc[tied.index]
    tied = tied[tied_violation == tied_violation.min()]
    return int(tied.index[len(tied) // 2])


def _significant(values: pd.Series, digits: int) -> pd.Series:
    """Each value rounded to ``digits`` significant digits, so it prints short (NaN kept)."""
    return values.map(lambda v: v if not np.isfinite(v) else float(f"{v:.{digits}g}"))
