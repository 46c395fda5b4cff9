"""Atomic file writes: a reader sees the old file or the new one, never half of one.

Write to a temporary file in the target's directory (same filesystem), flush and
fsync it, then ``os.replace`` it over the target (tuner.configpatch.replace_file).
A file written in place of another keeps its owner, group and mode; a new one is
0644 (reports and label exports are meant to be shared) unless ``mode`` says
otherwise. Pass ``mode=0o600`` for files that may hold secrets (a report with the
config snapshot and request context): it applies to a replaced file as well, so a
report an older run left 0644 is tightened.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO

from tuner.configpatch import replace_file

SHARED_MODE = 0o644


def atomic_write_bytes(path: str | Path, data: bytes, *, mode: int | None = None) -> Path:
    return atomic_write_with(path, lambda fh: fh.write(data), mode=mode)


def atomic_write_text(path: str | Path, text: str, *, mode: int | None = None) -> Path:
    return atomic_write_bytes(path, text.encode("utf-8"), mode=mode)


def atomic_write_with(path: str | Path, write: Callable[[BinaryIO], object], *, mode: int | None = None) -> Path:
    """Call ``write(fh)`` on a temporary binary file, then move it over ``path``.

    ``write`` may be called a second time, on the file itself, when a replacement
    cannot be given the existing file's owner (see tuner.configpatch.atomic_write)."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    replace_file(target, write, mode=mode, new_mode=SHARED_MODE)
    return target
