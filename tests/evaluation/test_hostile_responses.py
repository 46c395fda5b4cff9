"""Hostile answers are bounded: a whole-request deadline, a byte cap, results cut to
top_k, and an abort check that ends a batch at once (a dead backend, a stop request).

Every case runs against a real HTTP service on loopback (tests/support/fake_search.py)
or, for the dead backend, a real process that the test kills. The time bounds asserted
are the ones the spec states (EvalSpec.query_bound_s, ABORT_POLL_S) plus a slack for a
busy machine; the slack is seconds, the failures they guard against are minutes.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from pydantic import ValidationError
from support.fake_search import FakeSearch

from tuner.data.dataset import Query, QuerySet
from tuner.errors import FailureBudgetExceeded, ResponseMappingError
from tuner.evaluation import EvalSpec, RequestMapping, run_batch
from tuner.evaluation.batch import ABORT_POLL_S, BatchAborted, StopAfterGrace, any_abort
from tuner.evaluation.mapping import parse_response
from tuner.evaluation.spec import DEADLINE_TIMEOUTS, ResponseMapping

SLACK_S = 3.0  # a busy CI machine; every bound below is far from the unbounded case
N = 6


def _queries(n: int = N) -> QuerySet:
    return QuerySet("hostile", "hash", tuple(Query(f"q{i}", f"text {i}", "short", "faq", "in") for i in range(n)))


def _payload(i: int, n_hits: int = 10) -> dict:
    return {"results": [{"doc_id": f"d{i}-{j}", "score": 1.0 - j / 10, "title": f"T{j}"} for j in range(n_hits)]}


QRELS = {f"q{i}": {f"d{i}-{j}": (i + j) % 4 for j in range(0, 10, 2)} for i in range(N)}


@pytest.fixture
def svc():
    with FakeSearch({f"text {i}": _payload(i) for i in range(N)}) as service:
        yield service


def _spec(url: str, **kw) -> EvalSpec:
    base = dict(request=RequestMapping(url=url), top_k=10, concurrency=2, timeout_s=0.5, retries=1,
                backoff_s=0.01, backoff_max_s=0.05)
    base.update(kw)
    return EvalSpec(**base)


def _timed(fn, *args, **kw):
    started = time.monotonic()
    try:
        return fn(*args, **kw), time.monotonic() - started
    except Exception as exc:  # noqa: BLE001 - handed back with the time it took
        return exc, time.monotonic() - started


# ------------------------------------------------------------------ the spec


def test_deadline_defaults_to_a_multiple_of_the_timeout_and_bounds_a_query():
    spec = _spec("http://x", timeout_s=3, retries=2, backoff_max_s=1)
    assert spec.deadline_s is None and spec.request_deadline_s == DEADLINE_TIMEOUTS * 3
    assert spec.query_bound_s == 3 * DEADLINE_TIMEOUTS * 3 + 2 * 1
    assert _spec("http://x", timeout_s=3, deadline_s=5).request_deadline_s == 5
    assert _spec("http://x").max_response_bytes == 16 * 1024 * 1024


@pytest.mark.parametrize(("values", "said"), [
    ({"timeout_s": 3, "deadline_s": 2}, "deadline_s=2 is below timeout_s=3"),
    ({"deadline_s": 0}, "deadline_s=0: use a positive number of seconds"),
    ({"deadline_s": float("inf")}, "deadline_s=inf: use a positive number"),
    ({"max_response_bytes": 0}, "max_response_bytes=0: use a byte count from 1024"),
    ({"max_response_bytes": 2 ** 31}, "max_response_bytes=2147483648: use a byte count"),
])
def test_bad_bounds_are_one_line_config_errors(tmp_path: Path, values: dict, said: str):
    from tuner.config.yamlfile import format_validation_error

    doc = {"request": {"url": "http://x"}, **values}
    with pytest.raises(ValidationError, match=said) as info:
        EvalSpec.model_validate(doc)
    line = format_validation_error(info.value, tmp_path / "spec.yaml", doc, EvalSpec)
    key = next(iter(values)) if len(values) == 1 else "deadline_s"
    assert f"spec.yaml: {key}: {said}" in line and "\n" not in line


# ------------------------------------------------------------------ results beyond top_k


def test_parse_cuts_to_top_k_and_counts_without_parsing_the_rest():
    payload = {"results": [{"doc_id": f"d{j}"} for j in range(5)] + [{"no": "id"}] * 3}
    parsed = parse_response(payload, ResponseMapping(), "q1", top_k=5)
    assert [h.doc_id for h in parsed.hits] == [f"d{j}" for j in range(5)] and parsed.truncated == 3
    assert parse_response({"results": payload["results"][:5]}, ResponseMapping(), "q1", top_k=5).truncated == 0
    with pytest.raises(ResponseMappingError):  # without a cut the broken hits are parsed
        parse_response(payload, ResponseMapping(), "q1")


def test_a_50000_hit_answer_is_cut_to_top_k_and_counted(svc):
    from tuner.report.build import build_report

    # timeout_s well above the 0.5 s default: a 50,000-hit answer on a loaded machine may
    # pause longer between reads (it failed so once), and this test is about the cut
    clean = run_batch(_spec(svc.url, timeout_s=10), _queries(), QRELS)
    svc.extra_hits.update({"text 1": 50_000, "text 2": 50_000})
    result = run_batch(_spec(svc.url, timeout_s=10), _queries(), QRELS)
    assert {q: len(h) for q, h in result.hits.items()} == {f"q{i}": 10 for i in range(N)}
    assert result.per_query["n_truncated"].to_dict() == {f"q{i}": 50_000 if i in (1, 2) else 0 for i in range(N)}
    assert result.metrics["N_Truncated_Hits"] == 100_000 == result.truncated_hits
    assert clean.metrics["N_Truncated_Hits"] == 0
    assert result.metrics["Primary_Metric_Score"] == pytest.approx(clean.metrics["Primary_Metric_Score"])
    assert all(u.rank <= 10 for u in result.unjudged)
    report = json.dumps(build_report(result))
    assert len(report) < 200_000, "the cut hits reached the report"
    assert json.loads(report)["scorecard"]["N_Truncated_Hits"] == 100_000


# ------------------------------------------------------------------ byte cap


def test_a_runaway_body_fails_its_query_at_the_byte_cap_and_is_not_retried(svc):
    cap = 1024 * 1024
    svc.flood_bytes["text 3"] = 256 * cap
    spec = _spec(svc.url, max_response_bytes=cap, max_failed_queries=1, retries=3, timeout_s=5)
    result, took = _timed(run_batch, spec, _queries(), QRELS)
    (failed,) = result.failed
    assert failed.query_id == "q3" and failed.attempts == 1 and svc.attempts["text 3"] == 1
    assert failed.reason.startswith(f"ResponseTooLarge (not retried): the body is over max_response_bytes={cap}")
    assert "top_k=10" in failed.reason and "\n" not in failed.reason
    # the client hung up near the cap: the rest of the 256 MiB was never sent
    deadline = time.monotonic() + 10
    while "text 3" not in svc.body_bytes_sent and time.monotonic() < deadline:
        time.sleep(0.05)
    assert svc.body_bytes_sent["text 3"] < 64 * cap
    assert took < spec.request_deadline_s + SLACK_S


def test_a_declared_length_over_the_cap_fails_before_the_body_is_read(svc):
    svc.extra_hits["text 4"] = 50_000  # ~3 MB with a Content-Length
    # timeout_s well above the 0.5 s default: the service builds the 3 MB answer before its
    # headers, and under load 15 that took longer than 0.5 s (a ReadTimeout, not the cap)
    spec = _spec(svc.url, max_response_bytes=1024 * 1024, max_failed_queries=1, timeout_s=10)
    (failed,) = run_batch(spec, _queries(), QRELS).failed
    assert failed.query_id == "q4" and "(Content-Length " in failed.reason


def test_an_error_body_is_read_only_as_far_as_its_reason_needs(svc):
    svc.status_for["text 0"] = 404
    svc.responses["text 0"] = {}
    (failed,) = run_batch(_spec(svc.url, max_failed_queries=1), _queries(), QRELS).failed
    assert failed.reason.startswith("HTTP 404 (not retried): ") and len(failed.reason) < 200


# ------------------------------------------------------------------ whole-request deadline


def test_a_dripping_backend_fails_its_query_within_the_stated_bound(svc):
    # 5 bytes a second: every read comes well within timeout_s, so only the deadline ends it
    svc.drip_bps["text 2"] = 5
    spec = _spec(svc.url, timeout_s=0.5, deadline_s=1.0, retries=1, max_failed_queries=1)
    result, took = _timed(run_batch, spec, _queries(), QRELS)
    (failed,) = result.failed
    assert failed.query_id == "q2" and failed.attempts == 2 == svc.attempts["text 2"]
    assert failed.reason.startswith("DeadlineTimeout after 2 attempt(s): the whole-request deadline of 1 s")
    assert "deadline_s" in failed.reason and "\n" not in failed.reason
    assert took < spec.query_bound_s + SLACK_S
    assert result.metrics["N_Queries"] == N and result.metrics["Failed_Queries"] == 1


def test_a_one_byte_per_second_backend_fails_the_batch_within_the_bound(svc):
    svc.drip_bps["*"] = 1
    spec = _spec(svc.url, timeout_s=3, deadline_s=3, retries=1, max_failed_queries=0)  # the timeout_s
    err, took = _timed(run_batch, spec, _queries(), QRELS)
    assert isinstance(err, FailureBudgetExceeded) and "DeadlineTimeout" in str(err)
    assert took < spec.query_bound_s + SLACK_S  # one query's bound: the budget allows no failure


# ------------------------------------------------------------------ abort


def test_abort_before_the_first_request_sends_nothing(svc):
    with pytest.raises(BatchAborted, match=r"after 0 of 6 queries .*: backend gone: last log line$") as info:
        run_batch(_spec(svc.url), _queries(), QRELS, abort=lambda: "backend gone:\n  last log line\n")
    assert info.value.reason == "backend gone: last log line"  # one line, whatever the check said
    assert svc.requests == []


def test_abort_mid_batch_cancels_requests_in_flight(svc):
    svc.delay_s["*"] = 5.0
    gone = threading.Event()
    threading.Timer(0.5, gone.set).start()
    err, took = _timed(run_batch, _spec(svc.url, timeout_s=10), _queries(), QRELS,
                       abort=lambda: "stop requested" if gone.is_set() else None)
    assert isinstance(err, BatchAborted) and err.reason == "stop requested"
    assert str(err).startswith("batch aborted after 0 of 6 queries (requests in flight cancelled): stop requested")
    assert took < 0.5 + ABORT_POLL_S + SLACK_S  # not 5 s per answer


def test_abort_is_asked_before_every_retry(svc):
    for i in range(N):
        svc.fail_always.add(f"text {i}")
    def abort():
        return "backend died" if svc.requests else None

    # a retry schedule of minutes, ended at the first retry
    spec = _spec(svc.url, retries=5, backoff_s=60, backoff_max_s=60)
    err, took = _timed(run_batch, spec, _queries(), QRELS, abort=abort)
    assert isinstance(err, BatchAborted) and err.reason == "backend died"
    assert took < ABORT_POLL_S + SLACK_S and len(svc.requests) <= 2  # one attempt per query in flight


def test_an_exception_of_the_abort_check_propagates(svc):
    def broken():
        raise RuntimeError("the check itself broke")

    with pytest.raises(RuntimeError, match="the check itself broke"):
        run_batch(_spec(svc.url), _queries(), QRELS, abort=broken)


def test_a_killed_backend_process_ends_the_batch_at_once_not_after_the_retry_schedule(tmp_path: Path):
    script = Path(__file__).resolve().parents[1] / "support" / "fake_search.py"
    proc = subprocess.Popen([sys.executable, str(script), "--queries", "40", "--results", "10", "--delay-s", "0.2"],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        url = proc.stdout.readline().strip()
        assert url.startswith("http://127.0.0.1:"), url
        queries = QuerySet("killed", "hash", tuple(Query(f"q{i}", f"query {i}", "short", "faq", "in")
                                                   for i in range(40)))
        answered: list[float] = []
        killed_at: list[float] = []

        def kill_after_two(qid, row):
            answered.append(time.monotonic())
            if len(answered) == 2:
                proc.kill()
                killed_at.append(time.monotonic())

        def failure():
            code = proc.poll()
            return None if code is None else f"fake_search.py exited with code {code}"

        # retries of 2 + 4 + 8 s for every query still to send: tens of seconds without the check
        spec = EvalSpec(request=RequestMapping(url=url), top_k=10, concurrency=2, timeout_s=5, retries=3,
                        backoff_s=2, backoff_max_s=8, max_failed_queries=39)
        err, _ = _timed(run_batch, spec, queries, {}, on_result=kill_after_two, abort=failure)
        ended = time.monotonic()
        assert isinstance(err, BatchAborted), err
        assert err.reason == "fake_search.py exited with code -9"
        assert ended - killed_at[0] < ABORT_POLL_S + SLACK_S  # the retry schedule alone: 2 + 4 + 8 s
    finally:
        proc.kill()
        proc.wait()


# ------------------------------------------------------------------ abort checks


def test_stop_after_grace_lets_a_batch_finish_then_aborts():
    now = [100.0]
    stop: list[str] = []
    check = StopAfterGrace(lambda: stop[0] if stop else None, grace_s=5, clock=lambda: now[0])
    assert check() is None
    stop.append("interrupted by SIGTERM")
    assert check() is None  # the grace starts now
    now[0] += 4.9
    assert check() is None
    now[0] += 0.2
    assert check() == "interrupted by SIGTERM; the batch under way did not finish within 5 s of it"
    assert StopAfterGrace(lambda: "stop", grace_s=0)() is not None


def test_any_abort_gives_the_first_reason():
    assert any_abort(None, None) is None
    check = any_abort(lambda: None, None, lambda: "dead", lambda: "stopped")
    assert check is not None and check() == "dead"


def test_a_stop_during_a_dripping_batch_ends_it_within_grace_and_poll(svc):
    svc.drip_bps["*"] = 1
    stop = threading.Event()
    threading.Timer(0.5, stop.set).start()
    check = StopAfterGrace(lambda: "interrupted by SIGTERM" if stop.is_set() else None, grace_s=1.0)
    spec = _spec(svc.url, timeout_s=30, retries=3)  # 120 s a request, 8 min a query
    err, took = _timed(run_batch, spec, _queries(), QRELS, abort=check)
    assert isinstance(err, BatchAborted) and err.reason.startswith("interrupted by SIGTERM; the batch under way")
    assert took < 0.5 + 1.0 + ABORT_POLL_S + SLACK_S
