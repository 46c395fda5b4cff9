"""The preflight's check that an OOS constraint can move at all (issue 26, item 3): on
hand-built batches of the config as found, out-of-scope queries handed off for a reason
no tuned key controls stop it, a reason naming only untuned keys warns, and OOS answers
that the gates' whole range leaves unchanged warn."""

from tuner.config.objective import Constraint
from tuner.data.dataset import Query, QuerySet
from tuner.evaluation import QueryResponse, evaluate_responses
from tuner.evaluation.mapping import Hit, ParsedResponse
from tuner.study.gates.threshold import GateRange
from tuner.study.preflight import check_oos_movable

OOS_BOUND = [Constraint(metric="OOS_FP_Rate", op="<=", bound=0.1)]
TUNED = ["fusion.method", "fusion.weights", "confidence.threshold", "citation.min_score"]
GATES = [GateRange("confidence.threshold", 0.0, 0.9, 0.01), GateRange("citation.min_score", 0.0, 0.5, 0.01)]
NO_CANDIDATES = "no candidates (no run source ranks query_id 'o0')"


def _queries(n_in=10, n_oos=10):
    qs = [Query(f"q{i}", f"query {i}", "short", "t", "in") for i in range(n_in)]
    qs += [Query(f"o{i}", f"oos {i}", "off_topic", "t", "oos") for i in range(n_oos)]
    return QuerySet("t", "h", tuple(qs))


def _batch(queries, answer):
    """``answer(qid) -> (docs, confidence, handoff, reason)``; hits score 0.9, 0.8, ..."""
    responses = []
    for q in queries:
        docs, conf, handoff, reason = answer(q.query_id)
        hits = tuple(Hit(d, 0.9 - i / 10) for i, d in enumerate(docs))
        parsed = ParsedResponse(hits, conf, handoff, None, reason)
        responses.append(QueryResponse(q.query_id, f"r-{q.query_id}", parsed))
    qrels = {q.query_id: {f"d-{q.query_id}": 3} for q in queries.in_scope()}
    return evaluate_responses(queries, qrels, responses)


def _in_scope(qid):
    return [f"d-{qid}", "x"], 0.8, False, None


def _codes(findings):
    return {(f.code, f.level) for f in findings}


def test_oos_queries_no_source_ranks_stop_with_the_reason_and_the_fix():
    qs = _queries()
    batch = _batch(qs, lambda qid: ([], 0.0, True, NO_CANDIDATES) if qid.startswith("o") else _in_scope(qid))
    findings = check_oos_movable(batch, OOS_BOUND, tuned_keys=TUNED, gates=GATES)
    assert _codes(findings) == {("oos_cannot_vary", "stop")}
    message = findings[0].message
    assert "'OOS_FP_Rate <= 0.1' cannot vary: all 10 out-of-scope queries are handed off" in message
    assert NO_CANDIDATES in message and "OOS_FP_Rate stays 0.000 under every config" in message
    assert "runs that rank the out-of-scope queries" in message and "\n" not in message


def test_a_handoff_by_a_tuned_gate_is_not_a_stop():
    qs = _queries()
    reason = "confidence 0.20 < confidence.threshold 0.60"
    batch = _batch(qs, lambda qid: (["a", "b"], 0.2, True, reason) if qid.startswith("o") else _in_scope(qid))
    # the gate is tuned and its range reaches below the OOS confidences: the rate moves
    assert check_oos_movable(batch, OOS_BOUND, tuned_keys=TUNED, gates=GATES) == []


def test_a_reason_naming_only_untuned_keys_warns():
    qs = _queries()
    reason = "confidence 0.20 < confidence.threshold 0.60"
    batch = _batch(qs, lambda qid: (["a"], 0.2, True, reason) if qid.startswith("o") else _in_scope(qid))
    findings = check_oos_movable(batch, OOS_BOUND, tuned_keys=["fusion.method", "fusion.weights"])
    assert _codes(findings) == {("oos_cannot_vary", "warn")}


def test_some_oos_queries_without_candidates_warn_that_the_metric_measures_the_others():
    qs = _queries()
    stuck = {"o0", "o1", "o2"}
    batch = _batch(qs, lambda qid: ([], 0.0, True, NO_CANDIDATES) if qid in stuck
                   else (["a"], 0.3, False, None) if qid.startswith("o") else _in_scope(qid))
    findings = check_oos_movable(batch, OOS_BOUND, tuned_keys=TUNED, gates=GATES)
    assert _codes(findings) == {("oos_partly_fixed", "warn")}
    assert "3 of 10 out-of-scope queries" in findings[0].message and "the other 7 only" in findings[0].message


