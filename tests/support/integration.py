"""Skip-or-fail rule for tests that need a service a user's machine may lack.

``need(condition, reason)`` skips with the reason, or fails when
TUNER_REQUIRE_INTEGRATION=1 (CI sets it after provisioning Docker, PostgreSQL,
Chromium and ../shared). Import it as ``from support.integration import need``:
a module named ``conftest`` is ambiguous once sub-folders have their own.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SHARED = Path(os.environ.get("TUNER_SHARED_DIR", REPO.parent / "shared"))
DATASETS = SHARED / "datasets"


def integration_required() -> bool:
    return os.environ.get("TUNER_REQUIRE_INTEGRATION") == "1"


def need(condition: bool, reason: str) -> None:
    """Skip (or fail under TUNER_REQUIRE_INTEGRATION=1) when ``condition`` is false."""
    if condition:
        return
    if integration_required():
        pytest.fail(f"integration requirement missing (TUNER_REQUIRE_INTEGRATION=1): {reason}")
    pytest.skip(reason)
