"""Storage URLs of a study, and the one safe way to open Optuna's RDBStorage on them:
the thing `tuner run`, `worker`, `apply` and the dashboards all need before they know
anything else about a study.

    sqlalchemy_url(url) -> str                  # postgresql:// names an installed driver
    redact(url) -> str                          # the URL without its password
    rdb_storage(url, **rdb_kwargs) -> RDBStorage   # schema creation serialised across processes
    with database_lock(url): ...                # one process at a time per database

Optuna and SQLAlchemy are imported inside the functions: this module sits below every
user of a storage, including commands that never open one.
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import hashlib
import os
import time
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tuner.dburl import redact, sqlalchemy_url
from tuner.errors import StudyError

if TYPE_CHECKING:
    import optuna

# How long a process waits for another one to finish creating the schema. Creation takes
# well under a second; only a process stuck while holding the lock makes anyone wait.
LOCK_TIMEOUT_S = 120.0
_LOCK_NAME = "tuner.storage.schema"
# pg_advisory_lock takes a bigint; a hash of the name keeps clear of the study locks'
# keys (tuner.study.storage.study_storage.storage_lock, tuner.study.storage.db_lock), which hash
# other names the same way.
_PG_LOCK_KEY = int.from_bytes(hashlib.blake2b(_LOCK_NAME.encode(), digest_size=8).digest(), "big", signed=True)
_SQLITE_POLL_S = 0.05


def rdb_storage(url: str, *, existing: bool = False, **rdb_kwargs: Any) -> optuna.storages.RDBStorage:
    """``optuna.storages.RDBStorage(sqlalchemy_url(url), **rdb_kwargs)``, built while
    holding `database_lock`.

    RDBStorage creates its schema on construction (``metadata.create_all``, then the
    version row and the alembic stamp) with check-then-create steps that are not atomic:
    N processes starting on an empty database race, and all but one can die with
    ``type "studydirection" already exists`` (PostgreSQL) or ``table ... already exists``
    (SQLite). Under the lock the first process creates the schema and the others find
    it. ``rdb_kwargs`` go to RDBStorage unchanged (engine_kwargs, heartbeat_interval,
    grace_period, heartbeat_stale_trial_callback, ...). Connection errors propagate as
    SQLAlchemy raises them; a lock not obtained raises StudyError. ``existing``: the
    schema is there already (a command reading a study a run made): no lock, no table
    creation, no schema version check (alembic reading its migration scripts).
    """
    import optuna

    from tuner.optuna_adapter import rdb_construction

    url = sqlalchemy_url(url)
    # A database server can restart under a study: its storage rides that out (see
    # RidingRDBStorage). A SQLite file has no connection to lose; its OperationalErrors
    # (a full disk) are not waited on.
    kind = optuna.storages.RDBStorage if url.startswith("sqlite") else riding_rdb_storage_class()
    if existing:  # no schema to create or check, no alembic revision to read
        with warnings.catch_warnings(), rdb_construction(existing=True):
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            return kind(url, skip_compatibility_check=True, skip_table_creation=True, **rdb_kwargs)
    with database_lock(url, engine_kwargs=rdb_kwargs.get("engine_kwargs")), warnings.catch_warnings():
        # heartbeat_interval has been "experimental" since optuna 2.9 and is relied upon.
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        with rdb_construction(existing=False):
            return kind(url, **rdb_kwargs)


@functools.cache
def riding_rdb_storage_class() -> type[optuna.storages.RDBStorage]:
    """``RidingRDBStorage``: Optuna's RDBStorage whose calls that are safe to repeat
    (tuner.optuna_adapter.RDB_CALLS_SAFE_TO_REPEAT) wait out a lost connection
    (tuner.study.storage.transient.retry_transient, 9 s): a database restart mid-trial
    met a pruner's report or a best-trial read that nothing retried, and ended a worker
    with "unreachable" a second after the server was back. Built on first use (Optuna is
    imported late here); also the module attribute ``RidingRDBStorage``, so a pickled
    storage finds its class."""
    import optuna

    from tuner.optuna_adapter import RDB_CALLS_SAFE_TO_REPEAT
    from tuner.study.storage.transient import retry_transient

    def riding(name: str) -> Any:
        base = getattr(optuna.storages.RDBStorage, name)

        @functools.wraps(base)
        def call(self: Any, *args: Any, **kwargs: Any) -> Any:
            return retry_transient(lambda: base(self, *args, **kwargs))

        return call

    namespace: dict[str, Any] = {name: riding(name) for name in RDB_CALLS_SAFE_TO_REPEAT}
    namespace.update(__module__=__name__, __qualname__="RidingRDBStorage", __doc__=riding_rdb_storage_class.__doc__)
    return type("RidingRDBStorage", (optuna.storages.RDBStorage,), namespace)


def __getattr__(name: str) -> Any:
    if name == "RidingRDBStorage":
        return riding_rdb_storage_class()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


@contextlib.contextmanager
def database_lock(
    url: str, *, timeout_s: float = LOCK_TIMEOUT_S, engine_kwargs: dict[str, Any] | None = None
) -> Iterator[None]:
    """Held by one process at a time among all that open the database at ``url``.

    PostgreSQL: a session-level ``pg_advisory_lock`` on a fixed key; MySQL: ``GET_LOCK``.
    Either is taken on a short-lived connection of its own (not the storage's pool), so
    the server drops it if the process dies. SQLite: ``flock`` on ``<db file>.lock``,
    which the kernel drops with the process. An in-memory or unknown database gets no
    lock: nothing else can open it. Not re-entrant: do not nest it for the same URL.
    ``engine_kwargs`` are the storage's, for their ``connect_args`` (TLS, options).
    """
    import sqlalchemy as sa

    url = sqlalchemy_url(url)
    parsed = sa.engine.make_url(url)
    backend = parsed.get_backend_name()
    if backend == "sqlite":
        with _sqlite_lock(parsed.database, timeout_s):
            yield
    elif backend in ("postgresql", "mysql"):
        with _server_lock(url, backend, timeout_s, (engine_kwargs or {}).get("connect_args", {})):
            yield
    else:
        yield


@contextlib.contextmanager
def _server_lock(url: str, backend: str, timeout_s: float, connect_args: dict[str, Any]) -> Iterator[None]:
    import sqlalchemy as sa

    engine = sa.create_engine(url, poolclass=sa.pool.NullPool, connect_args=connect_args)
    try:
        with engine.connect() as conn:
            conn = conn.execution_options(isolation_level="AUTOCOMMIT")
            if backend == "postgresql":
                _pg_lock(conn, url, timeout_s)
                unlock = sa.text("SELECT pg_advisory_unlock(:k)").bindparams(k=_PG_LOCK_KEY)
            else:
                got = conn.execute(sa.text("SELECT GET_LOCK(:n, :t)"), {"n": _LOCK_NAME, "t": timeout_s}).scalar()
                if got != 1:
                    raise _timeout(url, timeout_s)
                unlock = sa.text("SELECT RELEASE_LOCK(:n)").bindparams(n=_LOCK_NAME)
            try:
                yield
            finally:
                # Closing the connection releases the lock too; unlocking first keeps the
                # wait of the next process short if closing is slow.
                with contextlib.suppress(sa.exc.SQLAlchemyError):
                    conn.execute(unlock)
    finally:
        engine.dispose()


def _pg_lock(conn: Any, url: str, timeout_s: float) -> None:
    import sqlalchemy as sa

    # lock_timeout bounds the wait of pg_advisory_lock (SQLSTATE 55P03 when it expires).
    conn.execute(sa.text("SELECT set_config('lock_timeout', :ms, false)"), {"ms": f"{int(timeout_s * 1000)}"})
    try:
        conn.execute(sa.text("SELECT pg_advisory_lock(:k)"), {"k": _PG_LOCK_KEY})
    except sa.exc.OperationalError as exc:
        if getattr(exc.orig, "pgcode", None) == "55P03" or "lock timeout" in str(exc):
            raise _timeout(url, timeout_s) from exc
        raise


@contextlib.contextmanager
def _sqlite_lock(database: str | None, timeout_s: float) -> Iterator[None]:
    if not database or database == ":memory:" or database.startswith("file:"):
        yield
        return
    path = Path(f"{database}.lock")
    if not path.parent.is_dir():
        # SQLite will refuse the database with its own error; no lock file to make.
        yield
        return
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        end = time.monotonic() + timeout_s
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > end:
                    raise _timeout(f"sqlite:///{database}", timeout_s) from None
                time.sleep(_SQLITE_POLL_S)
        try:
            yield
        finally:
            fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)


def _timeout(url: str, timeout_s: float) -> StudyError:
    return StudyError(
        f"storage {redact(url)}: another process held the tuner's database lock for more than {timeout_s:g} s;"
        " stop the stuck tuner process (or wait for it) and start again"
    )
