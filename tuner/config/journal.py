"""The restore journal: the original bytes (and owner, group, mode) of the config files,
kept on disk while they are patched, so they can be put back byte for byte.

Before the first write a *restore journal* (JSON in the state dir) records each file's
original bytes and sha256, so the originals can be put back by ``Journal.restore()``
(``ConfigPatcher.restore()``) -- or by ``recover(journal)`` at the next start-up after a
crash.

Public API::

    Journal(path, owner=None)                     # owner: "tuner apply of trial #3 (study demo)"
        .active -> bool
        .begin(files) -> None                     # record the originals (once)
        .originals() -> dict[Path, bytes]; .metas() -> dict[Path, FileMeta]
        .restore() -> list[Path]                  # originals back, journal removed
    recover(journal_path) -> list[Path]           # replay a journal left by a crash
    pending(journal_path) -> Pending | None       # what a journal on disk would restore
        .line(resolve) -> str                     # the one loud line of a reader
        .replayed_line(restored) -> str           # what a replay restored, from whose journal
    recover_hint(experiment_file) -> str          # the command that resolves a pending journal
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tuner.errors import TargetError
from tuner.files import FileMeta, atomic_write, display_path, fsync_dir, write_as
from tuner.pids import pid_alive

JOURNAL_VERSION = 1


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


class Journal:
    """The originals of a set of files, kept on disk until they are restored.

    It holds the originals' bytes, which may include secrets: it is written 0600. Each
    entry also records the original's owner, group and mode (``uid``, ``gid``,
    ``mode``), put back by :meth:`restore` with the bytes. A journal without them (an
    older tuner's) restores the bytes and keeps the files' current owner and mode.
    """

    def __init__(self, path: Path, owner: str | None = None) -> None:
        self.path = Path(path)
        #: the command (and trial) whose writes this journal undoes, recorded by `begin`
        #: so the reader of a journal a crash left can say whose it is
        self.owner = owner

    @property
    def active(self) -> bool:
        return self.path.exists()

    def begin(self, files: Sequence[Path]) -> None:
        """Record the current bytes of ``files`` (no-op when a journal for them exists)."""
        if self.active:
            recorded = [Path(e["path"]) for e in self._load()["files"]]
            if sorted(recorded) != sorted(f.resolve() for f in files):
                raise TargetError(
                    f"{display_path(self.path)}: a restore journal for other files exists "
                    f"({', '.join(map(str, recorded))}); replay it with recover() or delete it"
                )
            return
        entries = []
        for f in files:
            data = f.read_bytes()
            meta = FileMeta.of(f)
            entries.append(
                {
                    "path": str(f.resolve()),
                    "sha256": _sha256(data),
                    "content_b64": base64.b64encode(data).decode("ascii"),
                    **({"uid": meta.uid, "gid": meta.gid, "mode": meta.mode} if meta is not None else {}),
                }
            )
        payload = {
            "version": JOURNAL_VERSION,
            "created_at": time.time(),
            "pid": os.getpid(),
            **({"owner": self.owner} if self.owner else {}),
            "files": entries,
        }
        self.path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write(self.path, json.dumps(payload, indent=1).encode("utf-8"), mode=0o600)

    def originals(self) -> dict[Path, bytes]:
        out: dict[Path, bytes] = {}
        for e in self._load()["files"]:
            data = base64.b64decode(e["content_b64"])
            if _sha256(data) != e["sha256"]:
                raise TargetError(
                    f"{display_path(self.path)}: journal entry for {e['path']} is corrupt (sha256 mismatch)"
                )
            out[Path(e["path"])] = data
        return out

    def metas(self) -> dict[Path, FileMeta]:
        """The originals' owner, group and mode (files an older journal recorded without them are left out)."""
        return {
            Path(e["path"]): FileMeta(int(e["uid"]), int(e["gid"]), int(e["mode"]))
            for e in self._load()["files"]
            if {"uid", "gid", "mode"} <= e.keys()
        }

    def restore(self) -> list[Path]:
        """Put every original back (bytes, owner, group, mode), then delete the journal.
        Returns the files that had to be changed."""
        if not self.active:
            return []
        metas = self.metas()
        changed = [path for path, data in self.originals().items() if _put_back(path, data, metas.get(path))]
        self.path.unlink()
        fsync_dir(self.path.parent)
        return changed

    def _load(self) -> dict[str, Any]:
        try:
            payload = json.loads(self.path.read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            raise TargetError(
                f"{display_path(self.path)}: unreadable restore journal ({exc}); restore the config by hand"
            ) from exc
        if payload.get("version") != JOURNAL_VERSION:
            raise TargetError(f"{display_path(self.path)}: unknown journal version {payload.get('version')!r}")
        return payload


def _put_back(path: Path, data: bytes, meta: FileMeta | None) -> bool:
    """``path`` with ``data`` and ``meta``'s owner and mode; True when anything changed."""
    current = path.read_bytes() if path.exists() else None
    meta = meta or FileMeta.of(path)
    if current != data:
        if meta is None:
            atomic_write(path, data)
        else:
            write_as(path, lambda fh: fh.write(data), meta)
        return True
    now = FileMeta.of(path)
    if meta is None or now is None or now == meta:
        return False
    try:  # same bytes, other owner or mode (e.g. an older tuner's write): owner first, it may clear set-id bits
        if (now.uid, now.gid) != (meta.uid, meta.gid):
            os.chown(path, meta.uid, meta.gid)
        os.chmod(path, meta.mode)
    except PermissionError:
        return False  # not ours to change; a write of ours never changed them
    return True


def recover(journal_path: Path) -> list[Path]:
    """Replay a journal left by a crash: restore the originals, remove the journal.

    Returns the files whose content, owner or mode had to be put back (empty when there
    was no journal).
    """
    return Journal(journal_path).restore()


@dataclass(frozen=True)
class Pending:
    """A restore journal on disk, as a reader sees it (nothing replayed)."""

    path: Path
    owner: str  # whose writes it undoes ("tuner apply of trial #3 (study demo)"; "a tuner" when not recorded)
    pid: int | None
    created_at: float | None
    files: list[Path]
    differ: list[Path]  # the files whose bytes are not the originals now
    alive: bool  # its writer still runs (a live run's journal, not a crash's)

    def _whose(self) -> str:
        when = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(self.created_at)) if self.created_at else "?"
        state = "still running" if self.alive else "no longer running"
        return f"{self.owner} (pid {self.pid if self.pid is not None else '?'}, {state}; journal written {when})"

    def _what(self) -> str:
        if not self.differ:
            return f"{_names(self.files)} (already the original bytes; only owner or mode may change)"
        return f"{_names(self.differ)} (now holding other bytes than the original)"

    def line(self, resolve: str) -> str:
        """The one line every command that reads the config prints while this journal is
        on disk: the journal, whose it is, what a replay would restore, what resolves it."""
        head = f"restore journal pending: {display_path(self.path)}, left by {self._whose()}"
        if self.alive:
            return (
                f"{head}: the config files hold its writes until it ends and restores {_names(self.files)}; "
                f"if that process is not a tuner any more, {resolve}"
            )
        return (
            f"{head}: the config files and what the backend serves may be its unchecked writes; a replay "
            f"restores {self._what()}; {resolve}"
        )

    def replayed_line(self, restored: Sequence[Path]) -> str:
        """What the replay of this journal did (after ``recover``)."""
        done = (
            f"restored {_names(restored)} (original bytes, owner and mode)"
            if restored
            else f"{_names(self.files)} already held the originals, nothing rewritten"
        )
        return f"replayed the restore journal {display_path(self.path)} left by {self._whose()}: {done}"


def recover_hint(experiment_file: Path | str) -> str:
    """The command that resolves a pending journal (for `Pending.line`)."""
    return (
        f"`tuner apply {experiment_file} --recover` replays it and restarts the backend on the originals "
        "(so does the next `tuner run` or `tuner apply`)"
    )


def _names(files: Sequence[Path]) -> str:
    return ", ".join(display_path(Path(f)) for f in files) or "no file"


def _alive(pid: int | None) -> bool:
    if pid is None or pid == os.getpid():
        return False  # this process replays only journals a dead process left
    return pid_alive(pid)


def pending(journal_path: Path) -> Pending | None:
    """The journal at ``journal_path`` as a reader sees it, or None when there is none.
    Reads only; TargetError when it cannot be read (the fix is to restore by hand)."""
    journal = Journal(journal_path)
    if not journal.active:
        return None
    payload = journal._load()
    originals = journal.originals()
    differ = [p for p, data in originals.items() if not p.exists() or p.read_bytes() != data]
    pid = payload.get("pid")
    pid = int(pid) if isinstance(pid, int) else None
    created = payload.get("created_at")
    return Pending(
        path=journal.path,
        owner=str(payload.get("owner") or "a tuner command"),
        pid=pid,
        created_at=float(created) if isinstance(created, (int, float)) else None,
        files=list(originals),
        differ=differ,
        alive=_alive(pid),
    )
