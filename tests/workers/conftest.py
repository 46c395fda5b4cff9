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
from support.workers import DEFAULT_TEST_DSN

from tuner.dburl import sqlalchemy_url


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


def _may_create_databases(url: str) -> bool:
    import sqlalchemy as sa

    engine = sa.create_engine(url, poolclass=sa.pool.NullPool)
    try:
        with engine.connect() as conn:
            return bool(conn.execute(sa.text(
                "SELECT rolcreatedb OR rolsuper FROM pg_roles WHERE rolname = current_user")).scalar())
    finally:
        engine.dispose()


@pytest.fixture
def fresh_pg_url(pg_dsn):
    """Factory: ``make() -> (url, kind)``, the SQLAlchemy URL of a brand-new empty place for
    Optuna's schema, dropped after the test.

    ``kind`` is "database" (a new database) when the test role may CREATE DATABASE, else
    "schema": a new schema in the test database, made the only one on the search_path
    through the URL's libpq ``options``. For Optuna both are empty: SQLAlchemy looks for
    its tables and enum types on the search_path, which is where it creates them (the
    provisioning script gives the role no CREATEDB, so CI takes the schema path).
    """
    import sqlalchemy as sa

    base = sa.engine.make_url(sqlalchemy_url(pg_dsn))
    kind = "database" if _may_create_databases(base.render_as_string(hide_password=False)) else "schema"
    admin = sa.create_engine(base, poolclass=sa.pool.NullPool, isolation_level="AUTOCOMMIT")
    made: list[str] = []

    def make() -> tuple[str, str]:
        name = f"tuner_fresh_{uuid.uuid4().hex[:12]}"
        with admin.connect() as conn:
            conn.execute(sa.text(f'CREATE {kind.upper()} "{name}"'))
        made.append(name)
        url = base.set(database=name) if kind == "database" else base.update_query_dict(
            {"options": f"-csearch_path={name}"})
        return url.render_as_string(hide_password=False), kind

    yield make
    with admin.connect() as conn:
        for name in made:
            drop = f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)' if kind == "database" else \
                f'DROP SCHEMA IF EXISTS "{name}" CASCADE'
            conn.execute(sa.text(drop))
    admin.dispose()
