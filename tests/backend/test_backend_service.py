"""The live service: HTTP contract and every tuned key, each through a real process.

Each test states the documented effect of one key and checks it on responses of two
services that differ only in that key (formulas written out, not recorded outputs).
"""

from __future__ import annotations

import math
import statistics
import time
from typing import Any

import httpx
import pytest
from backend_testdata import BM25_ONLY, NOW, Backends, backends, corpus_path, ids, search, shared_cache, write_corpus  # noqa: F401  (fixtures)
from support.backend import launch_backend, start_backend, write_backend_config

pytestmark = pytest.mark.slow

LINEAR = {"fusion": {"method": "linear"}}


# --- HTTP contract -------------------------------------------------------------------

def test_health_reports_corpus_size_and_config_hash(backends: Backends) -> None:
    backend = backends.get({})
    body = backend.health().json()
    assert body["status"] == "ok" and body["corpus_size"] == 14
    assert len(body["config_hash"]) == 64
    config = httpx.get(f"{backend.url}/admin/config").json()
    assert config["fusion"] == {"method": "rrf", "rrf_k": 60.0, "weights": {"bm25": 1.0, "dense": 1.0},
                                "normalization": "minmax", "normalize_weights": True}
    assert config["server"]["port"] == backend.port  # the --port override is effective


def test_search_response_shape_and_request_id_echo(backends: Backends) -> None:
    backend = backends.get({})
    response = backend.search({"query": "leather sofa", "top_k": 3, "now": NOW}, headers={"X-Request-ID": "req-42"})
    body = response.json()
    assert response.headers["X-Request-ID"] == "req-42" and body["request_id"] == "req-42"
    assert set(body) == {"results", "confidence", "handoff", "handoff_reason", "fallback_level", "request_id",
                         "config_hash"}
    assert body["handoff"] is False and body["handoff_reason"] is None  # the shipped threshold answers it
    assert 1 <= len(body["results"]) <= 3
    first = body["results"][0]
    assert {"doc_id", "score", "title", "date", "sub_scores"} <= set(first)
    assert set(first["sub_scores"]) == {"bm25", "dense"}
    assert all(0.0 <= r["score"] <= 1.0 for r in body["results"])
    generated = backend.search({"query": "sofa"}).json()["request_id"]
    assert generated and generated != backend.search({"query": "sofa"}).json()["request_id"]


@pytest.mark.parametrize(("body", "reason"), [
    ({"top_k": 3}, "query: Field required"),
    ({"query": "   "}, "query: must not be blank"),
    ({"query": "sofa", "top_k": 0}, "top_k: Input should be greater than or equal to 1"),
    ({"query": "sofa", "top_k": "many"}, "top_k: Input should be a valid integer"),
    ({"query": "sofa", "date_from": "yesterday"}, "date_from: Input should be a valid date"),
    ({"query": "sofa", "date_from": "2024-05-01", "date_to": "2024-04-01"}, "date_from 2024-05-01 is after date_to"),
    ({"query": "sofa", "date_hint_days": -1}, "date_hint_days: Input should be greater than or equal to 0"),
    (["sofa"], "body must be a JSON object"),
])
def test_bad_requests_get_422_with_the_reason(backends: Backends, body: Any, reason: str) -> None:
    backend = backends.get({})
    response = httpx.post(f"{backend.url}/search", json=body, headers={"X-Request-ID": "bad-1"})
    assert response.status_code == 422
    assert reason in response.json()["detail"]
    assert response.json()["request_id"] == "bad-1"


def test_invalid_json_is_422(backends: Backends) -> None:
    response = httpx.post(f"{backends.get({}).url}/search", content=b"{nope", headers={"content-type": "application/json"})
    assert response.status_code == 422 and "not valid JSON" in response.json()["detail"]


def test_unknown_body_fields_are_ignored_and_timestamps_mean_their_day(backends: Backends) -> None:
    backend = backends.get(BM25_ONLY)
    plain = search(backend, "lamp", date_hint_days=7)
    extra = search(backend, "lamp", date_hint_days=7, query_type="temporal", scope="in", source="x",
                   now=NOW + "T23:59:00Z")
    assert ids(extra) == ids(plain) and extra["fallback_level"] == plain["fallback_level"]


