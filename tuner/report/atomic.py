"""Atomic file writes: a reader sees the old file or the new one, never half of one.

Write to a temporary file in the target's directory (same filesystem), flush and
fsync it, then ``os.replace`` it over the target.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO


def atomic_write_bytes(path: str | Path, data: bytes) -> Path:
    return atomic_write_with(path, lambda fh: fh.write(data))


def atomic_write_text(path: str | Path, text: str) -> Path:
    return atomic_write_bytes(path, text.encode("utf-8"))


def atomic_write_with(path: str | Path, write: Callable[[BinaryIO], object]) -> Path:
    """Call ``write(fh)`` on a temporary binary file, then move it over ``path``."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    try:
        # mkstemp creates 0600; reports and label exports are meant to be shared
        os.chmod(tmp, _mode_for(target))
        with os.fdopen(fd, "wb") as fh:
            write(fh)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return target


def _mode_for(target: Path) -> int:
    try:
        return target.stat().st_mode & 0o777
    except FileNotFoundError:
        return 0o644
