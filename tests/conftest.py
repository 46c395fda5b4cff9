"""Shared test helpers.

Tests that need a service which may be missing on a user's machine (Docker engine,
PostgreSQL, Chromium, ../shared data) call ``need(condition, reason)``: it skips
with the reason, or fails when TUNER_REQUIRE_INTEGRATION=1 (CI sets it after
provisioning those services).

Every reference backend the session starts (directly, through `tuner`, in any xdist
worker) shares one index cache through $FUSION_BACKEND_INDEX_CACHE, set here: the
cache is content-addressed, so the seeded demo corpus's dense index is built once per
run instead of once per test project. Set the variable yourself to keep the cache
between runs; a test about the cache itself uses the ``own_index_cache`` fixture.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))

from support.integration import DATASETS, SHARED, integration_required, need  # noqa: E402

__all__ = ["DATASETS", "SHARED", "integration_required", "need"]

INDEX_CACHE_ENV = "FUSION_BACKEND_INDEX_CACHE"  # fusion_backend.index.INDEX_CACHE_ENV
_MADE_INDEX_CACHE = pytest.StashKey[str]()


def pytest_configure(config: pytest.Config) -> None:
    # The first process of the run (the xdist controller, or the only one) makes the
    # directory; xdist workers inherit the variable from it and every subprocess from them.
    if not os.environ.get(INDEX_CACHE_ENV):
        made = tempfile.mkdtemp(prefix="fusion-tuner-test-index-cache-")
        os.environ[INDEX_CACHE_ENV] = made
        config.stash[_MADE_INDEX_CACHE] = made


def pytest_unconfigure(config: pytest.Config) -> None:
    made = config.stash.get(_MADE_INDEX_CACHE, None)
    if made is not None:
        shutil.rmtree(made, ignore_errors=True)
        if os.environ.get(INDEX_CACHE_ENV) == made:
            del os.environ[INDEX_CACHE_ENV]


@pytest.fixture
def own_index_cache(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """The backends this test starts (and ``load_index`` in it) use their config's
    ``data.index_cache``, not the session's shared cache: for tests of the cache itself."""
    monkeypatch.delenv(INDEX_CACHE_ENV, raising=False)
    yield


@pytest.fixture(scope="session")
def repo_root() -> Path:
    return REPO


@pytest.fixture(scope="session")
def datasets_dir() -> Path:
    """../shared/datasets, or skip/fail with a clear reason when absent."""
    need(DATASETS.is_dir(), f"shared datasets not found at {DATASETS} (set TUNER_SHARED_DIR)")
    return DATASETS


@pytest.fixture(scope="session")
def cran_inputs(datasets_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Cranfield as JSONL corpus + queries, TREC qrels and two TREC runs (support/cranfield_files.py)."""
    from support.cranfield_files import build_inputs

    return build_inputs(datasets_dir, tmp_path_factory.mktemp("cran-inputs"))


@pytest.fixture(scope="session")
def cran_bundle(cran_inputs: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    """The `files` import of ``cran_inputs``: (bundle dir, importer stdout). Copy it before changing it."""
    from support.cranfield_files import import_bundle

    return import_bundle(cran_inputs, tmp_path_factory.mktemp("cran-bundle") / "cran")