def test_health_is_503_while_loading_then_200(tmp_path, own_index_cache) -> None:  # type: ignore[no-untyped-def]
    # A fresh cache forces a cold build (scikit-learn import + LSA fit): the port
    # answers 503 well before the index is ready.
    corpus = write_corpus(tmp_path / "corpus.jsonl")
    config = write_backend_config(tmp_path / "config.yaml", corpus=corpus, index_cache=tmp_path / "fresh-cache")
    backend = launch_backend(config)
    try:
        seen: list[int] = []
        searches: list[int] = []
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline and 200 not in seen:
            try:
                seen.append(backend.health(timeout=1).status_code)
                if seen[-1] == 503:
                    searches.append(backend.search({"query": "sofa"}).status_code)
            except httpx.TransportError:
                pass
            time.sleep(0.02)
        assert 503 in seen and seen[-1] == 200, (seen[-5:], backend.stderr())
        assert seen.index(200) > seen.index(503)
        assert 503 in searches  # /search also refuses until the index is ready
        assert backend.stop() == 0
    finally:
        backend.stop()


def test_sigterm_stops_the_service_promptly_with_exit_0(tmp_path, corpus_path, shared_cache) -> None:  # type: ignore[no-untyped-def]
    config = write_backend_config(tmp_path / "config.yaml", corpus=corpus_path, index_cache=shared_cache)
    with start_backend(config) as backend:
        started = time.monotonic()
        code = backend.stop()
        assert code == 0
        assert time.monotonic() - started < 30  # not the stop's SIGKILL fallback (generous: a busy machine)


def test_a_failed_index_load_exits_1_after_binding(tmp_path) -> None:  # type: ignore[no-untyped-def]
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text('{"doc_id": "a", "title": "t", "text": "x", "date": "not-a-date"}\n')
    backend = launch_backend(write_backend_config(tmp_path / "config.yaml", corpus=corpus))
    try:
        assert backend.process.wait(timeout=60) == 1
        assert f"{corpus}:1: date 'not-a-date' is not YYYY-MM-DD" in backend.stderr()
    finally:
        backend.stop()


# --- fusion ----------------------------------------------------------------------------

def rrf_expected(result: dict[str, Any], weights: dict[str, float], k: float) -> float:
    total = sum(w / (k + result["ranks"][s]) for s, w in weights.items() if result["ranks"][s] is not None)
    return total / (sum(weights.values()) / (k + 1))


@pytest.mark.parametrize("k", [60, 1])
def test_rrf_k_sets_the_reciprocal_rank_constant(backends: Backends, k: int) -> None:
    payload = search(backends.get(BM25_ONLY, {"fusion": {"rrf_k": k}}), "sofa living room")
    assert len(payload["results"]) >= 3
    for rank, result in enumerate(payload["results"], 1):
        assert result["ranks"]["bm25"] == rank
        assert result["score"] == pytest.approx((k + 1) / (k + rank))


def test_rrf_k_changes_scores(backends: Backends) -> None:
    a = search(backends.get(BM25_ONLY, {"fusion": {"rrf_k": 60}}), "sofa living room")
    b = search(backends.get(BM25_ONLY, {"fusion": {"rrf_k": 1}}), "sofa living room")
    assert [r["score"] for r in a["results"]][1:] != pytest.approx([r["score"] for r in b["results"]][1:])


@pytest.mark.parametrize("weights", [{"bm25": 1.0, "dense": 1.0}, {"bm25": 3.0, "dense": 0.5}])
def test_weights_enter_the_rrf_formula(backends: Backends, weights: dict[str, float]) -> None:
    payload = search(backends.get({"fusion": {"weights": weights}}), "velvet sofa couch")
    for result in payload["results"]:
        assert result["score"] == pytest.approx(rrf_expected(result, weights, 60))
    scores = [r["score"] for r in payload["results"]]
    assert scores == sorted(scores, reverse=True)


def test_a_zero_weight_turns_a_source_off(backends: Backends) -> None:
    lexical = search(backends.get({"fusion": {"weights": {"bm25": 1.0, "dense": 0.0}}}), "velvet sofa couch")
    dense = search(backends.get({"fusion": {"weights": {"bm25": 0.0, "dense": 1.0}}}), "velvet sofa couch")
    assert all(r["ranks"]["bm25"] is not None for r in lexical["results"])
    assert [r["ranks"]["bm25"] for r in lexical["results"]] == list(range(1, len(lexical["results"]) + 1))
    assert [r["ranks"]["dense"] for r in dense["results"]] == list(range(1, len(dense["results"]) + 1))
    assert ids(lexical) != ids(dense)


def test_method_linear_minmax_formula(backends: Backends) -> None:
    payload = search(backends.get(BM25_ONLY, LINEAR), "sofa living room")
    raw = [r["sub_scores"]["bm25"] for r in payload["results"]]
    lo, hi = min(raw), max(raw)
    assert [r["score"] for r in payload["results"]] == pytest.approx([(s - lo) / (hi - lo) for s in raw])
    rrf = search(backends.get(BM25_ONLY), "sofa living room")
    assert ids(rrf) == ids(payload)  # one source: same order, different scores
    assert [r["score"] for r in rrf["results"]] != pytest.approx([r["score"] for r in payload["results"]])


