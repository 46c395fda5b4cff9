"""A lost connection to the study's database (a server restart, a terminated backend, a
network blip) is waited out, not turned into a failed trial or a traceback.

    is_transient_storage_error(exc) -> bool   # a retry can cure it
    retry_transient(fn) -> fn()                # again after a transient error, 9 s in all

Two levels use it. The study's RDB storage (tuner.study.storage.database) rides out every
call that is safe to repeat (reads, attribute writes, intermediate values, heartbeats),
so a call anywhere in the trial core -- a pruner's report, a best-trial read beside the
trial line -- waits as the loop's own calls do. The loop (tuner.study.loop) wraps the
composite steps (ask, tell, queueing a retry) with their own repeat-safe logic. Nested, only
the outermost call retries: the waits never multiply.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")

#: the seconds retry_transient's defaults wait in all (0.2 + 0.4 + 0.8 + 1.6 + 2 + 2 + 2
#: between its 8 attempts): what a call rides out of a database away
RETRY_WAIT_S = 9

_inside = threading.local()


def is_transient_storage_error(exc: BaseException) -> bool:
    """A database error a retry can cure: the connection was lost (a server restart, a
    terminated backend, a network blip), anywhere in the exception's cause chain (Optuna
    wraps a failed commit in StorageInternalError)."""
    import sqlalchemy as sa

    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, sa.exc.DBAPIError) and seen.connection_invalidated:
            return True
        if isinstance(seen, sa.exc.OperationalError):
            return not _sqlite_for_good(seen)
        seen = seen.__cause__ or seen.__context__
    return False


def _sqlite_for_good(error: BaseException) -> bool:
    """A SQLite error no wait cures: a SQLite file has no connection to lose, so only a
    busy or locked database passes; a full disk, a read-only or unopenable file stay as
    they are (waiting them out cost a full-disk run 70 s before its one-line error)."""
    import sqlite3

    orig = getattr(error, "orig", None)
    if not isinstance(orig, sqlite3.Error):
        return False
    text = str(orig).lower()
    return "locked" not in text and "busy" not in text


def retry_transient(fn: Callable[[], T], *, attempts: int = 8, first_wait_s: float = 0.2, max_wait_s: float = 2.0) -> T:
    """``fn()``, again after a transient database error (is_transient_storage_error), up to
    ``attempts`` times with doubling waits of at most ``max_wait_s``; any other error, or
    the last one, is raised. ``fn`` must be safe to repeat (idempotent writes). Called
    inside another retry_transient on the same thread, ``fn`` runs once: the outer call
    retries the whole.

    The defaults wait 9 s in all (0.2, 0.4, 0.8, 1.6, then 2 s): a PostgreSQL restart keeps
    the server away for seconds, and 5 attempts (3 s) left a worker's loop raising a
    traceback while the database came back (the fault suite's two-worker restart)."""
    if getattr(_inside, "depth", 0):
        return fn()
    _inside.depth = 1
    try:
        wait = first_wait_s
        for attempt in range(1, attempts + 1):
            try:
                return fn()
            except Exception as exc:
                if attempt == attempts or not is_transient_storage_error(exc):
                    raise
            time.sleep(wait)
            wait = min(wait * 2, max_wait_s)
        raise AssertionError("unreachable")
    finally:
        _inside.depth = 0
