"""Files written so a reader sees the old bytes or the new ones, never a mix.

Every write goes to a temp file in the target's directory, is fsynced, given the
replaced file's owner, group and mode, and moved over the target with ``os.replace``.
When that owner cannot be given (a non-root tuner replacing a file it may write but
not own, a root-squashed mount), the bytes go into the file itself instead: same
inode, so owner, group and mode cannot change (not atomic; config writes are covered
by the restore journal, written first). Editors do the same (vim's 'backupcopy').

Two defaults for new files: ``NEW_FILE_MODE`` (0600) for what may hold secrets
(journal, config copies, snapshots) and ``SHARED_MODE`` (0644) for reports and
label exports written through ``atomic_write_text`` / ``_bytes`` / ``_with``; pass
``mode=0o600`` there for a report that carries a config snapshot.

    atomic_write(path, data, mode=None) -> bool        # False: written in place
    replace_file(path, write, mode=None, new_mode=0o600) -> bool
    write_as(path, write, meta) -> bool
    copy_preserving(src, dst) -> Path
    in_place_reason(path) -> str | None
    atomic_write_text / atomic_write_bytes / atomic_write_with(path, ..., mode=None) -> Path
    display_path(path) -> str                          # relative to the cwd when below it
"""

from __future__ import annotations

import errno
import grp
import os
import pwd
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from tuner.errors import TargetError

SHARED_MODE = 0o644


def display_path(path: Path | str) -> str:
    """``path`` relative to the working directory when it lies below it (shorter messages)."""
    p = Path(path)
    try:
        return os.path.relpath(p) if p.is_absolute() and Path.cwd() in p.parents else str(p)
    except ValueError:  # different drive (Windows)
        return str(p)


NEW_FILE_MODE = 0o600  # new files that may hold secrets: journal, config copies


@dataclass(frozen=True)
class FileMeta:
    """Owner, group and permission bits of a file."""

    uid: int
    gid: int
    mode: int

    @classmethod
    def of(cls, path: Path) -> FileMeta | None:
        try:
            st = Path(path).stat()
        except FileNotFoundError:
            return None
        return cls(st.st_uid, st.st_gid, st.st_mode & 0o7777)

    def describe(self) -> str:
        return f"{_user(self.uid)}:{_group(self.gid)} {self.mode:04o}"


class _OwnerNotKept(Exception):
    """The replacement could not be given the original's owner (or made at all)."""


def atomic_write(path: Path, data: bytes, *, mode: int | None = None) -> bool:
    """Write ``data`` to ``path`` so readers see the old or the new bytes, never a mix.

    An existing file keeps its owner, group and mode (``mode`` overrides the mode); a
    new one gets ``mode``, 0600 by default. Returns False when the owner could not be
    kept on a replacement and the file was rewritten in place instead (not atomic)."""
    return replace_file(path, lambda fh: fh.write(data), mode=mode)


def replace_file(
    path: Path, write: Callable[[BinaryIO], object], *, mode: int | None = None, new_mode: int = NEW_FILE_MODE
) -> bool:
    """:func:`atomic_write` with the bytes written by ``write(fh)`` (it may be called
    twice: once more for the in-place fallback); ``new_mode`` is a new file's mode."""
    path = Path(path)
    meta = FileMeta.of(path)
    if meta is None:
        _replace(path, write, mode=new_mode if mode is None else mode)
        return True
    if mode is not None:
        meta = FileMeta(meta.uid, meta.gid, mode)
    return write_as(path, write, meta)


def write_as(path: Path, write: Callable[[BinaryIO], object], meta: FileMeta) -> bool:
    """Replace ``path`` with a file of ``meta``'s owner and mode; in place (returns
    False) when that owner cannot be given and the file exists."""
    try:
        _replace(path, write, mode=meta.mode, owner=(meta.uid, meta.gid), strict=True)
        return True
    except _OwnerNotKept:
        if path.exists():
            _write_in_place(path, write, meta)
        else:  # gone meanwhile (a restore): nothing to write into, recreate as a copy would be
            _replace(path, write, mode=meta.mode, owner=(meta.uid, meta.gid))
        return False


def copy_preserving(src: Path, dst: Path) -> Path:
    """Copy ``src`` to ``dst`` atomically with ``src``'s mode, and its owner and group
    where permitted. A copy that cannot keep the group loses the group's permission
    bits (the group would be another one): a 0640 config never becomes readable by
    the tuner's group."""
    src, dst = Path(src), Path(dst)
    meta = FileMeta.of(src)
    if meta is None:
        raise FileNotFoundError(errno.ENOENT, "no such file to copy", str(src))
    data = src.read_bytes()
    _replace(dst, lambda fh: fh.write(data), mode=meta.mode, owner=(meta.uid, meta.gid), strict=False)
    return dst


