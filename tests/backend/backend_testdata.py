"""Test data, helpers and fixtures for the reference backend's tests.

Not a conftest.py on purpose: other test packages import the root conftest as
``conftest``, and a second conftest module of that name would shadow it. Test modules
import the fixtures they use from here.

The corpus is furniture with dates relative to ``NOW`` (2024-06-01) so date windows
have known contents: the three lamps are 22 days old, 73 days old and undated.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from support.backend import RunningBackend, start_backend, write_backend_config

NOW = "2024-06-01"

DOCS: list[dict[str, Any]] = [
    {"doc_id": "d01", "title": "Red leather sofa", "text": "A three seat sofa in red leather for the living room.", "date": "2024-05-30"},
    {"doc_id": "d02", "title": "Blue velvet couch", "text": "A deep couch upholstered in blue velvet, soft cushions.", "date": "2024-05-20"},
    {"doc_id": "d03", "title": "Green fabric sofa", "text": "Compact sofa in green fabric, two seats, living room.", "date": "2024-04-15"},
    {"doc_id": "d04", "title": "Oak dining table", "text": "Solid oak dining table that seats six people.", "date": "2024-03-01"},
    {"doc_id": "d05", "title": "Walnut coffee table", "text": "Low coffee table in walnut wood for the living room.", "date": None},
    {"doc_id": "d06", "title": "Leather armchair", "text": "Brown leather armchair, a classic reading chair.", "date": "2023-11-02"},
    {"doc_id": "d07", "title": "Brass floor lamp", "text": "Tall brass floor lamp with a linen shade for reading.", "date": "2024-05-10"},
    {"doc_id": "d08", "title": "Ceramic table lamp", "text": "Ceramic table lamp, white glaze, warm light.", "date": "2024-03-20"},
    {"doc_id": "d09", "title": "Paper pendant lamp", "text": "Round paper pendant lamp for the dining room.", "date": None},
    {"doc_id": "d10", "title": "Wool area rug", "text": "Hand woven wool rug for the living room floor.", "date": "2024-05-31"},
    {"doc_id": "d11", "title": "Jute rug", "text": "Natural jute rug, flat weave, hallway or porch.", "date": "2023-06-01"},
    {"doc_id": "d12", "title": "Linen sofa bed", "text": "Sofa bed in grey linen that folds out for guests.", "date": "2024-01-05"},
    {"doc_id": "d13", "title": "Velvet cushion set", "text": "Two velvet cushions in emerald green for a sofa or couch.", "date": "2024-05-25"},
    {"doc_id": "d14", "title": "Teak garden bench", "text": "Outdoor teak bench for the garden or porch.", "date": "2022-07-01"},
]

# BM25 alone: every lexical match is a hit, so date windows behave exactly as planned.
BM25_ONLY: dict[str, Any] = {"sources": {"dense": {"enabled": False}}}


def write_corpus(path: Path, docs: list[dict[str, Any]] = DOCS) -> Path:
    path.write_text("".join(json.dumps(d) + "\n" for d in docs))
    return path


class Backends:
    """One live service per distinct config (started on first use, stopped at the end)."""

    def __init__(self, root: Path, corpus: Path, cache: Path) -> None:
        self._root, self._corpus, self._cache = root, corpus, cache
        self._running: dict[str, tuple[Any, RunningBackend]] = {}

    def config(self, overrides: dict[str, Any]) -> Path:
        key = json.dumps(overrides, sort_keys=True)
        path = self._root / f"config-{len(self._running)}-{abs(hash(key)) % 10**8}.yaml"
        return write_backend_config(path, corpus=self._corpus, index_cache=self._cache, overrides=overrides)

    def get(self, *layers: dict[str, Any]) -> RunningBackend:
        overrides = merge(*layers)
        key = json.dumps(overrides, sort_keys=True)
        if key not in self._running:
            ctx = start_backend(self.config(overrides), timeout=90)
            self._running[key] = (ctx, ctx.__enter__())
        return self._running[key][1]

    def close(self) -> None:
        for ctx, _ in self._running.values():
            ctx.__exit__(None, None, None)


def merge(*layers: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for layer in layers:
        _merge_into(out, layer)
    return out


def _merge_into(target: dict[str, Any], layer: dict[str, Any]) -> None:
    for key, value in layer.items():
        if isinstance(value, dict) and isinstance(target.get(key), dict):
            _merge_into(target[key], value)
        else:
            target[key] = json.loads(json.dumps(value))


def search(backend: RunningBackend, query: str, **extra: Any) -> dict[str, Any]:
    body = {"query": query, "top_k": 50, "now": NOW, **extra}
    response = backend.search(body)
    assert response.status_code == 200, response.text
    return response.json()


def ids(payload: dict[str, Any]) -> list[str]:
    return [r["doc_id"] for r in payload["results"]]


@pytest.fixture(scope="session")
def corpus_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_corpus(tmp_path_factory.mktemp("corpus") / "corpus.jsonl")


@pytest.fixture(scope="session")
def shared_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("index-cache")


# Module scope: the ~13 services it starts stop when test_backend_service.py (its one user)
# ends, instead of idling in that xdist worker until the session ends.
@pytest.fixture(scope="module")
def backends(tmp_path_factory: pytest.TempPathFactory, corpus_path: Path, shared_cache: Path) -> Iterator[Backends]:
    pool = Backends(tmp_path_factory.mktemp("configs"), corpus_path, shared_cache)
    yield pool
    pool.close()
