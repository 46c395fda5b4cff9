"""Every test here starts and ends with no remembered secret values (tuner.secrets keeps
them process-wide, so one test's values would otherwise scrub another's output)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tuner import secrets


@pytest.fixture(autouse=True)
def no_remembered_secrets() -> Iterator[None]:
    secrets.forget_all()
    yield
    secrets.forget_all()
