"""disk-full: the state dir's filesystem fills up (a real tmpfs mounted for the test,
root only): `tuner labels import` into a label DB on it, and a `tuner run` whose
state dir fills up mid-run. Each ends on one line naming the full filesystem and the
path, exit 2, the config files as found; after space is freed the study resumes.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from faults.faultlib import (
    PYTHON,
    Calibration,
    FaultLog,
    Project,
    Running,
    assert_survived,
    assess,
    judge,
    states,
    wait_until,
)

pytestmark = [pytest.mark.slow]


@pytest.fixture
def small_fs(tmp_path: Path) -> Iterator[Path]:
    """A 4 MiB tmpfs under ``tmp_path``, unmounted after the test (skipped where mount is not permitted)."""
    mnt = tmp_path / "small-fs"
    mnt.mkdir()
    if os.geteuid() != 0:
        pytest.skip("disk-full needs a small filesystem of its own: mounting a tmpfs needs root")
    made = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m,mode=0755", "tmpfs", str(mnt)],
                          capture_output=True, text=True)
    if made.returncode != 0:
        pytest.skip(f"disk-full needs a small filesystem of its own; mount -t tmpfs was refused: {made.stderr.strip()}")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)


def fill(mnt: Path) -> Path:
    """Write a file on ``mnt`` until the filesystem is full; returns it (remove it to free the space)."""
    filler = mnt / "filler"
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        while True:
            os.write(fd, b"\0" * 65536)
    except OSError:
        pass
    try:
        while True:  # the last few blocks
            os.write(fd, b"\0" * 512)
    except OSError:
        pass
    finally:
        os.close(fd)
    return filler


def test_a_full_state_dir_ends_in_one_line(tmp_path: Path, small_fs: Path, calibration: Calibration,
                                           fault_log: FaultLog) -> None:
    # (a) `tuner labels import` of a file bigger than what is left of the filesystem.
    project = Project.create(tmp_path / "full", study="full", n_trials=6, state_dir=str(small_fs / "state"))
    big = project.root / "big-qrels.txt"
    big.write_text("".join(f"q{q} 0 q{q}-doc-{d}-{'x' * 40} {d % 4}\n" for q in range(300) for d in range(200)))
    db = small_fs / "state" / "labels-import.db"
    logs = project.root / "logs"
    logs.mkdir(exist_ok=True)
    imported = Running([PYTHON, "-m", "tuner", "labels", "import", str(big), "--dataset-id", "big", "--db", str(db),
                        "--format", "qrels"], project.root, logs / "00-labels-import").wait()
    db.unlink(missing_ok=True)
    by_import = {
        "exit 2": imported.returncode == 2,
        "one line naming the full filesystem and the label DB": imported.one_line_error(
            f"no space left on the filesystem at {small_fs} (tmpfs", f"writing {db} (database or disk is full)"),
    }
    # (b) `tuner run` whose state dir fills up once trial 1's backend serves.
    run = project.start("run", "--no-cache")
    try:
        wait_until(lambda: project.serving(3) or not run.alive(), "trial 1's batch is under way")
        assert run.alive(), "the run ended before trial 1"
        filler = fill(small_fs)
        done = run.wait()
    finally:
        run.kill_quietly()
    full_line = done.one_line_error(f"no space left on the filesystem at {small_fs} (tmpfs",
                                    f"writing {small_fs / 'state'}", "the config files are restored")
    by_run = {
        "exit 2": done.returncode == 2,
        "one line naming the full filesystem and the state dir, saying the config is restored": full_line,
        "no traceback": "Traceback" not in done.output,
        "the config as found (said by the restore)": project.config.read_bytes() == project.original
        and "restarting the backend on the original config" in done.stdout,
        "no restore journal left": not project.journal_left(),
    }
    # Space freed: the study resumes (a trial the full disk kept from its record is failed as stale).
    filler.unlink()
    again = project.tuner("run", "--n-trials", "1", "--no-cache")
    trials = project.trials()
    record = fault_log.add(judge("disk-full", assess(project, calibration), {
        "the resumed run exits 0": again.returncode == 0,
        "the resumed run measured a trial": states(trials)[-1:] == ["COMPLETE"],
        "locks free": project.locks_free(),
    }, injections={"labels import": by_import, "run, state dir filled mid-run": by_run}))
    assert_survived(record)
