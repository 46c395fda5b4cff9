"""The vectorised gate solve and regate return exactly what the code they replaced
returned (reference_solve.py, reference_result.py: today's code kept verbatim): chosen
values, every column of the sweep table, every metric and per-query row of the
re-gated batch, to the last bit.

The batches are synthetic and hostile on purpose: ties, empty result lists, failed
queries in and out of scope, OOS queries, queries the backend handed off, missing
confidences and handoff fields, fewer hits than top_m, scores exactly at (and within
rounding of) the cut values, repeated documents, lists whose scores rise, unlabelled
documents and queries, both gain schemes."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pandas as pd
import pytest

from threshold import reference_result, reference_solve
from threshold.equality import assert_same_batch, assert_same_solution, reference_picks_by_todays_rule
from tuner.config.objective import Constraint as MetricBound
from tuner.data.dataset import Query, QuerySet
from tuner.errors import ConfigError
from tuner.evaluation.mapping import Hit, ParsedResponse
from tuner.evaluation.outcomes import FailedQuery, QueryResponse
from tuner.evaluation.regate import regate
from tuner.evaluation.result import evaluate_responses
from tuner.evaluation.summary import column_mean, column_means
from tuner.study.gates.gate_arrays import HitArrays
from tuner.study.gates.threshold import (
    CONFIDENCE_PARAM,
    MIN_SCORE_PARAM,
    GateRange,
    Retrieval,
    scorecard_at,
    solve,
    solve_batch,
    sweep,
)

CUTS = (0.0, 0.6, 0.1)  # the min_score grid: 0.0, 0.1, ..., 0.6


class MaxFP:
    """A constraint that is not a tuner.config.objective.Constraint: called per row."""

    def violation(self, metrics):
        return metrics["OOS_FP_Rate"] - 0.3


def hostile_batch(seed: int, *, n_in: int = 26, n_oos: int = 9, n_docs: int = 60, depth: int = 14,
                  gains: str = "linear", unscored: bool = False) -> tuple[Any, ...]:
    """(queries, qrels, responses, failed) of a batch with every awkward case in it."""
    rng = np.random.default_rng(seed)
    queries, responses, failed, qrels = [], [], [], {}
    grid = np.round(np.arange(0.0, 0.61, 0.1), 4)
    for i in range(n_in + n_oos):
        oos = i >= n_in
        qid = f"q{i:02d}"
        queries.append(Query(qid, f"text {i}", ["short", "long"][i % 2], "s", "oos" if oos else "in"))
        if not oos and i % 7 != 5:  # some in-scope queries have no labels at all
            labelled = rng.choice(n_docs, size=int(rng.integers(3, 25)), replace=False)
            qrels[qid] = {f"d{d}": int(rng.integers(0, 4)) for d in labelled}
        if oos and i % 4 == 0:  # labels of an OOS query must not matter
            qrels[qid] = {f"d{d}": 3 for d in range(5)}
        kind = rng.integers(0, 12)
        if kind == 0:
            failed.append(FailedQuery(qid, f"r{i}", "timeout", latency_ms=float(rng.uniform(5, 50))))
            continue
        n = 0 if kind == 1 else int(rng.integers(1, depth + 1))  # empty lists; fewer hits than top_m
        docs = [f"d{d}" for d in rng.choice(n_docs, size=n, replace=False)]
        if n > 3 and kind in (2, 10):
            docs[3] = docs[1]  # a repeated document
        scores = np.sort(rng.choice([*grid, *rng.uniform(0, 0.8, 8), *(grid - 5e-10), *(grid - 3e-9)], size=n))[::-1]
        if kind in (3, 10):
            scores = rng.permutation(scores)  # a list whose scores rise (kind 10: and repeats a document)
        if kind == 4 and n:
            scores = np.full(n, 0.3)  # all tied, exactly at a cut
        hit_scores: list[float | None] = [float(s) for s in scores]
        if unscored and kind == 5 and n:
            hit_scores[0] = None
        hits = tuple(Hit(doc, s, f"title {doc}") for doc, s in zip(docs, hit_scores))
        conf = float(np.round(rng.uniform(0.1, 0.9) if not oos else rng.uniform(0.0, 0.7), 2))
        if kind == 6:
            conf = None
        handoff = None if kind == 7 else bool(conf is not None and conf < 0.35 and kind % 2)
        responses.append(QueryResponse(
            qid, f"r{i}", ParsedResponse(hits, conf, handoff, ["0", "date_30d", None][i % 3],
                                         handoff_reason="confidence.threshold" if handoff else None,
                                         truncated=int(kind == 8)),
            latency_ms=float(rng.uniform(5, 80)), attempts=1 + int(kind == 9),
        ))
    return QuerySet(f"hostile-{seed}", "h", tuple(queries)), qrels, responses, failed, gains


def batch_of(seed: int, **kw: Any) -> Any:
    qs, qrels, responses, failed, gains = hostile_batch(seed, **kw)
    new = evaluate_responses(qs, qrels, responses, failed, gains=gains)
    old = reference_result.evaluate_responses(qs, qrels, responses, failed, gains=gains)
    assert_same_batch(old, new)  # the evaluation core scores the same through the hit table
    return new


def gate_sets() -> list[list[GateRange]]:
    return [
        [GateRange(CONFIDENCE_PARAM, 0.1, 0.8, 0.05), GateRange(MIN_SCORE_PARAM, *CUTS)],
        [GateRange("rag.cutoff", *CUTS, role="min_score"), GateRange("rag.min_confidence", 0.0, 0.9, 0.01,
                                                                     role="confidence")],
        [GateRange(CONFIDENCE_PARAM, 0.0, 0.9, 0.01)],
        [GateRange(MIN_SCORE_PARAM, 0.0, 0.6, 0.05)],
    ]


def constraint_sets() -> list[list[Any]]:
    bound = MetricBound.parse("OOS_FP_Rate <= 0.3")
    return [
        [],
        [bound],  # taken on whole columns
        [bound, MetricBound.parse("Answer_Recall >= 0.5")],  # two, as a trial passes them
        [MaxFP()],  # called per row
        [MetricBound.parse("OOS_FP_Rate <= -1")],  # infeasible everywhere
    ]


def check_solve(batch: Any, gates: list[GateRange], **kw: Any) -> Any:
    with reference_picks_by_todays_rule(HitArrays.from_batch(batch), gates):
        old = reference_solve.solve_batch(batch, gates, **kw)
    new = solve_batch(batch, gates, **kw)
    assert_same_solution(old, new)
    return new


def check_regate(batch: Any, **kw: Any) -> None:
    assert_same_batch(reference_solve.regate(batch, **kw), regate(batch, **kw))


@pytest.mark.parametrize("seed", range(8))
@pytest.mark.parametrize("gates", range(4))
def test_solve_batch_and_regate_equal_the_reference(seed: int, gates: int) -> None:
    batch = batch_of(seed, gains="exp" if seed % 3 == 2 else "linear")
    for i, constraints in enumerate(constraint_sets()):
        if (seed + i) % 2 and i:  # every constraint kind on half the seeds: keeps the test quick
            continue
        sol = check_solve(batch, gate_sets()[gates], constraints=constraints)
        conf = next((g for g in gate_sets()[gates] if g.role == "confidence"), None)
        check_regate(batch, confidence_threshold=sol.by_role.get("confidence"),
                     min_score=sol.by_role.get("min_score"),
                     sweep_range=None if conf is None else (conf.low, conf.high, conf.step or 0.01))


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("objective", ["NDCG@10", "NDCG", "Recall@50", "Judged@10", "ERR@20"])
def test_other_objectives_and_top_m(seed: int, objective: str) -> None:
    batch = batch_of(seed + 20)
    check_solve(batch, gate_sets()[0], objective=objective, top_m=3)
    check_solve(batch, gate_sets()[3], objective=objective, top_m=20)


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize(("t", "m"), [(None, None), (0.4, None), (None, 0.3), (0.35, 0.2), (0.9, 0.6),
                                      (0.0, 0.0), (0.5, 0.1 - 5e-10), (-math.inf, 0.6)])
def test_regate_at_any_values_equals_the_reference(seed: int, t: float | None, m: float | None) -> None:
    batch = batch_of(seed + 30)
    check_regate(batch, confidence_threshold=t, min_score=m)
    check_regate(batch, confidence_threshold=t, min_score=m, sweep_range=(0.0, 0.9, 0.05))
    # a re-gated batch re-gates like any batch
    once = regate(batch, confidence_threshold=t, min_score=m)
    check_regate(once, confidence_threshold=0.6, min_score=0.4)


def test_per_query_rows_in_another_order() -> None:
    batch = batch_of(41)
    batch.per_query = batch.per_query.iloc[::-1]
    check_solve(batch, gate_sets()[0], constraints=constraint_sets()[1])
    check_regate(batch, confidence_threshold=0.4, min_score=0.2)


def test_a_batch_without_its_hit_table_is_graded_again() -> None:
    batch = batch_of(40)
    bare = evaluate_responses(*hostile_batch(40)[:4])
    bare.hit_table = None
    assert_same_solution(solve_batch(batch, gate_sets()[0]), solve_batch(bare, gate_sets()[0]))
    assert_same_batch(regate(batch, confidence_threshold=0.4, min_score=0.2),
                      regate(bare, confidence_threshold=0.4, min_score=0.2))


@pytest.mark.parametrize("seed", range(3))
def test_the_public_retrieval_api_equals_the_reference(seed: int) -> None:
    batch = batch_of(seed + 50)
    old_r = reference_solve.retrieval_from_batch(batch, retrieved_min_score=0.0, top_m=4)
    new_r = Retrieval.from_batch(batch, retrieved_min_score=0.0, top_m=4)
    assert new_r == old_r
    for gates in gate_sets():
        with reference_picks_by_todays_rule(HitArrays.from_retrieval(old_r), gates):
            old = reference_solve.solve(old_r, gates, constraints=[MaxFP()])
        assert_same_solution(old, solve(new_r, gates, constraints=[MaxFP()]))
    ts, ms = np.array([0.0, 0.35, 0.5]), np.array([0.3, 0.0, 0.1])  # min_scores in no order: counted hit by hit
    for handoff in (False, True):
        pd.testing.assert_frame_equal(
            reference_solve.sweep(old_r, ts, ms, objective="NDCG@20", backend_handoff=handoff),
            sweep(new_r, ts, ms, objective="NDCG@20", backend_handoff=handoff), check_exact=True)
        assert reference_solve.scorecard_at(old_r, 0.4, 0.2, backend_handoff=handoff) == \
            scorecard_at(new_r, 0.4, 0.2, backend_handoff=handoff)


def test_unscored_hits_are_refused_by_a_score_gate_and_kept_by_a_confidence_gate() -> None:
    batch = batch_of(60, unscored=True)
    for solver in (reference_solve.solve_batch, solve_batch):
        with pytest.raises(ConfigError, match="has hits without a score") as exc:
            solver(batch, gate_sets()[0])
        assert "query q" in str(exc.value)
    check_solve(batch, gate_sets()[2], constraints=constraint_sets()[1])
    check_regate(batch, confidence_threshold=0.5, min_score=0.3)  # an unscored hit is kept


def test_the_pick_rule_on_a_table_is_the_solutions_row() -> None:
    from tuner.study.gates.threshold import _pick

    sol = solve_batch(batch_of(62), gate_sets()[0], constraints=constraint_sets()[1])
    row = sol.table.loc[_pick(sol.table, "Primary_Metric_Score")]
    assert {k: row[k] for k in sol.values} == sol.values


def test_an_empty_batch_is_refused_as_before() -> None:
    from tuner.errors import EvaluationError

    empty = Retrieval((), {})
    for solver in (reference_solve.solve, solve):
        with pytest.raises(EvaluationError, match="empty batch"):
            solver(empty, gate_sets()[0])


def test_a_constraint_on_an_unknown_metric_fails_as_before() -> None:
    batch = batch_of(61)
    bad = MetricBound.parse("No_Such_Metric <= 0.1")
    messages = []
    for solver in (reference_solve.solve_batch, solve_batch):
        with pytest.raises(ConfigError) as exc:
            solver(batch, gate_sets()[0], constraints=[bad])
        messages.append(str(exc.value))
    assert messages[0] == messages[1]


def test_batches_without_in_scope_or_oos_queries() -> None:
    qs, qrels, responses, failed, _ = hostile_batch(70, n_in=0, n_oos=12)
    only_oos = evaluate_responses(qs, qrels, responses, failed)
    qs, qrels, responses, failed, _ = hostile_batch(71, n_in=12, n_oos=0)
    only_in = evaluate_responses(qs, qrels, responses, failed)
    for batch in (only_oos, only_in):
        for gates in gate_sets():
            sol = check_solve(batch, gates, constraints=constraint_sets()[2] if batch is only_in else [])
            check_regate(batch, confidence_threshold=sol.by_role.get("confidence"),
                         min_score=sol.by_role.get("min_score"))


def test_column_means_are_the_frame_means() -> None:
    rng = np.random.default_rng(0)
    for n in (0, 1, 7, 8, 9, 127, 128, 129, 174, 1000, 20000):
        values = rng.random((5, n)) * 10.0 ** rng.integers(-3, 3, (5, 1))
        if n > 3:
            values[1, ::3] = np.nan
            values[4] = np.nan
        frame = pd.DataFrame(values.T, columns=list("abcde"))
        expected = frame.mean()
        got = column_means({c: values[i] for i, c in enumerate("abcde")})
        for c in "abcde":
            assert _same_nan(got[c], float(expected[c])), (n, c)
            assert _same_nan(column_mean(values["abcde".index(c)]), float(frame[c].mean())), (n, c)


def _same_nan(a: Any, b: Any) -> bool:
    return a == b or (isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b))


@pytest.mark.parametrize(("depth", "ideal_depth"), [(None, None), (5, 5), (50, 50), (3, None)])
def test_hit_table_rankings_are_prepares(depth: int | None, ideal_depth: int | None) -> None:
    from tuner import metrics as scorecard
    from tuner.evaluation.hits import HitTable

    rng = np.random.default_rng(1)
    ids = [f"q{i}" for i in range(30)]
    lists = [[f"d{d}" for d in rng.integers(0, 40, int(rng.integers(0, 12)))] for _ in ids]  # repeats too
    qrels = {q: {f"d{d}": int(rng.integers(0, 4)) for d in rng.choice(40, 10, replace=False)} for q in ids[::2]}
    table = HitTable.build(ids, [[(d, 1.0) for d in docs] for docs in lists], qrels, np.ones(len(ids), dtype=bool),
                           doc_of=lambda h: h[0], score_of=lambda h: h[1])
    lengths = np.array([int(rng.integers(0, len(docs) + 1)) for docs in lists])  # the first n of each list
    rows = np.arange(len(ids))
    got = table.batch(ids, rows, lengths, gains="exp", depth=depth, ideal_depth=ideal_depth)
    want = scorecard.prepare({q: docs[:n] for q, docs, n in zip(ids, lists, lengths.tolist(), strict=True)}, qrels,
                             ids, gains="exp", depth=depth, ideal_depth=ideal_depth)
    for name in ("grades", "judged", "lengths", "ideal_grades", "grade_counts"):
        a, b = getattr(want, name), getattr(got, name)
        assert a.dtype == b.dtype and a.shape == b.shape and (a == b).all(), name
    assert (got.query_ids, got.gains, got.depth_limit, got.ideal_depth_limit) == \
        (want.query_ids, want.gains, want.depth_limit, want.ideal_depth_limit)
