"""regate: a batch retrieved at the gates' low end, re-scored at other gate values,
equals what the threshold solver reports for those values, and is the identity at
the values the batch was retrieved with."""

from __future__ import annotations

import pandas as pd
import pytest
from threshold.test_threshold import synthetic_batch

from tuner.evaluation.mapping import Hit, ParsedResponse
from tuner.evaluation.outcomes import QueryResponse
from tuner.evaluation.regate import regate
from tuner.evaluation.result import evaluate_responses
from tuner.study.gates.threshold import CONFIDENCE_PARAM, MIN_SCORE_PARAM, GateRange, solve_batch

LOW_T, LOW_M = 0.2, 0.0


def retrieved_at_low_end(seed: int):
    """The synthetic batch as a backend with the gates at their low end returns it:
    handed off exactly when confidence < LOW_T (every score is >= LOW_M)."""
    qs, qrels, responses, failed = synthetic_batch(seed)
    low = [QueryResponse(r.query_id, r.request_id,
                         ParsedResponse(r.response.hits, r.response.confidence, r.response.confidence < LOW_T, "0"),
                         latency_ms=10.0 + i, attempts=1)
           for i, r in enumerate(responses)]
    return evaluate_responses(qs, qrels, low, failed)


@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize(("t", "m"), [(0.2, 0.0), (0.45, 0.3), (0.7, 0.6), (0.3, 0.95)])
def test_regate_metrics_equal_the_solved_metrics(seed: int, t: float, m: float) -> None:
    batch = retrieved_at_low_end(seed)
    # a one-point range makes the solver report exactly (t, m)
    sol = solve_batch(batch, [GateRange(CONFIDENCE_PARAM, t, t), GateRange(MIN_SCORE_PARAM, m, m)])
    assert sol.values == {CONFIDENCE_PARAM: t, MIN_SCORE_PARAM: m}
    gated = regate(batch, confidence_threshold=t, min_score=m)
    solved = {k: v for k, v in sol.metrics.items() if not k.startswith("n_")}
    assert "OOS_FP_Rate" in solved and "NDCG@20" in solved
    for name, value in solved.items():
        assert gated.metrics[name] == pytest.approx(value, abs=1e-12), name
    # the per-query rows say the same: shown results are those scoring >= m
    for q in batch.queries:
        kept = [h for h in batch.hits[q.query_id] if h.score >= m]
        assert gated.hits[q.query_id] == tuple(kept)
        assert gated.per_query.loc[q.query_id, "n_results"] == len(kept)


def test_regate_at_the_retrieved_values_is_the_identity() -> None:
    batch = retrieved_at_low_end(2)
    same = regate(batch, confidence_threshold=LOW_T, min_score=LOW_M)
    assert same.metrics == pytest.approx(batch.metrics, abs=1e-12, nan_ok=True)
    pd.testing.assert_frame_equal(same.per_query, batch.per_query)
    assert same.unjudged == batch.unjudged and same.failed == batch.failed
    untouched = regate(batch, confidence_threshold=None, min_score=None)
    pd.testing.assert_frame_equal(untouched.per_query, batch.per_query)


def test_unscored_hits_survive_the_score_filter_and_an_emptied_list_is_handed_off() -> None:
    qs, qrels, responses, failed = synthetic_batch(3)
    first = responses[0]
    hits = (Hit("x1", None, "t"), Hit("x2", 0.1, "t"))
    responses[0] = QueryResponse(first.query_id, first.request_id, ParsedResponse(hits, 0.9, False, "0"))
    second = responses[1]
    low = (Hit("y1", 0.1, "t"),)
    responses[1] = QueryResponse(second.query_id, second.request_id, ParsedResponse(low, 0.9, False, "0"))
    batch = evaluate_responses(qs, qrels, responses, failed)
    gated = regate(batch, confidence_threshold=None, min_score=0.5)
    assert [h.doc_id for h in gated.hits[first.query_id]] == ["x1"]
    assert gated.per_query.loc[first.query_id, "handoff"] is False
    assert gated.per_query.loc[second.query_id, "handoff"] is True
    assert gated.per_query.loc[second.query_id, "n_results"] == 0
    assert not gated.per_query.loc[second.query_id, "answered"]


@pytest.mark.parametrize("m", [0.0, 0.3, 0.7])
def test_regate_with_only_min_score_equals_the_solver_and_keeps_the_backends_handoffs(m: float) -> None:
    qs, qrels, responses, failed = synthetic_batch(4)  # the backend hands off below confidence 0.6
    batch = evaluate_responses(qs, qrels, responses, failed)
    sol = solve_batch(batch, [GateRange(MIN_SCORE_PARAM, m, m)])
    gated = regate(batch, confidence_threshold=None, min_score=m)
    for name, value in sol.metrics.items():
        if not name.startswith("n_"):
            assert gated.metrics[name] == pytest.approx(value, abs=1e-12), name
    handed_off = {r.query_id for r in responses if r.response.confidence < 0.6}
    assert not gated.per_query.loc[sorted(handed_off), "answered"].any()


@pytest.mark.parametrize(("t", "m"), [(0.45, 0.3), (0.7, 0.6)])
def test_regate_by_role_equals_the_solver_on_renamed_keys(t: float, m: float) -> None:
    # Another backend's keys for the same gates: the solver reports by role, regate takes roles.
    batch = retrieved_at_low_end(1)
    gates = [GateRange("rag.min_confidence", t, t, role="confidence"), GateRange("rag.cutoff", m, m, role="min_score")]
    sol = solve_batch(batch, gates)
    assert sol.values == {"rag.min_confidence": t, "rag.cutoff": m}
    assert sol.by_role == {"confidence": t, "min_score": m}
    gated = regate(batch, confidence_threshold=sol.by_role["confidence"], min_score=sol.by_role["min_score"])
    for name, value in sol.metrics.items():
        if not name.startswith("n_"):
            assert gated.metrics[name] == pytest.approx(value, abs=1e-12), name
