"""Round-trip patching, atomic writes and the restore journal, on real files."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from ruamel.yaml import YAML

from tuner.config.configpatch import ConfigPatcher, patch_text, unified_diff
from tuner.config.journal import Journal, recover
from tuner.errors import ConfigError, TargetError

CONFIG = textwrap.dedent(
    """\
    # Top comment: kept.
    server:
      host: 127.0.0.1   # loopback only
      port: 8080

    fusion:
      method: rrf                      # rrf | linear
      rrf_k: 60                        # RRF constant
      weights: {bm25: 1.0, dense: 1.0} # per-source weights
      label: "quoted value"
    fallback:
      windows_days: [30, 90]           # strictly increasing
      block:
        - 1
        - 2
    recency:
      weight: 0.0                      # float in the file
      half_life_days: 30               # int in the file
    # Trailing comment: kept.
    """
)


def changed_lines(before: str, after: str) -> dict[int, tuple[str, str]]:
    a, b = before.splitlines(), after.splitlines()
    assert len(a) == len(b), "patching must not add or drop lines"
    return {i: (x, y) for i, (x, y) in enumerate(zip(a, b)) if x != y}


def plain(text: str) -> object:
    return YAML(typ="safe", pure=True).load(text)


def test_only_patched_values_change_byte_for_byte() -> None:
    out = patch_text(
        CONFIG,
        {
            "fusion.rrf_k": 175,
            "fusion.weights": {"bm25": 0.3, "dense": 0.7},
            "fallback.windows_days": [14, 120],
            "fusion.label": "other value",
        },
    )
    diff = changed_lines(CONFIG, out)
    assert sorted(diff) == [7, 8, 9, 11]
    assert diff[7][1] == "  rrf_k: 175                       # RRF constant"
    assert diff[8][1] == "  weights: {bm25: 0.3, dense: 0.7} # per-source weights"
    assert diff[9][1] == '  label: "other value"'  # quoting style kept
    assert diff[11][1] == "  windows_days: [14, 120]          # strictly increasing"  # flow style kept
    expected = plain(CONFIG)
    expected["fusion"].update(rrf_k=175, weights={"bm25": 0.3, "dense": 0.7}, label="other value")
    expected["fallback"]["windows_days"] = [14, 120]
    assert plain(out) == expected


def test_int_and_float_spelling_follows_the_file() -> None:
    out = patch_text(CONFIG, {"recency.weight": 1, "recency.half_life_days": 45.0, "fallback.block": [3, 4, 5]})
    data = plain(out)
    assert data["recency"]["weight"] == 1.0 and isinstance(data["recency"]["weight"], float)
    assert data["recency"]["half_life_days"] == 45 and isinstance(data["recency"]["half_life_days"], int)
    assert "  weight: 1.0 " in out
    assert "    - 5\n" in out  # block list stays a block list with the file's indentation


def test_unpatched_round_trip_is_identical_including_indentation_and_crlf() -> None:
    four = "a:\n    b:\n        - x\n        - y\n    c: 1   # c\n"
    assert patch_text(four, {"a.c": 2}) == four.replace("c: 1   # c", "c: 2   # c")
    crlf = CONFIG.replace("\n", "\r\n")
    out = patch_text(crlf, {"fusion.rrf_k": 61})
    assert out == crlf.replace("rrf_k: 60 ", "rrf_k: 61 ")


@pytest.mark.parametrize(
    ("path", "needle"),
    [
        ("fusion.rrf_kk", "fusion.rrf_kk: no such key (did you mean fusion.rrf_k?)"),
        ("fusoin.rrf_k", "no such key fusoin"),
        ("fusion.weights.sparse", "no such key"),
    ],
)
def test_unknown_paths_are_refused(path: str, needle: str) -> None:
    with pytest.raises(ConfigError) as exc:
        patch_text(CONFIG, {path: 1}, "cfg.yaml")
    assert needle in str(exc.value) and str(exc.value).startswith("cfg.yaml: ")


@pytest.fixture
def files(tmp_path: Path) -> list[Path]:
    a = tmp_path / "config.yaml"
    b = tmp_path / "other.yaml"
    a.write_text(CONFIG)
    b.write_text("x: 1  # other file\ny: [1, 2]\n")
    return [a, b]


def test_render_writes_nothing_and_diff_shows_only_the_change(files: list[Path], tmp_path: Path) -> None:
    patcher = ConfigPatcher(files, tmp_path / "state" / "journal.json")
    texts = patcher.render({0: {"fusion.rrf_k": 10}})
    assert files[0].read_text() == CONFIG
    assert list(texts) == files and texts[files[1]] == files[1].read_text()
    diff = patcher.diff({0: {"fusion.rrf_k": 10}, 1: {"x": 2}})
    assert [ln for ln in diff.splitlines() if ln[:1] in "+-" and ln[:3] not in ("+++", "---")] == [
        "-  rrf_k: 60                        # RRF constant",
        "+  rrf_k: 10                        # RRF constant",
        "-x: 1  # other file",
        "+x: 2  # other file",
    ]
    assert unified_diff("a\n", "a\n", "same") == ""


def test_apply_journals_first_and_restore_is_byte_for_byte(files: list[Path], tmp_path: Path) -> None:
    originals = [f.read_bytes() for f in files]
    journal_path = tmp_path / "state" / "journal.json"
    patcher = ConfigPatcher(files, journal_path)
    patcher.apply({0: {"fusion.rrf_k": 10}})
    assert journal_path.exists()
    recorded = json.loads(journal_path.read_text())["files"]
    assert [Path(e["path"]) for e in recorded] == [f.resolve() for f in files]
    # A second trial renders from the originals, not from the first trial's file.
    patcher.apply({0: {"fusion.method": "linear"}, 1: {"y": [5, 6]}})
    current = plain(files[0].read_text())
    assert current["fusion"]["rrf_k"] == 60 and current["fusion"]["method"] == "linear"
    assert files[1].read_text() == "x: 1  # other file\ny: [5, 6]\n"
    assert sorted(patcher.restore()) == sorted(f.resolve() for f in files)
    assert [f.read_bytes() for f in files] == originals
    assert not journal_path.exists()
    assert patcher.restore() == []  # idempotent


def test_a_failed_write_leaves_the_original_and_no_temp_file(
    files: list[Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    before = files[0].read_bytes()

    def disk_full(fd: int) -> None:
        raise OSError(28, "No space left on device")

    patcher = ConfigPatcher(files)  # no journal: the write itself is under test
    monkeypatch.setattr(os, "fsync", disk_full)
    with pytest.raises(OSError, match="No space left"):
        patcher.apply({0: {"fusion.rrf_k": 10}})
    monkeypatch.undo()
    assert files[0].read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["config.yaml", "other.yaml"]


CRASHER = """
import os, sys
from tuner.config.configpatch import ConfigPatcher
patcher = ConfigPatcher(sys.argv[1:3], sys.argv[3])
patcher.apply({0: {"fusion.rrf_k": 7}, 1: {"x": 9}})
os._exit(1)  # die without restoring, like a killed tuner
"""


def test_recover_replays_a_journal_left_by_a_crash(files: list[Path], tmp_path: Path) -> None:
    originals = [f.read_bytes() for f in files]
    journal_path = tmp_path / "state" / "journal.json"
    proc = subprocess.run(
        [sys.executable, "-c", CRASHER, str(files[0]), str(files[1]), str(journal_path)],
        capture_output=True, text=True, timeout=60,
    )
    assert proc.returncode == 1, proc.stderr
    assert plain(files[0].read_text())["fusion"]["rrf_k"] == 7  # the crash left the trial's config
    assert journal_path.exists()
    restored = recover(journal_path)
    assert sorted(restored) == sorted(f.resolve() for f in files)
    assert [f.read_bytes() for f in files] == originals
    assert not journal_path.exists()
    assert recover(journal_path) == []


def test_a_journal_for_other_files_is_not_overwritten(files: list[Path], tmp_path: Path) -> None:
    journal_path = tmp_path / "journal.json"
    ConfigPatcher(files[:1], journal_path).apply({0: {"fusion.rrf_k": 3}})
    with pytest.raises(TargetError, match="a restore journal for other files exists"):
        ConfigPatcher(files, journal_path).apply({1: {"x": 2}})
    assert Journal(journal_path).restore() == [files[0].resolve()]


def test_corrupt_journal_is_reported_not_applied(files: list[Path], tmp_path: Path) -> None:
    journal_path = tmp_path / "journal.json"
    ConfigPatcher(files, journal_path).apply({0: {"fusion.rrf_k": 3}})
    payload = json.loads(journal_path.read_text())
    payload["files"][0]["sha256"] = "0" * 64
    journal_path.write_text(json.dumps(payload))
    with pytest.raises(TargetError, match="corrupt"):
        recover(journal_path)
    assert journal_path.exists()  # kept for a human to look at


def test_missing_config_file_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="config file not found"):
        ConfigPatcher([tmp_path / "nope.yaml"])


def test_repeated_patches_of_one_text_do_not_leak_into_each_other() -> None:
    # patch_text caches the parsed base text; each call must patch a fresh copy of it.
    first = patch_text(CONFIG, {"fusion.rrf_k": 175, "fallback.windows_days": [14, 120, 365]})
    second = patch_text(CONFIG, {"fusion.method": "linear"})
    assert plain(first)["fallback"]["windows_days"] == [14, 120, 365]
    assert sorted(changed_lines(CONFIG, second)) == [6]
    assert patch_text(CONFIG, {}) == CONFIG


def test_values_that_do_not_change_leave_the_text_byte_for_byte() -> None:
    """Issue 26 item 4: the baseline writes the file as found, and a key whose value is
    unchanged keeps its line even when another key changes."""
    text = CONFIG.replace("{bm25: 1.0, dense: 1.0}", "{bm25: 1.00, dense: 1.0}").replace("rrf_k: 60 ", "rrf_k: 6e1")
    same = {"fusion.weights": {"bm25": 1, "dense": 1.0}, "fusion.rrf_k": 60.0, "fallback.windows_days": [30, 90],
            "recency.weight": 0, "fusion.label": "quoted value"}
    assert patch_text(text, same) == text  # verbatim: not even a round trip
    out = patch_text(text, {**same, "fusion.method": "linear"})
    assert changed_lines(text, out) == {6: ("  method: rrf                      # rrf | linear",
                                            "  method: linear                   # rrf | linear")}
    # 0.5/0.5 is a change for a backend that does not divide by the weight sum: written
    out = patch_text(text, {"fusion.weights": {"bm25": 0.5, "dense": 1.0}})
    assert list(changed_lines(text, out).values()) == [("  weights: {bm25: 1.00, dense: 1.0} # per-source weights",
                                                         "  weights: {bm25: 0.5, dense: 1.0}  # per-source weights")]


def test_an_unknown_key_is_refused_even_with_no_change() -> None:
    with pytest.raises(ConfigError, match="no such key"):
        patch_text(CONFIG, {"fusion.rrf_kk": 60})
