"""Why a trial failed, decided in one place: `classify_failure` (pure) turns the error a
trial's stages ended with into a kind and the one-line ``fail_reason`` it records.

The kind decides what the loop does with the trial:

- ``interrupted`` (a stop before its evaluation), ``early_stop`` (the OOS early stop:
  COMPLETE and infeasible), ``pruned``: as before;
- ``infrastructure``: the study's own storage failed under the trial (Optuna's
  StorageInternalError, a SQLAlchemy OperationalError / InterfaceError / disconnect, a
  database driver's connection error: a PostgreSQL restart, a connection cut, a SQLite
  file locked too long). Nothing is known about the trial's config: the loop queues the
  same params again (tuner.study.storage.retry) and the failed trial's reason says so;
- ``trial``: the tuner's own errors about the trial (the backend never healthy, it
  exited, too many failed queries, a bad answer): the config's or the backend's
  verdict, kept;
- ``crash``: anything else, a bug in a collaborator (a storage error the database raised
  for the data written -- a constraint, a value too long -- is one: a retry repeats it);
  the trial fails, the study goes on.

The storage error is looked for through the whole cause chain (``__cause__`` and
``__context__``): Optuna wraps a failed commit in StorageInternalError, whose own
message ("... invalid data in the commit, e.g. exceeding max length") hides the
connection error under it, so the reason names the driver's error too.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import optuna

from tuner.errors import TunerError
from tuner.study.stop import TrialInterrupted
from tuner.study.trial.pruning import OOSBudgetExceeded

FailureKind = Literal["interrupted", "early_stop", "pruned", "infrastructure", "trial", "crash"]

INFRASTRUCTURE = "infrastructure"  # the fail_reason prefix of a trial failed by the study's storage
RETRIED_AS = "retried as trial #"  # in an infrastructure failure's reason once its params were queued again

# (module prefix, class name) of the storage errors, matched along an exception's MRO so
# nothing is imported to classify (the drivers are optional)
_STORAGE_ERRORS = (
    ("optuna.exceptions", "StorageInternalError"),
    ("sqlalchemy.exc", "OperationalError"),
    ("sqlalchemy.exc", "InterfaceError"),
    ("sqlalchemy.exc", "DisconnectionError"),
    ("sqlalchemy.exc", "TimeoutError"),  # the connection pool's: no connection within pool_timeout
    ("psycopg2", "OperationalError"),
    ("psycopg2", "InterfaceError"),
    ("psycopg", "OperationalError"),
    ("psycopg", "InterfaceError"),
    ("sqlite3", "OperationalError"),
    ("sqlite3", "InterfaceError"),
    ("pymysql", "OperationalError"),
    ("pymysql", "InterfaceError"),
    ("MySQLdb", "OperationalError"),
    ("MySQLdb", "InterfaceError"),
)

# the database refused the data (Optuna wraps these in StorageInternalError too): not infrastructure
_DATA_ERRORS = frozenset({"IntegrityError", "DataError", "ProgrammingError", "NotSupportedError"})


@dataclass(frozen=True)
class Failure:
    kind: FailureKind
    reason: str  # the trial's fail_reason (first line only: the runner keeps one line)


def classify_failure(exc: BaseException) -> Failure:
    """The kind of a trial's failure and its one-line reason (see the module doc)."""
    if isinstance(exc, TrialInterrupted):
        return Failure("interrupted", str(exc))
    if isinstance(exc, OOSBudgetExceeded):
        return Failure("early_stop", str(exc))
    storage = storage_errors(exc)
    if storage and not _data_error_in(exc):
        # the innermost with words in it (the driver's) says what happened to the connection;
        # a pool's own bookkeeping error (InvalidatePoolError "()") says nothing
        inner = next((e for e in reversed(storage) if any(c.isalpha() for c in str(e))), storage[-1])
        named = _named(inner) if inner is exc else f"{type(exc).__name__} ({_named(inner)})"
        return Failure("infrastructure", f"{INFRASTRUCTURE}: the study's storage failed: {named}")
    if isinstance(exc, optuna.TrialPruned):
        return Failure("pruned", str(exc) or "pruned")
    if isinstance(exc, TunerError):
        return Failure("trial", _named(exc))
    return Failure("crash", f"crash: {_named(exc)}")


def storage_errors(exc: BaseException) -> list[BaseException]:
    """The storage errors in ``exc``'s cause chain, outermost first (empty: none)."""
    return [e for e in _chain(exc) if _is_storage_error(e)]


def _chain(exc: BaseException) -> list[BaseException]:
    out: list[BaseException] = []
    current: BaseException | None = exc
    while current is not None and all(current is not seen for seen in out):
        out.append(current)
        current = current.__cause__ or current.__context__
    return out


def _data_error_in(exc: BaseException) -> bool:
    """Whether the database refused what was written (a constraint, a value too long): an
    error of the data, which a retry repeats, not of the connection."""
    return any(cls.__name__ in _DATA_ERRORS for e in _chain(exc) for cls in type(e).__mro__)


def _is_storage_error(exc: BaseException) -> bool:
    for cls in type(exc).__mro__:
        module = cls.__module__ or ""
        if any(
            cls.__name__ == name and (module == prefix or module.startswith(prefix + "."))
            for prefix, name in _STORAGE_ERRORS
        ):
            return True
    # any DB-API error SQLAlchemy saw the connection die under (a reset, a closed socket)
    return bool(getattr(exc, "connection_invalidated", False)) and type(exc).__module__.startswith("sqlalchemy")


def _named(exc: BaseException) -> str:
    text = str(exc).strip()
    first = text.splitlines()[0].strip() if text else ""
    return f"{type(exc).__name__}: {first}" if first else type(exc).__name__


def retried_reason(reason: str, number: int) -> str:
    """An infrastructure failure's reason once its params are queued again as ``number``."""
    return f"{reason} ({RETRIED_AS}{number})"


def not_retried_reason(reason: str, why: str) -> str:
    """An infrastructure failure's reason when it could not be retried, and why."""
    return f"{reason} (not retried: {why})"


def is_retried_infrastructure(reason: str | None) -> bool:
    """Whether a recorded fail_reason is an infrastructure failure whose retry was queued:
    its retry stands for it (in n_trials and the failure budget)."""
    return bool(reason) and str(reason).startswith(INFRASTRUCTURE) and f"({RETRIED_AS}" in str(reason)
