"""A real PostgreSQL for the multi-worker tests (.ci/provision-30-postgres.sh starts one).

TUNER_TEST_PG_DSN overrides the DSN; the default is the one the provisioning script
creates. Each test gets its own study name and deletes the study afterwards.
"""

from __future__ import annotations

import os
import uuid

import optuna
import pytest
from support.integration import need

from tuner.storage import sqlalchemy_url
from tuner.workers import DEFAULT_TEST_DSN


def _reachable(dsn: str) -> str | None:
    try:
        import psycopg2

        psycopg2.connect(dsn, connect_timeout=3).close()
    except Exception as exc:  # any driver error means "not usable here"
        return f"{type(exc).__name__}: {str(exc).strip()}"
    return None


@pytest.fixture(scope="session")
def pg_dsn() -> str:
    dsn = os.environ.get("TUNER_TEST_PG_DSN", DEFAULT_TEST_DSN)
    problem = _reachable(dsn)
    need(problem is None, f"PostgreSQL not reachable at {dsn} ({problem}); run `bash .ci/provision-30-postgres.sh` "
                          "as root or set TUNER_TEST_PG_DSN")
    return dsn


@pytest.fixture
def pg_study(pg_dsn):
    """(dsn, study name) of a fresh maximising study; deleted after the test."""
    name = f"test-{uuid.uuid4().hex[:12]}"
    url = sqlalchemy_url(pg_dsn)
    optuna.create_study(study_name=name, storage=url, direction="maximize")
    yield url, name
    try:
        optuna.delete_study(study_name=name, storage=url)
    except KeyError:
        pass
