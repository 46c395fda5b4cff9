"""The preflight's pure checks on hand-built batches: each stops (or warns) on the
set-up it is about and stays quiet on a sound one."""

import math

import pytest

from tuner.config.objective import Constraint
from tuner.data.dataset import Query, QuerySet, judged_subset
from tuner.errors import InputError
from tuner.evaluation import EvalSpec, QueryResponse, RequestMapping, evaluate_responses
from tuner.evaluation.mapping import Hit, ParsedResponse
from tuner.study.preflight import (
    MIN_OOS_QUERIES,
    PreflightError,
    PreflightReport,
    check_batch,
    check_constraints,
    check_request_fields,
    empty_results_problem,
    sample_queries,
)

SPEC = EvalSpec(request=RequestMapping(url="http://127.0.0.1:1/search"))


def _queries(n_in=10, n_oos=0, extra=None):
    qs = [Query(f"q{i}", f"query {i}", "short", "t", "in", extra=dict(extra or {})) for i in range(n_in)]
    qs += [Query(f"o{i}", f"oos {i}", "short", "t", "oos") for i in range(n_oos)]
    return QuerySet("t", "h", tuple(qs))


def _resp(qid, docs, *, handoff=False, reason=None):
    hits = tuple(Hit(d, 1.0 - i / 100) for i, d in enumerate(docs))
    return QueryResponse(qid, f"r-{qid}", ParsedResponse(hits, 0.5, handoff, None, reason), 5.0, 1)


def _batch(queries, docs_of, *, handoff_of=lambda qid: False, reason=None, qrels=None):
    qrels = qrels if qrels is not None else {q.query_id: {f"d-{q.query_id}": 3} for q in queries.in_scope()}
    responses = [_resp(q.query_id, docs_of(q.query_id), handoff=handoff_of(q.query_id), reason=reason)
                 for q in queries]
    return evaluate_responses(queries, qrels, responses)


def _codes(findings, level=None):
    return {f.code for f in findings if level is None or f.level == level}


def test_sound_batch_has_no_stop_or_warning():
    qs = _queries(10, 6)
    batch = _batch(qs, lambda qid: [f"d-{qid}", "other"])
    findings = check_batch(batch, SPEC)
    assert _codes(findings, "stop") == set() and _codes(findings, "warn") == set()
    assert "hands off 0 of 10" in next(f.message for f in findings if f.code == "handoff")


def test_mostly_empty_results_stop_with_raw_response_and_query_id_hint():
    qs = _queries(10)
    batch = _batch(qs, lambda qid: [] if qid != "q0" else ["d-q0"])
    seen = []
    findings = check_batch(batch, SPEC, raw_response=lambda qid: seen.append(qid) or '{"results": []}')
    stop = next(f for f in findings if f.code == "empty_results")
    assert stop.level == "stop" and "9 of 10 in-scope queries came back with no results" in stop.message
    assert '{"results": []}' in stop.message and "results_path='results'" in stop.message
    assert "does not send query_id" in stop.message  # the default body sends query and top_k only
    assert seen and seen[0] != "q0"  # the raw response shown is one of an empty query
    assert "\n" not in stop.message


def test_empty_results_guard_follows_max_empty_share():
    qs = _queries(10)
    batch = _batch(qs, lambda qid: [] if int(qid[1:]) < 4 else [f"d-{qid}"])  # 4 of 10 empty
    assert empty_results_problem(batch, SPEC) is None
    strict = SPEC.model_copy(update={"max_empty_share": 0.3})
    assert "4 of 10" in empty_results_problem(batch, strict)


def test_doc_ids_matching_no_label_stop_and_show_both_formats():
    qs = _queries(5)
    batch = _batch(qs, lambda qid: [f"DOC-{qid.upper()}", "DOC-X"])
    stop = next(f for f in check_batch(batch, SPEC) if f.code == "no_label_match")
    assert stop.level == "stop"
    assert "'DOC-Q0'" in stop.message and "'d-q0'" in stop.message


def test_handoff_share_is_always_said_warned_above_ten_percent_and_stops_above_half():
    qs = _queries(10)
    for n_handed, level in ((1, "info"), (2, "warn"), (6, "stop")):
        batch = _batch(qs, lambda qid: [f"d-{qid}"], handoff_of=lambda qid: int(qid[1:]) < n_handed,
                       reason="confidence 0.41 < confidence.threshold 0.60")
        finding = next(f for f in check_batch(batch, SPEC) if f.code == "handoff")
        assert finding.level == level, n_handed
        assert f"hands off {n_handed} of 10" in finding.message
        assert "confidence.threshold 0.60" in finding.message  # the key the response names


def test_handoff_names_gate_values_when_response_gives_no_reason_and_solved_gates_only_warn():
    qs = _queries(10)
    batch = _batch(qs, lambda qid: [f"d-{qid}"], handoff_of=lambda qid: True)
    stop = next(f for f in check_batch(batch, SPEC, gate_values={"rag.min_confidence": 0.6}) if f.code == "handoff")
    assert stop.level == "stop" and "rag.min_confidence = 0.6" in stop.message
    solved = next(f for f in check_batch(batch, SPEC, gates_solved=True) if f.code == "handoff")
    assert solved.level == "warn"


