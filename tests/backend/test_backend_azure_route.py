"""POST /indexes/{index}/docs/search, the Azure AI Search-shaped hybrid query, through a
real service, against RRF computed here by hand from the index's own BM25 scores and
cosines (loaded in-process from the same config: the route's fusion is not reused)."""

from __future__ import annotations

from typing import Any

import httpx
import numpy as np
import pytest
from backend_testdata import Backends, backends, corpus_path, shared_cache  # noqa: F401  (fixtures)
from fusion_backend.config import load_config
from fusion_backend.index import SearchIndex, load_index
from fusion_backend.text import analyze
from support.backend import RunningBackend

pytestmark = pytest.mark.slow

ROUTE = "/indexes/catalog/docs/search"


@pytest.fixture(scope="module")
def live(backends: Backends) -> RunningBackend:
    return backends.get({})


@pytest.fixture(scope="module")
def index(live: RunningBackend) -> SearchIndex:
    return load_index(load_config(live.config_path))


def azure(backend: RunningBackend, body: Any, api_version: str = "2024-07-01") -> httpx.Response:
    return httpx.post(f"{backend.url}{ROUTE}", params={"api-version": api_version}, json=body, timeout=60)


def ok(backend: RunningBackend, body: dict[str, Any]) -> list[dict[str, Any]]:
    response = azure(backend, body)
    assert response.status_code == 200, response.text
    return list(response.json()["value"])


def bm25_list(index: SearchIndex, text: str) -> list[tuple[str, float]]:
    scores = index.bm25["bm25"].scores(analyze(text))
    order = sorted((d for d in range(len(scores)) if scores[d] > 0), key=lambda d: (-scores[d], d))
    return [(index.docs.doc_ids[d], float(scores[d])) for d in order]


def cosine_list(index: SearchIndex, text: str) -> list[tuple[str, float]]:
    cos = index.embedder.doc_vectors @ index.embedder.embed(text)
    order = sorted(range(len(cos)), key=lambda d: (-cos[d], d))
    return [(index.docs.doc_ids[d], float(cos[d])) for d in order]


def test_a_text_query_alone_scores_bm25(live: RunningBackend, index: SearchIndex) -> None:
    value = ok(live, {"search": "leather sofa"})
    expected = bm25_list(index, "leather sofa")
    assert [h["id"] for h in value] == [d for d, _ in expected]
    assert [h["@search.score"] for h in value] == pytest.approx([s for _, s in expected])
    assert {"id", "title", "@search.score"} <= set(value[0]) and "@search.documentDebugInfo" not in value[0]


def test_a_vector_query_alone_scores_azures_cosine_score(live: RunningBackend, index: SearchIndex) -> None:
    value = ok(live, {"vectorQueries": [{"kind": "text", "text": "reading light", "fields": "dense", "k": 4}],
                      "debug": "vector"})
    expected = cosine_list(index, "reading light")[:4]
    assert [h["id"] for h in value] == [d for d, _ in expected]
    for hit, (_, cos) in zip(value, expected, strict=True):
        assert hit["@search.score"] == pytest.approx(1 / (1 + (1 - cos)))
        sub = hit["@search.documentDebugInfo"]["vectors"]["subscores"]
        assert sub["vectors"] == [{"dense": {"searchScore": pytest.approx(1 / (2 - cos)),
                                             "vectorSimilarity": pytest.approx(cos)}}]
        assert "text" not in sub


def test_hybrid_is_weighted_rrf_with_k_60_over_cut_lists(live: RunningBackend, index: SearchIndex) -> None:
    body = {
        "search": "sofa living room",
        "top": 6,
        "hybridSearch": {"maxTextRecallSize": 3},
        "vectorQueries": [
            {"kind": "text", "text": "comfortable couch", "fields": "dense", "k": 5, "weight": 2.0},
            {"kind": "text", "text": "garden bench", "fields": "dense", "k": 4, "weight": 0.5},
        ],
        "debug": "all",
    }
    lists = [
        (bm25_list(index, "sofa living room")[:3], 1.0),
        (cosine_list(index, "comfortable couch")[:5], 2.0),
        (cosine_list(index, "garden bench")[:4], 0.5),
    ]
    fused: dict[str, float] = {}
    for ranked, weight in lists:
        for rank, (doc, _) in enumerate(ranked, 1):
            fused[doc] = fused.get(doc, 0.0) + weight / (60 + rank)
    corpus_order = index.docs.doc_ids
    expected = sorted(fused, key=lambda d: (-fused[d], corpus_order.index(d)))[:6]
    value = ok(live, body)
    assert [h["id"] for h in value] == expected
    assert [h["@search.score"] for h in value] == pytest.approx([fused[d] for d in expected])
    for hit in value:  # the debug sub-scores: each list's own score, in request order
        sub = hit["@search.documentDebugInfo"]["vectors"]["subscores"]
        text = dict(lists[0][0])
        assert sub.get("text") == ({"searchScore": pytest.approx(text[hit["id"]])} if hit["id"] in text else None)
        assert len(sub["vectors"]) == 2 and sub["documentBoost"] == 1.0
        for entry, (ranked, _) in zip(sub["vectors"], lists[1:], strict=True):
            cos = dict(ranked)
            if hit["id"] in cos:
                assert entry == {"dense": {"searchScore": pytest.approx(1 / (2 - cos[hit["id"]])),
                                           "vectorSimilarity": pytest.approx(cos[hit["id"]])}}
            else:
                assert entry == {}


