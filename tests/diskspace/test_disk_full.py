"""tuner.diskspace: a full disk found under the errors it hides behind, told in one line
(the real full filesystem is the fault suite's: tests/faults/test_disk_full.py)."""

from __future__ import annotations

import errno
import sqlite3
from pathlib import Path

import optuna
import sqlalchemy as sa

from tuner.diskspace import disk_full, filesystem_of
from tuner.errors import DiskFull, LabelError


def chained(outer: BaseException, inner: BaseException, *, cause: bool = False) -> BaseException:
    """``outer`` as Python raises it inside an ``except inner`` (context) or ``from inner`` (cause)."""
    try:
        try:
            raise inner
        except BaseException as exc:
            if cause:
                raise outer from exc
            raise outer  # noqa: B904 - the context is the point
    except BaseException as got:
        return got


FULL = sqlite3.OperationalError("database or disk is full")


def test_sqlite_full_behind_its_cannot_rollback_is_found(tmp_path: Path) -> None:
    # SQLite rolls the transaction back itself; the caller's ROLLBACK then fails and hides the cause
    exc = chained(sqlite3.OperationalError("cannot rollback - no transaction is active"), FULL)
    full = disk_full(exc, tmp_path / "labels.db")
    assert isinstance(full, DiskFull)
    text = str(full)
    assert "\n" not in text
    assert f"writing {tmp_path / 'labels.db'}" in text and "database or disk is full" in text
    assert f"the filesystem at {filesystem_of(tmp_path)}" in text
    assert text.endswith("then run it again")


def test_optuna_storage_error_over_sqlalchemy_over_sqlite_is_found(tmp_path: Path) -> None:
    wrapped = chained(sa.exc.OperationalError("COMMIT", {}, FULL), FULL, cause=True)
    exc = chained(optuna.exceptions.StorageInternalError("An exception is raised during the commit."), wrapped,
                  cause=True)
    full = disk_full(exc, tmp_path, fix="free space")
    assert full is not None and f"writing {tmp_path} (database or disk is full); free space, then" in str(full)


def test_enospc_names_the_file_the_write_names(tmp_path: Path) -> None:
    target = tmp_path / "state" / "trials" / "3" / "report.json"
    full = disk_full(OSError(errno.ENOSPC, "No space left on device", str(target)), tmp_path)
    assert full is not None and f"writing {target} (No space left on device)" in str(full)


def test_without_a_path_it_still_says_the_disk_is_full() -> None:
    full = disk_full(chained(RuntimeError("boom"), FULL))
    assert full is not None and str(full).startswith("a write failed: the disk is full (database or disk is full)")


def test_other_errors_are_not_a_full_disk(tmp_path: Path) -> None:
    assert disk_full(sqlite3.OperationalError("database is locked"), tmp_path) is None
    assert disk_full(OSError(errno.EACCES, "Permission denied", "x"), tmp_path) is None
    # a backend's own full disk, quoted in a failed query's reason, is not ours
    assert disk_full(LabelError("q1: HTTP 500 No space left on device; database or disk is full"), tmp_path) is None


def test_the_filesystem_is_named_by_its_mount_point_and_space(tmp_path: Path) -> None:
    text = filesystem_of(tmp_path / "not" / "made" / "yet")
    mount = text.split(" (", 1)[0]
    assert Path(mount).is_mount() and str(tmp_path).startswith(mount)
    assert " free of " in text
