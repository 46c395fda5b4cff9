import math

import numpy as np
import pandas as pd
import pytest

from tuner import metrics
from tuner.data.dataset import Query, QuerySet
from tuner.errors import EvaluationError
from tuner.evaluation import FailedQuery, QueryResponse, UnjudgedHit, evaluate_responses, query_record
from tuner.evaluation.mapping import Hit, ParsedResponse


def _qs():
    qs = [
        Query("a", "alpha", "short", "faq", "in"),
        Query("b", "beta", "long_tail", "faq", "in"),
        Query("c", "gamma", "short", "docs", "in"),      # handed off by the backend
        Query("d", "delta", "temporal", "docs", "in"),   # fails
        Query("x", "buy shoes", "short", "oos", "oos"),  # answered: a false positive
        Query("y", "weather", "short", "oos", "oos"),    # handed off
        Query("z", "stocks", "short", "oos", "oos"),     # fails: counts as answered
    ]
    return QuerySet("demo", "hash", tuple(qs))


QRELS = {
    "a": {"a1": 3, "a2": 0, "a3": 2},
    "b": {"b1": 1, "b9": 3},
    "c": {"c1": 3},
    "d": {"d1": 2},
}


def _resp(qid, docs, *, conf=None, handoff=None, level=None, latency=10.0):
    hits = tuple(Hit(d, 1.0 / (i + 1), f"title {d}") for i, d in enumerate(docs))
    return QueryResponse(qid, f"rid-{qid}", ParsedResponse(hits, conf, handoff, level), latency, 1)


def _outcomes():
    responses = [
        _resp("a", ["a1", "u1", "a3", "a2"], conf=0.9, handoff=False, level="0", latency=10.0),
        _resp("b", ["u2", "b1"], conf=0.6, handoff=False, level="1", latency=20.0),
        _resp("c", ["c1", "u3"], conf=0.3, handoff=True, level="0", latency=30.0),
        _resp("x", ["o1"], conf=0.7, handoff=False, level="2", latency=40.0),
        _resp("y", ["o2"], conf=0.2, handoff=True, level="2", latency=50.0),
    ]
    failed = [FailedQuery("d", "rid-d", "HTTP 500 after 4 attempt(s)", 4), FailedQuery("z", "rid-z", "ReadTimeout", 4)]
    return responses, failed


def test_ranking_metrics_score_handoffs_and_failures_zero():
    responses, failed = _outcomes()
    result = evaluate_responses(_qs(), QRELS, responses, failed)
    # independent path: what the scorecard gives for the effective rankings
    effective = {"a": ["a1", "u1", "a3", "a2"], "b": ["u2", "b1"], "c": [], "d": []}
    expected = metrics.score_rankings(effective, QRELS, ["a", "b", "c", "d"])
    pq = result.per_query
    for column in expected.columns:
        assert pq.loc[["a", "b", "c", "d"], column].tolist() == pytest.approx(expected[column].tolist()), column
        assert result.metrics[column] == pytest.approx(expected[column].mean()), column
        assert pq.loc[["x", "y", "z"], column].isna().all()
    assert pq.loc["c", "Primary_Metric_Score"] == 0.0
    # the raw results of the handed-off query are kept
    assert [h.doc_id for h in result.hits["c"]] == ["c1", "u3"]


def test_oos_and_operations_metrics():
    responses, failed = _outcomes()
    m = evaluate_responses(_qs(), QRELS, responses, failed).metrics
    n_in, n_oos = 4, 3
    # answered: a, b (in); x, z (oos; z failed so counts as answered)  handed off: c, d (in), y (oos)
    assert m["OOS_FP_Rate"] == pytest.approx(2 / n_oos)
    assert m["InScope_Handoff_Rate"] == pytest.approx(2 / n_in)
    tp, fp = 1, 2
    p, r = tp / (tp + fp), tp / n_oos
    assert m["Handoff_F1"] == pytest.approx(2 * p * r / (p + r))
    latencies = [10.0, 20.0, 30.0, 40.0, 50.0]
    assert m["Latency_Avg_ms"] == pytest.approx(sum(latencies) / 5)
    # linear interpolation at position (n-1)*0.95 = 3.8 -> 40 + 0.8*(50-40)
    assert m["Latency_P95_ms"] == pytest.approx(40 + 0.8 * 10)
    assert m["Latency_P50_ms"] == pytest.approx(30.0)  # the middle of five
    assert m["Failed_Queries"] == 2 and m["N_Queries"] == 7
    assert (m["N_InScope_Queries"], m["N_OOS_Queries"]) == (4, 3)
    # Judged@10 over in-scope queries with a non-empty raw ranking: a 3/4, b 1/2, c 1/2 (d failed: no ranking)
    assert m["Judged@10"] == pytest.approx((3 / 4 + 1 / 2 + 1 / 2) / 3)


