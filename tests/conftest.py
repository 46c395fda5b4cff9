"""Shared test helpers.

Tests that need a service which may be missing on a user's machine (Docker engine,
PostgreSQL, Chromium, ../shared data) call ``need(condition, reason)``: it skips
with the reason, or fails when TUNER_REQUIRE_INTEGRATION=1 (CI sets it after
provisioning those services).
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))

from support.integration import DATASETS, SHARED, integration_required, need  # noqa: E402

__all__ = ["DATASETS", "SHARED", "integration_required", "need"]


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
