"""An explained retrieval read from per-hit sub-scores (tuner.evaluation.subscores): each
source's list is the hits that carry its sub-score, ranked by score (or by declared
rank), ties in the order the fused scores imply; replayed at the served setting it is
the engine's answer; what it cannot read is refused in one line. The answers here are
Azure AI Search's documented ``debug: "vector"`` shape, written by hand."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from tuner.errors import ResponseMappingError
from tuner.evaluation.fusion_replay import FusionSetting, replay
from tuner.evaluation.mapping import parse_response
from tuner.evaluation.replay_batch import ReplayBatch
from tuner.evaluation.spec import ResponseMapping
from tuner.evaluation.subscores import SourcePaths, SubscoreMapping, SubscoreReader, explained_from_answer

DEBUG = "@search\\.documentDebugInfo.vectors.subscores"
AZURE = SubscoreMapping({"text": SourcePaths(f"{DEBUG}.text.searchScore"),
                         "dense": SourcePaths(f"{DEBUG}.vectors.0.dense.searchScore")}, limit=1000)
RESPONSE = ResponseMapping(results_path="value", doc_id="id", score="@search\\.score", title="title")
K = 60.0


def _hit(doc: str, text: float | None, dense: float | None, *, w: float = 1.0, ranks: tuple[int, int] = (0, 0),
         fused: float | None = None) -> dict[str, Any]:
    sub: dict[str, Any] = {"vectors": [{"dense": {"searchScore": dense, "vectorSimilarity": 2 - 1 / dense}}
                                       if dense is not None else {}], "documentBoost": 1.0}
    if text is not None:
        sub["text"] = {"searchScore": text}
    if fused is None:  # Azure's RRF: sum of weight / (60 + rank) over the lists holding the hit
        fused = (1 / (K + ranks[0]) if ranks[0] else 0.0) + (w / (K + ranks[1]) if ranks[1] else 0.0)
    return {"@search.score": fused, "id": doc, "title": doc.upper(),
            "@search.documentDebugInfo": {"vectors": {"subscores": sub}}}


def _answer(hits: list[dict[str, Any]]) -> dict[str, Any]:
    return {"value": sorted(hits, key=lambda h: -h["@search.score"])}


# text list: a (3.0), b (2.0), c (1.0); dense list: c (0.9), d (0.8), a (0.7)
ANSWER = _answer([_hit("a", 3.0, 0.7, ranks=(1, 3)), _hit("b", 2.0, None, ranks=(2, 0)),
                  _hit("c", 1.0, 0.9, ranks=(3, 1)), _hit("d", None, 0.8, ranks=(0, 2))])
SERVED = FusionSetting(method="rrf", weights={"dense": 1.0}, rrf_k=K, plain_sum=True)


def _lists(answer: dict[str, Any], mapping: SubscoreMapping = AZURE, served: FusionSetting | None = SERVED
           ) -> dict[str, list[str]]:
    e = explained_from_answer(answer, RESPONSE, mapping, "q1", served)
    return {name: [e.doc_ids[d] for d in docs.tolist()] for name, (docs, _s) in e.tiers[0][1].items()}


def test_each_source_lists_the_hits_carrying_its_sub_score_best_first() -> None:
    assert _lists(ANSWER) == {"text": ["a", "b", "c"], "dense": ["c", "d", "a"]}
    e = explained_from_answer(ANSWER, RESPONSE, AZURE, "q1")
    assert e.sources == ("text", "dense") and [level for level, _ in e.tiers] == ["primary"]
    assert e.tiers[0][1]["text"][1].tolist() == [3.0, 2.0, 1.0]


def test_replayed_at_the_served_setting_it_is_the_engines_answer_and_at_another_weight_azures_rrf() -> None:
    e = explained_from_answer(ANSWER, RESPONSE, AZURE, "q1", SERVED)
    live = parse_response(ANSWER, RESPONSE, "q1")
    assert replay(e, SERVED, 10).hits == live.hits  # ids, scores to the bit, titles
    assert [h.score for h in replay(e, SERVED, 10).hits] == [h.score for h in live.hits]
    heavy = FusionSetting(method="rrf", weights={"dense": 3.0}, rrf_k=K, plain_sum=True)
    got = {h.doc_id: h.score for h in replay(e, heavy, 10).hits}
    assert got == {"a": 1 / 61 + 3 / 63, "b": 1 / 62, "c": 1 / 63 + 3 / 61, "d": 3 / 62}
    assert [h.doc_id for h in replay(e, heavy, 2).hits] == ["c", "a"]
    # the batch replay gives the same bits (plain_sum in both)
    batch = ReplayBatch({"q1": e}, ["q1"], [True], {"q1": {"c": 3}}, 10).table(heavy)
    assert batch.table.scores.tolist() == [h.score for h in replay(e, heavy, 10).hits]


def test_a_sources_ties_are_put_in_the_order_the_fused_scores_imply() -> None:
    # b and e tie in text (2.0); the engine ranked e 2nd and b 3rd there (its index order),
    # so b's fused score is 1/63 + 1/61 and e's 1/62; in the answer b comes first
    hits = [_hit("a", 3.0, None, ranks=(1, 0)), _hit("b", 2.0, 0.9, ranks=(3, 1)),
            _hit("e", 2.0, None, ranks=(2, 0)), _hit("d", None, 0.8, ranks=(0, 2))]
    answer = _answer(hits)
    assert [h["id"] for h in answer["value"]] == ["b", "a", "e", "d"]
    assert _lists(answer)["text"] == ["a", "e", "b"]
    e = explained_from_answer(answer, RESPONSE, AZURE, "q1", SERVED)
    assert replay(e, SERVED, 10).hits == parse_response(answer, RESPONSE, "q1").hits
    # without the fused scores' evidence the tie keeps the answer's order: not the engine's
    assert _lists(answer, served=None)["text"] == ["a", "b", "e"]
    wrong = explained_from_answer(answer, RESPONSE, AZURE, "q1")
    assert [h.score for h in replay(wrong, SERVED, 10).hits] != [h["@search.score"] for h in answer["value"]]


def test_declared_ranks_order_a_list_and_must_run_without_a_gap() -> None:
    ranked = SubscoreMapping({"text": SourcePaths(rank="r.text"), "dense": SourcePaths(rank="r.dense")})
    hits = [{"id": "a", "@search.score": 0.03, "r": {"text": 2, "dense": 1}},
            {"id": "b", "@search.score": 0.02, "r": {"text": 1}},
            {"id": "c", "@search.score": 0.01, "r": {"dense": 2}}]
    assert _lists({"value": hits}, ranked) == {"text": ["b", "a"], "dense": ["a", "c"]}
    hits[2]["r"]["dense"] = 3  # rank 2 of dense is missing from the answer
    with pytest.raises(ResponseMappingError, match=r"query q1: source dense's ranks run \[1, 3\] where \[1, 2\] "
                                                   r"were due: the answer lacks a document that source ranked"):
        _lists({"value": hits}, ranked)


def test_an_answer_as_long_as_its_cap_may_have_cut_candidates_and_is_refused() -> None:
    capped = SubscoreMapping(AZURE.sources, limit=4)
    with pytest.raises(ResponseMappingError, match=r"query q1: the explained answer has 4 hits, its cap "
                                                   r"\(replay.subscores.limit is 4\)"):
        _lists(ANSWER, capped)
    assert _lists(ANSWER, SubscoreMapping(AZURE.sources, limit=5))["text"] == ["a", "b", "c"]


@pytest.mark.parametrize(("value", "said"), [("high", "'high', not a finite number"), (True, "True, not a finite"),
                                             (float("inf"), "inf, not a finite number")])
def test_a_sub_score_that_is_not_a_number_is_refused_naming_the_field(value: Any, said: str) -> None:
    answer = _answer([_hit("a", 3.0, 0.7, ranks=(1, 1))])
    answer["value"][0]["@search.documentDebugInfo"]["vectors"]["subscores"]["text"]["searchScore"] = value
    with pytest.raises(ResponseMappingError) as exc:
        _lists(answer)
    assert f"query q1: hit 0: source text's score at '{DEBUG}.text.searchScore' is {said}" in str(exc.value)
    assert "fix replay.subscores.sources.text.score" in str(exc.value)


def test_a_repeated_document_is_not_the_replay_model() -> None:
    answer = {"value": [*ANSWER["value"], ANSWER["value"][0]]}
    with pytest.raises(ResponseMappingError, match="lists 1 document\\(s\\) twice"):
        _lists(answer)


def test_the_reader_finds_no_explanation_in_an_answer_without_sub_scores() -> None:
    reader = SubscoreReader(AZURE, RESPONSE, SERVED)
    plain = {"value": [{"id": h["id"], "@search.score": h["@search.score"]} for h in ANSWER["value"]]}
    assert reader.read(plain, "q1") is None
    assert reader.read({"value": []}, "q1") is not None  # nothing found is an answer (every setting: empty)
    read = reader.read(ANSWER, "q1")
    assert read is not None and read[1] is SERVED


def test_a_hit_absent_from_a_source_adds_nothing_for_it_at_any_weight() -> None:
    e = explained_from_answer(ANSWER, RESPONSE, AZURE, "q1", SERVED)
    for w in np.geomspace(0.1, 5.0, 5):
        s = FusionSetting(method="rrf", weights={"dense": float(w)}, rrf_k=K, plain_sum=True)
        got = {h.doc_id: h.score for h in replay(e, s, 10).hits}
        assert got["b"] == 1 / 62  # text only
        assert got["d"] == w / 62  # dense only


def test_a_declared_rank_is_the_engines_and_is_never_reordered_by_the_fused_scores() -> None:
    both = SubscoreMapping({"text": SourcePaths(score="s.text", rank="r.text"), "dense": SourcePaths(score="s.dense")})
    # text ties a and b at 2.0; the engine says b is 1st, a 2nd; the fused scores are made up
    hits = [{"id": "a", "@search.score": 0.5, "s": {"text": 2.0, "dense": 0.9}, "r": {"text": 2}},
            {"id": "b", "@search.score": 0.4, "s": {"text": 2.0}, "r": {"text": 1}}]
    assert _lists({"value": hits}, both) == {"text": ["b", "a"], "dense": ["a"]}
