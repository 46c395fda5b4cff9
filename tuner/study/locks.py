"""Who may patch a config file and drive a study right now.

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
  cannot patch one file at once.

A refused lock raises `LockHeld`, one line naming the holder (pid, host, command,
since when) and the fix. A lock left by a dead holder is taken over and the caller
gets a message saying so. Only the holder of both may replay a restore journal.

    with StudyLease.acquire(storage_url, study, mode="exclusive", command="tuner run") as lease:
        lease.notes -> list[str]            # "took over the lock of pid ... (gone)"
        lease.lost() -> str | None          # a database lock taken over while we stalled

Locks are re-entrant within a process (a run's holdout validation patches again).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import socket
import threading
import time
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from tuner.errors import StudyError

Mode = Literal["exclusive", "shared"]
HEARTBEAT_S = 10.0
STALE_AFTER_S = 60.0
_TABLE = "tuner_locks"


class LockHeld(StudyError):
    """Another live process holds the lock (the message names it and the fix)."""


@dataclass(frozen=True)
class Holder:
    """Who holds a lock, as recorded beside it."""

    pid: int
    host: str
    command: str
    since: float  # epoch seconds
    mode: str = "exclusive"

    @classmethod
    def me(cls, command: str, mode: str = "exclusive") -> "Holder":
        return cls(os.getpid(), socket.gethostname(), command, time.time(), mode)

    def describe(self) -> str:
        since = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(self.since))
        return f"{self.command} (pid {self.pid} on {self.host}, since {since})"

    def alive_here(self) -> bool | None:
        """Whether the holder process still exists (None: it runs on another host)."""
        if self.host != socket.gethostname():
            return None
        return pid_alive(self.pid)

    def to_json(self) -> str:
        return json.dumps(self.__dict__)

    @classmethod
    def from_text(cls, text: str) -> "Holder | None":
        try:
            data = json.loads(text)
            return cls(int(data["pid"]), str(data["host"]), str(data["command"]), float(data["since"]),
                       str(data.get("mode", "exclusive")))
        except (ValueError, KeyError, TypeError):
            return None


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


# ---------------------------------------------------------------- file locks


@dataclass
class _Held:
    fd: int
    count: int


_held_files: dict[str, _Held] = {}
_held_studies: dict[tuple[str, str], list[Any]] = {}
_held_lock = threading.Lock()


def lock_file_for(config_file: Path) -> Path:
    """The hidden lock file beside a config file (the config itself is replaced
    atomically on every write, so a lock on its inode would not outlive a trial)."""
    return config_file.parent / f".{config_file.name}.tuner-lock"


@contextlib.contextmanager
def file_lock(path: Path, *, what: str, command: str, fix: str, notes: list[str] | None = None) -> Iterator[None]:
    """Hold an exclusive ``flock`` on ``path`` (created when missing) for the block.

    Refused at once with `LockHeld` when another process holds it. Re-entrant within
    a process. The holder is written into the file; a record left by a holder that
    died without releasing is reported in ``notes`` ("took over").
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    key = str(path.parent.resolve() / path.name)
    with _held_lock:
        held = _held_files.get(key)
        if held is not None:
            held.count += 1
    if held is not None:
        try:
            yield
        finally:
            with _held_lock:
                held.count -= 1
        return
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            if exc.errno not in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                raise
            holder = Holder.from_text(_read_fd(fd))
            who = holder.describe() if holder else "another process"
            raise LockHeld(f"{what} is locked by {who}; {fix}") from None
        previous = Holder.from_text(_read_fd(fd))
        if previous is not None and notes is not None:
            notes.append(f"took over the lock on {what} left by {previous.describe()}, which is gone")
        _write_fd(fd, Holder.me(command).to_json())
        with _held_lock:
            _held_files[key] = _Held(fd, 1)
        try:
            yield
        finally:
            with _held_lock:
                _held_files.pop(key, None)
            _write_fd(fd, "")  # released cleanly: nothing to take over
            fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)


