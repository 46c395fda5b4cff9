"""Gates that move only when something asks them to (tuner.study.gates.gate_choice, through the
per-trial solve and the replayed settings' solve): on a batch whose objective is flat
over wide ranges of both gates, a gate keeps its value as found; when that value is not
among the best, the tie that cuts least; and when a constraint needs the gate, the
margin rule moves it and the solution says which constraint moved it, from what to what."""

from __future__ import annotations

import numpy as np
import pytest

from tuner.config.objective import Constraint as MetricBound
from tuner.data.dataset import Query, QuerySet
from tuner.evaluation.mapping import Hit, ParsedResponse
from tuner.evaluation.outcomes import QueryResponse
from tuner.evaluation.result import evaluate_responses
from tuner.study.gates.gate_arrays import HitArrays
from tuner.study.gates.gate_choice import choose_gates
from tuner.study.gates.threshold import CONFIDENCE_PARAM, MIN_SCORE_PARAM, GateRange, solve_arrays, solve_batch
from tuner.study.replay.replay_pool import ReplayContext

N_IN, N_OOS = 12, 6
#: in-scope confidences 0.55..0.9, OOS ones 0.2..0.4: any threshold in [0, 0.55] answers
#: every in-scope query, and only one above 0.4 hands every OOS query off
IN_CONF = np.linspace(0.55, 0.9, N_IN)
OOS_CONF = np.linspace(0.2, 0.4, N_OOS)


def wide_ties_batch():
    """Every in-scope query: its two relevant documents first (scores 0.9, 0.8), then
    irrelevant ones scoring 0.45 down to 0.30, so a min_score up to 0.45 costs the
    objective nothing but drops hits. OOS queries: the same shape, unlabelled."""
    queries, responses, qrels = [], [], {}
    for i in range(N_IN + N_OOS):
        oos = i >= N_IN
        qid = f"q{i:02d}"
        queries.append(Query(qid, f"text {i}", "short", "s", "oos" if oos else "in"))
        docs = [f"{qid}-rel0", f"{qid}-rel1", *(f"{qid}-junk{j}" for j in range(4))]
        scores = [0.9, 0.8, 0.45, 0.4, 0.35, 0.3]
        if not oos:
            qrels[qid] = {docs[0]: 3, docs[1]: 2, docs[2]: 0}
        conf = float(OOS_CONF[i - N_IN] if oos else IN_CONF[i])
        hits = tuple(Hit(d, s, d) for d, s in zip(docs, scores, strict=True))
        responses.append(QueryResponse(qid, f"r{i}", ParsedResponse(hits, round(conf, 4), False, "0")))
    return evaluate_responses(QuerySet("wide-ties", "h", tuple(queries)), qrels, responses, [])


def gates(t_found: float | None, m_found: float | None) -> list[GateRange]:
    return [GateRange(CONFIDENCE_PARAM, 0.0, 0.6, 0.01, found=t_found),
            GateRange(MIN_SCORE_PARAM, 0.0, 0.5, 0.01, found=m_found)]


OOS_BOUND = MetricBound.parse("OOS_FP_Rate <= 0.1")


def test_the_batch_has_wide_ties():
    sol = solve_batch(wide_ties_batch(), gates(None, None))
    table = sol.table
    best = table["Primary_Metric_Score"].max()
    tied = table[np.isclose(table["Primary_Metric_Score"], best, rtol=0, atol=1e-12)]
    assert set(np.round(tied[CONFIDENCE_PARAM], 2)) >= {0.0, 0.3, 0.55}
    assert set(np.round(tied[MIN_SCORE_PARAM], 2)) >= {0.0, 0.3, 0.45}


def test_without_constraints_a_gate_keeps_its_value_as_found():
    sol = solve_batch(wide_ties_batch(), gates(0.12, 0.05), constraints=[])
    assert sol.values == {CONFIDENCE_PARAM: 0.12, MIN_SCORE_PARAM: 0.05}
    assert sol.moved == ""
    # a value as found off the step grid is a candidate too, and kept
    sol = solve_batch(wide_ties_batch(), gates(0.123, 0.0375))
    assert sol.values == {CONFIDENCE_PARAM: 0.123, MIN_SCORE_PARAM: 0.0375}


def test_a_value_as_found_that_is_not_among_the_best_gives_way_to_the_tie_that_cuts_least():
    # 0.58 hands off the least confident in-scope query (0.55): not among the best, so the
    # confidence gate takes the tied value handing off fewest (0); the min_score stays as found
    sol = solve_batch(wide_ties_batch(), gates(0.58, 0.2))
    assert sol.values == {CONFIDENCE_PARAM: 0.0, MIN_SCORE_PARAM: 0.2}
    # none as found (or out of range): both at the least-cutting tie, not the plateau's middle
    for found in ((None, None), (0.95, 0.9)):
        sol = solve_batch(wide_ties_batch(), gates(*found))
        assert sol.values == {CONFIDENCE_PARAM: 0.0, MIN_SCORE_PARAM: 0.0}, found
        assert sol.moved == ""


