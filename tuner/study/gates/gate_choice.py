"""Which row of a gate solve's grid becomes the trial's gates (pure numpy): the one rule
the per-trial solve, the replayed fusion settings (both through tuner.study.gates.threshold)
and the slimmed sweep table (tuner.study.gates.sweep_table) choose by.

A gate filters what one retrieval returned, and over a range of its values the
objective is often flat: the grid then has a *tied* set of best rows. Picking inside
that set is not free: a higher confidence threshold hands off more queries, a higher
min_score drops more hits, and next year's queries may cross a breakpoint this batch
never reached. So a gate moves only when something asks it to:

1. The *kept* row: among the rows tied at the best objective (constraints ignored), the
   one with every gate at its value as found in the config (``found``, the study's
   baseline); failing that, with as many gates as found as possible, and of those the
   one that cuts least (the most hits shown: the fewest handed off or dropped; then the
   lowest values, gate by gate).
2. When the kept row meets the constraints, it is the choice: a gate that does not
   change the objective and that no constraint needs keeps its value.
3. Otherwise a constraint *needs* a gate. Among the feasible rows tied at their best
   objective (else the least violating, as before), each gate that can stay at its kept
   value does; the gates that must move take the middle of what is left (the margin
   rule: away from the breakpoint the constraint sits on). ``GateChoice.kept_row``
   says where they would have been, so the trial can say which constraint moved
   which gate, and by how much.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import numpy as np

_ATOL = 1e-12  # objective ties, as the solver has always compared them
_VALUE_ATOL = 1e-9  # gate values are rounded grid values


@dataclass(frozen=True)
class GateChoice:
    """The chosen row, the row the rule keeps without constraints, and whether a
    constraint moved the choice away from it (``needed``)."""

    row: int
    kept_row: int
    needed: bool


def choose_gates(
    objective: np.ndarray,
    violation: np.ndarray,
    values: Mapping[str, np.ndarray],
    found: Mapping[str, float | None],
    *,
    shown: Callable[[np.ndarray], np.ndarray] | None = None,
) -> GateChoice:
    """The row of a solve grid to take (module doc). ``objective`` and ``violation`` (<= 0
    feasible) per row, higher objective better, NaN skipped; ``values``: each gate's value
    per row, in gate order; ``found``: each gate's value as found (None or absent: none);
    ``shown(rows)``: the hits each of ``rows`` shows (more shows, less cuts), asked only
    to break a tie the gates' values cannot."""
    objective = np.asarray(objective, dtype=float)
    violation = np.asarray(violation, dtype=float)
    columns = {name: np.asarray(v, dtype=float) for name, v in values.items()}
    everywhere = np.ones(objective.size, dtype=bool)
    kept = _kept(_tied(objective, everywhere), columns, found, shown)
    if violation[kept] <= 0:
        return GateChoice(kept, kept, False)
    feasible = violation <= 0
    pool = feasible if feasible.any() else violation == _skipna(np.min, violation)
    tied = _tied(objective, pool)
    tied = tied[violation[tied] == _skipna(np.min, violation[tied])]
    if not tied.size:  # no objective anywhere: nothing to move for
        return GateChoice(kept, kept, False)
    for v in columns.values():  # a gate no constraint needs stays where it was kept
        stays = tied[_close(v[tied], v[kept], _VALUE_ATOL)]
        if stays.size:
            tied = stays
    return GateChoice(int(tied[len(tied) // 2]), kept, True)


def _tied(objective: np.ndarray, pool: np.ndarray) -> np.ndarray:
    """The rows of ``pool`` at its best objective, in row order."""
    best = _skipna(np.max, objective[pool])
    return np.flatnonzero(pool & _close(objective, best, _ATOL))


def _kept(
    tied: np.ndarray,
    columns: Mapping[str, np.ndarray],
    found: Mapping[str, float | None],
    shown: Callable[[np.ndarray], np.ndarray] | None,
) -> int:
    """Of the ``tied`` rows: the most gates at their value as found, then the least cut."""
    if not tied.size:  # no objective anywhere (every row NaN): the first row, as found or not
        return 0
    matches = np.zeros(tied.size, dtype=np.int64)
    for name, v in columns.items():
        at = found.get(name)
        if at is not None and math.isfinite(at):
            matches += _close(v[tied], at, _VALUE_ATOL)
    rows = tied[matches == matches.max()]
    if rows.size > 1 and shown is not None:
        hits = np.asarray(shown(rows))
        rows = rows[hits == hits.max()]
    # the lowest values, gate by gate: each gate is monotone (a higher value never cuts less)
    order = np.lexsort([columns[name][rows] for name in reversed(list(columns))]) if columns else [0]
    return int(rows[order[0]])


def _close(values: np.ndarray, to: float, atol: float) -> np.ndarray:
    """``np.isclose(values, to, rtol=0, atol=atol)`` (NaN never close, equal infinities
    close), without its checks and broadcasting: it runs a few times for each of a solve
    grid's groups, and np.isclose was most of a trial's sweep table (~15 ms a trial)."""
    with np.errstate(invalid="ignore"):  # inf - inf
        return (np.abs(values - to) <= atol) | (values == to)


def _skipna(reduce: Callable[..., float], values: np.ndarray) -> float:
    values = values[~np.isnan(values)]
    return float(reduce(values)) if values.size else math.nan