def test_a_weight_moves_a_vector_querys_documents(live: RunningBackend) -> None:
    def body(weight: float) -> dict[str, Any]:
        return {"search": "lamp", "top": 3,
                "vectorQueries": [{"kind": "text", "text": "rug floor", "fields": "dense", "k": 3, "weight": weight}]}

    low, high = ok(live, body(0.01)), ok(live, body(100.0))
    assert [h["id"] for h in low] != [h["id"] for h in high]
    lamps = {"d07", "d08", "d09"}
    assert {h["id"] for h in low} == lamps  # the text query dominates
    assert not lamps & {h["id"] for h in high[:1]}  # the vector query dominates


@pytest.mark.parametrize("debug", [None, "disabled"])
def test_debug_info_only_when_asked(live: RunningBackend, debug: str | None) -> None:
    body: dict[str, Any] = {"search": "sofa", "vectorQueries": [{"kind": "text", "text": "sofa", "fields": "dense"}]}
    if debug:
        body["debug"] = debug
    assert all("@search.documentDebugInfo" not in h for h in ok(live, body))


@pytest.mark.parametrize(("body", "message"), [
    ({"search": "sofa", "vectorQueries": [{"kind": "text", "text": "x", "fields": "contentVector"}]},
     "Invalid value for 'vectorQueries.0.fields': 'contentVector'"),
    ({"vectorQueries": [{"kind": "text", "text": "x", "fields": "dense", "weight": 0}]},
     "Invalid value for 'vectorQueries.0.weight': Input should be greater than 0"),
    ({"vectorQueries": [{"kind": "vector", "vector": [0.1], "fields": "dense"}]},
     "Invalid value for 'vectorQueries.0.kind'"),
    ({"search": "sofa", "debug": "semantic"}, "Invalid value for 'debug'"),
    ({"search": "sofa", "top": 0}, "Invalid value for 'top'"),
    ({"search": "sofa", "hybridSearch": {"maxTextRecallSize": 0}}, "Invalid value for 'hybridSearch.maxTextRecallSize'"),
    ({"search": "sofa", "skip": 10}, "paging is not supported"),
    ({"search": "sofa", "filter": "date gt 2024"}, "filters are not supported"),
    ({"search": "*"}, "needs a text query (search) or at least one vector query"),
    ([1], "must be a JSON object"),
])
def test_bad_requests_are_400_with_an_azure_error(live: RunningBackend, body: Any, message: str) -> None:
    response = azure(live, body)
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["code"] == "InvalidRequestParameter" and message in error["message"], error


def test_invalid_json_is_400(live: RunningBackend) -> None:
    response = httpx.post(f"{live.url}{ROUTE}", content=b"{nope", headers={"content-type": "application/json"})
    assert response.status_code == 400 and "not valid JSON" in response.json()["error"]["message"]


def test_api_version_and_index_name_do_not_change_the_answer(live: RunningBackend) -> None:
    body = {"search": "lamp", "vectorQueries": [{"kind": "text", "text": "lamp", "fields": "dense"}]}
    first = azure(live, body).json()
    other = httpx.post(f"{live.url}/indexes/other/docs/search", json=body, timeout=60).json()
    assert first == other == azure(live, body, api_version="2025-09-01").json()


def test_scores_agree_with_numpy_rrf_on_every_document(live: RunningBackend, index: SearchIndex) -> None:
    """The same check over the whole corpus (top: every document), vectorised."""
    text, vq = "velvet cushions", "green sofa"
    value = ok(live, {"search": text, "top": 100,
                      "vectorQueries": [{"kind": "text", "text": vq, "fields": "dense", "k": 100}]})
    ids = index.docs.doc_ids
    score = np.zeros(len(ids))
    for ranked in (bm25_list(index, text), cosine_list(index, vq)):
        for rank, (doc, _) in enumerate(ranked, 1):
            score[ids.index(doc)] += 1 / (60 + rank)
    assert {h["id"]: h["@search.score"] for h in value} == pytest.approx(
        {ids[d]: score[d] for d in range(len(ids)) if score[d] > 0})
