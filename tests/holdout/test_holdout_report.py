"""The holdout report: paired deltas with intervals, coverage, the unjudged-hits warning."""

from __future__ import annotations

import pytest

from tuner.data.dataset import Query, QuerySet
from tuner.errors import EvaluationError
from tuner.evaluation.holdout import holdout_report
from tuner.evaluation.mapping import Hit, ParsedResponse
from tuner.evaluation.outcomes import QueryResponse
from tuner.evaluation.result import evaluate_responses

N = 30


def queryset(n_oos=4):
    qs = [Query(f"q{i}", "t", "short", "s", "in") for i in range(N)]
    qs += [Query(f"o{i}", "t", "short", "s", "oos") for i in range(n_oos)]
    return QuerySet("hold", "h", tuple(qs))


def qrels():
    # Per query: 5 relevant docs r0..r4 (grades 3..1) and 5 judged-irrelevant docs n0..n4.
    return {f"q{i}": {**{f"r{j}": max(1, 3 - j // 2) for j in range(5)}, **{f"n{j}": 0 for j in range(5)}}
            for i in range(N)}


def batch(qs, labels, ranking_of, oos_answered=False):
    responses = []
    for q in qs:
        if q.scope == "oos":
            responses.append(QueryResponse(q.query_id, "r", ParsedResponse((Hit("x"),), 0.5, not oos_answered)))
        else:
            docs = ranking_of(q.query_id)
            responses.append(QueryResponse(q.query_id, "r", ParsedResponse(tuple(Hit(d) for d in docs), 0.9, False)))
    return evaluate_responses(qs, labels, responses)


def test_clear_win_is_significant_with_interval_above_zero():
    qs, labels = queryset(), qrels()
    worse = lambda q: [f"n{j}" for j in range(3)] + [f"r{j}" for j in range(5)]  # noqa: E731
    better = lambda q: (["r0", "r1"] if int(q[1:]) % 5 else []) + worse(q)  # noqa: E731
    report = holdout_report(batch(qs, labels, worse), batch(qs, labels, better), n_resamples=2000)
    row = report.comparison.loc["Primary_Metric_Score"]
    assert row["delta"] > 0 and row["ci_low"] > 0 and row["p_value"] < 0.05
    assert report.verdict == "best trial significantly better"
    assert (row["wins"], row["losses"], row["ties"]) == (N - N // 5, 0, N // 5)
    assert report.n_in_scope == N and report.n_queries == N + 4
    assert report.judged == {"baseline": 1.0, "best": 1.0}
    assert report.warnings == []
    md = report.to_markdown()
    assert "Primary_Metric_Score" in md and "significantly better" in md
    assert report.to_dict()["metrics"][0]["metric"] == "NDCG@20"


def test_win_that_rests_on_unjudged_hits_is_flagged():
    qs, labels = queryset(), qrels()
    # Baseline puts 4 never-graded documents first; best shows the same judged ones without them.
    base = lambda q: [f"u{j}" for j in range(4)] + [f"r{j}" for j in range(5)]  # noqa: E731
    best = lambda q: [f"r{j}" for j in range(5)]  # noqa: E731
    report = holdout_report(batch(qs, labels, base), batch(qs, labels, best), n_resamples=2000)
    assert report.comparison.loc["Primary_Metric_Score", "delta"] > 0
    assert report.condensed_delta == pytest.approx(0.0)
    assert any("rests on unjudged hits" in w for w in report.warnings)
    # Baseline judged@10 = 5 judged of its 9 shown hits.
    assert report.judged["baseline"] == pytest.approx(5 / 9)
    assert any("Judged@10 of the baseline" in w for w in report.warnings)


def test_identical_systems_show_no_difference_and_oos_rates():
    qs, labels = queryset(), qrels()
    same = lambda q: ["r0", "n0", "r1"]  # noqa: E731
    report = holdout_report(batch(qs, labels, same), batch(qs, labels, same, oos_answered=True), n_resamples=500)
    assert report.verdict == "no significant difference"
    assert report.comparison["delta"].abs().max() == 0
    assert report.oos_fp == {"baseline": 0.0, "best": 1.0}


def test_different_query_sets_are_rejected():
    labels = qrels()
    a = batch(queryset(), labels, lambda q: ["r0"])
    b = batch(QuerySet("x", "h", tuple(Query(f"q{i}", "t", "s", "s", "in") for i in range(5))), labels, lambda q: ["r0"])
    with pytest.raises(EvaluationError, match="different queries"):
        holdout_report(a, b)
