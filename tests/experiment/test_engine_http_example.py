"""The OpenSearch stored-pipeline example (experiments/engines/opensearch_stored_pipeline.yaml,
target.channel: http) loads with the tuner's own loader, and what a trial sends is the
engine's documented shape: the JSON below is written by hand from OpenSearch's public
reference (Search Pipeline API: GET /_search/pipeline/NAME answers ``{NAME: {...}}``, PUT
takes the pipeline bare and answers ``{"acknowledged": true}``; the normalization-processor's
``normalization.technique`` / ``combination.technique`` / ``combination.parameters.weights``;
a search names a stored pipeline with ``?search_pipeline=NAME``), never produced by the
code under test. An in-memory pipeline API answers as OpenSearch documents it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import pytest

from tuner.config.experiment import Experiment, load_experiment
from tuner.config.space.loading import load_space
from tuner.data.dataset import Query
from tuner.evaluation.mapping import parse_response, prepare_request
from tuner.study.trial.http_channel import HTTP_TEXT, HttpConfigPatcher
from tuner.targets.http_config import HttpConfigStore, HttpJournal

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "experiments" / "engines" / "opensearch_stored_pipeline.yaml"
AUTH = "Basic b3M6b3M="
PIPELINE_URL = "http://localhost:9200/_search/pipeline/hybrid-search"
QUERY = Query(query_id="q1", query="red leather sofa", query_type="keyword", source="test", scope="in",
              extra={"date_from": "2024-01-01"})


def pipeline(normalization: str, combination: str, weights: list[float]) -> dict[str, Any]:
    """The stored pipeline as PUT /_search/pipeline/NAME takes it."""
    return {"description": "Hybrid search: BM25 + neural",
            "phase_results_processors": [{"normalization-processor": {
                "normalization": {"technique": normalization},
                "combination": {"technique": combination, "parameters": {"weights": weights}}}}]}


PRODUCTION = pipeline("min_max", "arithmetic_mean", [0.3, 0.7])
SEARCH_BODY = {"size": 50, "_source": {"includes": ["title"]},
               "query": {"hybrid": {"queries": [
                   {"match": {"text": {"query": "red leather sofa"}}},
                   {"neural": {"passage_embedding": {"query_text": "red leather sofa", "model_id": "my-model-id",
                                                     "k": 100}}}]}}}


class PipelineApi:
    def __init__(self) -> None:
        self.stored = PRODUCTION
        self.puts: list[httpx.Request] = []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        assert str(request.url) == PIPELINE_URL and request.headers["Authorization"] == AUTH
        if request.method == "GET":
            return httpx.Response(200, json={"hybrid-search": self.stored})
        assert request.method == "PUT" and "If-Match" not in request.headers
        self.puts.append(request)
        self.stored = json.loads(request.content)
        return httpx.Response(200, json={"acknowledged": True})


@pytest.fixture(autouse=True)
def _secret(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPENSEARCH_AUTH", AUTH)


def load() -> Experiment:
    return load_experiment(EXAMPLE, check_paths=False)


def patcher(exp: Experiment, api: PipelineApi, tmp_path: Path) -> HttpConfigPatcher:
    http = exp.target.http
    assert http is not None
    store = HttpConfigStore(http.url, method=http.method, headers=http.headers, read_back=http.read_back,
                            document=http.document, transport=httpx.MockTransport(api))
    return HttpConfigPatcher(store, HttpJournal(tmp_path / "journal.json"))


def test_the_example_loads_as_an_http_channel_study_against_a_running_engine() -> None:
    exp = load()
    http = exp.target.http
    assert exp.target.channel == "http" and exp.target.apply == "none" and exp.target.config_files == []
    assert http is not None and (http.url, http.method, http.document, http.read_back) == (
        PIPELINE_URL, "PUT", "hybrid-search", True)
    assert http.headers == {"Authorization": AUTH}
    assert exp.search_space == (REPO / "search_space" / "engines" / "opensearch_stored_pipeline.yaml").resolve()


def test_the_space_is_checked_against_the_pipeline_as_found_and_the_baseline_changes_nothing(
        tmp_path: Path) -> None:
    exp, api = load(), PipelineApi()
    space = load_space(exp.search_space)
    p = patcher(exp, api, tmp_path)
    assert p.documents() == [PRODUCTION]
    assert space.validate_against(p.documents()) == []
    found = space.current_assignment(p.documents())
    assert found == {"fusion.normalization": "min_max", "fusion.combination": "arithmetic_mean",
                     "fusion.weights": {"0": 0.3, "1": 0.7}}
    texts = p.render(space.edits(space.as_found(found, p.documents())))
    assert json.loads(texts[HTTP_TEXT]) == PRODUCTION


def test_a_trials_put_is_the_documented_pipeline_and_restore_puts_the_original_back(tmp_path: Path) -> None:
    exp, api = load(), PipelineApi()
    space = load_space(exp.search_space)
    p = patcher(exp, api, tmp_path)
    trial = {"fusion.normalization": "l2", "fusion.combination": "harmonic_mean",
             "fusion.weights": {"0": 0.6, "1": 0.4}}
    p.write(p.render(space.edits(trial)))
    assert json.loads(api.puts[-1].content) == pipeline("l2", "harmonic_mean", [0.6, 0.4])
    assert json.loads(api.puts[-1].content) != PRODUCTION  # the check can fail
    p.restore()
    assert api.stored == PRODUCTION and json.loads(api.puts[-1].content) == PRODUCTION


def test_the_search_names_the_stored_pipeline_and_carries_no_inline_one() -> None:
    exp = load()
    prepared = prepare_request(exp.evaluation, QUERY, "rid-1")
    assert prepared.method == "POST"
    assert prepared.url == "http://localhost:9200/my-index/_search?search_pipeline=hybrid-search"
    assert dict(prepared.json) == SEARCH_BODY


def test_the_response_mapping_reads_the_engines_answer() -> None:
    answer = {"hits": {"total": {"value": 1}, "hits": [{"_id": "d7", "_score": 0.91, "_source": {"title": "Seven"}}]}}
    parsed = parse_response(answer, load().evaluation.response, "q1", top_k=50)
    assert [(h.doc_id, h.score, h.title) for h in parsed.hits] == [("d7", 0.91, "Seven")]
