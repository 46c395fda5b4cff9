"""Which failures are the infrastructure's (the study's storage) and which the trial's:
tuner.study.trial.failures.classify_failure, one table."""

from __future__ import annotations

import sqlite3

import optuna
import psycopg2
import pytest
import sqlalchemy as sa

from tuner.errors import BackendExited, EvaluationError, HealthTimeout
from tuner.study.stop import TrialInterrupted
from tuner.study.trial.failures import classify_failure, is_retried_infrastructure, not_retried_reason, retried_reason
from tuner.study.trial.pruning import OOSBudgetExceeded


def chained(outer: BaseException, *causes: BaseException) -> BaseException:
    """``outer`` raised from causes[0], raised from causes[1], ... as the libraries chain them."""
    for upper, lower in zip((outer, *causes), causes):
        upper.__cause__ = lower
    return outer


def restart_cut() -> BaseException:
    """What Optuna raised when PostgreSQL restarted under a commit (issue 27 item 5)."""
    driver = psycopg2.OperationalError("terminating connection due to administrator command\nSSL SYSCALL ...")
    return chained(optuna.exceptions.StorageInternalError("An exception is raised during the commit."),
                   sa.exc.OperationalError("UPDATE trials ...", {}, driver), driver)


CASES = [
    # (the error, its kind, the start of its reason)
    (restart_cut(), "infrastructure",
     "infrastructure: the study's storage failed: StorageInternalError (OperationalError: terminating connection "
     "due to administrator command)"),
    (sa.exc.OperationalError("INSERT", {}, sqlite3.OperationalError("database is locked")), "infrastructure",
     "infrastructure: the study's storage failed: OperationalError: (sqlite3.OperationalError) database is locked"),
    (sa.exc.InterfaceError("SELECT", {}, psycopg2.InterfaceError("connection already closed")), "infrastructure",
     "infrastructure: the study's storage failed: InterfaceError:"),
    (sa.exc.DBAPIError("SELECT", {}, ConnectionResetError(104, "Connection reset by peer"),
                       connection_invalidated=True), "infrastructure",
     "infrastructure: the study's storage failed: DBAPIError:"),
    (sa.exc.TimeoutError("QueuePool limit of size 2 overflow 4 reached"), "infrastructure",
     "infrastructure: the study's storage failed: TimeoutError: QueuePool limit"),
    (psycopg2.OperationalError("connection to server at \"127.0.0.1\", port 5432 failed: Connection refused"),
     "infrastructure", "infrastructure: the study's storage failed: OperationalError: connection to server"),
    # a tuner error raised while the storage was failing under it is the storage's
    (chained(EvaluationError("could not report query q3"), sa.exc.OperationalError("INSERT", {}, Exception("gone"))),
     "infrastructure", "infrastructure: the study's storage failed: EvaluationError (OperationalError:"),
    # the database refused the data: a retry would repeat it
    (chained(optuna.exceptions.StorageInternalError("An exception is raised during the commit."),
             sa.exc.IntegrityError("INSERT", {}, Exception("duplicate key"))), "crash",
     "crash: StorageInternalError: An exception is raised during the commit."),
    (EvaluationError("3 of 10 queries failed (max_failed_queries=2)"), "trial",
     "EvaluationError: 3 of 10 queries failed"),
    (HealthTimeout("backend not healthy within 60 s"), "trial", "HealthTimeout: backend not healthy"),
    (BackendExited("backend exited with code 3"), "trial", "BackendExited: backend exited with code 3"),
    (TrialInterrupted("interrupted by SIGTERM before evaluation; the trial did not run"), "interrupted",
     "interrupted by SIGTERM before evaluation"),
    (optuna.TrialPruned(), "pruned", "pruned"),
    (OOSBudgetExceeded(3, 1, 5, 0.2), "early_stop", ""),
    # a connection reset by the backend (HTTP), not by the database: the trial's own
    (ConnectionResetError(104, "Connection reset by peer"), "crash", "crash: ConnectionResetError:"),
    (KeyError("objective"), "crash", "crash: KeyError: 'objective'"),
]


@pytest.mark.parametrize(("exc", "kind", "reason"), CASES, ids=[f"{i}-{c[1]}" for i, c in enumerate(CASES)])
def test_classify_failure(exc: BaseException, kind: str, reason: str) -> None:
    failure = classify_failure(exc)
    assert failure.kind == kind
    assert failure.reason.startswith(reason), failure.reason
    assert "\n" not in failure.reason


def test_a_retried_infrastructure_reason_is_recognised_and_nothing_else() -> None:
    reason = classify_failure(restart_cut()).reason
    assert is_retried_infrastructure(retried_reason(reason, 7))
    assert retried_reason(reason, 7).endswith("(retried as trial #7)")
    assert not is_retried_infrastructure(reason)
    assert not is_retried_infrastructure(not_retried_reason(reason, "it is a retry already"))
    assert not is_retried_infrastructure("crash: ValueError: (retried as trial #7)")
    assert not is_retried_infrastructure(None)


def test_the_reason_names_the_error_that_says_what_happened() -> None:
    # as a pre-ping under a restart chains them: the driver's error is raised while the
    # pool's InvalidatePoolError (no message) is handled
    driver = psycopg2.OperationalError("server closed the connection unexpectedly")
    driver.__context__ = sa.exc.InvalidatePoolError()
    exc = chained(optuna.exceptions.StorageInternalError("An exception is raised during the commit."),
                  sa.exc.OperationalError("SELECT 1", {}, driver), driver)
    assert classify_failure(exc).reason == ("infrastructure: the study's storage failed: StorageInternalError "
                                            "(OperationalError: server closed the connection unexpectedly)")
