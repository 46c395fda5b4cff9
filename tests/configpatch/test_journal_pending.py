"""A restore journal on disk as a reader sees it (tuner.config.journal.pending): whose
it is, what a replay would restore, the command that resolves it; and what a replay says."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from tuner.config.configpatch import ConfigPatcher
from tuner.config.journal import pending, recover, recover_hint


def patched(tmp_path: Path, owner: str | None) -> tuple[Path, Path, bytes]:
    config = tmp_path / "config.yaml"
    config.write_text("fusion:\n  rrf_k: 60   # kept\n")
    original = config.read_bytes()
    journal = tmp_path / "state" / "restore-journal.json"
    patcher = ConfigPatcher([config], journal)
    assert patcher.journal is not None
    patcher.journal.owner = owner
    patcher.apply({0: {"fusion.rrf_k": 167}})
    return config, journal, original


def dead_pid() -> int:
    """The pid of a process that has ended (a journal's writer killed)."""
    proc = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    return int(proc.stdout)


def as_left_by(journal: Path, pid: int) -> None:
    payload = json.loads(journal.read_text())
    payload["pid"] = pid
    journal.write_text(json.dumps(payload))


def test_no_journal_is_nothing_pending(tmp_path: Path) -> None:
    assert pending(tmp_path / "restore-journal.json") is None


def test_a_killed_apply_s_journal_is_one_line_naming_it_what_it_restores_and_the_fix(tmp_path: Path) -> None:
    config, journal, original = patched(tmp_path, "tuner apply of trial #3 (study 'demo')")
    as_left_by(journal, dead_pid())
    found = pending(journal)
    assert found is not None and not found.alive
    assert found.files == [config.resolve()] and found.differ == [config.resolve()]
    line = found.line(recover_hint("exp.yaml"))
    assert "\n" not in line
    assert line.startswith(f"restore journal pending: {journal}, left by tuner apply of trial #3 (study 'demo')")
    assert "no longer running" in line
    assert f"a replay restores {config} (now holding other bytes than the original)" in line
    assert "`tuner apply exp.yaml --recover`" in line
    assert config.read_bytes() != original and journal.exists()  # reading changed nothing


def test_a_journal_whose_writer_still_runs_is_a_live_one(tmp_path: Path) -> None:
    _config, journal, _ = patched(tmp_path, "tuner run of study 'demo'")
    as_left_by(journal, os.getppid())  # a live process other than this one
    found = pending(journal)
    assert found is not None and found.alive
    assert "still running" in found.line("X") and "until it ends and restores" in found.line("X")


def test_a_replay_says_what_it_restored_and_from_whose_journal(tmp_path: Path) -> None:
    config, journal, original = patched(tmp_path, "tuner apply of trial #3 (study 'demo')")
    as_left_by(journal, dead_pid())
    found = pending(journal)
    assert found is not None
    line = found.replayed_line(recover(journal))
    assert config.read_bytes() == original and not journal.exists()
    assert line.startswith(f"replayed the restore journal {journal} left by tuner apply of trial #3 (study 'demo')")
    assert line.endswith(f"restored {config} (original bytes, owner and mode)")


def test_a_journal_an_older_tuner_wrote_names_no_owner_but_still_reads(tmp_path: Path) -> None:
    _config, journal, _ = patched(tmp_path, None)
    payload = json.loads(journal.read_text())
    assert "owner" not in payload
    found = pending(journal)
    assert found is not None and found.owner == "a tuner command"


def test_a_reader_names_an_unreadable_journal_instead_of_failing(tmp_path: Path) -> None:
    from types import SimpleNamespace

    from tuner.cli.study_common import pending_journal_line

    journal = tmp_path / "restore-journal.json"
    journal.write_text("{not json")
    line = pending_journal_line(SimpleNamespace(journal_path=journal, source="exp.yaml"))
    assert line is not None and line.startswith("restore journal pending but unreadable: ")
    assert "restore the config by hand" in line