def test_linear_hybrid_is_weighted_mean_of_minmax_scores(backends: Backends) -> None:
    weights = {"bm25": 0.7, "dense": 0.3}
    payload = search(backends.get(LINEAR, {"fusion": {"weights": weights}}), "velvet sofa couch")
    results = payload["results"]
    for result in results:
        expected = 0.0
        for source, w in weights.items():
            pool = [r["sub_scores"][source] for r in results if r["sub_scores"][source] is not None]
            value = result["sub_scores"][source]
            if value is not None:
                expected += w * (value - min(pool)) / (max(pool) - min(pool))
        assert result["score"] == pytest.approx(expected / sum(weights.values()))


def test_normalization_z_maps_through_the_normal_cdf(backends: Backends) -> None:
    payload = search(backends.get(BM25_ONLY, LINEAR, {"fusion": {"normalization": "z"}}), "sofa living room")
    raw = [r["sub_scores"]["bm25"] for r in payload["results"]]
    mean, std = statistics.fmean(raw), statistics.pstdev(raw)
    expected = [0.5 * (1 + math.erf((s - mean) / std / math.sqrt(2))) for s in raw]
    assert [r["score"] for r in payload["results"]] == pytest.approx(expected, rel=1e-5)


# --- sources ---------------------------------------------------------------------------

def test_depth_caps_each_sources_candidates(backends: Backends) -> None:
    full = search(backends.get(BM25_ONLY), "sofa")
    assert len(full["results"]) >= 3
    capped = search(backends.get(BM25_ONLY, {"sources": {"bm25": {"depth": 2}}}), "sofa")
    assert ids(capped) == ids(full)[:2]
    hybrid = search(backends.get({"sources": {"dense": {"depth": 1}}}), "sofa")
    assert sum(r["ranks"]["dense"] is not None for r in hybrid["results"]) == 1


def test_enabled_false_removes_a_source(backends: Backends) -> None:
    hybrid = search(backends.get({}), "sofa")
    lexical = search(backends.get(BM25_ONLY), "sofa")
    assert set(lexical["results"][0]["sub_scores"]) == {"bm25"}
    assert all(r["sub_scores"]["bm25"] is not None for r in lexical["results"])
    assert len(hybrid["results"]) > len(lexical["results"])


def test_min_similarity_floors_dense_candidates(backends: Backends) -> None:
    floor = 0.5
    payload = search(backends.get({"sources": {"dense": {"min_similarity": floor}}}), "velvet couch cushions")
    dense = [r["sub_scores"]["dense"] for r in payload["results"] if r["sub_scores"]["dense"] is not None]
    assert dense and min(dense) > floor
    unfloored = search(backends.get({}), "velvet couch cushions")
    assert len(unfloored["results"]) > len(payload["results"])


# --- the gate --------------------------------------------------------------------------

def test_confidence_is_mean_similarity_of_top_m(backends: Backends) -> None:
    for m in (1, 3):
        payload = search(backends.get({"confidence": {"top_m": m}}), "leather sofa")
        top = [r["similarity"] for r in payload["results"][:m]]
        assert payload["confidence"] == pytest.approx(max(0.0, statistics.fmean(top)))
    one = search(backends.get({"confidence": {"top_m": 1}}), "leather sofa")["confidence"]
    three = search(backends.get({"confidence": {"top_m": 3}}), "leather sofa")["confidence"]
    assert one != pytest.approx(three)


def test_confidence_does_not_depend_on_top_k(backends: Backends) -> None:
    backend = backends.get({"confidence": {"top_m": 3}})
    assert search(backend, "leather sofa", top_k=1)["confidence"] == pytest.approx(
        search(backend, "leather sofa", top_k=10)["confidence"])


def test_threshold_decides_handoff_and_results_are_still_returned(backends: Backends) -> None:
    confidence = search(backends.get({}), "leather sofa")["confidence"]
    assert 0.05 < confidence < 0.95
    low = search(backends.get({"confidence": {"threshold": round(confidence - 0.05, 3)}}), "leather sofa")
    high = search(backends.get({"confidence": {"threshold": round(confidence + 0.05, 3)}}), "leather sofa")
    assert low["handoff"] is False and high["handoff"] is True
    assert ids(high) == ids(low) and high["results"]
    # The reason names the key, with enough digits that the two numbers differ.
    threshold = round(confidence + 0.05, 3)
    assert low["handoff_reason"] is None
    assert high["handoff_reason"] == f"confidence {confidence:.2f} < confidence.threshold {threshold:.2f}"


