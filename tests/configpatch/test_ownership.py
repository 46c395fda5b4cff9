"""Owner, group and mode of the files the tuner writes in place of others.

The service reading the config may run as another user (here ``nobody:nogroup``,
mode 0640): after a trial's patch, a restore, a crash recovery or a copy it must still
be able to read the file, and copies of a private file must stay private. Changing a
file's owner needs root, so most tests skip without it; the non-root fallback (write
in place) is checked by dropping to ``nobody`` in a forked child.
"""

from __future__ import annotations

import grp
import json
import os
import pwd
import shutil
import stat
import subprocess
import sys
import tempfile
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tuner.config.configpatch import ConfigPatcher
from tuner.config.journal import recover
from tuner.errors import TargetError
from tuner.files import FileMeta, atomic_write, atomic_write_text, copy_preserving

CONFIG = "# kept\nfusion:\n  rrf_k: 60  # RRF constant\n  weights: {bm25: 1.0, dense: 1.0}\n"


def _ids() -> tuple[int, int]:
    try:
        return pwd.getpwnam("nobody").pw_uid, grp.getgrnam("nogroup").gr_gid
    except KeyError:
        pytest.skip("no nobody user / nogroup group on this machine")


NOBODY, NOGROUP = _ids()
needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="chown to another user needs root (run as root to check ownership)")


def _meta(path: Path) -> tuple[int, int, int]:
    st = path.stat()
    return st.st_uid, st.st_gid, stat.S_IMODE(st.st_mode)


def _foreign_config(tmp_path: Path, mode: int = 0o640) -> Path:
    config = tmp_path / "etc" / "config.yaml"
    config.parent.mkdir()
    config.write_text(CONFIG)
    os.chown(config, NOBODY, NOGROUP)
    config.chmod(mode)
    return config


@needs_root
def test_patch_and_restore_keep_owner_group_and_mode(tmp_path: Path) -> None:
    config = _foreign_config(tmp_path)
    journal = tmp_path / "state" / "journal.json"
    patcher = ConfigPatcher([config], journal)
    assert patcher.notes == []  # root can give any owner: atomic replacements throughout
    inode = config.stat().st_ino

    patcher.apply({0: {"fusion.rrf_k": 20}})
    assert "rrf_k: 20" in config.read_text()
    assert config.stat().st_ino != inode  # replaced (atomic), not rewritten in place
    assert _meta(config) == (NOBODY, NOGROUP, 0o640)

    patcher.apply({0: {"fusion.rrf_k": 30}})  # a second trial
    assert _meta(config) == (NOBODY, NOGROUP, 0o640)

    assert patcher.restore() == [config.resolve()]
    assert config.read_text() == CONFIG
    assert _meta(config) == (NOBODY, NOGROUP, 0o640)


@needs_root
def test_the_journal_is_private_and_records_the_owner(tmp_path: Path) -> None:
    config = _foreign_config(tmp_path)
    journal = tmp_path / "state" / "journal.json"
    ConfigPatcher([config], journal).apply({0: {"fusion.rrf_k": 20}})
    assert stat.S_IMODE(journal.stat().st_mode) == 0o600  # holds the originals' bytes
    entry = json.loads(journal.read_text())["files"][0]
    assert (entry["uid"], entry["gid"], entry["mode"]) == (NOBODY, NOGROUP, 0o640)


@needs_root
def test_recover_after_a_crash_restores_bytes_owner_and_mode(tmp_path: Path) -> None:
    config = _foreign_config(tmp_path)
    journal = tmp_path / "state" / "journal.json"
    script = textwrap.dedent(
        f"""
        import os
        from tuner.config.configpatch import ConfigPatcher
        ConfigPatcher([{str(config)!r}], {str(journal)!r}).apply({{0: {{"fusion.rrf_k": 20}}}})
        os._exit(9)  # crash with the trial's config written and the journal left behind
        """
    )
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 9, proc.stderr
    assert journal.exists() and "rrf_k: 20" in config.read_text()
    # Whatever changed the owner meanwhile (an older tuner's write), recovery puts it back.
    os.chown(config, 0, 0)
    config.chmod(0o644)

    assert recover(journal) == [config.resolve()]
    assert config.read_text() == CONFIG
    assert _meta(config) == (NOBODY, NOGROUP, 0o640)
    assert not journal.exists()


