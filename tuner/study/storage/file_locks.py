"""File locks: an exclusive ``flock`` on a file that records its holder (the kernel drops
it when its holder dies, whatever killed it), re-entrant within a process.

    with file_lock(path, what=..., command=..., fix=..., notes=notes): ...
    with config_locks(config_files, command=...): ...   # one per config file
    with url_locks(urls, command=...): ...              # one per config URL (channel: http)
    read_holder(path) -> Holder | None                  # who holds it now

A config lock is an ``flock`` on a hidden file beside the config file
(``.config.yaml.tuner-lock``): two experiments with different state dirs still cannot
patch one file at once.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import threading
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from tuner.study.storage.lock_holder import Holder, LockHeld


@dataclass
class _Held:
    fd: int
    count: int


_held_files: dict[str, _Held] = {}
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
            stack.enter_context(
                file_lock(
                    lock_file_for(f),
                    what=f"config file {f}",
                    command=command,
                    notes=notes,
                    fix="wait for it to finish or stop it; parallel trials go through `tuner worker`, "
                    "each with its own config copy",
                )
            )
        yield


def url_lock_file(url: str) -> Path:
    """The lock file of a config URL (channel: http): in one folder of the machine's temp
    dir, named by the URL's hash, so two experiments (any state dirs) on one URL meet."""
    import hashlib
    import tempfile
    from urllib.parse import urlsplit, urlunsplit

    parts = urlsplit(url.strip())
    key = urlunsplit((parts.scheme.lower(), parts.netloc.lower(), parts.path.rstrip("/"), parts.query, ""))
    name = hashlib.sha256(key.encode("utf-8")).hexdigest()[:24]
    return Path(tempfile.gettempdir()) / "fusion-tuner-url-locks" / f"{name}.tuner-lock"


@contextlib.contextmanager
def url_locks(urls: Sequence[str], *, command: str, notes: list[str] | None = None) -> Iterator[None]:
    """Hold the lock of every config URL (sorted): a second process that would write the
    same config document is refused with the holder named."""
    from tuner.secrets import redact_url

    with contextlib.ExitStack() as stack:
        for url in sorted(set(urls)):
            stack.enter_context(
                file_lock(
                    url_lock_file(url),
                    what=f"config URL {redact_url(url)}",
                    command=command,
                    notes=notes,
                    fix="wait for it to finish or stop it; one process writes a config document at a time",
                )
            )
        yield
