"""A full disk, told in one line: which filesystem, which path, and the fix.

A full filesystem surfaces far from where it happened: SQLite says ``database or disk
is full`` (and, as it has already rolled the transaction back, the ROLLBACK after it
says ``cannot rollback - no transaction is active``, hiding the first error in its
context), SQLAlchemy wraps that in an OperationalError, Optuna wraps that in a
StorageInternalError, and a plain write raises ``OSError(ENOSPC)``. ``disk_full``
walks an exception's cause and context chain for any of them and returns the
``DiskFull`` to raise instead (or None when the disk is not the cause).

    disk_full(exc, *paths, fix=...) -> DiskFull | None
    filesystem_of(path) -> str          # "/mnt/state (tmpfs, 0 B free of 1.0 MiB)"

The path named is the one the failed write names (an OSError's filename), else the
of ``paths`` (what the caller was writing: a label DB, the state dir, a SQLite study)
on the filesystem with the least space left (the first of them on a tie).
"""

from __future__ import annotations

import errno
import os
from pathlib import Path

from tuner.errors import DiskFull

_FULL_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT})
_SQLITE_FULL = 13  # SQLITE_FULL: "database or disk is full"
_FULL_TEXT = "database or disk is full"


def disk_full(
    exc: BaseException, *paths: str | Path | None, fix: str = "free space on it or move the file to a larger disk"
) -> DiskFull | None:
    """The DiskFull to raise for ``exc`` when a full filesystem caused it, else None;
    ``fix`` says what to do (the message adds "then run it again")."""
    cause = _full_cause(exc)
    if cause is None:
        return None
    named = getattr(cause, "filename", None) if isinstance(cause, OSError) else None
    candidates = [Path(p) for p in ((named,) if named else ()) + tuple(p for p in paths if p)]
    if not candidates:
        return DiskFull(
            f"a write failed: the disk is full ({_what(cause)}); free space where this command "
            "writes (its state_dir, label DB or study storage), then run it again"
        )
    path = min(candidates, key=_room)
    return DiskFull(
        f"no space left on the filesystem at {filesystem_of(path)} writing {path} ({_what(cause)}); "
        f"{fix}, then run it again"
    )


def filesystem_of(path: str | Path) -> str:
    """Where ``path``'s filesystem is mounted, its type and its free space, as text."""
    mount = _mount_point(Path(path))
    kind = _fs_type(mount)
    try:
        st = os.statvfs(mount)
        space = f"{_size(st.f_bavail * st.f_frsize)} free of {_size(st.f_blocks * st.f_frsize)}"
    except OSError:
        space = "size unknown"
    return f"{mount} ({kind + ', ' if kind else ''}{space})"


def _full_cause(exc: BaseException) -> BaseException | None:
    seen: set[int] = set()
    todo: list[BaseException] = [exc]
    while todo:
        e = todo.pop()
        if id(e) in seen:
            continue
        seen.add(id(e))
        if isinstance(e, OSError) and e.errno in _FULL_ERRNOS:
            return e
        if _is_sqlite_full(e):
            return e
        # SQLAlchemy keeps the driver's error as .orig; Python chains the rest
        todo += [x for x in (getattr(e, "orig", None), e.__cause__, e.__context__) if isinstance(x, BaseException)]
    return None


def _is_sqlite_full(e: BaseException) -> bool:
    import sqlite3

    if not isinstance(e, sqlite3.Error):
        return False
    return getattr(e, "sqlite_errorcode", None) == _SQLITE_FULL or _FULL_TEXT in str(e).lower()


def _what(cause: BaseException) -> str:
    if isinstance(cause, OSError):
        return os.strerror(cause.errno) if cause.errno is not None else str(cause)
    return str(cause).splitlines()[0] or type(cause).__name__


def _existing(path: Path) -> Path:
    path = path.absolute()
    while not path.exists() and path != path.parent:
        path = path.parent
    return path


def _mount_point(path: Path) -> Path:
    path = _existing(path)
    while not os.path.ismount(path) and path != path.parent:
        path = path.parent
    return path


def _fs_type(mount: Path) -> str:
    try:
        with open("/proc/self/mounts", encoding="utf-8", errors="replace") as f:
            kinds = [
                fields[2]
                for fields in (line.split() for line in f)
                if len(fields) > 2 and fields[1].replace("\\040", " ") == str(mount)
            ]
    except OSError:
        return ""
    return kinds[-1] if kinds else ""  # the last mount at a point is the one seen


def _room(path: Path) -> float:
    free = _free_bytes(path)
    return float("inf") if free is None else free


def _free_bytes(path: Path) -> int | None:
    try:
        st = os.statvfs(_existing(path))
    except OSError:
        return None
    return st.f_bavail * st.f_frsize


def _size(n: int) -> str:
    size = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if size < 1024 or unit == "TiB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    raise AssertionError("unreachable")
