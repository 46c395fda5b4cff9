"""Reload without a restart: ``POST /admin/reload`` and SIGHUP, against real processes.

The contract checked here: a backend reloaded to config X answers every search exactly
as a backend freshly started on X (full responses compared on demo queries); the
fingerprint in /health is the sha256 of the config file bytes; refusals (400 bad config,
409 server.* changed, 503 still loading) keep the old config served; only index
settings rebuild the index. Outcomes only, never timings.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from support.backend import RunningBackend, start_backend, write_backend_config

from tuner.config.experiment import free_port

pytestmark = pytest.mark.slow

NOW = "2025-06-28"  # the demo catalog's "today": temporal queries' windows have content


# --- fixtures ----------------------------------------------------------------------------

class Demo:
    def __init__(self, root: Path) -> None:
        from support.demo_data import copy_demo_data

        copy_demo_data(root / "demo")
        self.root = root
        self.corpus = root / "demo" / "corpus.jsonl"
        self.cache = root / "index-cache"
        rows = [json.loads(line) for line in (root / "demo" / "queries.jsonl").read_text().splitlines()]
        temporal = [q for q in rows if q.get("date_hint_days") is not None][:10]
        other = [q for q in rows if q.get("date_hint_days") is None and q["scope"] == "in"][::12][:10]
        self.queries = [{"now": NOW, **q, "top_k": 20} for q in temporal + other]

    def write(self, path: Path, overrides: dict[str, Any]) -> Path:
        return write_backend_config(path, corpus=self.corpus, index_cache=self.cache, overrides=overrides)


@pytest.fixture(scope="module")
def demo(tmp_path_factory: pytest.TempPathFactory) -> Demo:
    return Demo(tmp_path_factory.mktemp("reload-demo"))


@pytest.fixture(scope="module")
def live(demo: Demo) -> Iterator[RunningBackend]:
    """One backend for the whole module; each test writes its config file and reloads."""
    with start_backend(demo.write(demo.root / "live.yaml", {}), timeout=120) as backend:
        yield backend


def reload(backend: RunningBackend) -> httpx.Response:
    return httpx.post(f"{backend.url}/admin/reload", timeout=120)


def answers(backend: RunningBackend, queries: list[dict[str, Any]]) -> list[dict[str, Any]]:
    out = []
    for body in queries:
        response = backend.search(body)
        assert response.status_code == 200, response.text
        out.append({k: v for k, v in response.json().items() if k != "request_id"})
    return out


def fresh_answers(demo: Demo, config: Path) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Answers and /health of a backend freshly started on a copy of ``config``'s bytes."""
    copy = demo.root / f"fresh-{config.stem}.yaml"
    shutil.copyfile(config, copy)
    with start_backend(copy, timeout=120) as fresh:
        return answers(fresh, demo.queries), fresh.health().json()


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


# --- exactness ---------------------------------------------------------------------------

VARIANTS = {
    "linear-z": {"fusion": {"method": "linear", "normalization": "z", "weights": {"bm25": 0.3, "dense": 0.7}}},
    "rrf-recency-windows": {"fusion": {"method": "rrf", "rrf_k": 5, "weights": {"bm25": 2.0, "dense": 0.5}},
                            "recency": {"weight": 0.5, "half_life_days": 10}, "fallback": {"windows_days": [3, 60]},
                            "confidence": {"threshold": 0.4}, "sources": {"dense": {"min_similarity": 0.1}}},
    "linear-minmax-gates": {"fusion": {"method": "linear", "normalization": "minmax"},
                            "recency": {"weight": 2.0, "half_life_days": 3}, "fallback": {"windows_days": []},
                            "citation": {"min_score": 0.3}, "sources": {"bm25": {"depth": 20}}},
}


@pytest.mark.parametrize("name", list(VARIANTS))
def test_a_reloaded_backend_answers_exactly_as_a_fresh_start(demo: Demo, live: RunningBackend, name: str) -> None:
    config = demo.write(live.config_path, {})
    assert reload(live).status_code == 200
    before = answers(live, demo.queries)

    demo.write(config, VARIANTS[name])
    response = reload(live)
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["status"] == "reloaded" and body["index_rebuilt"] is False
    assert body["config_fingerprint"] == sha256(config)
    assert isinstance(body["seconds"], float)
    reloaded = answers(live, demo.queries)
    assert reloaded != before  # the change took effect ...

    expected, fresh_health = fresh_answers(demo, config)
    assert reloaded == expected  # ... exactly as a fresh start: ids, order, scores, gate, fallback_level
    health = live.health().json()
    assert health["config_hash"] == fresh_health["config_hash"]
    assert health["config_fingerprint"] == fresh_health["config_fingerprint"] == sha256(config)
    assert health["data_fingerprint"] == fresh_health["data_fingerprint"]


