"""Who may patch a config file and drive a study right now: the study lease and the
patch rights on top of the file locks (tuner.study.storage.file_locks) and the database lock
rows (tuner.study.storage.db_lock).

Two processes on one study or one config file measure each other's configs: both patch
the same file, restart their own backends from it, and record scores the other one
caused, with nothing to show it. Every process that patches holds two kinds of lock:

- **a study lock**, exclusive for `tuner run`, `apply` and `demo`, shared by the
  `tuner worker`s of a study (a worker refuses a study a run holds, and a run refuses
  a study workers hold). It lives where the study lives: beside a SQLite study file
  (an ``flock``, which the kernel drops when its holder dies, whatever killed it), or
  in the study's own database for PostgreSQL/MySQL (a row per holder with a heartbeat,
  so machines that share the database see each other; a holder silent for
  ``stale_after_s`` is gone and its row is taken over).
- **a config lock** per target config file, an ``flock`` on a hidden file beside it
  (``.config.yaml.tuner-lock``): two experiments with different state dirs still
  cannot patch one file at once; with ``channel: http`` one per config URL instead
  (file_locks.url_lock_file: a folder in the temp dir, the file named by the URL's hash).

A refused lock raises `LockHeld`, one line naming the holder (pid, host, command,
since when) and the fix. A lock left by a dead holder is taken over and the caller
gets a message saying so. Only the holder of both may replay a restore journal.

    with StudyLease.acquire(storage_url, study, mode="exclusive", command="tuner run") as lease:
        lease.notes -> list[str]            # "took over the lock of pid ... (gone)"
        lease.lost() -> str | None          # a database lock taken over while we stalled
    with patch_rights(storage_url, study, config_files, mode=..., command=...) as lease: ...
    study_holders(storage_url, study) -> list[Holder]

Locks are re-entrant within a process (a run's holdout validation patches again).
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tuner.errors import StudyError
from tuner.study.storage.db_lock import HEARTBEAT_S, STALE_AFTER_S, TABLE, DbLock, Mode, fix_for
from tuner.study.storage.file_locks import config_locks, file_lock, read_holder, url_locks
from tuner.study.storage.lock_holder import Holder

_held_studies: dict[tuple[str, str], list[Any]] = {}
_held_lock = threading.Lock()


def sqlite_path(url: str) -> Path | None:
    prefix = "sqlite:///"
    if not url.startswith(prefix) or ":memory:" in url:
        return None
    return Path(url[len(prefix) :])


def study_lock_file(db: Path, study: str) -> Path:
    safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in study)
    return db.parent / f".{db.name}.{safe}.tuner-lock"


@dataclass
class StudyLease:
    """A held study lock; see the module docstring."""

    study: str
    notes: list[str] = field(default_factory=list)
    _db: DbLock | None = None

    def lost(self) -> str | None:
        """Why the lock is no longer ours (a database lock taken over while this process
        stalled past ``stale_after_s``), else None."""
        return self._db.lost if self._db is not None else None

    @classmethod
    @contextlib.contextmanager
    def acquire(
        cls,
        storage_url: str,
        study: str,
        *,
        mode: Mode,
        command: str,
        heartbeat_s: float = HEARTBEAT_S,
        stale_after_s: float = STALE_AFTER_S,
    ) -> Iterator[StudyLease]:
        key = (storage_url, study)
        with _held_lock:
            held = _held_studies.get(key)
            if held is not None:
                held[1] += 1
        if held is not None:  # re-entrant: a run's holdout validation asks again
            try:
                yield held[0]
            finally:
                with _held_lock:
                    held[1] -= 1
            return
        lease = cls(study)
        with _held_lock:
            _held_studies[key] = [lease, 1]
        try:
            with cls._acquire(
                lease,
                storage_url,
                study,
                mode=mode,
                command=command,
                heartbeat_s=heartbeat_s,
                stale_after_s=stale_after_s,
            ):
                yield lease
        finally:
            with _held_lock:
                _held_studies.pop(key, None)

    @staticmethod
    @contextlib.contextmanager
    def _acquire(
        lease: StudyLease,
        storage_url: str,
        study: str,
        *,
        mode: Mode,
        command: str,
        heartbeat_s: float,
        stale_after_s: float,
    ) -> Iterator[None]:
        db = sqlite_path(storage_url)
        fix = fix_for(mode)
        if db is not None:
            if mode == "shared":  # workers need a shared database; refused elsewhere with the reason
                raise StudyError(f"study {study!r}: workers cannot share a SQLite study; use PostgreSQL storage")
            with file_lock(
                study_lock_file(db, study), what=f"study {study!r}", command=command, fix=fix, notes=lease.notes
            ):
                yield
            return
        lock = DbLock(
            storage_url, study, mode=mode, command=command, heartbeat_s=heartbeat_s, stale_after_s=stale_after_s
        )
        lease.notes.extend(lock.acquire())
        lease._db = lock
        try:
            yield
        finally:
            lock.release()


@contextlib.contextmanager
def patch_rights(
    storage_url: str,
    study: str,
    config_files: Sequence[Path],
    *,
    mode: Mode,
    command: str,
    urls: Sequence[str] = (),
) -> Iterator[StudyLease]:
    """The study lock, then the lock of every config file and config URL (channel: http):
    what a process must hold before it replays a restore journal or patches a config."""
    with (
        StudyLease.acquire(storage_url, study, mode=mode, command=command) as lease,
        config_locks(config_files, command=command, notes=lease.notes),
        url_locks(urls, command=command, notes=lease.notes),
    ):
        yield lease


def study_holders(storage_url: str, study: str) -> list[Holder]:
    """Who holds the study lock now (for `tuner status`-like messages); [] when free."""
    db = sqlite_path(storage_url)
    if db is not None:
        holder = read_holder(study_lock_file(db, study))
        return [holder] if holder else []
    import sqlalchemy as sa

    from tuner.dburl import sqlalchemy_url

    engine = sa.create_engine(sqlalchemy_url(storage_url))
    try:
        with engine.connect() as conn:
            if not sa.inspect(conn).has_table(TABLE):
                return []
            rows = conn.execute(
                sa.text(f"SELECT holder, heartbeat FROM {TABLE} WHERE study = :s"), {"s": study}
            ).fetchall()
    finally:
        engine.dispose()
    now = time.time()
    return [
        h for text_, beat in rows if now - float(beat) <= STALE_AFTER_S and (h := Holder.from_text(text_)) is not None
    ]
