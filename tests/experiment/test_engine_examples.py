"""The engine examples (experiments/engines/*.yaml) load with the tuner's own loader, and
a trial's request rendered through their binding is the engine's documented request
shape: the JSON below is written by hand from each engine's public API reference (Azure
AI Search "Documents - Search Post", Elasticsearch's rrf and linear retrievers,
OpenSearch's hybrid query with a temporary search pipeline, Qdrant's Query API, Weaviate's
GraphQL hybrid search), never
produced by the code under test. The baseline (the declared request) is what each
example says production sends, and its values lie in the example's search space."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest

from tuner.config.experiment import Experiment, load_experiment
from tuner.config.space.loading import load_space
from tuner.data.dataset import Query
from tuner.evaluation.answers import AnswerDecoder
from tuner.evaluation.mapping import encode_json, parse_response, prepare_request
from tuner.evaluation.paths import split_path
from tuner.evaluation.request_binding import RequestBinding
from tuner.study.trial.request_channel import declared_values, request_document_of

REPO = Path(__file__).resolve().parents[2]
ENGINES = REPO / "experiments" / "engines"
SECRETS = {"AZURE_SEARCH_KEY": "az-key", "ES_API_KEY": "es-key", "OPENSEARCH_AUTH": "Basic b3M6b3M=",
           "QDRANT_API_KEY": "qd-key", "WEAVIATE_API_KEY": "wv-key"}
QUERY = Query(query_id="q1", query="red leather sofa", query_type="keyword", source="test", scope="in",
              extra={"date_from": "2024-01-01"})  # an extra field no engine takes: pass_extra is off
TOP_K = 50

# --------------------------------------------------------------------------- the references

AZURE_URL = "https://my-service.search.windows.net/indexes/my-index/docs/search?api-version=2024-05-01-preview"


def azure(weight: float, k: int, recall: int) -> dict[str, Any]:
    return {"search": "red leather sofa", "top": 50, "select": "id,title",
            "vectorQueries": [{"kind": "text", "text": "red leather sofa", "fields": "contentVector", "k": k,
                               "weight": weight}],
            "hybridSearch": {"maxTextRecallSize": recall}}


def es_rrf(rank_constant: int, window: int, k: int) -> dict[str, Any]:
    return {"size": 50, "_source": ["title"],
            "retriever": {"rrf": {
                "retrievers": [
                    {"standard": {"query": {"match": {"body": "red leather sofa"}}}},
                    {"knn": {"field": "body_embedding", "k": k, "num_candidates": 500,
                             "query_vector_builder": {"text_embedding": {"model_id": "my-embedding-model",
                                                                         "model_text": "red leather sofa"}}}}],
                "rank_constant": rank_constant, "rank_window_size": window}}}


def es_linear(w_text: float, w_dense: float, norm_text: str, window: int) -> dict[str, Any]:
    return {"size": 50, "_source": ["title"],
            "retriever": {"linear": {
                "retrievers": [
                    {"retriever": {"standard": {"query": {"match": {"body": "red leather sofa"}}}},
                     "weight": w_text, "normalizer": norm_text},
                    {"retriever": {"knn": {"field": "body_embedding", "k": 100, "num_candidates": 500,
                                           "query_vector_builder": {"text_embedding": {
                                               "model_id": "my-embedding-model", "model_text": "red leather sofa"}}}},
                     "weight": w_dense, "normalizer": "minmax"}],
                "rank_window_size": window}}}


def opensearch(normalization: str, combination: str, weights: list[float]) -> dict[str, Any]:
    return {"size": 50, "_source": {"includes": ["title"]},
            "query": {"hybrid": {"queries": [
                {"match": {"text": {"query": "red leather sofa"}}},
                {"neural": {"passage_embedding": {"query_text": "red leather sofa", "model_id": "my-model-id",
                                                  "k": 100}}}]}},
            "search_pipeline": {"phase_results_processors": [{"normalization-processor": {
                "normalization": {"technique": normalization},
                "combination": {"technique": combination, "parameters": {"weights": weights}}}}]}}


def qdrant(k: int, weights: list[float], sparse_limit: int, dense_limit: int) -> dict[str, Any]:
    return {"prefetch": [
                {"query": {"text": "red leather sofa", "model": "qdrant/bm25"}, "using": "sparse",
                 "limit": sparse_limit},
                {"query": {"text": "red leather sofa", "model": "sentence-transformers/all-minilm-l6-v2"},
                 "using": "dense", "limit": dense_limit}],
            "query": {"rrf": {"k": k, "weights": weights}}, "limit": 50, "with_payload": ["title"]}


def weaviate(alpha: float, fusion: str, text: str = "red leather sofa") -> dict[str, Any]:
    """Weaviate's GraphQL API: POST /v1/graphql with ``{"query", "variables"}``; hybrid's
    arguments written in the GraphQL text as Weaviate's reference writes them, the query
    text a String variable."""
    return {"query": "query Hybrid($q: String!) { Get { Article(hybrid: {query: $q, alpha: %s, fusionType: %s}, "
                     "limit: 50) { title _additional { id score } } } }" % (alpha, fusion),
            "variables": {"q": text}}


# name -> (url, headers, production values, production body, a trial's values, that trial's body,
#          an answer in the engine's documented shape, its (id, score, title) hits)
CASES: dict[str, dict[str, Any]] = {
    "azure_ai_search": {
        "url": AZURE_URL, "headers": {"api-key": "az-key"},
        "production": {"fusion.weights.dense": 1.0, "sources.dense.k": 50, "sources.text.max_recall": 1000},
        "production_body": azure(1.0, 50, 1000),
        "trial": {"fusion.weights.dense": 2.5, "sources.dense.k": 120, "sources.text.max_recall": 300},
        "trial_body": azure(2.5, 120, 300),
        "answer": {"@odata.count": 2, "value": [
            {"@search.score": 0.0331, "id": "d7", "title": "Seven"},
            {"@search.score": 0.0163, "id": "d2", "title": "Two",
             "@search.documentDebugInfo": {"vectors": {"subscores": {"text": {"searchScore": 2.1}}}}}]},
        "hits": [("d7", 0.0331, "Seven"), ("d2", 0.0163, "Two")],
    },
    "elasticsearch_rrf": {
        "url": "http://localhost:9200/my-index/_search", "headers": {"Authorization": "ApiKey es-key"},
        "production": {"fusion.rrf_k": 60, "fusion.window": 100, "sources.dense.k": 50},
        "production_body": es_rrf(60, 100, 50),
        "trial": {"fusion.rrf_k": 12, "fusion.window": 250, "sources.dense.k": 200},
        "trial_body": es_rrf(12, 250, 200),
        "answer": {"took": 5, "timed_out": False, "hits": {"total": {"value": 2, "relation": "eq"}, "max_score": 0.03,
                   "hits": [{"_index": "my-index", "_id": "d7", "_score": 0.0325, "_source": {"title": "Seven"}},
                            {"_index": "my-index", "_id": "d2", "_score": 0.0161, "_source": {"title": "Two"}}]}},
        "hits": [("d7", 0.0325, "Seven"), ("d2", 0.0161, "Two")],
    },
    "elasticsearch_linear": {
        "url": "http://localhost:9200/my-index/_search", "headers": {"Authorization": "ApiKey es-key"},
        "production": {"fusion.weights.text": 1.0, "fusion.weights.dense": 1.0, "fusion.normalizer.text": "minmax",
                       "fusion.window": 100},
        "production_body": es_linear(1.0, 1.0, "minmax", 100),
        "trial": {"fusion.weights.text": 0.3, "fusion.weights.dense": 0.7, "fusion.normalizer.text": "l2_norm",
                  "fusion.window": 200},
        "trial_body": es_linear(0.3, 0.7, "l2_norm", 200),
        "answer": {"hits": {"hits": [{"_id": "d7", "_score": 1.7, "_source": {"title": "Seven"}}]}},
        "hits": [("d7", 1.7, "Seven")],
    },
    "opensearch_hybrid": {
        "url": "http://localhost:9200/my-index/_search", "headers": {"Authorization": "Basic b3M6b3M="},
        "production": {"fusion.normalization": "min_max", "fusion.combination": "arithmetic_mean",
                       "fusion.weights.text": 0.5, "fusion.weights.dense": 0.5},
        "production_body": opensearch("min_max", "arithmetic_mean", [0.5, 0.5]),
        "trial": {"fusion.normalization": "l2", "fusion.combination": "harmonic_mean",
                  "fusion.weights.text": 0.2, "fusion.weights.dense": 0.8},
        "trial_body": opensearch("l2", "harmonic_mean", [0.2, 0.8]),
        "answer": {"hits": {"total": {"value": 1}, "hits": [{"_id": "d7", "_score": 0.91,
                                                               "_source": {"title": "Seven"}}]}},
        "hits": [("d7", 0.91, "Seven")],
    },
    "qdrant": {
        "url": "http://localhost:6333/collections/my-collection/points/query", "headers": {"api-key": "qd-key"},
        "production": {"fusion.rrf_k": 60, "fusion.weights.sparse": 1.0, "fusion.weights.dense": 1.0,
                       "sources.sparse.limit": 100, "sources.dense.limit": 100},
        "production_body": qdrant(60, [1.0, 1.0], 100, 100),
        "trial": {"fusion.rrf_k": 5, "fusion.weights.sparse": 0.35, "fusion.weights.dense": 0.65,
                  "sources.sparse.limit": 60, "sources.dense.limit": 400},
        "trial_body": qdrant(5, [0.35, 0.65], 60, 400),
        "answer": {"result": {"points": [{"id": 7, "version": 3, "score": 0.5, "payload": {"title": "Seven"}},
                                         {"id": "5c56c793-69f3-4fbf-87e6-c4bf54c28c26", "version": 1,
                                          "score": 0.25, "payload": {"title": "Uuid"}}]},
                   "status": "ok", "time": 0.002},
        "hits": [("7", 0.5, "Seven"), ("5c56c793-69f3-4fbf-87e6-c4bf54c28c26", 0.25, "Uuid")],
    },
    "weaviate": {
        "url": "http://localhost:8080/v1/graphql", "headers": {"Authorization": "Bearer wv-key"},
        "production": {"fusion.alpha": 0.75, "fusion.method": "relativeScoreFusion"},
        "production_body": weaviate(0.75, "relativeScoreFusion"),
        "trial": {"fusion.alpha": 0.3, "fusion.method": "rankedFusion"},
        "trial_body": weaviate(0.3, "rankedFusion"),
        # GraphQL's _additional.score is text
        "answer": {"data": {"Get": {"Article": [
            {"title": "Seven", "_additional": {"id": "5c56c793-69f3-4fbf-87e6-c4bf54c28c26", "score": "0.8"}},
            {"title": "Two", "_additional": {"id": "0b8c4d2e-3d34-4d6f-9d4b-2f5b7c1e9a10", "score": "0.016393442"}}]}}},
        "hits": [("5c56c793-69f3-4fbf-87e6-c4bf54c28c26", 0.8, "Seven"),
                 ("0b8c4d2e-3d34-4d6f-9d4b-2f5b7c1e9a10", 0.016393442, "Two")],
    },
}


@pytest.fixture(autouse=True)
def _secrets(monkeypatch: pytest.MonkeyPatch) -> None:
    for name, value in SECRETS.items():
        monkeypatch.setenv(name, value)


def load(name: str) -> Experiment:
    return load_experiment(ENGINES / f"{name}.yaml", check_paths=False)


def sent(exp: Experiment, request: Any) -> dict[str, Any]:
    """The JSON body the tuner sends for QUERY with ``request`` (placeholders filled)."""
    spec = exp.evaluation.model_copy(update={"request": request})
    prepared = prepare_request(spec, QUERY, "rid-1")
    assert prepared.method == "POST"
    return dict(prepared.json)


def test_every_example_is_covered() -> None:
    # the http-channel example (a stored pipeline) has its own module: test_engine_http_example.py
    assert {p.stem for p in ENGINES.glob("*.yaml")} - {"opensearch_stored_pipeline"} == set(CASES)


@pytest.mark.parametrize("name", sorted(CASES))
def test_the_example_loads_as_a_request_channel_study_against_a_running_engine(name: str) -> None:
    exp = load(name)
    assert exp.target.channel == "request" and exp.target.apply == "none" and exp.target.config_files == []
    assert exp.target.health.url.startswith(("http://", "https://"))
    assert exp.evaluation.request.pass_extra is False
    assert exp.evaluation.top_k == TOP_K
    space = load_space(exp.search_space)
    assert exp.search_space == (REPO / "search_space" / "engines" / f"{name}.yaml").resolve()
    request_document_of(exp, space)  # every key the space tunes is bound (ConfigError otherwise)
    bound = set(RequestBinding.parse(exp.target.request.bind).places) if exp.target.request else set()
    assert bound == set(CASES[name]["production"])


@pytest.mark.parametrize("name", sorted(CASES))
def test_the_baseline_is_what_production_sends(name: str) -> None:
    exp, case = load(name), CASES[name]
    binding = RequestBinding.parse(exp.target.request.bind) if exp.target.request else None
    assert binding is not None
    assert declared_values(binding, exp.evaluation.request) == case["production"]
    assert exp.evaluation.request.url == case["url"]
    assert exp.evaluation.request.headers == case["headers"]
    assert sent(exp, exp.evaluation.request) == case["production_body"]
    # the baseline trial renders the declared values: the request is unchanged
    assert sent(exp, binding.render(exp.evaluation.request, case["production"])) == case["production_body"]


@pytest.mark.parametrize("name", sorted(CASES))
def test_the_production_values_lie_in_the_search_space(name: str) -> None:
    exp, production = load(name), CASES[name]["production"]
    space = load_space(exp.search_space)
    for p in space.params:
        spec = p.spec
        if spec.type == "simplex":
            assert all(production[f"{p.path}.{c}"] > 0 for c in spec.components), p.name
        elif spec.type == "categorical":
            assert production[p.path] in spec.choices, p.name
        else:
            assert spec.low <= production[p.path] <= spec.high, p.name


@pytest.mark.parametrize("name", sorted(CASES))
def test_a_trials_request_is_the_engines_documented_shape(name: str) -> None:
    exp, case = load(name), CASES[name]
    binding = RequestBinding.parse(exp.target.request.bind) if exp.target.request else None
    assert binding is not None
    declared_before = copy.deepcopy(exp.evaluation.request.body)
    rendered = binding.render(exp.evaluation.request, case["trial"])
    assert sent(exp, rendered) == case["trial_body"]
    assert sent(exp, rendered) != case["production_body"]  # the check can fail
    assert rendered.url == case["url"] and rendered.headers == case["headers"]
    assert exp.evaluation.request.body == declared_before  # rendering never edits the declared request


@pytest.mark.parametrize("name", sorted(CASES))
def test_the_response_mapping_reads_the_engines_answer(name: str) -> None:
    exp, case = load(name), CASES[name]
    parsed = parse_response(case["answer"], exp.evaluation.response, "q1", top_k=TOP_K)
    assert [(h.doc_id, h.score, h.title) for h in parsed.hits] == case["hits"]
    # as the trial reads it: the answer's bytes (a fast typed decode, or the general path)
    decoded = AnswerDecoder(exp.evaluation.response, TOP_K).parse(json.dumps(case["answer"]).encode(), "q1")
    assert decoded == parsed


@pytest.mark.parametrize("text", ['the "best" sofa', "back\\slash \\\" and {braces}", "ünïcode ✓ $alpha: 1"])
def test_weaviate_sends_a_query_with_quotes_and_backslashes_as_a_graphql_variable(text: str) -> None:
    """The query text never enters the GraphQL text (where it would need GraphQL string
    escaping): it is the variable $q, and the body's JSON encoding carries it intact."""
    exp = load("weaviate")
    binding = RequestBinding.parse(exp.target.request.bind) if exp.target.request else None
    assert binding is not None
    rendered = binding.render(exp.evaluation.request, CASES["weaviate"]["trial"])
    spec = exp.evaluation.model_copy(update={"request": rendered})
    query = Query(query_id="q2", query=text, query_type="keyword", source="test", scope="in")
    prepared = prepare_request(spec, query, "rid-2")
    assert prepared.json == weaviate(0.3, "rankedFusion", text)
    assert json.loads(encode_json(prepared.json)) == weaviate(0.3, "rankedFusion", text)


