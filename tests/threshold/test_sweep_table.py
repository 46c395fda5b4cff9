"""slim_sweep on a real solve: the profile over the first gate (its best row per value,
by the solver's own rule), the cross through the solution, and the chosen row."""

from __future__ import annotations

import numpy as np
import pytest

from threshold.test_threshold import MaxFP, synthetic_batch
from tuner.evaluation.result import evaluate_responses
from tuner.study.gates.sweep_table import CHOSEN, slim_sweep
from tuner.study.gates.threshold import CONFIDENCE_PARAM, MIN_SCORE_PARAM, GateRange, Retrieval, solve

GATES = [GateRange(CONFIDENCE_PARAM, 0.0, 0.9, 0.01), GateRange(MIN_SCORE_PARAM, 0.0, 0.5, 0.01)]
NAMES = [g.param for g in GATES]


def solved(seed: int, gates=GATES, bound: float = 0.3):
    qs, qrels, responses, failed = synthetic_batch(seed)
    retrieval = Retrieval.from_batch(evaluate_responses(qs, qrels, responses, failed))
    return retrieval, solve(retrieval, gates, constraints=[MaxFP(bound)])


@pytest.mark.parametrize(("seed", "bound"), [(0, 0.3), (1, 0.3), (2, -1.0)])  # -1: infeasible everywhere
def test_slim_keeps_the_profile_the_cross_and_marks_the_solution(seed: int, bound: float) -> None:
    retrieval, sol = solved(seed, bound=bound)
    full = sol.table
    assert len(full) == 91 * 51
    slim = slim_sweep(full, sol.values, NAMES)
    t_chosen, m_chosen = sol.values[CONFIDENCE_PARAM], sol.values[MIN_SCORE_PARAM]
    # far fewer rows: one per threshold plus the cross at the chosen threshold
    at_t = slim[np.isclose(slim[CONFIDENCE_PARAM], t_chosen)]
    assert len(at_t) == 51 and sorted(at_t[MIN_SCORE_PARAM]) == pytest.approx(sorted(full[MIN_SCORE_PARAM].unique()))
    assert sorted(slim[CONFIDENCE_PARAM].unique()) == pytest.approx(sorted(full[CONFIDENCE_PARAM].unique()))
    assert len(slim) <= 91 + 51
    assert list(slim.columns) == [*full.columns, CHOSEN]
    # the chosen row: exactly one, the solution, with its objective and violation
    row = slim[slim[CHOSEN]]
    assert len(row) == 1
    assert (row[CONFIDENCE_PARAM].iloc[0], row[MIN_SCORE_PARAM].iloc[0]) == (t_chosen, m_chosen)
    assert row["Primary_Metric_Score"].iloc[0] == pytest.approx(sol.objective, rel=1e-9)
    assert row["violation"].iloc[0] == pytest.approx(sol.violation, rel=1e-9, abs=1e-12)
    # each threshold's best row is the row the solver picks when that threshold is the only candidate
    for t in sorted(full[CONFIDENCE_PARAM].unique()):  # every one of the 91
        alone = solve(retrieval, [GateRange(CONFIDENCE_PARAM, t, t), GATES[1]], constraints=[MaxFP(bound)])
        rows = slim[np.isclose(slim[CONFIDENCE_PARAM], t)]
        kept = rows[np.isclose(rows[MIN_SCORE_PARAM], alone.values[MIN_SCORE_PARAM])]
        assert len(kept) == 1, t
        assert kept["Primary_Metric_Score"].iloc[0] == pytest.approx(alone.objective, rel=1e-9), t
    # the slim file is a small part of the full one
    assert len(slim.to_csv(index=False)) < len(full.to_csv(index=False)) / 15


def test_one_gate_keeps_every_row() -> None:
    _, sol = solved(3, gates=[GATES[0]])
    slim = slim_sweep(sol.table, sol.values, [CONFIDENCE_PARAM])
    assert len(slim) == len(sol.table) == 91 and slim[CHOSEN].sum() == 1
    assert slim.loc[slim[CHOSEN], CONFIDENCE_PARAM].iloc[0] == sol.values[CONFIDENCE_PARAM]


def test_floats_are_rounded_and_gates_stay_exact() -> None:
    _, sol = solved(4)
    slim = slim_sweep(sol.table, sol.values, NAMES)
    text = slim.to_csv(index=False)
    longest = max(len(cell) for line in text.splitlines()[1:] for cell in line.split(","))
    assert longest <= len("-0.1234567891e-05")
    assert set(slim[CONFIDENCE_PARAM]) <= set(np.round(np.arange(0, 0.905, 0.01), 2))


def test_unknown_gate_names_are_an_error() -> None:
    _, sol = solved(5)
    with pytest.raises(ValueError, match="pass ThresholdSolution.values"):
        slim_sweep(sol.table, sol.values, ["rag.min_confidence"])
    with pytest.raises(ValueError, match="not in the table"):
        slim_sweep(sol.table, {}, NAMES)
