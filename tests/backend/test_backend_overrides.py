"""Per-request fusion overrides on POST /search, through a real service.

An override must answer exactly as a service started with the merged config answers,
carry that config's hash, be refused (422, one line naming the key) where the config
file would be refused or where it would need another index, and stay in its request.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest
from backend_testdata import NOW, Backends, backends, corpus_path, search, shared_cache  # noqa: F401  (fixtures)
from fusion_backend.config import load_config
from fusion_backend.errors import ConfigError
from support.backend import write_backend_config

pytestmark = pytest.mark.slow

BM25_WEIGHT_ONLY = {"fusion": {"weights": {"dense": 0.0}}}
DENSE_WEIGHT_ONLY = {"fusion": {"weights": {"bm25": 0.0}}}


def scored(payload: dict[str, Any]) -> list[tuple[str, float]]:
    return [(r["doc_id"], round(r["score"], 9)) for r in payload["results"]]


@pytest.mark.parametrize("overrides", [
    {"fusion": {"method": "linear"}},
    {"fusion": {"rrf_k": 5, "weights": {"bm25": 0.3, "dense": 0.7}}},
    {"sources": {"bm25": {"depth": 2}}, "citation": {"min_score": 0.2}},
    {"fallback": {"windows_days": [10]}, "recency": {"weight": 1.0}},
])
def test_an_override_answers_as_a_service_started_with_the_merged_config(backends: Backends,
                                                                         overrides: dict[str, Any]) -> None:
    served, started = backends.get({}), backends.get(overrides)
    for query, extra in (("leather sofa", {}), ("lamp", {"date_hint_days": 7})):
        answer = search(served, query, overrides=overrides, **extra)
        expected = search(started, query, **extra)
        assert scored(answer) == scored(expected)
        assert answer["fallback_level"] == expected["fallback_level"]
        assert answer["config_hash"] == started.health().json()["config_hash"]
        assert answer["config_hash"] != served.health().json()["config_hash"]


def test_without_overrides_the_answer_carries_the_served_config_hash(backends: Backends) -> None:
    backend = backends.get({})
    served_hash = backend.health().json()["config_hash"]
    assert search(backend, "sofa")["config_hash"] == served_hash
    assert search(backend, "sofa", overrides={})["config_hash"] == served_hash
    # an override that restates the served value changes nothing, the hash included
    assert search(backend, "sofa", overrides={"fusion": {"rrf_k": 60}})["config_hash"] == served_hash


def test_an_override_lasts_one_request(backends: Backends) -> None:
    backend = backends.get({})
    before = search(backend, "leather sofa")
    assert scored(search(backend, "leather sofa", overrides=DENSE_WEIGHT_ONLY)) != scored(before)
    assert scored(search(backend, "leather sofa")) == scored(before)
    assert httpx.get(f"{backend.url}/admin/config").json()["fusion"]["weights"] == {"bm25": 1.0, "dense": 1.0}


def test_parallel_requests_each_get_their_own_overrides(backends: Backends) -> None:
    backend = backends.get({})
    query = "velvet couch cushions"
    expected = {
        "bm25": scored(search(backends.get(BM25_WEIGHT_ONLY), query)),
        "dense": scored(search(backends.get(DENSE_WEIGHT_ONLY), query)),
        "none": scored(search(backend, query)),
    }
    assert len({tuple(v) for v in expected.values()}) == 3  # each override has a visible effect
    kinds = ["bm25", "dense", "none"] * 8
    layers = {"bm25": BM25_WEIGHT_ONLY, "dense": DENSE_WEIGHT_ONLY, "none": None}

    def one(kind: str) -> tuple[str, list[tuple[str, float]]]:
        body = {"query": query, "top_k": 50, "now": NOW, "overrides": layers[kind]}
        response = httpx.post(f"{backend.url}/search", json=body, timeout=60)
        assert response.status_code == 200, response.text
        return kind, scored(response.json())

    with ThreadPoolExecutor(max_workers=8) as pool:
        answers = list(pool.map(one, kinds))
    assert all(got == expected[kind] for kind, got in answers)


def file_rule(tmp_path: Path, corpus: Path, cache: Path, layer: dict[str, Any]) -> str:
    """What the config file gets for the same value, after its 'path:line: ' prefix."""
    config = write_backend_config(tmp_path / "bad.yaml", corpus=corpus, index_cache=cache, overrides=layer)
    with pytest.raises(ConfigError) as err:
        load_config(config)
    return str(err.value).split(": ", 1)[1]


@pytest.mark.parametrize("layer", [
    {"fusion": {"rrf_k": -1}},
    {"fusion": {"method": "sum"}},
    {"fusion": {"weights": {"nope": 1.0}}},
    {"fusion": {"weights": {"bm25": 0.0, "dense": 0.0}}},
    {"fusion": {"bogus": 1}},
    {"fallback": {"windows_days": [90, 30]}},
])
def test_a_bad_override_is_422_with_the_config_files_wording(backends: Backends, tmp_path: Path, corpus_path: Path,
                                                             shared_cache: Path, layer: dict[str, Any]) -> None:
    backend = backends.get({})
    response = backend.search({"query": "sofa", "overrides": layer}, headers={"X-Request-ID": "ov-1"})
    assert response.status_code == 422
    body = response.json()
    assert body["request_id"] == "ov-1" and "\n" not in body["detail"]
    assert body["detail"] == "overrides: " + file_rule(tmp_path, corpus_path, shared_cache, layer)


@pytest.mark.parametrize(("layer", "key"), [
    ({"data": {"corpus": "/elsewhere.jsonl"}}, "data"),
    ({"server": {"port": 1}}, "server"),
    ({"sources": {"bm25": {"k1": 2.0}}}, "sources.bm25.k1"),
    ({"sources": {"dense": {"dims": 16}}}, "sources.dense.dims"),
    ({"sources": {"bm25": {"enabled": False}}}, "sources.bm25.enabled"),
    ({"sources": {"extra": {"type": "bm25"}}}, "sources.extra"),
])
def test_index_keys_cannot_be_set_per_request(backends: Backends, layer: dict[str, Any], key: str) -> None:
    response = backends.get({}).search({"query": "sofa", "overrides": layer})
    assert response.status_code == 422
    detail = response.json()["detail"]
    assert detail.startswith(f"overrides: {key}: ")
    assert "per request" in detail


def test_overrides_must_be_an_object(backends: Backends) -> None:
    response = backends.get({}).search({"query": "sofa", "overrides": [1]})
    assert response.status_code == 422 and response.json()["detail"].startswith("overrides: Input should be a valid dictionary")
