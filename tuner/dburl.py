"""Database URLs for Optuna and MLflow storage: an installed driver named, no password in messages."""

from __future__ import annotations

import importlib.util

from tuner.errors import StudyError


def sqlalchemy_url(url: str) -> str:
    """``postgresql://`` with an explicit driver that is installed.

    SQLAlchemy 2.1 maps a bare ``postgresql://`` to psycopg 3, while the tuner's test
    extra (and many machines) have psycopg2; a URL that names its driver is kept.
    """
    scheme, sep, rest = url.partition("://")
    if scheme.lower() not in ("postgresql", "postgres") or not sep:
        return url
    for module, driver in (("psycopg", "psycopg"), ("psycopg2", "psycopg2")):
        if importlib.util.find_spec(module) is not None:
            return f"postgresql+{driver}://{rest}"
    raise StudyError(
        f"storage {redact(url)} needs a PostgreSQL driver: pip install psycopg2-binary (or psycopg[binary])"
    )


def redact(url: str) -> str:
    """The URL without its password, for messages."""
    head, sep, tail = url.partition("://")
    if "@" not in tail:
        return url
    creds, _, host = tail.rpartition("@")
    user = creds.split(":", 1)[0]
    return f"{head}{sep}{user}:***@{host}"
