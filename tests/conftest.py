"""Shared test helpers.

Tests that need a service which may be missing on a user's machine (Docker engine,
PostgreSQL, Chromium, ../shared data) call ``need(condition, reason)``: it skips
with the reason, or fails when TUNER_REQUIRE_INTEGRATION=1 (CI sets it after
provisioning those services).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SHARED = Path(os.environ.get("TUNER_SHARED_DIR", REPO.parent / "shared"))
DATASETS = SHARED / "datasets"

sys.path.insert(0, str(REPO / "tests"))


def integration_required() -> bool:
    return os.environ.get("TUNER_REQUIRE_INTEGRATION") == "1"


def need(condition: bool, reason: str) -> None:
    """Skip (or fail under TUNER_REQUIRE_INTEGRATION=1) when ``condition`` is false."""
    if condition:
        return
    if integration_required():
        pytest.fail(f"integration requirement missing (TUNER_REQUIRE_INTEGRATION=1): {reason}")
    pytest.skip(reason)


@pytest.fixture(scope="session")
def repo_root() -> Path:
    return REPO


@pytest.fixture(scope="session")
def datasets_dir() -> Path:
    """../shared/datasets, or skip/fail with a clear reason when absent."""
    need(DATASETS.is_dir(), f"shared datasets not found at {DATASETS} (set TUNER_SHARED_DIR)")
    return DATASETS
