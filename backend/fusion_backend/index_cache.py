"""The on-disk index cache: one directory per (component, key).

A component (the BM25 index, the dense document vectors) is built into a private
temporary directory and published with one ``os.rename``. Readers never see a half
written directory, and when two replicas build the same component at once the first
rename wins and the other discards its copy. ``meta.json`` is written last and names
the full key, so a directory is trusted only when its key matches.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from .errors import IndexBuildError

STALE_TMP_SECONDS = 3600  # a build older than this was abandoned (killed replica)
FORMAT_VERSION = 1


def component_key(kind: str, fields: dict[str, Any]) -> str:
    body = json.dumps({"kind": kind, "format": FORMAT_VERSION, **fields}, sort_keys=True)
    return hashlib.sha256(body.encode()).hexdigest()


def cached_component(
    cache_dir: Path, kind: str, fields: dict[str, Any], build: Callable[[Path], None]
) -> tuple[Path, bool]:
    """Directory holding the component for ``fields``; builds it when absent.

    Returns ``(directory, cache_hit)``. ``build(tmp_dir)`` writes the component's files.
    """
    key = component_key(kind, fields)
    final = cache_dir / f"{kind}-{key[:32]}"
    if _valid(final, key):
        return final, True
    try:
        cache_dir.mkdir(parents=True, exist_ok=True)
        _sweep_stale(cache_dir)
        tmp = Path(tempfile.mkdtemp(prefix=f".tmp-{kind}-", dir=cache_dir))
    except OSError as exc:
        raise IndexBuildError(f"data.index_cache: cannot write {cache_dir}: {exc.strerror}") from exc
    try:
        build(tmp)
        # A plain write: tmp is private until the rename below publishes the whole directory.
        meta = {"key": key, "kind": kind, **fields}
        (tmp / "meta.json").write_text(json.dumps(meta, sort_keys=True, default=str))
        _publish(tmp, final, key)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)  # gone already when the rename won
    return final, False


def _publish(tmp: Path, final: Path, key: str) -> None:
    if final.exists() and not _valid(final, key):
        shutil.rmtree(final, ignore_errors=True)  # a foreign or damaged directory
    try:
        os.rename(tmp, final)
    except OSError as exc:
        if not _valid(final, key):  # not "another replica was faster"
            raise IndexBuildError(f"data.index_cache: cannot publish {final}: {exc.strerror}") from exc


def _valid(directory: Path, key: str) -> bool:
    try:
        return json.loads((directory / "meta.json").read_text())["key"] == key
    except (OSError, ValueError, KeyError, TypeError):
        return False


def _sweep_stale(cache_dir: Path) -> None:
    now = time.time()
    for entry in cache_dir.glob(".tmp-*"):
        try:
            if now - entry.stat().st_mtime > STALE_TMP_SECONDS:
                shutil.rmtree(entry, ignore_errors=True)
        except OSError:
            pass