@needs_root
def test_recover_puts_back_owner_and_mode_of_unchanged_bytes(tmp_path: Path) -> None:
    config = _foreign_config(tmp_path)
    journal = tmp_path / "state" / "journal.json"
    patcher = ConfigPatcher([config], journal)
    patcher.apply({0: {"fusion.rrf_k": 60}})  # same value: journal written, bytes unchanged
    os.chown(config, 0, 0)
    config.chmod(0o600)
    assert recover(journal) == [config.resolve()]
    assert _meta(config) == (NOBODY, NOGROUP, 0o640)


def test_a_journal_without_owner_fields_still_restores(tmp_path: Path) -> None:
    """Journals written by an older tuner (no uid/gid/mode) replay as before."""
    config = tmp_path / "config.yaml"
    config.write_text(CONFIG)
    config.chmod(0o640)
    journal = tmp_path / "journal.json"
    ConfigPatcher([config], journal).apply({0: {"fusion.rrf_k": 20}})
    payload = json.loads(journal.read_text())
    for entry in payload["files"]:
        del entry["uid"], entry["gid"], entry["mode"]
    journal.write_text(json.dumps(payload))
    assert recover(journal) == [config.resolve()]
    assert config.read_text() == CONFIG and stat.S_IMODE(config.stat().st_mode) == 0o640


@needs_root
def test_copies_keep_mode_and_owner(tmp_path: Path) -> None:
    private = _foreign_config(tmp_path, mode=0o600)
    backup = copy_preserving(private, tmp_path / "backup-private.yaml")
    assert backup.read_text() == CONFIG
    assert _meta(backup) == (NOBODY, NOGROUP, 0o600)

    shared = tmp_path / "shared.yaml"
    shared.write_text(CONFIG)
    shared.chmod(0o644)
    copy = tmp_path / "copy.yaml"
    copy.write_text("old copy\n")
    copy.chmod(0o600)
    copy_preserving(shared, copy)  # a replica copy refreshed: the source's mode, not the old copy's
    assert copy.read_text() == CONFIG and stat.S_IMODE(copy.stat().st_mode) == 0o644


def test_a_private_configs_copy_is_private_without_root(tmp_path: Path) -> None:
    config = tmp_path / "config.yaml"
    config.write_text(CONFIG)
    config.chmod(0o600)
    backup = copy_preserving(config, tmp_path / "backup.yaml")
    assert stat.S_IMODE(backup.stat().st_mode) == 0o600


def test_new_files_default_to_private_and_report_files_to_shared(tmp_path: Path) -> None:
    atomic_write(tmp_path / "secret.bin", b"x")
    assert stat.S_IMODE((tmp_path / "secret.bin").stat().st_mode) == 0o600
    atomic_write_text(tmp_path / "report.csv", "a\n")
    assert stat.S_IMODE((tmp_path / "report.csv").stat().st_mode) == 0o644
    atomic_write_text(tmp_path / "report.json", "{}\n", mode=0o600)
    assert stat.S_IMODE((tmp_path / "report.json").stat().st_mode) == 0o600
    (tmp_path / "old.json").write_text("{}")
    (tmp_path / "old.json").chmod(0o644)
    atomic_write_text(tmp_path / "old.json", "{}\n", mode=0o600)  # an older run's report is tightened
    assert stat.S_IMODE((tmp_path / "old.json").stat().st_mode) == 0o600


