"""A live answer that lists a document twice: the first occurrence counts, the later
copies are removed before ranks are assigned (tuner.evaluation.mapping), counted per
query (``n_repeats``) and in total (``N_Repeated_Hits``). Scored live, the answer equals
``tuner score`` on the same list written as a run file without the repeats (a run file
with them is refused, as trec_eval refuses it), through either answer decoder."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from support.fake_search import FakeSearch

from tuner.data.dataset import Query, QuerySet
from tuner.evaluation import EvalSpec, RequestMapping, run_batch
from tuner.evaluation.answers import AnswerDecoder
from tuner.evaluation.mapping import Hit, ParsedResponse, decode_json, parse_response
from tuner.evaluation.regate import regate
from tuner.evaluation.spec import ResponseMapping

TYPED = ResponseMapping()  # the answers' hits are Hit structs as they are: the msgspec path
GENERAL = ResponseMapping(results_path="data.0.hits")  # a list index: parse_response's path only

# q1 is the case: the second relevant document (r2) is listed after two copies of r1
ANSWERS = {
    "q1": ["r1", "r1", "r1", "r2", "u1"],
    "q2": ["u1", "r3", "u2", "r3", "r4", "u1", "r5"],
    "q3": ["r6", "x", "y", "z"],  # no repeat
    "q4": ["u9", "u9"],
}
QRELS = {
    "q1": {"r1": 3, "r2": 3, "u1": 0},
    "q2": {"r3": 2, "r4": 1, "r5": 3, "r9": 2},
    "q3": {"r6": 1, "y": 3},
    "q4": {"r7": 2},
}
DEDUPED = {qid: list(dict.fromkeys(docs)) for qid, docs in ANSWERS.items()}
REPEATS = {qid: len(docs) - len(DEDUPED[qid]) for qid, docs in ANSWERS.items()}


def _hits(docs: list[str]) -> list[dict]:
    return [{"doc_id": d, "score": 1.0 - i / 100, "title": f"T {d}"} for i, d in enumerate(docs)]


def _body(docs: list[str], mapping: ResponseMapping) -> dict:
    return {"results": _hits(docs)} if mapping is TYPED else {"data": [{"hits": _hits(docs)}]}


def _queries() -> QuerySet:
    return QuerySet("dupes", "h", tuple(Query(qid, f"text {qid}", "short", "t", "in") for qid in ANSWERS))


# ------------------------------------------------------------------ one answer


@pytest.mark.parametrize("mapping", [TYPED, GENERAL], ids=["typed", "general"])
def test_both_decoders_keep_the_first_occurrence_and_count_the_rest(mapping):
    decoder = AnswerDecoder(mapping, top_k=5)
    assert decoder.typed is (mapping is TYPED)
    docs = ["a", "b", "a", "c", "b", "d", "a"]  # top_k=5 cuts the last two first, then a, b repeat
    content = json.dumps(_body(docs, mapping)).encode()
    parsed = decoder.parse(content, "q")
    assert [h.doc_id for h in parsed.hits] == ["a", "b", "c"]
    assert [h.score for h in parsed.hits] == [1.0, 0.99, 0.97]  # each first copy's own hit
    assert (parsed.repeats, parsed.truncated) == (2, 2)
    assert parsed == parse_response(decode_json(content, "q"), mapping, "q", top_k=5)


def test_a_response_built_by_hand_holds_each_document_once():
    made = ParsedResponse([Hit("a", 0.9), Hit("a", 0.8), Hit("b", 0.7)], 0.5, False, None)
    assert made.hits == (Hit("a", 0.9), Hit("b", 0.7)) and made.repeats == 1
    clean = ParsedResponse((Hit("a"), Hit("b")))
    assert clean.repeats == 0 and type(clean.hits) is tuple


# ------------------------------------------------------------------ a live batch against tuner score


def _tuner_score(tmp_path: Path, rankings: dict[str, list[str]]) -> dict:
    qrels = tmp_path / "qrels.txt"
    qrels.write_text("".join(f"{q} 0 {d} {g}\n" for q, labels in QRELS.items() for d, g in labels.items()))
    run = tmp_path / "run.jsonl"
    run.write_text("".join(json.dumps({"query_id": q, "results": [{"doc_id": d} for d in docs]}) + "\n"
                           for q, docs in rankings.items()))
    out = tmp_path / "score.json"
    done = subprocess.run([sys.executable, "-m", "tuner", "score", "--qrels", str(qrels), "--run", str(run),
                           "--order", "given", "--json", str(out)], capture_output=True, text=True,
                          env={**os.environ, "COLUMNS": "200"})
    assert done.returncode == 0, done.stderr
    return json.loads(out.read_text())


@pytest.fixture(scope="module")
def scored(tmp_path_factory) -> dict:
    return _tuner_score(tmp_path_factory.mktemp("score"), DEDUPED)


@pytest.mark.parametrize("mapping", [TYPED, GENERAL], ids=["typed", "general"])
def test_a_live_answer_scores_as_tuner_score_on_its_list_without_the_repeats(mapping, scored):
    responses = {f"text {qid}": _body(docs, mapping) for qid, docs in ANSWERS.items()}
    with FakeSearch(responses) as svc:
        spec = EvalSpec(request=RequestMapping(url=svc.url), response=mapping, top_k=10)
        result = run_batch(spec, _queries(), QRELS)
    assert {q: [h.doc_id for h in hits] for q, hits in result.hits.items()} == DEDUPED
    assert result.per_query["n_repeats"].to_dict() == REPEATS
    assert result.metrics["N_Repeated_Hits"] == sum(REPEATS.values()) == result.repeated_hits == 5
    assert result.per_query["n_results"].to_dict() == {q: len(d) for q, d in DEDUPED.items()}
    for qid, expected in scored["per_query"].items():  # every metric tuner score gives, to the last bit
        live = result.per_query.loc[qid]
        assert {m: float(live[m]) for m in expected} == expected, qid
    assert {m: result.metrics[m] for m in scored["aggregate"]} == scored["aggregate"]
    # the case: the second relevant document is credited at rank 2, not 4
    assert result.per_query.loc["q1", "NDCG@5"] == 1.0  # both grade-3 documents on top, as the ideal ranking
    # the unjudged hits are those of the list without the repeats, at its ranks
    assert [(u.query_id, u.rank, u.doc_id) for u in result.unjudged if u.query_id == "q2"] == [
        ("q2", 1, "u1"), ("q2", 3, "u2")]


def test_tuner_score_refuses_the_list_with_its_repeats(tmp_path):
    qrels = tmp_path / "qrels.txt"
    qrels.write_text("q1 0 r1 3\n")
    run = tmp_path / "run.jsonl"
    run.write_text(json.dumps({"query_id": "q1", "results": [{"doc_id": d} for d in ANSWERS["q1"]]}) + "\n")
    done = subprocess.run([sys.executable, "-m", "tuner", "score", "--qrels", str(qrels), "--run", str(run),
                           "--order", "given"], capture_output=True, text=True)
    assert done.returncode != 0 and "lists doc r1 again" in done.stderr


def test_gates_re_cut_the_list_without_the_repeats():
    # the gate cuts each deduplicated list where its scores fall below min_score (the copies of
    # r1 at 0.99 and 0.98 are not there to be kept, so r2 at 0.97 comes second)
    responses = {f"text {qid}": _body(docs, TYPED) for qid, docs in ANSWERS.items()}
    with FakeSearch(responses) as svc:
        spec = EvalSpec(request=RequestMapping(url=svc.url), top_k=10)
        result = run_batch(spec, _queries(), QRELS)
    gated = regate(result, confidence_threshold=None, min_score=0.965)
    kept = {q: [h.doc_id for h in hits] for q, hits in gated.hits.items()}
    assert kept == {"q1": ["r1", "r2"], "q2": ["u1", "r3", "u2"], "q3": ["r6", "x", "y", "z"], "q4": ["u9"]}
    assert gated.per_query["n_repeats"].to_dict() == REPEATS and gated.repeated_hits == 5
    from tuner import metrics

    expected = metrics.score_rankings(kept, QRELS, list(kept))
    for qid in kept:
        assert gated.per_query.loc[qid, "NDCG@20"] == expected.loc[qid, "NDCG@20"]
        assert gated.per_query.loc[qid, "Primary_Metric_Score"] == expected.loc[qid, "Primary_Metric_Score"]
    assert not np.isnan(gated.primary)


def test_replay_check_names_a_live_answer_that_repeated_a_hit():
    from tuner.evaluation.explain_batch import _difference

    replayed = ParsedResponse((Hit("a", 0.9), Hit("b", 0.8)), 0.5, False, "primary")
    live = ParsedResponse((Hit("a", 0.9), Hit("a", 0.9), Hit("b", 0.8)), 0.5, False, "primary")
    assert live.hits == replayed.hits  # the rest agrees, yet the backend is not the replay model
    assert _difference(live, replayed) == ("the live answer listed 1 doc ids again (removed before ranking); "
                                           "the replay never does")
    assert _difference(replayed, replayed) is None
