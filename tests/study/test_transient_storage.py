"""Transient database errors (a lost connection) are retried where the pipelined loop
talks to the study's database beside a running trial; other errors are not."""

from __future__ import annotations

import optuna
import pytest
import sqlalchemy as sa

from tuner.study.storage.transient import is_transient_storage_error, retry_transient


def lost_connection() -> Exception:
    return sa.exc.OperationalError("INSERT ...", {}, Exception("server closed the connection unexpectedly"))


def wrapped_by_optuna() -> Exception:
    try:
        try:
            raise lost_connection()
        except sa.exc.SQLAlchemyError as e:
            raise optuna.exceptions.StorageInternalError("An exception is raised during the commit.") from e
    except optuna.exceptions.StorageInternalError as exc:
        return exc


def test_a_lost_connection_is_transient_also_under_optunas_wrapper() -> None:
    assert is_transient_storage_error(lost_connection())
    assert is_transient_storage_error(wrapped_by_optuna())
    assert not is_transient_storage_error(sa.exc.IntegrityError("INSERT", {}, Exception("duplicate key")))
    assert not is_transient_storage_error(ValueError("bad value"))


def test_a_sqlite_file_is_waited_on_only_while_locked() -> None:
    import sqlite3

    def sqlite_error(message: str) -> Exception:
        return sa.exc.OperationalError("COMMIT", {}, sqlite3.OperationalError(message))

    assert is_transient_storage_error(sqlite_error("database is locked"))
    # a full disk, a read-only or missing file: no wait cures them (a full disk waited 70 s)
    for message in ("database or disk is full", "attempt to write a readonly database",
                    "unable to open database file"):
        assert not is_transient_storage_error(sqlite_error(message)), message


def test_retry_transient_retries_only_what_a_retry_can_cure() -> None:
    calls = []

    def flaky() -> str:
        calls.append(1)
        if len(calls) < 3:
            raise wrapped_by_optuna()
        return "done"

    assert retry_transient(flaky, first_wait_s=0.001) == "done" and len(calls) == 3

    def broken() -> None:
        calls.append(1)
        raise ValueError("not transient")

    calls.clear()
    with pytest.raises(ValueError):
        retry_transient(broken, first_wait_s=0.001)
    assert len(calls) == 1

    def always_down() -> None:
        calls.append(1)
        raise lost_connection()

    calls.clear()
    with pytest.raises(sa.exc.OperationalError):
        retry_transient(always_down, total_s=0.003, first_wait_s=0.001)  # waits 0.001, 0.002
    assert len(calls) == 3


def test_a_workers_check_between_trials_rides_through_a_lost_connection(monkeypatch: pytest.MonkeyPatch) -> None:
    """A worker looks for stale trials and counts the study's trials before each new one
    (on the pipeline's helper thread, beside a running trial): a database restart then
    is retried, as ask and tell are, not raised out of the loop (seen in CI: a worker
    died with a traceback when PostgreSQL restarted mid-study)."""
    from tuner.study import loop as loop_mod
    from tuner.study.loop import RunResult, StudyLoop

    study = optuna.create_study(direction="maximize")
    calls = {"stale": 0, "count": 0}

    def stale_once(s: optuna.Study) -> list[int]:
        calls["stale"] += 1
        if calls["stale"] == 1:
            raise wrapped_by_optuna()
        return [4]

    def count_once(s: optuna.Study) -> int:
        calls["count"] += 1
        if calls["count"] == 1:
            raise wrapped_by_optuna()
        return 7

    monkeypatch.setattr(loop_mod, "fail_stale_heartbeats", stale_once)
    monkeypatch.setattr(loop_mod, "count_counted", count_once)
    monkeypatch.setattr(loop_mod.time, "sleep", lambda s: None)
    loop = StudyLoop(study, runner=None, replica=0, study_total=7)
    result = RunResult(study.study_name)
    assert loop._why_stop(result, 0.0, n_trials=None, timeout=None, in_flight=1) == "n_trials"
    assert calls == {"stale": 2, "count": 2} and result.stale_failed == [4]


