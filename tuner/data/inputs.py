"""Fingerprints of the data a backend serves outside its config (``target.inputs``).

A trial's result depends on the corpus and run files too, and those may be regenerated
at the same path between two runs of a study. ``target.inputs`` declares them (paths,
globs or directories); their content hashes are part of the result-cache key, so a
changed file is a cache miss that names the file.

    expand(patterns) -> list[Path]                  # files, sorted; InputError when one matches nothing
    fingerprint_inputs(paths, *, root=None, memo=None) -> InputsFingerprint
    InputsWatch(patterns, root=None).current()      # the same, re-stat'ing cheaply between trials
    changed_files(old, new) -> list[str]            # which files differ, for a miss reason

A file's sha256 is streamed, and kept in a memo keyed by its stat signature (path, size,
mtime_ns, ctime_ns, inode, device), so only a changed file is hashed again: an
unchanged 100 MB corpus costs one ``stat`` per trial, not 75 ms of hashing. A file
modified within ``RACY_S`` of being hashed is not memoised (a rewrite in the same
timestamp tick could keep its signature: git's "racy clean" problem), nor is one that
changed while it was read (hashed again).
"""

from __future__ import annotations

import glob
import hashlib
import os
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from tuner.errors import InputError

RACY_S = 2.0  # a file younger than this is hashed again at the next check
_HASH_ATTEMPTS = 3
_GLOB_CHARS = frozenset("*?[")

Signature = tuple[int, int, int, int, int]


@dataclass(frozen=True)
class InputsFingerprint:
    """Per-file sha256 by name (relative to the project when below it) and their digest."""

    files: Mapping[str, str]
    digest: str = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "files", dict(sorted(self.files.items())))
        combined = hashlib.sha256()
        for name, sha in self.files.items():
            for part in (name, sha):
                data = part.encode("utf-8")
                combined.update(len(data).to_bytes(8, "big"))
                combined.update(data)
        object.__setattr__(self, "digest", combined.hexdigest())

    def short(self) -> str:
        return self.digest[:12]


def is_glob(pattern: str) -> bool:
    return any(c in _GLOB_CHARS for c in pattern)


class MissingInput(InputError):
    """A declared input names no file; ``problem`` says how ("does not exist", ...)."""

    def __init__(self, pattern: str, problem: str) -> None:
        super().__init__(f"target.inputs: {pattern} {problem}")
        self.pattern = pattern
        self.problem = problem


def expand_one(pattern: str | Path) -> list[Path]:
    """The files one pattern names: a file, every file below a directory, or a glob's
    matches (``**`` recursive; a matched directory contributes its files)."""
    text = str(pattern)
    if is_glob(text):
        matches = [Path(m) for m in glob.glob(text, recursive=True)]
        if not matches:
            raise MissingInput(text, "matches no file")
    else:
        path = Path(text)
        if not path.exists():
            raise MissingInput(text, "does not exist")
        matches = [path]
    files: list[Path] = []
    for m in matches:
        files.extend(_files_below(m) if m.is_dir() else [m])
    if not files:
        raise MissingInput(text, "holds no file")
    return files


def expand(patterns: Iterable[str | Path]) -> list[Path]:
    """Every file the patterns name, absolute, without duplicates, sorted."""
    seen: dict[str, Path] = {}
    for pattern in patterns:
        for f in expand_one(pattern):
            seen.setdefault(os.path.abspath(f), Path(os.path.abspath(f)))
    return [seen[k] for k in sorted(seen)]


def _files_below(directory: Path) -> list[Path]:
    out: list[Path] = []
    for dirpath, dirnames, filenames in os.walk(directory):
        dirnames.sort()
        out.extend(Path(dirpath) / name for name in sorted(filenames))
    return out


def _signature(st: os.stat_result) -> Signature:
    return (st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino, st.st_dev)


def _stat(path: Path) -> os.stat_result:
    try:
        return path.stat()
    except OSError as exc:
        raise InputError(f"{path}: cannot read: {exc.strerror}") from exc


def sha256_file(path: Path) -> str:
    try:
        with open(path, "rb") as fh:
            return hashlib.file_digest(fh, "sha256").hexdigest()
    except OSError as exc:
        raise InputError(f"{path}: cannot read: {exc.strerror}") from exc


def _name(path: Path, root: Path | None) -> str:
    if root is not None:
        try:
            return path.relative_to(root).as_posix()
        except ValueError:
            pass
    return path.as_posix()


class HashMemo:
    """sha256 by absolute path and stat signature, in this process."""

    def __init__(self) -> None:
        self._entries: dict[str, tuple[Signature, str]] = {}
        self.hashed = 0  # files actually read (a test and a benchmark count them)

    def digest(self, path: Path) -> str:
        key = str(path)
        for _ in range(_HASH_ATTEMPTS):
            before = _signature(_stat(path))
            entry = self._entries.get(key)
            if entry is not None and entry[0] == before:
                return entry[1]
            started = time.time_ns()
            sha = sha256_file(path)
            self.hashed += 1
            if _signature(_stat(path)) != before:
                continue  # written while it was read
            if started - max(before[1], before[2]) > RACY_S * 1e9:
                self._entries[key] = (before, sha)
            else:
                self._entries.pop(key, None)
            return sha
        raise InputError(f"{path} keeps changing while it is hashed; wait until it is written, then re-run")


def fingerprint_inputs(
    paths: Sequence[str | Path], *, root: Path | None = None, memo: HashMemo | None = None
) -> InputsFingerprint:
    """The fingerprint of every file ``paths`` names (files, directories or globs)."""
    memo = memo or HashMemo()
    root = Path(os.path.abspath(root)) if root is not None else None
    return InputsFingerprint({_name(f, root): memo.digest(f) for f in expand(paths)})


class InputsWatch:
    """``target.inputs`` of one run: hashed at the first ``current()``, then re-stat'ed
    (and only changed files re-hashed) at every later call."""

    def __init__(self, patterns: Sequence[str | Path], *, root: Path | None = None) -> None:
        self.patterns = list(patterns)
        self.root = root
        self.memo = HashMemo()

    def current(self) -> InputsFingerprint:
        return fingerprint_inputs(self.patterns, root=self.root, memo=self.memo)


def changed_files(old: Mapping[str, str], new: Mapping[str, str]) -> list[str]:
    """Names whose content differs, then new ones ``(new)``, then vanished ones ``(gone)``."""
    changed = [n for n in sorted(new) if n in old and old[n] != new[n]]
    added = [f"{n} (new)" for n in sorted(new) if n not in old]
    gone = [f"{n} (gone)" for n in sorted(old) if n not in new]
    return changed + added + gone


def describe_files(names: Sequence[str], *, limit: int = 3) -> str:
    shown = ", ".join(names[:limit])
    return shown + (f" and {len(names) - limit} more" if len(names) > limit else "")