def test_unjudged_hits_and_threshold_sweep_and_histogram():
    responses, failed = _outcomes()
    result = evaluate_responses(_qs(), QRELS, responses, failed)
    assert result.unjudged == [UnjudgedHit("a", 2, "u1", "title u1"), UnjudgedHit("b", 1, "u2", "title u2"),
                               UnjudgedHit("c", 2, "u3", "title u3")]
    sweep = result.threshold_sweep
    assert sweep is not None and len(sweep) == 51  # 0.00, 0.02, ..., 1.00
    # at 0.40: answer a (0.9), b (0.6), x (0.7); hand off c (0.3), y (0.2); d, z have no confidence
    assert sweep.loc[0.40, "OOS_FP_Rate"] == pytest.approx(1 / 2)
    assert sweep.loc[0.40, "InScope_Handoff_Rate"] == pytest.approx(1 / 3)
    pms = result.per_query["Primary_Metric_Score"]
    raw_c = metrics.score_rankings({"c": ["c1", "u3"]}, QRELS, ["c"])["Primary_Metric_Score"].iloc[0]
    # c answers at 0.40 only if conf >= 0.40: 0.3 < 0.40, so still handed off; d keeps its observed 0
    assert sweep.loc[0.40, "Primary_Metric_Score"] == pytest.approx((pms["a"] + pms["b"] + 0 + 0) / 4)
    assert sweep.loc[0.62, "Primary_Metric_Score"] == pytest.approx((pms["a"] + 0 + 0 + 0) / 4)
    assert raw_c > 0  # the handed-off query had a good raw answer, which the sweep would show below 0.30
    hist = result.fallback_histogram
    assert hist.loc["short"].to_dict() == {"0": 2, "1": 0, "2": 2}
    assert hist.loc["all"].sum() == 5


def test_per_query_info_columns():
    responses, failed = _outcomes()
    pq = evaluate_responses(_qs(), QRELS, responses, failed).per_query
    assert pq.index.tolist() == ["a", "b", "c", "d", "x", "y", "z"]
    assert pq.loc["d", "status"] == "failed" and "HTTP 500" in pq.loc["d", "failure_reason"]
    assert pq.loc["d", "request_id"] == "rid-d" and pq.loc["d", "attempts"] == 4
    assert pq["answered"].tolist() == [True, True, False, False, True, False, True]
    assert pq.loc["a", "n_results"] == 4 and math.isnan(pq.loc["d", "confidence"])


def test_query_record_matches_final_row():
    responses, failed = _outcomes()
    qs = _qs()
    result = evaluate_responses(qs, QRELS, responses, failed)
    for outcome in [*responses, *failed]:
        record = query_record(qs[outcome.query_id], outcome, QRELS)
        row = result.per_query.loc[outcome.query_id]
        for key, value in record.items():
            if key == "query_id":
                continue
            expected = row[key]
            if pd.isna(expected) if not isinstance(expected, (list, dict)) else False:
                assert value is None or (isinstance(value, float) and math.isnan(value)), key
            elif isinstance(expected, float):
                assert value == pytest.approx(expected), key
            else:
                assert value == expected, key


def test_exp_gains_are_passed_through():
    responses, failed = _outcomes()
    lin = evaluate_responses(_qs(), QRELS, responses, failed)
    exp = evaluate_responses(_qs(), QRELS, responses, failed, gains="exp")
    expected = metrics.score_rankings({"a": ["a1", "u1", "a3", "a2"]}, QRELS, ["a"], gains="exp")
    assert exp.per_query.loc["a", "NDCG@20"] == pytest.approx(expected.loc["a", "NDCG@20"])
    assert exp.gains == "exp" and lin.gains == "linear"


def test_every_query_needs_exactly_one_outcome():
    responses, failed = _outcomes()
    with pytest.raises(EvaluationError, match=r"1 queries have no outcome \(first: z\)"):
        evaluate_responses(_qs(), QRELS, responses, failed[:1])
    with pytest.raises(EvaluationError, match="query a: two outcomes"):
        evaluate_responses(_qs(), QRELS, [*responses, responses[0]], failed)
    with pytest.raises(EvaluationError, match="'zz', which is not in query set 'demo'"):
        evaluate_responses(_qs(), QRELS, [*responses, _resp("zz", [])], failed)


def test_evaluation_of_a_large_batch_is_fast_enough_to_run_per_trial():
    # not a timing assertion: checks the vectorised path handles a realistic size correctly
    n = 500
    qs = QuerySet("big", "h", tuple(Query(f"q{i}", "t", "short", "s", "in") for i in range(n)))
    rng = np.random.default_rng(1)
    qrels = {f"q{i}": {f"d{j}": int(rng.integers(0, 4)) for j in range(0, 80, 3)} for i in range(n)}
    responses = [_resp(f"q{i}", [f"d{j}" for j in rng.permutation(100)[:50]]) for i in range(n)]
    result = evaluate_responses(qs, qrels, responses)
    direct = metrics.score_rankings({r.query_id: [h.doc_id for h in r.response.hits] for r in responses}, qrels,
                                    qs.query_ids)
    assert result.metrics["Primary_Metric_Score"] == pytest.approx(direct["Primary_Metric_Score"].mean())
