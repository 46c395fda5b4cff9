"""A trial's solve grid, slimmed for its threshold_sweep.csv (pure).

tuner.study.gates.threshold.solve scores every pair of gate values (``ThresholdSolution.table``:
on the demo 91 confidence thresholds x 51 min_scores = 4,641 rows, about 600 KB a
trial). ``slim_sweep`` keeps the rows that say why the solution won:

- for each value of the first gate, its best row (the profile over that gate), picked
  by the solver's own rule (tuner.study.gates.gate_choice: the other gate as found or cutting
  least, unless a constraint needs it);
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

from tuner.study.gates.gate_choice import choose_gates

#: significant digits kept of every float (gate values are grid values: exact)
SIGNIFICANT_DIGITS = 10
_ATOL = 1e-9  # gate values are rounded grid values; the solver compares scores to 1e-9 as well
CHOSEN = "chosen"


def slim_sweep(
    table: pd.DataFrame,
    chosen: Mapping[str, float],
    names: Sequence[str],
    *,
    objective: str | None = None,
    found: Mapping[str, float | None] | None = None,
) -> pd.DataFrame:
    """The rows of ``table`` (tuner.study.gates.threshold.ThresholdSolution.table) described in
    the module doc, in grid order, plus ``chosen``. ``chosen``: the solved values by
    gate key (``ThresholdSolution.values``); ``names``: the gate keys, the first one
    profiled; ``objective``: the objective column (default: the one after the gates,
    where tuner.study.gates.threshold.sweep puts it); ``found``: the gates' values as found
    (``GateRange.found``), which the profile keeps where the solver would."""
    gates = list(names)
    if not gates or (absent := [n for n in gates if n not in table.columns or n not in chosen]):
        missing = absent if gates else ["(none given)"]
        raise ValueError(
            f"slim_sweep: gate columns {missing} are not in the table or the chosen values; "
            "pass ThresholdSolution.values and the keys of the gates that were solved"
        )
    objective = objective or next(c for c in table.columns if c not in gates)
    frame = table.reset_index(drop=True)
    at = {n: np.isclose(frame[n].to_numpy(dtype=float), float(chosen[n]), rtol=0, atol=_ATOL) for n in gates}
    is_chosen = np.logical_and.reduce(list(at.values()))
    if len(gates) == 1:
        keep = frame.index.to_numpy()
    else:
        violation = frame["violation"].to_numpy(dtype=float) if "violation" in frame else np.zeros(len(frame))
        others = {n: frame[n].to_numpy(dtype=float) for n in gates[1:]}
        best = _best_rows(
            frame[gates[0]].to_numpy(), frame[objective].to_numpy(dtype=float), violation, others, dict(found or {})
        )
        keep = np.union1d(np.asarray(best, dtype=np.int64), np.flatnonzero(at[gates[0]] | is_chosen))
    out = frame.loc[keep].copy()
    out[CHOSEN] = is_chosen[keep]
    for column in out.columns:
        if column != CHOSEN and pd.api.types.is_float_dtype(out[column]):
            out[column] = _significant(out[column], SIGNIFICANT_DIGITS)
    return out.reset_index(drop=True)


def _best_rows(
    first: np.ndarray,
    objective: np.ndarray,
    violation: np.ndarray,
    others: Mapping[str, np.ndarray],
    found: Mapping[str, float | None],
) -> list[int]:
    """Per value of the first gate (in sorted order), the row the solver would pick among
    its rows: tuner.study.gates.gate_choice.choose_gates on them, the other gates' columns
    (``others``) and values as found. NumPy per group: the pandas version cost ~0.2 s a
    trial on the demo's 4,641-row grid."""
    order = np.argsort(first, kind="stable")  # row order kept within a value
    _, starts = np.unique(first[order], return_index=True)
    picked = []
    for rows in np.split(order, starts[1:]):
        choice = choose_gates(objective[rows], violation[rows], {n: v[rows] for n, v in others.items()}, found)
        picked.append(int(rows[choice.row]))
    return picked


def _significant(values: pd.Series, digits: int) -> pd.Series:
    """Each value rounded to ``digits`` significant digits, so it prints short (NaN kept)."""
    return values.map(lambda v: v if not np.isfinite(v) else float(f"{v:.{digits}g}"))
