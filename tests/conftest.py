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