def test_an_index_setting_rebuilds_and_still_answers_as_a_fresh_start(demo: Demo, live: RunningBackend) -> None:
    config = demo.write(live.config_path, {})
    assert reload(live).status_code == 200
    data_fingerprint = live.health().json()["data_fingerprint"]

    demo.write(config, {"sources": {"bm25": {"k1": 0.9, "b": 0.4}}, "fusion": {"rrf_k": 20}})
    body = reload(live).json()
    assert body["index_rebuilt"] is True
    assert body["changed"] == ["fusion.rrf_k", "sources.bm25.b", "sources.bm25.k1"]
    assert answers(live, demo.queries) == fresh_answers(demo, config)[0]
    assert live.health().json()["data_fingerprint"] == data_fingerprint  # same data, other index

    demo.write(config, {"sources": {"bm25": {"k1": 0.9, "b": 0.4}}, "fusion": {"rrf_k": 30}})
    body = reload(live).json()
    assert (body["index_rebuilt"], body["changed"]) == (False, ["fusion.rrf_k"])


@pytest.mark.parametrize(("overrides", "rebuilt", "changed"), [
    ({"sources": {"dense": {"enabled": False, "depth": 7}}}, False, ["sources.dense.depth", "sources.dense.enabled"]),
    ({"sources": {"bm25": {"enabled": False}}}, True, ["sources.bm25.enabled"]),
    ({"sources": {"dense": {"dims": 64}}}, True, ["sources.dense.dims"]),
    ({}, False, []),
])
def test_which_keys_rebuild_the_index(demo: Demo, live: RunningBackend, overrides: dict[str, Any], rebuilt: bool,
                                      changed: list[str]) -> None:
    demo.write(live.config_path, {})
    assert reload(live).status_code == 200
    demo.write(live.config_path, overrides)
    body = reload(live).json()
    assert (body["index_rebuilt"], body["changed"]) == (rebuilt, changed)


def test_a_corpus_rewritten_on_disk_is_reloaded_with_the_same_config(demo: Demo, live: RunningBackend) -> None:
    demo.write(live.config_path, {})
    assert reload(live).status_code == 200
    data_fingerprint = live.health().json()["data_fingerprint"]
    stat = demo.corpus.stat()
    os.utime(demo.corpus, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000_000))  # as a regeneration would
    body = reload(live).json()
    assert (body["index_rebuilt"], body["changed"]) == (True, [])
    assert live.health().json()["data_fingerprint"] == data_fingerprint  # same bytes: same data


# --- fingerprint and refusals ------------------------------------------------------------

def test_health_fingerprint_is_the_sha256_of_the_config_bytes(demo: Demo, live: RunningBackend) -> None:
    demo.write(live.config_path, {})
    assert reload(live).status_code == 200
    before = live.health().json()
    assert before["config_fingerprint"] == sha256(live.config_path)

    # A comment-only edit: other bytes, so another fingerprint; the same effective config.
    live.config_path.write_bytes(live.config_path.read_bytes() + b"# edited by hand\n")
    body = reload(live).json()
    after = live.health().json()
    assert body["config_fingerprint"] == after["config_fingerprint"] == sha256(live.config_path)
    assert after["config_fingerprint"] != before["config_fingerprint"]
    assert (body["changed"], after["config_hash"]) == ([], before["config_hash"])
    assert after["reloads"] == before["reloads"] + 1
    for key in ("status", "corpus_size", "corpus_hash", "data_fingerprint", "index_cache_hits", "load_seconds"):
        assert key in after


@pytest.mark.parametrize(("bad", "message"), [
    ({"fallback": {"windows_days": [90, 30]}}, "fallback.windows_days: must be strictly increasing"),
    ({"fusion": {"weights": {"splade": 1.0}}}, "fusion.weights.splade: names an unknown source"),
    ("fusion: {method: rrf\n", "invalid YAML"),
])
def test_a_bad_config_is_refused_with_400_and_the_old_one_stays(demo: Demo, live: RunningBackend, bad: Any,
                                                                 message: str) -> None:
    demo.write(live.config_path, {"fusion": {"method": "linear"}})
    assert reload(live).status_code == 200
    health, served = live.health().json(), answers(live, demo.queries[:3])

    if isinstance(bad, str):
        live.config_path.write_text(bad)
    else:
        demo.write(live.config_path, {"fusion": {"method": "linear"}, **bad})
    response = reload(live)
    assert response.status_code == 400
    error = response.json()["error"]
    assert message in error and str(live.config_path.resolve()) in error and "\n" not in error
    assert error.startswith("config not reloaded: ") and "previous config stays in effect" in error
    assert live.health().json() == health  # fingerprint, hash, reload count unchanged
    assert answers(live, demo.queries[:3]) == served


def test_a_server_port_given_on_the_command_line_is_not_a_change(demo: Demo, live: RunningBackend) -> None:
    # start_backend passes --host/--port: the file's server.* is overridden, at start and on reload.
    demo.write(live.config_path, {})
    assert reload(live).status_code == 200
    demo.write(live.config_path, {"server": {"port": 1}})
    body = reload(live).json()
    assert body["status"] == "reloaded" and body["changed"] == []