def test_the_azure_score_key_is_one_key_with_a_dot() -> None:
    assert split_path(load("azure_ai_search").evaluation.response.score or "") == ("@search.score",)


def test_the_azure_example_replays_its_vector_weight_from_the_documented_debug_sub_scores() -> None:
    """The example's replay mapping reads Azure's documented ``debug: "vector"`` answer
    (REST "Documents - Search Post": ``@search.documentDebugInfo.vectors.subscores``,
    ``text.searchScore``, ``vectors[i].<field>.searchScore``), written by hand here: each
    source's list, and the setting served (the declared weight 1.0, Azure's RRF at 60)."""
    from tuner.evaluation.explain_batch import explain_spec
    from tuner.study.replay.fusion_search import ReplayPlan
    from tuner.study.trial.replay_measure import answer_reader

    exp = load("azure_ai_search")
    assert exp.replay is not None
    space = load_space(exp.search_space)
    plan = ReplayPlan(space, exp.replay)
    reader = answer_reader(plan, exp.evaluation, request_document_of(exp, space))
    body = sent(exp, explain_spec(exp.evaluation, exp.replay.request).request)
    assert body == {**azure(1.0, 50, 1000), "debug": "vector", "top": 3500}

    def hit(doc: str, score: float, text: float | None, vector: float | None) -> dict[str, Any]:
        sub: dict[str, Any] = {"vectors": [{"contentVector": {"searchScore": vector, "vectorSimilarity": 0.5}}
                                           if vector is not None else {}], "documentBoost": 1.0}
        if text is not None:
            sub["text"] = {"searchScore": text}
        return {"@search.score": score, "id": doc, "title": doc,
                "@search.documentDebugInfo": {"vectors": {"subscores": sub}}}

    answer = {"value": [hit("d7", 1 / 61 + 1 / 61, 4.2, 0.81), hit("d2", 1 / 62, 2.1, None),
                        hit("d9", 1 / 62, None, 0.77)]}
    read = reader.read(answer, "q1")
    assert read is not None
    explained, served = read
    lists = {n: [explained.doc_ids[d] for d in docs.tolist()] for n, (docs, _s) in explained.tiers[0][1].items()}
    assert lists == {"text": ["d7", "d2"], "dense": ["d7", "d9"]}
    assert (served.method, served.rrf_k, served.plain_sum, dict(served.weights)) == ("rrf", 60.0, True,
                                                                                      {"dense": 1.0})