def test_a_constraint_that_needs_the_gate_moves_it_and_says_so():
    constraint = OOS_BOUND  # what a trial passes too (the experiment's own)
    sol = solve_batch(wide_ties_batch(), gates(0.12, 0.05), constraints=[constraint])
    assert sol.feasible
    # only a threshold above the most confident OOS query (0.4) and at most the least
    # confident in-scope one (0.55) keeps the objective and meets the bound: the middle
    plateau = [round(t, 2) for t in np.arange(0.41, 0.555, 0.01)]
    assert sol.values[CONFIDENCE_PARAM] == plateau[len(plateau) // 2] == 0.48
    assert sol.values[MIN_SCORE_PARAM] == 0.05  # no constraint needs it: as found
    assert sol.moved == ("OOS_FP_Rate <= 0.1 moved confidence.threshold 0.12 -> 0.48 (+0.36): at the value as "
                         "found, OOS_FP_Rate = 1")


def test_a_constraint_the_value_as_found_meets_moves_nothing():
    sol = solve_batch(wide_ties_batch(), gates(0.45, 0.05), constraints=[OOS_BOUND])
    assert sol.values == {CONFIDENCE_PARAM: 0.45, MIN_SCORE_PARAM: 0.05}
    assert sol.moved == ""


@pytest.mark.parametrize(("found", "constraints"), [((0.12, 0.05), []), ((0.58, 0.2), []), ((None, None), []),
                                                    ((0.12, 0.05), [OOS_BOUND])])
def test_the_replayed_settings_solve_chooses_the_same(found, constraints):
    batch = wide_ties_batch()
    live = solve_batch(batch, gates(*found), constraints=constraints)
    arrays = HitArrays.from_batch(batch)
    replayed = solve_arrays(arrays, gates(*found), constraints=constraints, full=False)
    assert (replayed.values, replayed.moved, replayed.objective) == (live.values, live.moved, live.objective)
    # what a replay trial scores each fusion setting with (tuner.study.replay.replay_pool)
    named = dict(zip(("confidence", "cutoff"), gates(*found), strict=True))
    context = ReplayContext({}, arrays.query_ids, tuple(arrays.is_oos), batch.qrels, 6, "linear", named,
                            "Primary_Metric_Score", constraints)
    objective, violation, columns = context.solved(arrays)
    assert objective == live.objective and violation == live.violation
    assert (columns["solved.confidence"], columns["solved.cutoff"]) == (live.values[CONFIDENCE_PARAM],
                                                                        live.values[MIN_SCORE_PARAM])


def test_the_rule_on_plain_columns():
    # one gate, a flat objective over rows 0..4, a constraint broken below row 3
    objective = np.array([1.0, 1.0, 1.0, 1.0, 1.0, 0.5])
    values = {"g": np.array([0.0, 0.1, 0.2, 0.3, 0.4, 0.5])}
    free = np.zeros(6)
    assert choose_gates(objective, free, values, {"g": 0.2}).row == 2  # as found
    assert choose_gates(objective, free, values, {"g": 0.5}).row == 0  # not among the best: cuts least
    needed = choose_gates(objective, np.array([1, 1, 1, 0, 0, 0.0]), values, {"g": 0.2})
    assert (needed.row, needed.kept_row, needed.needed) == (4, 2, True)  # the middle of rows 3..4
    # every row infeasible: the least violating, still said to be needed
    worst = choose_gates(objective, np.array([3, 2, 1, 1, 1, 1.0]), values, {"g": 0.0})
    assert (worst.row, worst.needed) == (3, True)


def test_the_hits_a_row_shows_are_counted_query_by_query():
    from threshold.test_solve_vectorised import batch_of
    from tuner.study.gates.gate_arrays import hits_shown

    batch = batch_of(7)  # hostile: failed, empty, unscored-free, handed-off and OOS queries
    arrays = HitArrays.from_batch(batch)
    ts, ms = np.round(np.arange(0.0, 0.91, 0.05), 2), np.round(np.arange(0.0, 0.61, 0.1), 1)
    rows = np.arange(len(ts) * len(ms))[::-3]
    for handoff in (False, True):
        expected = []
        for r in rows:
            t, m = ts[r // len(ms)], ms[r % len(ms)]
            n = 0
            for q, qid in enumerate(arrays.query_ids):
                if arrays.failed[q] or arrays.conf[q] < t or (handoff and arrays.handoff[q]):
                    continue
                n += sum(h.score is None or h.score >= m - 1e-9 for h in batch.hits[qid])
            expected.append(n)
        assert hits_shown(arrays, ts, ms, handoff, rows).tolist() == expected


def test_the_closeness_test_is_numpys_isclose_with_no_relative_tolerance() -> None:
    """choose_gates compares with its own test (np.isclose's checks cost a trial's sweep
    table most of its time): the same answer on ties, near misses, NaN and infinities."""
    from tuner.study.gates.gate_choice import _close

    rng = np.random.default_rng(3)
    grid = np.round(rng.uniform(0, 1, 400), 3)
    values = np.concatenate([grid, grid + 1e-13, grid + 2e-9, [np.nan, np.inf, -np.inf, 0.0, -0.0]])
    for to in [*grid[:25], np.nan, np.inf, -np.inf, 0.0]:
        for atol in (1e-12, 1e-9):
            expected = np.isclose(values, to, rtol=0, atol=atol)
            assert np.array_equal(_close(values, to, atol), expected), (to, atol)
    assert _close(values, np.inf, 1e-9).sum() == 1 and not _close(values, np.nan, 1e-9).any()
