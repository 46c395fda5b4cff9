"""tuner.study.storage.locks with real processes: a lock another process holds refuses at once with
the holder named, a dead holder's lock is taken over with a message, and the
database lock of a PostgreSQL study keeps runs and workers apart across processes."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
import uuid
from pathlib import Path

import pytest

from tuner.study.storage.file_locks import config_locks, lock_file_for, read_holder
from tuner.study.storage.lock_holder import LockHeld
from tuner.study.storage.locks import StudyLease, patch_rights, study_holders

HOLD = textwrap.dedent("""
    import sys, time
    from pathlib import Path
    from tuner.study.storage.file_locks import config_locks
    from tuner.study.storage.locks import StudyLease
    storage, study, config, mode, ready = sys.argv[1:6]
    with StudyLease.acquire(storage, study, mode=mode, command="holder-under-test", heartbeat_s=0.5,
                            stale_after_s=3):
        with config_locks([Path(config)] if config != "-" else [], command="holder-under-test"):
            Path(ready).write_text("held")
            time.sleep(600)
""")


def _hold(tmp_path: Path, storage: str, study: str, config: str = "-", mode: str = "exclusive") -> subprocess.Popen:
    ready = tmp_path / f"ready-{uuid.uuid4().hex[:6]}"
    proc = subprocess.Popen([sys.executable, "-c", HOLD, storage, study, config, mode, str(ready)],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    deadline = time.monotonic() + 120
    while not ready.exists():
        assert proc.poll() is None, proc.stdout.read() if proc.stdout else ""
        assert time.monotonic() < deadline, "the holder never took the lock"
        time.sleep(0.05)
    return proc


def _kill(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=60)


def test_a_sqlite_study_held_by_another_process_is_refused_naming_the_holder(tmp_path: Path) -> None:
    storage = f"sqlite:///{tmp_path / 'optuna.db'}"
    holder = _hold(tmp_path, storage, "s")
    try:
        with pytest.raises(LockHeld) as info:
            with StudyLease.acquire(storage, "s", mode="exclusive", command="tuner run"):
                pass
        message = str(info.value)
        assert f"pid {holder.pid}" in message and "holder-under-test" in message
        assert "tuner worker" in message and "\n" not in message
        assert [h.pid for h in study_holders(storage, "s")] == [holder.pid]
        # another study on the same file is free
        with StudyLease.acquire(storage, "other", mode="exclusive", command="tuner run"):
            pass
    finally:
        _kill(holder)


def test_a_killed_holders_lock_is_taken_over_with_a_message(tmp_path: Path) -> None:
    storage = f"sqlite:///{tmp_path / 'optuna.db'}"
    config = tmp_path / "config.yaml"
    config.write_text("a: 1\n")
    holder = _hold(tmp_path, storage, "s", str(config))
    _kill(holder)  # SIGKILL: no clean release, the holder record stays in the files
    assert study_holders(storage, "s") == []  # the kernel dropped the flock with the process
    with patch_rights(storage, "s", [config], mode="exclusive", command="tuner run") as lease:
        taken = [n for n in lease.notes if "took over" in n]
        assert len(taken) == 2 and all(f"pid {holder.pid}" in n for n in taken), lease.notes
    with patch_rights(storage, "s", [config], mode="exclusive", command="tuner run") as lease:
        assert lease.notes == []  # released cleanly last time: nothing to take over


def test_a_config_file_is_locked_across_experiments_and_locks_are_reentrant(tmp_path: Path) -> None:
    config = tmp_path / "config.yaml"
    config.write_text("a: 1\n")
    # a holder with its own (other) study still owns the config file
    holder = _hold(tmp_path, f"sqlite:///{tmp_path / 'elsewhere.db'}", "x", str(config))
    try:
        with pytest.raises(LockHeld, match=rf"config file .*config.yaml is locked by .*pid {holder.pid}"):
            with config_locks([config], command="tuner apply"):
                pass
        assert read_holder(lock_file_for(config)).pid == holder.pid
    finally:
        _kill(holder)
    with config_locks([config], command="tuner run"):
        with config_locks([config], command="tuner validate"):  # same process: re-entrant
            assert read_holder(lock_file_for(config)).pid == os.getpid()
        assert read_holder(lock_file_for(config)).pid == os.getpid()
    assert read_holder(lock_file_for(config)) is None


# ---------------------------------------------------------------- PostgreSQL


from workers.conftest import pg_dsn  # noqa: E402,F401  (the PostgreSQL the worker tests use)


@pytest.fixture
def pg_url(pg_dsn) -> str:  # noqa: F811
    return pg_dsn


def test_postgres_study_lock_keeps_runs_and_workers_apart(tmp_path: Path, pg_url: str) -> None:
    study = f"lock-{uuid.uuid4().hex[:8]}"
    worker = _hold(tmp_path, pg_url, study, mode="shared")
    try:
        # a second worker shares the study ...
        with StudyLease.acquire(pg_url, study, mode="shared", command="tuner worker --replica 1"):
            pass
        # ... a run does not get it while workers hold it
        with pytest.raises(LockHeld, match=rf"study '{study}' is locked by holder-under-test \(pid {worker.pid}"):
            with StudyLease.acquire(pg_url, study, mode="exclusive", command="tuner run"):
                pass
        assert [h.pid for h in study_holders(pg_url, study)] == [worker.pid]
    finally:
        _kill(worker)
    # the killed worker's row is recognised as gone (same host, dead pid) and taken over
    with StudyLease.acquire(pg_url, study, mode="exclusive", command="tuner run") as lease:
        assert any(f"pid {worker.pid}" in n and "took over" in n for n in lease.notes), lease.notes
    assert study_holders(pg_url, study) == []
    # and a worker does not get a study a run holds
    run = _hold(tmp_path, pg_url, study, mode="exclusive")
    try:
        with pytest.raises(LockHeld, match=rf"pid {run.pid}.*a `tuner run` or `tuner apply` holds the study alone"):
            with StudyLease.acquire(pg_url, study, mode="shared", command="tuner worker --replica 0"):
                pass
    finally:
        _kill(run)


def test_postgres_lock_of_a_silent_holder_on_another_host_goes_stale(pg_url: str) -> None:
    import json

    import sqlalchemy as sa

    from tuner.dburl import sqlalchemy_url

    study = f"stale-{uuid.uuid4().hex[:8]}"
    with StudyLease.acquire(pg_url, study, mode="exclusive", command="tuner run", heartbeat_s=0.2,
                            stale_after_s=1) as lease:
        assert lease.lost() is None
    engine = sa.create_engine(sqlalchemy_url(pg_url))
    holder = json.dumps({"pid": 1, "host": "some-other-machine", "command": "tuner run", "since": time.time()})
    with engine.begin() as conn:  # a holder elsewhere that beat 10 minutes ago
        conn.execute(sa.text("INSERT INTO tuner_locks (study, token, mode, holder, heartbeat) "
                             "VALUES (:s, 'gone', 'exclusive', :h, :b)"),
                     {"s": study, "h": holder, "b": time.time() - 600})
    engine.dispose()
    with StudyLease.acquire(pg_url, study, mode="exclusive", command="tuner run") as lease:
        assert any("some-other-machine" in n for n in lease.notes), lease.notes


def test_postgres_lock_taken_over_while_silent_is_reported_lost(pg_url: str) -> None:
    import sqlalchemy as sa

    from tuner.dburl import sqlalchemy_url

    study = f"lost-{uuid.uuid4().hex[:8]}"
    with StudyLease.acquire(pg_url, study, mode="exclusive", command="tuner run", heartbeat_s=0.2,
                            stale_after_s=1) as lease:
        engine = sa.create_engine(sqlalchemy_url(pg_url))
        with engine.begin() as conn:  # what a taker-over does to a stale row
            conn.execute(sa.text("DELETE FROM tuner_locks WHERE study = :s"), {"s": study})
        engine.dispose()
        deadline = time.monotonic() + 60
        while lease.lost() is None and time.monotonic() < deadline:
            time.sleep(0.1)
        assert lease.lost() is not None and "taken over" in lease.lost()