@needs_root
def test_report_writer_keeps_the_owner_of_a_file_it_replaces(tmp_path: Path) -> None:
    labels = _foreign_config(tmp_path, mode=0o664)
    atomic_write_text(labels, "new\n")
    assert labels.read_text() == "new\n" and _meta(labels) == (NOBODY, NOGROUP, 0o664)


# ---------------------------------------------------------------- non-root tuner


@pytest.fixture
def open_dir() -> Iterator[Path]:
    """A folder ``nobody`` can reach (pytest's tmp_path sits under a 0700 root folder)."""
    folder = Path(tempfile.mkdtemp(prefix="tuner-ownership-"))
    folder.chmod(0o755)
    try:
        yield folder
    finally:
        shutil.rmtree(folder)


def _as_nobody(config: Path, journal: Path) -> dict[str, Any]:
    """Patch and restore ``config`` in a forked child running as nobody:nogroup (the
    interpreter lives under /root, so a fresh one could not start as nobody)."""
    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child reports through the pipe
        out: dict[str, Any] = {}
        try:
            os.setgroups([])
            os.setgid(NOGROUP)
            os.setuid(NOBODY)
            patcher = ConfigPatcher([config], journal)
            out["notes"] = patcher.notes
            patcher.apply({0: {"fusion.rrf_k": 20}})
            out["patched"] = config.read_text()
            out["restored"] = [str(p) for p in patcher.restore()]
        except TargetError as exc:
            out["error"] = str(exc)
        except BaseException as exc:
            out["crash"] = repr(exc)
        finally:
            os.write(write_fd, json.dumps(out).encode())
            os._exit(0)
    os.close(write_fd)
    with os.fdopen(read_fd, "rb") as fh:
        data = fh.read()
    os.waitpid(pid, 0)
    out = json.loads(data)
    assert "crash" not in out, out["crash"]
    return out


def _state_for_nobody(root: Path) -> Path:
    state = root / "state"
    state.mkdir()
    os.chown(state, NOBODY, NOGROUP)
    return state / "journal.json"


@needs_root
def test_a_non_root_tuner_writes_a_file_it_does_not_own_in_place_and_says_so(open_dir: Path) -> None:
    """A group-writable config of another owner: a replacement would be the tuner's,
    so the bytes go into the file itself and the patcher says so."""
    config = _foreign_config(open_dir, mode=0o664)
    os.chown(config, 0, NOGROUP)  # root's file, writable by the tuner's group
    inode = config.stat().st_ino

    out = _as_nobody(config, _state_for_nobody(open_dir))
    assert "error" not in out, out
    assert len(out["notes"]) == 1 and "owned by root:nogroup 0664" in out["notes"][0]
    assert "rewritten in place" in out["notes"][0]
    assert "rrf_k: 20" in out["patched"] and out["restored"] == [str(config)]
    assert config.read_text() == CONFIG
    assert config.stat().st_ino == inode and _meta(config) == (0, NOGROUP, 0o664)


@needs_root
def test_a_non_root_tuner_that_cannot_write_the_file_gets_one_line_with_the_fix(open_dir: Path) -> None:
    config = _foreign_config(open_dir, mode=0o644)
    os.chown(config, 0, 0)
    config.parent.chmod(0o777)  # it may create the temp file, not give it root's owner

    out = _as_nobody(config, _state_for_nobody(open_dir))
    error = out["error"]
    assert "\n" not in error and "owned by root:root 0644" in error
    assert error.endswith("run the tuner as root, or let nobody write the file")
    assert config.read_text() == CONFIG and _meta(config) == (0, 0, 0o644)
    assert not [p for p in config.parent.iterdir() if p.name.endswith(".tmp")]


def test_file_meta_describes_owner_and_mode(tmp_path: Path) -> None:
    f = tmp_path / "f"
    f.write_text("")
    f.chmod(0o640)
    meta = FileMeta.of(f)
    assert meta is not None and meta.describe().endswith(" 0640") and FileMeta.of(tmp_path / "none") is None
