"""A lost connection to the study's database (a server restart, a terminated backend, a
network blip) is waited out, not turned into a failed trial or a traceback.

    is_transient_storage_error(exc) -> bool   # a retry can cure it
    retry_transient(fn) -> fn()                # again after a transient error, 9 s in all
    ride_s() -> float                          # those seconds: $TUNER_STORAGE_RIDE_S, else 9

Two levels use it. The study's RDB storage (tuner.study.storage.database) rides out every
call that is safe to repeat (reads, attribute writes, intermediate values, heartbeats),
so a call anywhere in the trial core -- a pruner's report, a best-trial read beside the
trial line -- waits as the loop's own calls do. The loop (tuner.study.loop) wraps the
composite steps (ask, tell, queueing a retry) with their own repeat-safe logic. Nested, only
the outermost call retries: the waits never multiply.
"""

from __future__ import annotations

import math
import os
import threading
import time
from collections.abc import Callable
from typing import TypeVar

from tuner.errors import ConfigError

T = TypeVar("T")

#: the seconds retry_transient waits in all by default (0.2 + 0.4 + 0.8 + 1.6 + 2 + 2 + 2
#: between its 8 attempts): what a call rides out of a database away
RETRY_WAIT_S = 9
#: sets those seconds for every call of the process (and the processes it starts): a
#: database whose restarts last longer wants more; the fault suite sets less, so that its
#: outages "longer than the ride" take seconds instead of a quarter of a minute
RIDE_ENV = "TUNER_STORAGE_RIDE_S"

_inside = threading.local()


def ride_s() -> float:
    """The seconds a call waits out a database away: $TUNER_STORAGE_RIDE_S, else 9."""
    raw = os.environ.get(RIDE_ENV, "").strip()
    if not raw:
        return RETRY_WAIT_S
    try:
        value = float(raw)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and 0.5 <= value <= 3600):
        raise ConfigError(
            f"{RIDE_ENV}={raw!r}: not a number of seconds from 0.5 to 3600; unset it for the default {RETRY_WAIT_S:g} s"
        )
    return value


def waits(total_s: float, first_wait_s: float = 0.2, max_wait_s: float = 2.0) -> list[float]:
    """The waits between attempts: doubling from ``first_wait_s``, at most ``max_wait_s``
    each, the last one cut so that they add up to ``total_s``."""
    out: list[float] = []
    wait, left = first_wait_s, total_s
    while left > 1e-9:
        out.append(round(min(wait, left), 6))
        left -= out[-1]
        wait = min(wait * 2, max_wait_s)
    return out


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


def retry_transient(
    fn: Callable[[], T], *, total_s: float | None = None, first_wait_s: float = 0.2, max_wait_s: float = 2.0
) -> T:
    """``fn()``, again after a transient database error (is_transient_storage_error), with
    doubling waits of at most ``max_wait_s`` that add up to ``total_s`` (by default
    ride_s()); any other error, or the one after the last wait, is raised. ``fn`` must be
    safe to repeat (idempotent writes). Called inside another retry_transient on the same
    thread, ``fn`` runs once: the outer call retries the whole.

    The default waits 9 s in all (0.2, 0.4, 0.8, 1.6, then 2 s: 8 attempts): a PostgreSQL
    restart keeps the server away for seconds, and 5 attempts (3 s) left a worker's loop
    raising a traceback while the database came back (the fault suite's two-worker restart)."""
    if getattr(_inside, "depth", 0):
        return fn()
    _inside.depth = 1
    try:
        pauses = waits(ride_s() if total_s is None else total_s, first_wait_s, max_wait_s)
        for pause in [*pauses, None]:
            try:
                return fn()
            except Exception as exc:
                if pause is None or not is_transient_storage_error(exc):
                    raise
            time.sleep(pause)
        raise AssertionError("unreachable")
    finally:
        _inside.depth = 0