def test_a_database_away_past_the_retries_is_one_line_that_says_what_is_kept_and_how_to_resume() -> None:
    from tuner.errors import DatabaseUnreachable, StudyError
    from tuner.study.storage.study_storage import database_unreachable
    from tuner.study.storage.transient import RETRY_WAIT_S

    def away(exc: BaseException) -> DatabaseUnreachable | None:
        return database_unreachable(exc, study="s", url="postgresql://u:secret@db:5432/optuna",
                                    kept="KEPT", resume="`tuner run x.yaml` resumes")

    error = away(wrapped_by_optuna())
    assert isinstance(error, DatabaseUnreachable) and isinstance(error, StudyError)
    assert str(error) == (
        "study 's': its database postgresql://u:***@db:5432/optuna is unreachable (Exception: server closed the "
        f"connection unexpectedly) for longer than the ~{RETRY_WAIT_S} s the tuner waits out; kept: KEPT; once it "
        "answers again, `tuner run x.yaml` resumes"
    )
    assert away(sa.exc.IntegrityError("INSERT", {}, Exception("duplicate key"))) is None
    assert away(ValueError("bad value")) is None


def test_retry_wait_s_is_what_retry_transient_waits(monkeypatch: pytest.MonkeyPatch) -> None:
    from tuner.study.storage import transient

    slept: list[float] = []
    monkeypatch.setattr(transient.time, "sleep", slept.append)

    def down() -> None:
        raise lost_connection()

    with pytest.raises(sa.exc.OperationalError):
        retry_transient(down)
    assert sum(slept) == pytest.approx(transient.RETRY_WAIT_S)


def test_nested_retries_do_not_multiply_their_waits() -> None:
    # the storage's calls ride out a lost connection, and so do the loop's steps around
    # them: nested, only the outermost retries (else 8 x 8 attempts, 9 s x 8 of waiting)
    inner_calls = []

    def inner() -> None:
        inner_calls.append(1)
        raise lost_connection()

    with pytest.raises(sa.exc.OperationalError):
        retry_transient(lambda: retry_transient(inner, first_wait_s=0.001), total_s=0.003, first_wait_s=0.001)
    assert len(inner_calls) == 3


def test_the_ride_is_a_knob_of_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    # $TUNER_STORAGE_RIDE_S sets what every call rides out (the fault suite shortens its
    # outages with it); the waits keep their doubling shape, the last one cut to fit
    from tuner.errors import ConfigError
    from tuner.study.storage import transient
    from tuner.study.storage.study_storage import database_unreachable

    assert transient.waits(9) == [0.2, 0.4, 0.8, 1.6, 2.0, 2.0, 2.0]
    assert transient.waits(3) == [0.2, 0.4, 0.8, 1.6]
    assert transient.waits(2.5) == [0.2, 0.4, 0.8, 1.1]
    slept: list[float] = []
    monkeypatch.setattr(transient.time, "sleep", slept.append)
    monkeypatch.setenv(transient.RIDE_ENV, "4")
    calls = []

    def down() -> None:
        calls.append(1)
        raise lost_connection()

    with pytest.raises(sa.exc.OperationalError):
        retry_transient(down)
    assert sum(slept) == pytest.approx(4.0) and len(calls) == len(slept) + 1 == 6
    error = database_unreachable(wrapped_by_optuna(), study="s", url="sqlite:///x.db", kept="K", resume="R")
    assert "for longer than the ~4 s the tuner waits out" in str(error)
    for bad in ("soon", "0", "-3", "nan", "inf"):
        monkeypatch.setenv(transient.RIDE_ENV, bad)
        with pytest.raises(ConfigError, match=f"^TUNER_STORAGE_RIDE_S='{bad}': not a number of seconds"):
            retry_transient(down)
    monkeypatch.setenv(transient.RIDE_ENV, "")
    assert transient.ride_s() == transient.RETRY_WAIT_S


def test_a_bad_ride_is_refused_where_the_storage_is_checked(monkeypatch: pytest.MonkeyPatch) -> None:
    # `tuner worker` checks its storage before it starts anything (tuner run: run_experiment's first lines)
    from tuner.errors import ConfigError
    from tuner.study.storage import transient
    from tuner.study.storage.study_storage import check_storage

    check_storage("sqlite:///x.db", n_workers=1)
    monkeypatch.setenv(transient.RIDE_ENV, "0")
    with pytest.raises(ConfigError, match=r"TUNER_STORAGE_RIDE_S='0': not a number of seconds from 0.5 to 3600"):
        check_storage("sqlite:///x.db", n_workers=1)
