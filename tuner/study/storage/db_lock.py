"""The study lock of a PostgreSQL/MySQL study, in the study's own database: a row per
holder (table ``tuner_locks``) with a heartbeat, so machines that share the database see
each other; a holder silent for ``stale_after_s`` is gone and its row is taken over.

    lock = DbLock(url, study, mode="shared", command=..., heartbeat_s=..., stale_after_s=...)
    notes = lock.acquire(); ...; lock.lost -> str | None; lock.release()
"""

from __future__ import annotations

import threading
import time
import uuid
from typing import TYPE_CHECKING, Any, Literal

from tuner.errors import StudyError
from tuner.study.storage.lock_holder import Holder, LockHeld

if TYPE_CHECKING:
    from sqlalchemy.engine import Engine

Mode = Literal["exclusive", "shared"]
HEARTBEAT_S = 10.0
STALE_AFTER_S = 60.0
TABLE = "tuner_locks"


def fix_for(mode: Mode) -> str:
    if mode == "exclusive":
        return (
            "wait for it to finish or stop it (Ctrl-C); for parallel trials run `tuner worker EXPERIMENT "
            "--replica N` on PostgreSQL storage instead of a second `tuner run`"
        )
    return "a `tuner run` or `tuner apply` holds the study alone: wait for it to finish, then start the workers"


class DbLock:
    """The study lock in the study's database: a row per holder, a heartbeat per row."""

    def __init__(
        self, url: str, study: str, *, mode: Mode, command: str, heartbeat_s: float, stale_after_s: float
    ) -> None:
        from tuner.dburl import sqlalchemy_url

        self.url = sqlalchemy_url(url)
        self.study = study
        self.mode = mode
        self.holder = Holder.me(command, mode)
        self.token = uuid.uuid4().hex
        self.heartbeat_s = heartbeat_s
        self.stale_after_s = max(stale_after_s, 3 * heartbeat_s)
        self.lost: str | None = None
        self._engine: Engine | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def acquire(self) -> list[str]:
        import sqlalchemy as sa

        from tuner.dburl import redact

        try:
            self._engine = engine = sa.create_engine(self.url, pool_size=1, max_overflow=1, pool_pre_ping=True)
            with engine.begin() as conn:
                notes = self._claim(conn)
        except LockHeld:
            engine.dispose()
            raise
        except sa.exc.SQLAlchemyError as exc:
            if self._engine is not None:
                self._engine.dispose()
            raise StudyError(
                f"study lock in {redact(self.url)}: {type(exc).__name__}: "
                f"{str(exc).splitlines()[0]}; check that the database server runs"
            ) from exc
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
        conn.execute(
            text(
                f"CREATE TABLE IF NOT EXISTS {TABLE} (study VARCHAR(512) NOT NULL, token VARCHAR(64) NOT NULL, "
                "mode VARCHAR(16) NOT NULL, holder TEXT NOT NULL, heartbeat DOUBLE PRECISION NOT NULL, "
                "PRIMARY KEY (study, token))"
            )
        )
        now = time.time()
        rows = conn.execute(
            text(f"SELECT token, mode, holder, heartbeat FROM {TABLE} WHERE study = :s"), {"s": self.study}
        ).fetchall()
        notes: list[str] = []
        live = []
        for token, mode, holder_text, beat in rows:
            holder = Holder.from_text(holder_text)
            gone = now - float(beat) > self.stale_after_s or (holder is not None and holder.alive_here() is False)
            if gone:
                conn.execute(
                    text(f"DELETE FROM {TABLE} WHERE study = :s AND token = :t"), {"s": self.study, "t": token}
                )
                who = holder.describe() if holder else "an unknown process"
                notes.append(f"took over the lock on study {self.study!r} left by {who}, which is gone")
            else:
                live.append((mode, holder))
        blocking = [h for m, h in live if self.mode == "exclusive" or m == "exclusive"]
        if blocking:
            who = blocking[0].describe() if blocking[0] else "another process"
            more = f" and {len(blocking) - 1} more" if len(blocking) > 1 else ""
            raise LockHeld(f"study {self.study!r} is locked by {who}{more}; {fix_for(self.mode)}")
        conn.execute(
            text(f"INSERT INTO {TABLE} (study, token, mode, holder, heartbeat) VALUES (:s, :t, :m, :h, :b)"),
            {"s": self.study, "t": self.token, "m": self.mode, "h": self.holder.to_json(), "b": now},
        )
        if dialect == "mysql":
            conn.execute(text("SELECT RELEASE_LOCK(:n)"), {"n": f"tuner:{key}"})
        return notes

    def _beat(self) -> None:
        from sqlalchemy import text

        engine = self._acquired()
        while not self._stop.wait(self.heartbeat_s):
            try:
                with engine.begin() as conn:
                    n = conn.execute(
                        text(f"UPDATE {TABLE} SET heartbeat = :b WHERE study = :s AND token = :t"),
                        {"b": time.time(), "s": self.study, "t": self.token},
                    ).rowcount
                if n == 0:
                    self.lost = (
                        f"the lock on study {self.study!r} was taken over by another process while this "
                        f"one was silent for more than {self.stale_after_s:g} s"
                    )
                    return
            except Exception:  # noqa: BLE001 - a database blip: the next beat retries; staleness is judged on the server rows
                continue

    def release(self) -> None:
        from sqlalchemy import text

        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        engine = self._acquired()
        try:
            with engine.begin() as conn:
                conn.execute(
                    text(f"DELETE FROM {TABLE} WHERE study = :s AND token = :t"), {"s": self.study, "t": self.token}
                )
        except Exception:  # noqa: BLE001 - the row goes stale and is taken over; never fail a finished run on it
            pass
        finally:
            engine.dispose()

    def _acquired(self) -> Engine:
        """The engine ``acquire`` opened (the heartbeat and ``release`` come after it)."""
        if self._engine is None:
            raise StudyError(f"study lock on {self.study!r}: not acquired; call acquire() first")
        return self._engine


def _key(name: str) -> int:
    import hashlib

    return int.from_bytes(hashlib.blake2b(name.encode(), digest_size=8).digest(), "big", signed=True)