def in_place_reason(path: Path) -> str | None:
    """Why writes to the existing ``path`` will go in place instead of replacing it
    (None when they will not, as far as can be told before trying)."""
    meta = FileMeta.of(path)
    if meta is None or os.geteuid() == 0:
        return None
    me = os.geteuid()
    if meta.uid != me:
        why = f"owned by {meta.describe()} and this user ({_user(me)}) cannot give a new file that owner"
    elif meta.gid not in (os.getegid(), *os.getgroups()):
        why = f"of group {_group(meta.gid)}, which this user ({_user(me)}) is not in"
    elif not os.access(Path(path).parent, os.W_OK):
        why = f"in a folder this user ({_user(me)}) may not create files in"
    else:
        return None
    return (
        f"{display_path(Path(path))}: {why}: it is rewritten in place (owner and mode kept, "
        "not atomic; the restore journal covers a crash mid-write)"
    )


def _replace(
    path: Path,
    write: Callable[[BinaryIO], object],
    *,
    mode: int,
    owner: tuple[int, int] | None = None,
    strict: bool = False,
) -> None:
    try:
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    except PermissionError as exc:
        if strict:
            raise _OwnerNotKept from exc
        raise
    try:
        with os.fdopen(fd, "wb") as fh:
            write(fh)
            fh.flush()
            os.fsync(fh.fileno())
            mode = _give_owner(fh.fileno(), owner, mode, strict) if owner is not None else mode
            os.fchmod(fh.fileno(), mode)  # after fchown, which may clear set-id bits
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise
    fsync_dir(path.parent)


def _give_owner(fd: int, owner: tuple[int, int], mode: int, strict: bool) -> int:
    """Give the temp file ``owner``; the mode to set. Not strict: keep the group when
    only that is permitted, else drop the group's bits."""
    st = os.fstat(fd)
    uid, gid = owner
    if (st.st_uid, st.st_gid) == (uid, gid):
        return mode
    try:
        os.fchown(fd, uid, gid)
        return mode
    except PermissionError as exc:
        if strict:
            raise _OwnerNotKept from exc
    try:
        os.fchown(fd, -1, gid)
        return mode
    except PermissionError:
        return mode & ~0o070


def _write_in_place(path: Path, write: Callable[[BinaryIO], object], meta: FileMeta) -> None:
    """Overwrite ``path``'s own bytes (no truncation first: a reader never sees it empty)."""
    try:
        fd = os.open(path, os.O_WRONLY)
    except PermissionError as exc:
        me = _user(os.geteuid())
        as_whom = "root" if meta.uid == 0 else f"{_user(meta.uid)} or root"
        raise TargetError(
            f"{display_path(path)}: owned by {meta.describe()}; this user ({me}) can neither give a replacement "
            f"that owner nor write the file ({exc.strerror}); run the tuner as {as_whom}, or let {me} write the file"
        ) from exc
    with os.fdopen(fd, "wb") as fh:
        write(fh)
        fh.truncate()
        fh.flush()
        os.fsync(fh.fileno())


def _user(uid: int) -> str:
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return str(uid)


def _group(gid: int) -> str:
    try:
        return grp.getgrgid(gid).gr_name
    except KeyError:
        return str(gid)


def fsync_dir(directory: Path) -> None:
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:  # pragma: no cover - platforms without directory fds
        return
    try:
        os.fsync(fd)
    except OSError:  # pragma: no cover
        pass
    finally:
        os.close(fd)


def atomic_write_bytes(path: str | Path, data: bytes, *, mode: int | None = None) -> Path:
    return atomic_write_with(path, lambda fh: fh.write(data), mode=mode)


def atomic_write_text(path: str | Path, text: str, *, mode: int | None = None) -> Path:
    return atomic_write_bytes(path, text.encode("utf-8"), mode=mode)


def atomic_write_with(path: str | Path, write: Callable[[BinaryIO], object], *, mode: int | None = None) -> Path:
    """Call ``write(fh)`` on a temporary binary file, then move it over ``path``.

    ``write`` may be called a second time, on the file itself, when a replacement
    cannot be given the existing file's owner (see atomic_write)."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    replace_file(target, write, mode=mode, new_mode=SHARED_MODE)
    return target


def overwrite_in_place(path: str | Path, data: bytes) -> None:
    """Replace ``path``'s bytes keeping its inode, so every hard link to it (a study's
    Optuna and MLflow artifacts link to the trial's files) sees the new bytes and the old
    ones are freed. Not atomic: for bookkeeping files only a reader may briefly see
    short; use `atomic_write_bytes` for anything else."""
    with open(path, "r+b") as fh:
        fh.write(data)
        fh.truncate()
        fh.flush()
        os.fsync(fh.fileno())


def hard_link(source: str | Path, dest: str | Path) -> bool:
    """Make ``dest`` a hard link to ``source`` (replacing another file there), so a file
    two stores hold (Optuna artifacts, MLflow's local artifacts) is one copy on disk.
    False when the file system refuses (EXDEV across file systems, no link support,
    permissions): the caller copies instead."""
    source, dest = Path(source), Path(dest)
    try:
        dest.parent.mkdir(parents=True, exist_ok=True)
        if dest.exists() or dest.is_symlink():
            if dest.exists() and os.path.samefile(source, dest):
                return True
            dest.unlink()
        os.link(source, dest)
        return True
    except OSError:
        return False
