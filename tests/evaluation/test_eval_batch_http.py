"""run_batch against a real HTTP service on loopback (tests/support/fake_search.py)."""

import asyncio
import uuid

import pytest
from support.fake_search import FakeSearch

from tuner import metrics
from tuner.data.dataset import Query, QuerySet
from tuner.errors import ConfigError, FailureBudgetExceeded
from tuner.evaluation import EvalSpec, RequestMapping, ResponseMapping, run_batch

N = 12


def _queries(n=N):
    qs = [Query(f"q{i}", f"text {i}", "short" if i % 2 else "temporal", "faq", "oos" if i >= n - 2 else "in",
                extra={"date_hint_days": i, "filters": {"lang": "en"}}) for i in range(n)]
    return QuerySet("http-demo", "hash", tuple(qs))


def _payload(i):
    docs = [f"d{i}-{j}" for j in range(10)]
    return {"results": [{"doc_id": d, "score": 1.0 - j / 10, "title": f"T {d}"} for j, d in enumerate(docs)],
            "confidence": 0.3 + i * 0.05, "handoff": i >= N - 1, "fallback_level": i % 3}


QRELS = {f"q{i}": {f"d{i}-{j}": (i + j) % 4 for j in range(0, 10, 2)} for i in range(N)}


@pytest.fixture
def svc():
    with FakeSearch({f"text {i}": _payload(i) for i in range(N)}) as service:
        yield service


def _spec(svc, **kw):
    base = dict(request=RequestMapping(url=svc.url),
                response=ResponseMapping(confidence="confidence", handoff="handoff", fallback_level="fallback_level"),
                top_k=10, concurrency=4, timeout_s=2.0, retries=3, backoff_s=0.01, backoff_max_s=0.05)
    base.update(kw)
    return EvalSpec(**base)


def _expected_primary(qids):
    rankings = {q: [h["doc_id"] for h in _payload(int(q[1:]))["results"]] for q in qids}
    return metrics.score_rankings(rankings, QRELS, qids)["Primary_Metric_Score"]


def test_batch_scores_every_query_and_records_request_ids(svc):
    result = run_batch(_spec(svc), _queries(), QRELS)
    in_ids = [f"q{i}" for i in range(N - 2)]
    assert result.per_query.loc[in_ids, "Primary_Metric_Score"].tolist() == pytest.approx(_expected_primary(in_ids).tolist())
    assert result.metrics["Failed_Queries"] == 0 and result.metrics["N_Queries"] == N
    # q11 is OOS and handed off, q10 OOS answered
    assert result.metrics["OOS_FP_Rate"] == pytest.approx(1 / 2)
    sent = {r.body["query"]: r.headers["X-Request-ID"] for r in svc.requests}
    assert len(sent) == N
    for qid, row in result.per_query.iterrows():
        assert sent[f"text {qid[1:]}"] == row["request_id"]
        assert uuid.UUID(row["request_id"]).version == 4
        assert row["latency_ms"] > 0
    assert len(set(sent.values())) == N


def test_extra_fields_are_passed_through(svc):
    run_batch(_spec(svc), _queries(), QRELS)
    body = next(r.body for r in svc.requests if r.body["query"] == "text 3")
    assert body == {"query": "text 3", "top_k": 10, "date_hint_days": 3, "filters": {"lang": "en"}}
    svc.requests.clear()
    run_batch(_spec(svc, request=RequestMapping(url=svc.url, pass_extra=False)), _queries(), QRELS)
    assert all(set(r.body) == {"query", "top_k"} for r in svc.requests)


def test_transient_5xx_and_resets_are_retried_with_the_same_request_id(svc):
    clean = run_batch(_spec(svc), _queries(), QRELS)
    svc.requests.clear()
    svc.attempts.clear()
    svc.fail_times["text 1"] = 2
    svc.reset_times["text 2"] = 2
    result = run_batch(_spec(svc), _queries(), QRELS)
    assert svc.attempts["text 1"] == 3 and svc.attempts["text 2"] == 3
    assert result.per_query.loc["q1", "attempts"] == 3 and result.per_query.loc["q2", "attempts"] == 3
    assert result.metrics["Failed_Queries"] == 0
    ids = {r.headers["X-Request-ID"] for r in svc.requests if r.body["query"] == "text 1"}
    assert ids == {result.per_query.loc["q1", "request_id"]}
    for key in ("Primary_Metric_Score", "NDCG@20", "OOS_FP_Rate"):
        assert result.metrics[key] == pytest.approx(clean.metrics[key])