def test_citation_min_score_drops_low_scores_and_hands_off_when_nothing_is_left(backends: Backends) -> None:
    base = search(backends.get({"confidence": {"threshold": 0.0}}), "sofa")
    scores = [r["score"] for r in base["results"]]
    cut = (scores[1] + scores[2]) / 2 if scores[1] != scores[2] else scores[1]
    cited = search(backends.get({"confidence": {"threshold": 0.0}, "citation": {"min_score": round(cut, 6)}}), "sofa")
    assert ids(cited) == [r["doc_id"] for r in base["results"] if r["score"] >= round(cut, 6)]
    assert 0 < len(cited["results"]) < len(base["results"]) and cited["handoff"] is False
    # Dense floored out: the best possible score is rank 1 in one of two equal sources = 0.5.
    only_lexical = {"confidence": {"threshold": 0.0}, "sources": {"dense": {"min_similarity": 0.99}}}
    assert search(backends.get(only_lexical), "lamp")["results"][0]["score"] == pytest.approx(0.5)
    none = search(backends.get(only_lexical, {"citation": {"min_score": 0.6}}), "lamp")
    assert none["results"] == [] and none["handoff"] is True and none["fallback_level"] == "no_filter"
    assert none["handoff_reason"] == "citation.min_score 0.60 left no result"


def test_no_match_at_all_is_empty_and_handed_off(backends: Backends) -> None:
    payload = search(backends.get({}), "zebra quantum", date_hint_days=7)
    assert payload == {**payload, "results": [], "confidence": 0.0, "handoff": True, "fallback_level": "empty",
                       "handoff_reason": "no candidates"}


# --- date fallback and recency -----------------------------------------------------------

LAMPS = {"d07": 22, "d08": 73, "d09": None}  # doc -> age in days at NOW (None: undated)


@pytest.mark.parametrize(("windows", "hint", "level", "docs"), [
    ([30, 90], 30, "primary", {"d07"}),
    ([30, 90], 7, "date_30d", {"d07"}),
    ([10, 90], 7, "date_90d", {"d07", "d08"}),
    ([5, 10], 7, "no_filter", {"d07", "d08", "d09"}),
    ([], 7, "no_filter", {"d07", "d08", "d09"}),
])
def test_fallback_windows_pick_the_first_tier_with_a_hit(backends: Backends, windows: list[int], hint: int,
                                                         level: str, docs: set[str]) -> None:
    payload = search(backends.get(BM25_ONLY, {"fallback": {"windows_days": windows}}), "lamp", date_hint_days=hint)
    assert payload["fallback_level"] == level
    assert set(ids(payload)) == docs


def test_explicit_range_is_the_primary_tier(backends: Backends) -> None:
    backend = backends.get(BM25_ONLY)
    inside = search(backend, "lamp", date_from="2024-03-01", date_to="2024-03-31")
    assert inside["fallback_level"] == "primary" and ids(inside) == ["d08"]
    outside = search(backend, "lamp", date_from="2021-01-01", date_to="2021-12-31")
    assert outside["fallback_level"] == "date_30d" and ids(outside) == ["d07"]


def test_no_date_constraint_reports_no_filter(backends: Backends) -> None:
    payload = search(backends.get(BM25_ONLY), "lamp")
    assert payload["fallback_level"] == "no_filter" and set(ids(payload)) == set(LAMPS)


@pytest.mark.parametrize("half_life", [7, 60])
def test_recency_boost_formula(backends: Backends, half_life: int) -> None:
    weight = 4.0
    base = {r["doc_id"]: r for r in search(backends.get(BM25_ONLY, LINEAR), "lamp")["results"]}
    boosted = search(backends.get(BM25_ONLY, LINEAR, {"recency": {"weight": weight, "half_life_days": half_life}}),
                     "lamp")
    for result in boosted["results"]:
        age = LAMPS[result["doc_id"]]
        decay = 0.0 if age is None else 0.5 ** (age / half_life)
        expected = base[result["doc_id"]]["score"] * (1 + weight * decay) / (1 + weight)
        assert result["score"] == pytest.approx(expected)


def test_recency_reorders_towards_recent_documents(backends: Backends) -> None:
    plain = search(backends.get(BM25_ONLY), "sofa")
    boosted = search(backends.get(BM25_ONLY, {"recency": {"weight": 10.0, "half_life_days": 7}}), "sofa")
    assert ids(boosted)[0] == "d01"  # 2 days old
    assert ids(boosted) != ids(plain)