def test_reload_before_the_index_is_loaded_is_503(demo: Demo) -> None:
    from fusion_backend.app import create_app
    from fusion_backend.reload import ConfigSource, ServiceState

    source = ConfigSource(demo.write(demo.root / "unloaded.yaml", {}))
    state = ServiceState(source, *source.read())
    app = create_app(state, on_load_failure=lambda: None)

    async def post() -> httpx.Response:  # ASGITransport runs no lifespan: the index never loads
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://backend") as client:
            return await client.post("/admin/reload")

    response = asyncio.run(post())
    assert response.status_code == 503
    assert response.json() == {"error": "the index is still loading: retry the reload when GET /health answers 200"}


def test_reloads_are_serialised_and_a_snapshot_outlives_a_swap(demo: Demo) -> None:
    from fusion_backend.reload import ConfigSource, ServiceState

    source = ConfigSource(demo.write(demo.root / "inproc.yaml", {}))
    state = ServiceState(source, *source.read())
    state.load()
    snapshot = state.current
    demo.write(source.path, {"fusion": {"rrf_k": 7}})
    outcomes: list[tuple[int, dict[str, Any]]] = []
    threads = [threading.Thread(target=lambda: outcomes.append(state.reload_logged("test"))) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(status for status, _ in outcomes) == [200, 200] and state.reloads == 2
    assert sorted(len(body["changed"]) for _, body in outcomes) == [0, 1]  # the second saw the first's result
    assert snapshot is not None and snapshot.cfg.fusion.rrf_k == 60  # an in-flight request's view is intact
    assert state.current is not None and state.current.cfg.fusion.rrf_k == 7


# --- SIGHUP and server.* ------------------------------------------------------------------

@pytest.fixture
def unpinned(demo: Demo, tmp_path: Path) -> Iterator[RunningBackend]:
    """A backend started with no --host/--port: it binds the file's server.port."""
    port = free_port()
    config = demo.write(tmp_path / "config.yaml", {"server": {"host": "127.0.0.1", "port": port}})
    fd, stderr_name = tempfile.mkstemp(prefix="fusion-backend-", suffix=".stderr")
    with os.fdopen(fd, "wb") as stderr:
        process = subprocess.Popen([sys.executable, "-m", "fusion_backend", "serve", "--config", str(config)],
                                   stdout=subprocess.DEVNULL, stderr=stderr, stdin=subprocess.DEVNULL)
    backend = RunningBackend(process, port, config, Path(stderr_name))
    try:
        backend.wait_healthy(120)
        yield backend
    finally:
        backend.stop()
        Path(stderr_name).unlink(missing_ok=True)


def wait_for_fingerprint(backend: RunningBackend, fingerprint: str, deadline_s: float = 30) -> dict[str, Any]:
    deadline = time.monotonic() + deadline_s
    health: dict[str, Any] = {}
    while time.monotonic() < deadline:
        health = backend.health().json()
        if health["config_fingerprint"] == fingerprint:
            return health
        time.sleep(0.05)
    raise AssertionError(f"fingerprint never became {fingerprint}: {health}; stderr:\n{backend.stderr()}")


def test_sighup_reloads_and_a_bad_config_never_crashes_it(demo: Demo, unpinned: RunningBackend) -> None:
    port = unpinned.port
    demo.write(unpinned.config_path, {"server": {"port": port}, "fusion": {"method": "linear"}})
    unpinned.process.send_signal(signal.SIGHUP)
    health = wait_for_fingerprint(unpinned, sha256(unpinned.config_path))
    assert health["reloads"] == 1
    assert httpx.get(f"{unpinned.url}/admin/config").json()["fusion"]["method"] == "linear"

    good = unpinned.config_path.read_bytes()
    unpinned.config_path.write_text("fusion: [not, a, mapping\n")
    unpinned.process.send_signal(signal.SIGHUP)
    deadline = time.monotonic() + 30
    while "reload (SIGHUP) refused [400]" not in unpinned.stderr() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert "reload (SIGHUP) refused [400]: config not reloaded" in unpinned.stderr()
    assert unpinned.process.poll() is None
    assert unpinned.health().json()["config_fingerprint"] == hashlib.sha256(good).hexdigest()


def test_a_server_port_change_needs_a_restart(demo: Demo, unpinned: RunningBackend) -> None:
    fingerprint = unpinned.health().json()["config_fingerprint"]
    demo.write(unpinned.config_path, {"server": {"port": unpinned.port + 1}, "fusion": {"rrf_k": 3}})
    response = reload(unpinned)
    assert response.status_code == 409
    error = response.json()["error"]
    assert error.startswith("restart needed: server.port changed")
    assert f"set server.port back to {unpinned.port}" in error
    assert unpinned.health().json()["config_fingerprint"] == fingerprint
    assert httpx.get(f"{unpinned.url}/admin/config").json()["fusion"]["rrf_k"] == 60