def test_permanent_failures_are_recorded_and_count_against_the_budget(svc):
    svc.fail_always.add("text 4")
    svc.bad_json.add("text 5")
    svc.status_for["text 6"] = 404
    result = run_batch(_spec(svc, max_failed_queries=3), _queries(), QRELS)
    failed = {f.query_id: f for f in result.failed}
    assert set(failed) == {"q4", "q5", "q6"}
    assert failed["q4"].reason.startswith("HTTP 500 after 4 attempt(s)") and failed["q4"].attempts == 4
    assert "query q5: response is not JSON" in failed["q5"].reason
    assert failed["q6"].reason.startswith("HTTP 404 (not retried)") and svc.attempts["text 6"] == 1
    assert result.metrics["Failed_Queries"] == 3
    assert result.per_query.loc[["q4", "q5", "q6"], "Primary_Metric_Score"].tolist() == [0.0, 0.0, 0.0]
    ok = [f"q{i}" for i in range(N - 2) if i not in (4, 5, 6)]
    expected = _expected_primary(ok).sum() / (N - 2)  # failures stay in the mean as zeros
    assert result.metrics["Primary_Metric_Score"] == pytest.approx(expected)

    with pytest.raises(FailureBudgetExceeded, match=r"3 of 12 queries failed, the budget allows 2 .*q\d: ") as info:
        run_batch(_spec(svc, max_failed_queries=2), _queries(), QRELS)
    assert "\n" not in str(info.value)
    assert {f.query_id for f in info.value.failed} == {"q4", "q5", "q6"}


def test_budget_exceeded_aborts_early(svc):
    for i in range(N):
        svc.fail_always.add(f"text {i}")
    with pytest.raises(FailureBudgetExceeded, match=r"1 of 12 queries failed, the budget allows 0"):
        run_batch(_spec(svc, concurrency=1, retries=0, max_failed_queries=0), _queries(), QRELS)
    assert len(svc.requests) < N  # the rest were never sent


def test_timeouts_are_retried_then_recorded(svc):
    svc.delay_s["text 3"] = 0.5
    result = run_batch(_spec(svc, timeout_s=0.1, retries=1, max_failed_queries=1), _queries(), QRELS)
    (failed,) = result.failed
    assert failed.query_id == "q3" and failed.attempts == 2 and "ReadTimeout" in failed.reason


def test_mapping_error_for_every_query_fails_the_batch_with_the_reason(svc):
    spec = _spec(svc, response=ResponseMapping(results_path="data.hits"))
    with pytest.raises(FailureBudgetExceeded, match=r"response has no 'data\.hits'.*set response\.results_path"):
        run_batch(spec, _queries(), QRELS)


def test_template_error_is_raised_before_any_request(svc):
    spec = _spec(svc, request=RequestMapping(url=svc.url, body={"q": "{query}", "d": "{no_such_field}"}))
    with pytest.raises(ConfigError, match="no_such_field"):
        run_batch(spec, _queries(), QRELS)
    assert svc.requests == []


def test_order_seed_shuffles_sending_order_not_results(svc):
    spec = _spec(svc, concurrency=1)
    first = run_batch(spec, _queries(), QRELS, order_seed=1)
    order1 = [r.body["query"] for r in svc.requests]
    svc.requests.clear()
    second = run_batch(spec, _queries(), QRELS, order_seed=2)
    order2 = [r.body["query"] for r in svc.requests]
    assert sorted(order1) == sorted(order2) and order1 != order2
    assert first.per_query.index.tolist() == second.per_query.index.tolist() == _queries().query_ids
    assert first.metrics["Primary_Metric_Score"] == pytest.approx(second.metrics["Primary_Metric_Score"])


def test_on_result_sees_every_query_and_can_stop_the_batch(svc):
    seen = {}
    result = run_batch(_spec(svc), _queries(), QRELS, on_result=lambda qid, row: seen.setdefault(qid, row))
    assert set(seen) == set(_queries().query_ids)
    for qid, row in seen.items():
        assert row["request_id"] == result.per_query.loc[qid, "request_id"]
        if qid not in ("q10", "q11"):
            assert row["Primary_Metric_Score"] == pytest.approx(result.per_query.loc[qid, "Primary_Metric_Score"])

    class Pruned(Exception):
        pass

    calls = []

    def stop(qid, row):
        calls.append(qid)
        raise Pruned(qid)

    svc.requests.clear()
    with pytest.raises(Pruned):
        run_batch(_spec(svc, concurrency=1), _queries(), QRELS, on_result=stop)
    assert len(calls) == 1 and len(svc.requests) < N


def test_run_batch_works_inside_a_running_event_loop(svc):
    async def caller():
        return run_batch(_spec(svc), _queries(), QRELS)

    result = asyncio.run(caller())
    assert result.metrics["N_Queries"] == N


def test_custom_get_mapping(svc):
    svc.responses = {f"text {i}": {"data": {"hits": [{"id": d["doc_id"]} for d in _payload(i)["results"]]}}
                     for i in range(N)}
    spec = _spec(svc, request=RequestMapping(url=svc.url, method="GET", body={"query": "{query}", "n": "{top_k}"}),
                 response=ResponseMapping(results_path="data.hits", doc_id="id", score=None, title=None))
    result = run_batch(spec, _queries(), QRELS)
    assert svc.requests[0].method == "GET" and svc.requests[0].params["n"] == "10"
    assert "date_hint_days" in svc.requests[0].params
    in_ids = [f"q{i}" for i in range(N - 2)]
    assert result.per_query.loc[in_ids, "Primary_Metric_Score"].tolist() == pytest.approx(_expected_primary(in_ids).tolist())
    assert result.threshold_sweep is None