def test_oos_answers_the_same_at_both_ends_of_the_gates_warn():
    qs = _queries()
    # confident OOS answers that keep a top hit above the highest cut: answered whatever the gates
    batch = _batch(qs, lambda qid: (["a", "b"], 0.95, False, None) if qid.startswith("o") else _in_scope(qid))
    findings = check_oos_movable(batch, OOS_BOUND, tuned_keys=TUNED, gates=GATES)
    assert _codes(findings) == {("oos_gate_flat", "warn")}
    message = findings[0].message
    assert "OOS_FP_Rate is 1.000" in message
    assert "confidence.threshold 0..0.9, citation.min_score 0..0.5" in message
    # the same batch with OOS confidences inside the gate's range: the gate moves the rate
    movable = _batch(qs, lambda qid: (["a", "b"], 0.5, False, None) if qid.startswith("o") else _in_scope(qid))
    assert check_oos_movable(movable, OOS_BOUND, tuned_keys=TUNED, gates=GATES) == []


def test_handed_off_oos_without_reasons_is_left_to_the_gate_range_check():
    qs = _queries()
    batch = _batch(qs, lambda qid: ([], None, True, None) if qid.startswith("o") else _in_scope(qid))
    findings = check_oos_movable(batch, OOS_BOUND, tuned_keys=TUNED, gates=GATES)
    assert _codes(findings) == {("oos_gate_flat", "warn")}  # cannot be sure: a warning
    assert "OOS_FP_Rate is 0.000" in findings[0].message


def test_nothing_to_check_without_an_oos_constraint_or_oos_queries():
    qs = _queries()
    batch = _batch(qs, lambda qid: ([], 0.0, True, NO_CANDIDATES) if qid.startswith("o") else _in_scope(qid))
    assert check_oos_movable(batch, [], tuned_keys=TUNED, gates=GATES) == []
    latency = [Constraint(metric="Latency_P95_ms", op="<=", bound=500)]
    assert check_oos_movable(batch, latency, tuned_keys=TUNED, gates=GATES) == []
    no_oos = _queries(n_oos=0)
    assert check_oos_movable(_batch(no_oos, _in_scope), OOS_BOUND, tuned_keys=TUNED, gates=GATES) == []


# ---------------------------------------------------------------- through `tuner check`


def test_tuner_check_stops_on_an_oos_set_no_source_ranks(tmp_path):
    """A `files` import whose runs rank none of the --oos queries: the importer says so,
    and `tuner check` stops with exit 2 and one line naming the reason and the fix."""
    import json
    import subprocess
    import sys
    from pathlib import Path

    from fusion_backend.importers.__main__ import main as import_main

    docs = [{"doc_id": f"d{i}", "title": f"wing {i}", "text": f"flutter of swept wings number {i}"} for i in range(8)]
    queries = [{"query_id": f"q{i}", "query": f"wing flutter {i}"} for i in range(6)]
    oos = "".join(f"9{i}\treset my password {i}\n" for i in range(6))  # TSV: any --queries format
    run = "".join(f"q{i} Q0 d{(i + j) % 8} {j + 1} {10 - j}.0 r\n" for i in range(6) for j in range(4))
    files = {"corpus.jsonl": "".join(json.dumps(d) + "\n" for d in docs),
             "queries.jsonl": "".join(json.dumps(q) + "\n" for q in queries), "oos.tsv": oos,
             "qrels.txt": "".join(f"q{i} 0 d{i} 2\n" for i in range(6)), "r.run": run}
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    out = tmp_path / "bundle"
    assert import_main(["files", "--name", "mini", "--corpus", str(tmp_path / "corpus.jsonl"),
                        "--queries", str(tmp_path / "queries.jsonl"), "--oos", str(tmp_path / "oos.tsv"),
                        "--qrels", str(tmp_path / "qrels.txt"), "--run", f"r={tmp_path / 'r.run'}",
                        "--out", str(out)]) == 0
    tuner = Path(sys.executable).parent / "tuner"
    proc = subprocess.run([str(tuner), "check", str(out / "experiment.yaml")], capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    err = proc.stderr.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: "), proc.stderr
    assert ("constraint 'OOS_FP_Rate <= 0.1' cannot vary: all 6 out-of-scope queries are handed off on the config "
            "as found for a reason no tuned key controls (e.g. no candidates (no run source ranks query_id '9"
            ) in err[0]
    assert "make the backend retrieve for them" in err[0]
    assert "stop oos_cannot_vary:" in proc.stdout
