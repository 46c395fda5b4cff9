"""A search space's keys bound to places in the declared request (issue 28's request
channel): the declared request is the baseline, a trial's request carries its values in
their places and nothing else changes, and every mistake is one line before a trial."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from tuner.data.dataset import Query
from tuner.errors import ConfigError
from tuner.evaluation.mapping import prepare_request
from tuner.evaluation.request_binding import Place, RequestBinding, parse_place
from tuner.evaluation.spec import EvalSpec, RequestMapping

AZURE_BODY = {
    "search": "{query}",
    "top": "{top_k}",
    "vectorQueries": [
        {"kind": "text", "text": "{query}", "fields": "titleVector", "k": 50, "weight": 1.0},
        {"kind": "text", "text": "{query}", "fields": "contentVector", "k": 50, "weight": 0.5},
    ],
    "hybridSearch": {"maxTextRecallSize": 1000},
}


def azure() -> RequestMapping:
    return RequestMapping(url="https://svc.search.windows.net/indexes/docs/docs/search?api-version=2025-09-01",
                          headers={"api-key": "secret", "X-Fusion-Depth": "80"}, body=copy.deepcopy(AZURE_BODY))


BIND = {
    "fusion.weights.content": "body.vectorQueries.1.weight",
    "fusion.k.title": "body.vectorQueries.0.k",
    "fusion.text_recall": "body.hybridSearch.maxTextRecallSize",
    "fusion.depth": "header.x-fusion-depth",
    "api.version": "query.api-version",
}


def test_places_parse_with_list_indices() -> None:
    assert parse_place("body.vectorQueries.1.weight") == Place("body", ("vectorQueries", 1, "weight"))
    assert parse_place("query.k") == Place("query", ("k",))
    assert parse_place("header.X-Weight") == Place("header", ("X-Weight",))
    assert str(parse_place("body.a.0.b")) == "body.a.0.b"


@pytest.mark.parametrize("text", ["vectorQueries.1.weight", "body", "body..x", "cookie.k", "query."])
def test_a_place_that_is_not_one_is_one_line(text: str) -> None:
    with pytest.raises(ConfigError, match=r"^target\.request\.bind\.k: .* is not a place in the request; write body"):
        parse_place(text, "k")


def test_the_declared_request_is_the_baseline() -> None:
    binding = RequestBinding.parse(BIND)
    assert binding.declared(azure()) == {"fusion.weights.content": 0.5, "fusion.k.title": 50,
                                         "fusion.text_recall": 1000, "fusion.depth": "80",
                                         "api.version": "2025-09-01"}
    typed = binding.declared(azure(), as_type=lambda key, text: int(text) if key == "fusion.depth" else text)
    assert typed["fusion.depth"] == 80


def test_a_trial_request_carries_its_values_and_nothing_else_changes() -> None:
    declared = azure()
    binding = RequestBinding.parse(BIND)
    trial = binding.render(declared, {"fusion.weights.content": 2.25, "fusion.k.title": 30, "fusion.depth": 120})
    expected = copy.deepcopy(AZURE_BODY)
    expected["vectorQueries"][1]["weight"] = 2.25
    expected["vectorQueries"][0]["k"] = 30
    assert trial.body == expected
    assert trial.headers == {"api-key": "secret", "X-Fusion-Depth": "120"}  # the declared spelling kept
    assert trial.url == declared.url
    assert declared.body == AZURE_BODY and declared.headers["X-Fusion-Depth"] == "80"  # the declared one untouched
    # the query placeholders are still filled per query, around the trial's values
    sent = prepare_request(EvalSpec(request=trial, top_k=10), Query(query_id="q1", query="red shoes", query_type="keyword", source="test", scope="in"), "r1")
    assert sent.json["search"] == "red shoes" and sent.json["top"] == 10
    assert sent.json["vectorQueries"][1] == {"kind": "text", "text": "red shoes", "fields": "contentVector",
                                             "k": 50, "weight": 2.25}


def test_query_parameters_are_replaced_in_the_url() -> None:
    binding = RequestBinding.parse({"fusion.rrf_k": "query.rank_constant"})
    declared = RequestMapping(url="http://es:9200/docs/_search?rank_constant=60&pretty=true", body={"q": "{query}"})
    trial = binding.render(declared, {"fusion.rrf_k": 20})
    assert trial.url == "http://es:9200/docs/_search?rank_constant=20&pretty=true"
    assert binding.render(declared, {"fusion.rrf_k": True}).url.startswith("http://es:9200/docs/_search?rank_constant=true")


@pytest.mark.parametrize(("bind", "message"), [
    ({"w": "body.vectorQueries.2.weight"}, r"body\.vectorQueries\.2 is not in it \(a list of 2 there\)"),
    ({"w": "body.hybridSearch.minScore"}, r"body\.hybridSearch\.minScore is not in it"),
    ({"w": "body.vectorQueries.0"}, r"holds a mapping in evaluation\.request\.body; bind a single value"),
    ({"w": "body.search"}, r"is '\{query\}', a placeholder the tuner fills per query"),
    ({"w": "query.k"}, r"has no query parameter 'k'"),
    ({"w": "header.X-Weight"}, r"evaluation\.request\.headers has no 'X-Weight'"),
])
def test_a_place_the_request_does_not_declare_is_refused_before_a_trial(bind: dict[str, str], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        RequestBinding.parse(bind).declared(azure())


def test_a_key_tuned_but_not_bound_and_two_keys_on_one_place_are_refused() -> None:
    binding = RequestBinding.parse({"fusion.weights.content": "body.vectorQueries.1.weight"})
    with pytest.raises(ConfigError, match=r"has no place for fusion\.rrf_k: every key the search space tunes"):
        binding.render(azure(), {"fusion.rrf_k": 20})
    with pytest.raises(ConfigError, match=r"a and b are both bound to body\.top"):
        RequestBinding.parse({"a": "body.top", "b": "body.top"})
    with pytest.raises(ConfigError, match=r"cannot be sent in a JSON request"):
        binding.render(azure(), {"fusion.weights.content": float("nan")})


def test_the_fragment_is_what_an_application_sets() -> None:
    binding = RequestBinding.parse(BIND)
    assert binding.fragment({"fusion.weights.content": 2.25, "fusion.depth": 120, "api.version": "2025-09-01"}) == {
        "body": {"vectorQueries": {"1": {"weight": 2.25}}},
        "headers": {"x-fusion-depth": "120"},
        "query": {"api-version": "2025-09-01"},
    }


# -- the engines' documented request shapes (written from each engine's public API
# reference): the declared request, a binding, and the request a trial sends.

def render(body: dict[str, Any], bind: dict[str, str], values: dict[str, Any]) -> dict[str, Any]:
    declared = RequestMapping(url="http://engine/search", body=copy.deepcopy(body))
    return RequestBinding.parse(bind).render(declared, values).body


def test_elasticsearch_rrf_retriever() -> None:
    body = {"retriever": {"rrf": {
        "retrievers": [{"standard": {"query": {"match": {"text": "{query}"}}}},
                       {"knn": {"field": "vector", "query_vector_builder": {
                           "text_embedding": {"model_id": "e5", "model_text": "{query}"}}, "k": 50, "num_candidates": 100}}],
        "rank_constant": 60, "rank_window_size": 100}}, "size": "{top_k}"}
    got = render(body, {"fusion.rrf_k": "body.retriever.rrf.rank_constant",
                        "fusion.window": "body.retriever.rrf.rank_window_size",
                        "fusion.knn_k": "body.retriever.rrf.retrievers.1.knn.k"},
                 {"fusion.rrf_k": 20, "fusion.window": 50, "fusion.knn_k": 40})
    assert got["retriever"]["rrf"]["rank_constant"] == 20 and got["retriever"]["rrf"]["rank_window_size"] == 50
    assert got["retriever"]["rrf"]["retrievers"][1]["knn"]["k"] == 40
    assert got["retriever"]["rrf"]["retrievers"][0] == body["retriever"]["rrf"]["retrievers"][0]


def test_elasticsearch_linear_retriever() -> None:
    body = {"retriever": {"linear": {"retrievers": [
        {"retriever": {"standard": {"query": {"match": {"text": "{query}"}}}}, "weight": 1.0, "normalizer": "minmax"},
        {"retriever": {"knn": {"field": "vector", "query_vector_builder": {
            "text_embedding": {"model_id": "e5", "model_text": "{query}"}}, "k": 50, "num_candidates": 100}},
         "weight": 1.0, "normalizer": "minmax"}], "rank_window_size": 100}}}
    got = render(body, {"fusion.weights.bm25": "body.retriever.linear.retrievers.0.weight",
                        "fusion.weights.dense": "body.retriever.linear.retrievers.1.weight",
                        "fusion.normalizer": "body.retriever.linear.retrievers.0.normalizer"},
                 {"fusion.weights.bm25": 0.3, "fusion.weights.dense": 0.7, "fusion.normalizer": "l2_norm"})
    parts = got["retriever"]["linear"]["retrievers"]
    assert [p["weight"] for p in parts] == [0.3, 0.7] and parts[0]["normalizer"] == "l2_norm"


def test_opensearch_hybrid_query_with_an_inline_pipeline() -> None:
    body = {"query": {"hybrid": {"queries": [{"match": {"text": {"query": "{query}"}}},
                                             {"neural": {"vector": {"query_text": "{query}", "model_id": "m", "k": 50}}}]}},
            "search_pipeline": {"phase_results_processors": [{"normalization-processor": {
                "normalization": {"technique": "min_max"},
                "combination": {"technique": "arithmetic_mean", "parameters": {"weights": [0.5, 0.5]}}}}]}}
    processor = "body.search_pipeline.phase_results_processors.0.normalization-processor"
    got = render(body, {"fusion.normalization": f"{processor}.normalization.technique",
                        "fusion.weights.bm25": f"{processor}.combination.parameters.weights.0",
                        "fusion.weights.dense": f"{processor}.combination.parameters.weights.1"},
                 {"fusion.normalization": "l2", "fusion.weights.bm25": 0.3, "fusion.weights.dense": 0.7})
    proc = got["search_pipeline"]["phase_results_processors"][0]["normalization-processor"]
    assert proc["normalization"]["technique"] == "l2"
    assert proc["combination"] == {"technique": "arithmetic_mean", "parameters": {"weights": [0.3, 0.7]}}


def test_qdrant_query_api_prefetch_and_fusion() -> None:
    body = {"prefetch": [{"query": {"text": "{query}", "model": "bm25"}, "using": "sparse", "limit": 20},
                         {"query": {"text": "{query}", "model": "e5"}, "using": "dense", "limit": 20}],
            "query": {"fusion": "rrf"}, "limit": "{top_k}", "with_payload": True}
    got = render(body, {"fusion.method": "body.query.fusion", "sources.sparse.depth": "body.prefetch.0.limit",
                        "sources.dense.depth": "body.prefetch.1.limit"},
                 {"fusion.method": "dbsf", "sources.sparse.depth": 50, "sources.dense.depth": 30})
    assert got["query"] == {"fusion": "dbsf"} and [p["limit"] for p in got["prefetch"]] == [50, 30]


# --------------------------------------------------------------------------- a value inside a text

GRAPHQL = ("query Hybrid($q: String!, $alpha2: Float) {{ Get {{ Article(hybrid: {{query: $q, alpha: 0.75, "
           "fusionType: relativeScoreFusion}}, limit: {top_k}) {{ title _additional {{ id score }} }} }} }}")
TEXT_BIND = {"fusion.alpha": "body.query#alpha", "fusion.method": "body.query#fusionType"}


def graphql(text: str = GRAPHQL) -> RequestMapping:
    return RequestMapping(url="http://weaviate:8080/v1/graphql", body={"query": text, "variables": {"q": "{query}"}},
                          pass_extra=False)


def test_a_text_place_parses_and_prints_with_its_argument() -> None:
    assert parse_place("body.query#alpha") == Place("body", ("query",), "alpha")
    assert parse_place("body.a.0.q#fusionType") == Place("body", ("a", 0, "q"), "fusionType")
    assert str(parse_place("body.query#alpha")) == "body.query#alpha"


@pytest.mark.parametrize("text", ["body.query#", "body.query#1x", "body.query#a-b", "body.#alpha", "body.q#a#b"])
def test_a_text_place_that_is_not_one_is_one_line(text: str) -> None:
    with pytest.raises(ConfigError, match=r"^target\.request\.bind\.k: .* is not a place in the request; write body"):
        parse_place(text, "k")


def test_the_values_written_in_the_declared_text_are_the_baseline_with_their_types() -> None:
    binding = RequestBinding.parse({**TEXT_BIND, "n": "body.query#limit2", "flag": "body.query#exact"})
    text = GRAPHQL.replace("limit: {top_k}", "limit: {top_k}, limit2: 7, exact: true")
    assert binding.declared(graphql(text)) == {"fusion.alpha": 0.75, "fusion.method": "relativeScoreFusion",
                                               "n": 7, "flag": True}


def test_a_trial_rewrites_only_the_bound_tokens_and_each_query_text_travels_as_a_variable() -> None:
    binding = RequestBinding.parse(TEXT_BIND)
    declared = graphql()
    rendered = binding.render(declared, {"fusion.alpha": 0.3, "fusion.method": "rankedFusion"})
    assert rendered.body["query"] == GRAPHQL.replace("alpha: 0.75", "alpha: 0.3").replace(
        "fusionType: relativeScoreFusion", "fusionType: rankedFusion")
    assert declared.body["query"] == GRAPHQL  # the declared request is never edited
    assert binding.declared(rendered) == {"fusion.alpha": 0.3, "fusion.method": "rankedFusion"}  # read back
    nasty = 'say "hi" \\ to {braces} and $alpha: 9'
    sent = prepare_request(EvalSpec(request=rendered, top_k=10), Query(query_id="q", query=nasty, query_type="keyword", source="t", scope="in"), "r").json
    assert sent == {"variables": {"q": nasty}, "query": (
        "query Hybrid($q: String!, $alpha2: Float) { Get { Article(hybrid: {query: $q, alpha: 0.3, "
        "fusionType: rankedFusion}, limit: 10) { title _additional { id score } } } }")}


@pytest.mark.parametrize(("value", "token"), [(1e-05, "1e-05"), (1, "1"), (0.5, "0.5"), (True, "true")])
def test_numbers_are_written_as_json_spells_them(value: Any, token: str) -> None:
    rendered = RequestBinding.parse({"a": "body.query#alpha"}).render(graphql(), {"a": value})
    assert f"alpha: {token}," in rendered.body["query"]


@pytest.mark.parametrize("value", ['x") { evil', "two words", "", float("nan"), None])
def test_a_value_that_is_not_a_number_or_a_bare_word_is_refused(value: Any) -> None:
    with pytest.raises(ConfigError, match=r"^fusion\.method: .* (cannot be written|cannot be sent)"):
        RequestBinding.parse(TEXT_BIND).render(graphql(), {"fusion.method": value})


@pytest.mark.parametrize(("text", "message"), [
    (GRAPHQL.replace("alpha: 0.75, ", ""), r"body\.query#alpha is not declared in evaluation\.request \(its text "
                                           r"has no 'alpha: <number or word>'\)"),
    (GRAPHQL.replace("alpha: 0.75", 'alpha: "0.75"'), r"has no 'alpha: <number or word>'"),
    (GRAPHQL.replace("alpha: 0.75", "alpha: {alpha}"), r"has no 'alpha: <number or word>'"),
    (GRAPHQL.replace("limit: {top_k}", "limit: {top_k}, alpha: 0.5"),
     r"body\.query#alpha is ambiguous: its text writes 'alpha:' 2 times; keep one"),
])
def test_a_text_without_the_argument_or_with_it_twice_is_refused_at_load(text: str, message: str) -> None:
    with pytest.raises(ConfigError, match=r"^target\.request\.bind\.fusion\.alpha: .*" + message):
        RequestBinding.parse(TEXT_BIND).declared(graphql(text))


def test_a_text_place_on_a_value_that_is_not_text_is_refused() -> None:
    request = RequestMapping(url="http://x/", body={"query": {"alpha": 0.5}})
    with pytest.raises(ConfigError, match=r"reads a value inside a text, but evaluation\.request\.body\.query holds "
                                          r"a dict; bind body\.<path> without #"):
        RequestBinding.parse({"a": "body.query#alpha"}).declared(request)


def test_the_fragment_names_the_arguments_to_write_in_the_text() -> None:
    binding = RequestBinding.parse(TEXT_BIND)
    assert binding.fragment({"fusion.alpha": 0.4, "fusion.method": "rankedFusion"}) == {
        "body": {"query": {"alpha": 0.4, "fusionType": "rankedFusion"}}}