def test_low_coverage_and_duplicates_warn():
    qs = _queries(4)
    batch = _batch(qs, lambda qid: ["u1", "u2", "u3", f"d-{qid}", "u1"])
    warns = _codes(check_batch(batch, SPEC), "warn")
    assert {"low_coverage", "duplicate_ids"} <= warns


def test_the_duplicate_warning_counts_the_repeats_removed_before_ranking():
    qs = _queries(4)
    batch = _batch(qs, lambda qid: ["u1", "u1", "u1", f"d-{qid}"] if qid in ("q1", "q3") else [f"d-{qid}", "u2"])
    dup = next(f for f in check_batch(batch, SPEC) if f.code == "duplicate_ids")
    assert dup.message == (
        "2 queries return the same doc id twice (first: q1); repeats are credited once: 4 later copies were "
        "removed before ranking (per query: n_repeats), so the backend shows fewer distinct results than top_k")
    assert batch.per_query.loc["q1", "Strong_Precision@10"] == 0.1  # d-q1 at rank 2: the repeats are gone
    assert batch.per_query.loc["q1", "MRR_Strong@10"] == 0.5


def test_oos_constraint_without_or_with_too_few_oos_queries():
    c = Constraint.parse("OOS_FP_Rate <= 0.10")
    assert _codes(check_constraints([c], _queries(10, 0)), "stop") == {"no_oos"}
    assert _codes(check_constraints([c], _queries(10, MIN_OOS_QUERIES - 1)), "stop") == {"few_oos"}
    coarse = check_constraints([c], _queries(10, MIN_OOS_QUERIES))  # steps of 0.2 > 0.1
    assert _codes(coarse, "warn") == {"coarse_oos"} and "steps of 0.200" in coarse[0].message
    assert check_constraints([c], _queries(10, 20)) == []
    other = Constraint.parse("Latency_P95_ms <= 200")
    assert check_constraints([other], _queries(10, 0)) == []


def test_request_fields_missing_and_unsent():
    qs = _queries(3, extra={"date_hint_days": 30})
    needs = SPEC.model_copy(update={"request": RequestMapping(url="http://x/s", body={"q": "{query}", "f": "{filter}"})})
    assert _codes(check_request_fields(needs, qs), "stop") == {"template_field"}
    unsent = SPEC.model_copy(update={"request": RequestMapping(url="http://x/s", pass_extra=False)})
    stop = check_request_fields(unsent, qs)
    assert _codes(stop, "stop") == {"unsent_fields"} and "date_hint_days (3 queries)" in stop[0].message
    assert check_request_fields(SPEC, qs) == []  # pass_extra sends it


def test_unjudged_queries_policy():
    qs = _queries(6, 2)
    qrels = {"q0": {"d": 1}, "q1": {"d": 0}}  # a grade-0 judgment is a judgment
    dropped = judged_subset(qs, qrels, "drop")
    assert [q.query_id for q in dropped.queries] == ["q0", "q1", "o0", "o1"]
    assert "dropped 4 of 6 in-scope queries" in dropped.note
    kept = judged_subset(qs, qrels, "keep")
    assert len(kept.queries) == 8 and "kept 4" in kept.note
    with pytest.raises(InputError, match="4 of 6 in-scope queries have no judgments"):
        judged_subset(qs, qrels, "error")
    assert judged_subset(qs, {q.query_id: {"d": 1} for q in qs}, "drop").note is None


def test_judged_at_k_is_undefined_when_nothing_came_back_and_empty_queries_are_counted():
    qs = _queries(4)
    batch = _batch(qs, lambda qid: [])
    assert math.isnan(batch.metrics["Judged@10"])
    assert batch.metrics["Empty_Queries"] == 4
    half = _batch(qs, lambda qid: [f"d-{qid}"] if qid in ("q0", "q1") else [])
    assert half.metrics["Judged@10"] == 1.0 and half.metrics["Empty_Queries"] == 2


def test_sample_keeps_small_sets_and_stratifies_big_ones():
    small = _queries(20, 5)
    assert sample_queries(small) == (small, None)
    big = _queries(900, 100)
    sample, seed = sample_queries(big, size=300, seed=3)
    assert seed == 3 and len(sample) == 300
    assert 25 <= len(sample.oos()) <= 35  # the set's 10% OOS share, about
    again, _ = sample_queries(big, size=300, seed=3)
    assert again.query_ids == sample.query_ids


def test_report_raises_first_stop_unless_skipped():
    report = PreflightReport()
    report.extend(check_constraints([Constraint.parse("OOS_FP_Rate <= 0.1")], _queries(3, 0)))
    with pytest.raises(PreflightError, match="no out-of-scope queries") as info:
        report.raise_for_stops("tuner run")
    assert info.value.exit_code == 2 and "--skip-checks" in str(info.value)
    report.skipped = True
    report.raise_for_stops()  # recorded, not raised
    assert report.to_dict()["skipped"] is True and report.to_dict()["passed"] is False


def test_a_handoff_reason_without_a_config_key_is_quoted_once():
    qs = _queries(10)
    batch = _batch(qs, lambda qid: [f"d-{qid}"], handoff_of=lambda qid: int(qid[1:]) < 2, reason="no candidates")
    finding = next(f for f in check_batch(batch, SPEC) if f.code == "handoff")
    assert finding.message.count("no candidates") == 1 and "2 with reason: no candidates" in finding.message
