"""GET / PUT /admin/config through a real service: what GET returns PUT accepts, a PUT
is validated like the file and served like a reload, If-Match guards it, and with
--config-store it survives a restart."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from backend_testdata import Backends, backends, corpus_path, merge, search, shared_cache  # noqa: F401  (fixtures)
from fusion_backend.config import load_config
from fusion_backend.errors import ConfigError
from support.backend import RunningBackend, start_backend, write_backend_config

pytestmark = pytest.mark.slow

STORE_ARG = "--config-store"


@pytest.fixture
def config_file(tmp_path: Path, corpus_path: Path, shared_cache: Path) -> Path:
    return write_backend_config(tmp_path / "config.yaml", corpus=corpus_path, index_cache=shared_cache)


@pytest.fixture
def live(config_file: Path) -> Iterator[RunningBackend]:
    with start_backend(config_file, timeout=90) as backend:
        yield backend


def get_config(backend: RunningBackend) -> tuple[dict[str, Any], str]:
    response = httpx.get(f"{backend.url}/admin/config")
    assert response.status_code == 200
    return response.json(), response.headers["ETag"]


def put(backend: RunningBackend, doc: Any, **headers: str) -> httpx.Response:
    return httpx.put(f"{backend.url}/admin/config", json=doc, headers=headers, timeout=120)


def served_hash(backend: RunningBackend) -> str:
    return str(backend.health().json()["config_hash"])


def expected_hash(tmp_path: Path, corpus: Path, cache: Path, layer: dict[str, Any]) -> str:
    """The hash of the same config written as a file and loaded as the service would."""
    path = write_backend_config(tmp_path / "expected.yaml", corpus=corpus, index_cache=cache, overrides=layer)
    return load_config(path).hash()


def test_get_returns_what_put_accepts_with_the_config_hash_as_etag(live: RunningBackend) -> None:
    doc, etag = get_config(live)
    assert etag == f'"{served_hash(live)}"'
    response = put(live, doc)
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["changed"] == [] and body["index_rebuilt"] is False and body["stored"] is False
    assert body["config_hash"] == served_hash(live) and response.headers["ETag"] == etag


def test_a_put_config_is_served_like_a_reload(live: RunningBackend, backends: Backends, tmp_path: Path,
                                              corpus_path: Path, shared_cache: Path) -> None:
    layer = {"fusion": {"rrf_k": 5, "weights": {"bm25": 0.25}}, "citation": {"min_score": 0.1}}
    doc, _ = get_config(live)
    before_reloads = live.health().json()["reloads"]
    response = put(live, merge(doc, layer))
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["changed"] == ["citation.min_score", "fusion.rrf_k", "fusion.weights.bm25"]
    assert body["index_rebuilt"] is False
    assert body["config_hash"] == expected_hash(tmp_path, corpus_path, shared_cache, layer) == served_hash(live)
    assert live.health().json()["reloads"] == before_reloads + 1
    assert get_config(live)[1] == f'"{body["config_hash"]}"'
    started = backends.get(layer)  # a fresh start with that config answers the same
    assert search(live, "leather sofa")["results"] == search(started, "leather sofa")["results"]


def test_an_index_key_rebuilds_the_index(live: RunningBackend, backends: Backends) -> None:
    layer = {"sources": {"bm25": {"k1": 0.9}}}
    doc, _ = get_config(live)
    response = put(live, merge(doc, layer))
    assert response.status_code == 200, response.text
    assert response.json()["index_rebuilt"] is True and response.json()["changed"] == ["sources.bm25.k1"]
    assert search(live, "leather sofa")["results"] == search(backends.get(layer), "leather sofa")["results"]


@pytest.mark.parametrize("layer", [{"fusion": {"rrf_k": -1}}, {"fusion": {"weights": {"nope": 1.0}}},
                                   {"sources": {"dense": {"dims": 1}}}, {"fusion": {"bogus": True}}])
def test_a_bad_document_is_422_with_the_files_wording_and_nothing_changes(
        live: RunningBackend, tmp_path: Path, corpus_path: Path, shared_cache: Path, layer: dict[str, Any]) -> None:
    doc, etag = get_config(live)
    response = put(live, merge(doc, layer))
    assert response.status_code == 422
    detail = response.json()["detail"]
    bad = write_backend_config(tmp_path / "bad.yaml", corpus=corpus_path, index_cache=shared_cache, overrides=layer)
    with pytest.raises(ConfigError) as err:
        load_config(bad)
    rule = str(err.value).split(": ", 1)[1]  # after the file's "path:line"
    assert detail.startswith(f"config not applied: PUT /admin/config: {rule} (")
    assert "\n" not in detail
    assert get_config(live) == (doc, etag)


@pytest.mark.parametrize(("body", "reason"), [(b"{nope", "not valid JSON"), (b"[1]", "must be a JSON object")])
def test_a_body_that_is_no_config_object_is_422(live: RunningBackend, body: bytes, reason: str) -> None:
    response = httpx.put(f"{live.url}/admin/config", content=body, headers={"content-type": "application/json"})
    assert response.status_code == 422 and reason in response.json()["detail"]


def test_if_match_guards_against_a_lost_update(live: RunningBackend) -> None:
    doc, etag = get_config(live)
    first = put(live, merge(doc, {"fusion": {"rrf_k": 7}}), **{"If-Match": etag})
    assert first.status_code == 200
    stale = put(live, merge(doc, {"fusion": {"rrf_k": 9}}), **{"If-Match": etag})
    assert stale.status_code == 412 and "GET /admin/config again" in stale.json()["detail"]
    assert get_config(live)[0]["fusion"]["rrf_k"] == 7
    bare = first.json()["config_hash"]  # an unquoted tag and '*' match too
    assert put(live, merge(doc, {"fusion": {"rrf_k": 9}}), **{"If-Match": bare}).status_code == 200
    assert put(live, doc, **{"If-Match": "*"}).status_code == 200


def test_the_command_lines_port_wins_over_the_documents_as_over_the_files(live: RunningBackend) -> None:
    doc, etag = get_config(live)
    response = put(live, merge(doc, {"server": {"port": live.port + 1}}))
    assert response.status_code == 200 and response.json()["changed"] == []
    assert get_config(live) == (doc, etag)


def test_without_a_store_a_reload_goes_back_to_the_file(live: RunningBackend) -> None:
    doc, etag = get_config(live)
    assert put(live, merge(doc, {"fusion": {"rrf_k": 3}})).status_code == 200
    assert httpx.post(f"{live.url}/admin/reload", timeout=60).status_code == 200
    assert get_config(live) == (doc, etag)


def test_the_store_keeps_a_put_config_across_restarts_and_reloads(config_file: Path, tmp_path: Path) -> None:
    store = tmp_path / "state" / "served-config.json"
    with start_backend(config_file, timeout=90, extra_args=[STORE_ARG, str(store)]) as backend:
        doc, _ = get_config(backend)
        assert not store.exists()  # nothing PUT yet: config.yaml is served
        response = put(backend, merge(doc, {"fusion": {"method": "linear"}}))
        assert response.status_code == 200 and response.json()["stored"] is True
        put_hash = response.json()["config_hash"]
        assert json.loads(store.read_text()) == get_config(backend)[0]
        assert httpx.post(f"{backend.url}/admin/reload", timeout=60).json()["changed"] == []
        assert [p.name for p in store.parent.iterdir()] == [store.name]  # no temporary file left
    with start_backend(config_file, timeout=90, extra_args=[STORE_ARG, str(store)]) as backend:
        assert served_hash(backend) == put_hash
        assert get_config(backend)[0]["fusion"]["method"] == "linear"
    with start_backend(config_file, timeout=90) as backend:  # without the flag: config.yaml
        assert get_config(backend)[0]["fusion"]["method"] == "rrf"


def test_a_broken_store_stops_the_start_with_exit_2(config_file: Path, tmp_path: Path) -> None:
    store = tmp_path / "served-config.json"
    store.write_text("{not json")
    from support.backend import launch_backend

    backend = launch_backend(config_file, extra_args=[STORE_ARG, str(store)])
    assert backend.process.wait(timeout=60) == 2
    assert f"{store}: the config store is not valid JSON" in backend.stderr()


def test_the_same_overrides_after_a_put_run_on_the_new_config(live: RunningBackend, backends: Backends) -> None:
    # the service keeps the searchers of recent overrides (a tuner sends one trial's with
    # every query); a config PUT in between must never meet a searcher of the old one
    overrides = {"fusion": {"rrf_k": 5}}
    doc, _ = get_config(live)
    first = search(live, "leather sofa", overrides=overrides)
    again = search(live, "leather sofa", overrides=overrides)  # from the kept searcher
    assert (again["results"], again["config_hash"]) == (first["results"], first["config_hash"])
    layer = {"fusion": {"weights": {"bm25": 0.1, "dense": 0.9}}, "citation": {"min_score": 0.0}}
    assert put(live, merge(doc, layer)).status_code == 200
    after = search(live, "leather sofa", overrides=overrides)
    expected = search(backends.get(layer, overrides), "leather sofa")
    assert [(r["doc_id"], round(r["score"], 9)) for r in after["results"]] == [
        (r["doc_id"], round(r["score"], 9)) for r in expected["results"]]
    assert after["config_hash"] != first["config_hash"]
