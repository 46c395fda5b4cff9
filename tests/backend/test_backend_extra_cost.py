"""FUSION_BACKEND_BENCH_CPU_MS (fusion_backend.extra_cost): a benchmark's fixed extra CPU
cost per search. It is spent (CPU time of the searching thread, a lower bound), every
search route spends it, the answers do not change, and a bad value stops the start."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from backend_testdata import NOW, corpus_path, shared_cache  # noqa: F401  (fixtures)
from support.backend import write_backend_config

from fusion_backend import extra_cost
from fusion_backend.errors import ConfigError
from fusion_backend.extra_cost import BENCH_CPU_ENV, burn, cpu_ms_from_env

QUERIES = ("leather sofa", "lamp for reading", "living room table")
REAL_BURN = extra_cost.burn


def test_burn_spends_at_least_the_cpu_time_asked_for() -> None:
    started = time.thread_time()
    rounds = burn(5.0)
    assert time.thread_time() - started >= 0.005 and rounds > 0
    assert burn(0) == 0


@pytest.mark.parametrize(("raw", "ms"), [(None, 0.0), ("", 0.0), (" 0 ", 0.0), ("2.5", 2.5), ("10", 10.0)])
def test_the_cost_is_read_from_the_environment(monkeypatch: pytest.MonkeyPatch, raw: str | None, ms: float) -> None:
    if raw is None:
        monkeypatch.delenv(BENCH_CPU_ENV, raising=False)
    else:
        monkeypatch.setenv(BENCH_CPU_ENV, raw)
    assert cpu_ms_from_env() == ms


@pytest.mark.parametrize("raw", ["fast", "-1", "nan", "inf"])
def test_a_bad_cost_stops_the_start_naming_the_variable(monkeypatch: pytest.MonkeyPatch, raw: str) -> None:
    from fusion_backend.app import create_app
    from fusion_backend.reload import ServiceState

    monkeypatch.setenv(BENCH_CPU_ENV, raw)
    with pytest.raises(ConfigError) as err:
        create_app(ServiceState.__new__(ServiceState), on_load_failure=lambda: None)
    assert BENCH_CPU_ENV in str(err.value) and repr(raw) in str(err.value) and "\n" not in str(err.value)


def answers(config: Path, monkeypatch: pytest.MonkeyPatch, cost: str | None) -> tuple[list[Any], list[float]]:
    """Both search routes' answers from an in-process app (the env var as given), and the
    costs it spent (burn recorded, then run)."""
    from fusion_backend.app import create_app
    from fusion_backend.reload import ConfigSource, ServiceState

    spent: list[float] = []
    monkeypatch.setattr(extra_cost, "burn", lambda ms: spent.append(ms) or REAL_BURN(ms))
    if cost is None:
        monkeypatch.delenv(BENCH_CPU_ENV, raising=False)
    else:
        monkeypatch.setenv(BENCH_CPU_ENV, cost)
    source = ConfigSource(config)
    state = ServiceState(source, *source.read())
    state.load()
    app = create_app(state, on_load_failure=lambda: None)

    async def run() -> list[Any]:
        out = []
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://backend") as client:
            for q in QUERIES:
                r = await client.post("/search", json={"query": q, "top_k": 5, "now": NOW,
                                                       "overrides": {"fusion": {"rrf_k": 30}}})
                out.append((r.status_code, {k: v for k, v in r.json().items() if k != "request_id"}))
                r = await client.post("/search", json={"query": q, "top_k": 5, "now": NOW})
                out.append((r.status_code, {k: v for k, v in r.json().items() if k != "request_id"}))
                r = await client.post("/indexes/furniture/docs/search", json={"search": q, "top": 5})
                out.append((r.status_code, r.json()))
        return out

    return asyncio.run(run()), spent


def test_every_search_spends_the_cost_and_answers_as_without_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                corpus_path: Path, shared_cache: Path) -> None:
    config = write_backend_config(tmp_path / "config.yaml", corpus=corpus_path, index_cache=shared_cache, overrides={})
    plain, spent_plain = answers(config, monkeypatch, None)
    costly, spent = answers(config, monkeypatch, "1.5")
    assert costly == plain and {status for status, _ in plain} == {200}
    assert all(body["results"] for _, body in plain[:2])  # real answers, not empty ones
    assert spent_plain == [] and spent == [1.5] * len(plain)  # /search with and without overrides, the Azure route