def read_holder(path: Path) -> Holder | None:
    """The holder recorded in a lock file when someone holds it now, else None."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        return None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except OSError:
            return Holder.from_text(_read_fd(fd))
        fcntl.flock(fd, fcntl.LOCK_UN)
        return None
    finally:
        os.close(fd)


def _read_fd(fd: int) -> str:
    os.lseek(fd, 0, os.SEEK_SET)
    return os.read(fd, 65536).decode("utf-8", errors="replace")


def _write_fd(fd: int, text: str) -> None:
    os.ftruncate(fd, 0)
    os.lseek(fd, 0, os.SEEK_SET)
    os.write(fd, text.encode())


@contextlib.contextmanager
def config_locks(files: Sequence[Path], *, command: str, notes: list[str] | None = None) -> Iterator[None]:
    """Hold the config lock of every file (sorted, so two processes never deadlock)."""
    with contextlib.ExitStack() as stack:
        for f in sorted({Path(f).absolute() for f in files}):
            stack.enter_context(file_lock(
                lock_file_for(f), what=f"config file {f}", command=command, notes=notes,
                fix="wait for it to finish or stop it; parallel trials go through `tuner worker`, "
                    "each with its own config copy",
            ))
        yield


# ---------------------------------------------------------------- study locks


def sqlite_path(url: str) -> Path | None:
    prefix = "sqlite:///"
    if not url.startswith(prefix) or ":memory:" in url:
        return None
    return Path(url[len(prefix):])


def study_lock_file(db: Path, study: str) -> Path:
    safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in study)
    return db.parent / f".{db.name}.{safe}.tuner-lock"


@dataclass
class StudyLease:
    """A held study lock; see the module docstring."""

    study: str
    notes: list[str] = field(default_factory=list)
    _db: "_DbLock | None" = None

    def lost(self) -> str | None:
        """Why the lock is no longer ours (a database lock taken over while this process
        stalled past ``stale_after_s``), else None."""
        return self._db.lost if self._db is not None else None

    @classmethod
    @contextlib.contextmanager
    def acquire(cls, storage_url: str, study: str, *, mode: Mode, command: str,
                heartbeat_s: float = HEARTBEAT_S, stale_after_s: float = STALE_AFTER_S) -> Iterator["StudyLease"]:
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
            with cls._acquire(lease, storage_url, study, mode=mode, command=command, heartbeat_s=heartbeat_s,
                              stale_after_s=stale_after_s):
                yield lease
        finally:
            with _held_lock:
                _held_studies.pop(key, None)

    @staticmethod
    @contextlib.contextmanager
    def _acquire(lease: "StudyLease", storage_url: str, study: str, *, mode: Mode, command: str,
                 heartbeat_s: float, stale_after_s: float) -> Iterator[None]:
        db = sqlite_path(storage_url)
        fix = _fix_for(mode)
        if db is not None:
            if mode == "shared":  # workers need a shared database; refused elsewhere with the reason
                raise StudyError(f"study {study!r}: workers cannot share a SQLite study; use PostgreSQL storage")
            with file_lock(study_lock_file(db, study), what=f"study {study!r}", command=command,
                           fix=fix, notes=lease.notes):
                yield
            return
        lock = _DbLock(storage_url, study, mode=mode, command=command, heartbeat_s=heartbeat_s,
                       stale_after_s=stale_after_s)
        lease.notes.extend(lock.acquire())
        lease._db = lock
        try:
            yield
        finally:
            lock.release()


def _fix_for(mode: Mode) -> str:
    if mode == "exclusive":
        return ("wait for it to finish or stop it (Ctrl-C); for parallel trials run `tuner worker EXPERIMENT "
                "--replica N` on PostgreSQL storage instead of a second `tuner run`")
    return "a `tuner run` or `tuner apply` holds the study alone: wait for it to finish, then start the workers"


class _DbLock:
    """The study lock in the study's database: a row per holder, a heartbeat per row."""

    def __init__(self, url: str, study: str, *, mode: Mode, command: str, heartbeat_s: float,
                 stale_after_s: float) -> None:
        from tuner.dburl import sqlalchemy_url

        self.url = sqlalchemy_url(url)
        self.study = study
        self.mode = mode
        self.holder = Holder.me(command, mode)
        self.token = uuid.uuid4().hex
        self.heartbeat_s = heartbeat_s
        self.stale_after_s = max(stale_after_s, 3 * heartbeat_s)
        self.lost: str | None = None
        self._engine: Any = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def acquire(self) -> list[str]:
        import sqlalchemy as sa

        from tuner.dburl import redact

        try:
            self._engine = sa.create_engine(self.url, pool_size=1, max_overflow=1, pool_pre_ping=True)
            with self._engine.begin() as conn:
                notes = self._claim(conn)
        except LockHeld:
            self._engine.dispose()
            raise
        except sa.exc.SQLAlchemyError as exc:
            if self._engine is not None:
                self._engine.dispose()
            raise StudyError(f"study lock in {redact(self.url)}: {type(exc).__name__}: "
                             f"{str(exc).splitlines()[0]}; check that the database server runs") from exc
        self._thread = threading.Thread(target=self._beat, name=f"study-lock-{self.study}", daemon=True)
        self._thread.start()
        return notes

    def _claim(self, conn: Any) -> list[str]:
        from sqlalchemy import text

        dialect = conn.dialect.name
        key = _key(f"tuner-lock:{self.study}")
        if dialect == "postgresql":
            conn.execute(text("SELECT pg_advisory_xact_lock(:k)"), {"k": key})
        elif dialect == "mysql":
            conn.execute(text("SELECT GET_LOCK(:n, 60)"), {"n": f"tuner:{key}"})
        conn.execute(text(
            f"CREATE TABLE IF NOT EXISTS {_TABLE} (study VARCHAR(512) NOT NULL, token VARCHAR(64) NOT NULL, "
            "mode VARCHAR(16) NOT NULL, holder TEXT NOT NULL, heartbeat DOUBLE PRECISION NOT NULL, "
            "PRIMARY KEY (study, token))"))
        now = time.time()
        rows = conn.execute(text(f"SELECT token, mode, holder, heartbeat FROM {_TABLE} WHERE study = :s"),
                            {"s": self.study}).fetchall()
        notes: list[str] = []
        live = []
        for token, mode, holder_text, beat in rows:
            holder = Holder.from_text(holder_text)
            gone = now - float(beat) > self.stale_after_s or (holder is not None and holder.alive_here() is False)
            if gone:
                conn.execute(text(f"DELETE FROM {_TABLE} WHERE study = :s AND token = :t"),
                             {"s": self.study, "t": token})
                who = holder.describe() if holder else "an unknown process"
                notes.append(f"took over the lock on study {self.study!r} left by {who}, which is gone")
            else:
                live.append((mode, holder))
        blocking = [h for m, h in live if self.mode == "exclusive" or m == "exclusive"]
        if blocking:
            who = blocking[0].describe() if blocking[0] else "another process"
            more = f" and {len(blocking) - 1} more" if len(blocking) > 1 else ""
            raise LockHeld(f"study {self.study!r} is locked by {who}{more}; {_fix_for(self.mode)}")
        conn.execute(text(f"INSERT INTO {_TABLE} (study, token, mode, holder, heartbeat) "
                          "VALUES (:s, :t, :m, :h, :b)"),
                     {"s": self.study, "t": self.token, "m": self.mode, "h": self.holder.to_json(), "b": now})
        if dialect == "mysql":
            conn.execute(text("SELECT RELEASE_LOCK(:n)"), {"n": f"tuner:{key}"})
        return notes

    def _beat(self) -> None:
        from sqlalchemy import text

        while not self._stop.wait(self.heartbeat_s):
            try:
                with self._engine.begin() as conn:
                    n = conn.execute(text(f"UPDATE {_TABLE} SET heartbeat = :b WHERE study = :s AND token = :t"),
                                     {"b": time.time(), "s": self.study, "t": self.token}).rowcount
                if n == 0:
                    self.lost = (f"the lock on study {self.study!r} was taken over by another process while this "
                                 f"one was silent for more than {self.stale_after_s:g} s")
                    return
            except Exception:  # a database blip: the next beat retries; staleness is judged on the server rows
                continue

    def release(self) -> None:
        from sqlalchemy import text

        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        try:
            with self._engine.begin() as conn:
                conn.execute(text(f"DELETE FROM {_TABLE} WHERE study = :s AND token = :t"),
                             {"s": self.study, "t": self.token})
        except Exception:  # the row goes stale and is taken over; never fail a finished run on it
            pass
        finally:
            self._engine.dispose()


def _key(name: str) -> int:
    import hashlib

    return int.from_bytes(hashlib.blake2b(name.encode(), digest_size=8).digest(), "big", signed=True)


@contextlib.contextmanager
def patch_rights(storage_url: str, study: str, config_files: Sequence[Path], *, mode: Mode,
                 command: str) -> Iterator[StudyLease]:
    """The study lock, then the lock of every config file: what a process must hold
    before it replays a restore journal or patches a config."""
    with StudyLease.acquire(storage_url, study, mode=mode, command=command) as lease:
        with config_locks(config_files, command=command, notes=lease.notes):
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
            if not sa.inspect(conn).has_table(_TABLE):
                return []
            rows = conn.execute(sa.text(f"SELECT holder, heartbeat FROM {_TABLE} WHERE study = :s"),
                                {"s": study}).fetchall()
    finally:
        engine.dispose()
    now = time.time()
    return [h for text_, beat in rows if now - float(beat) <= STALE_AFTER_S
            and (h := Holder.from_text(text_)) is not None]
