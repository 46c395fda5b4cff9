"""A SIGKILL inside `tuner apply`: what it leaves, what every reader says, the recovery.

- sigkill-apply: `tuner apply` is killed after its write, while it re-evaluates the
  trial's config. Every command that reads the config (`apply --dry-run`, `best`,
  `report`, `check`) says so in one line naming the journal, what it would restore and
  the command that resolves it; `tuner apply --recover` replays it, says what it
  restored and from whose journal, and restarts the backend on the original (served:
  its config fingerprint is the file's); a plain `tuner apply` after another kill
  replays it, says so, and applies.
"""

from __future__ import annotations

import hashlib
import json
import signal
from collections.abc import Iterator
from typing import Any

import pytest

from faults.faultlib import (
    Calibration,
    Done,
    FaultLog,
    Project,
    assert_survived,
    assess,
    fail_reasons,
    judge,
    states,
    wait_until,
)
from tuner.study.trial.attrs import assignment_of

pytestmark = [pytest.mark.slow]

JOURNAL, CONFIG = "state/restore-journal.json", "backend/config.yaml"  # as the tuner names them in the project


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def depth_of(trial: Any) -> int:
    return int(assignment_of(trial)["fusion.depth"])


def starts(project: Project) -> list[dict[str, Any]]:
    return [e for e in project.events() if e["event"] == "start"]


def searched(project: Project, life: int) -> bool:
    return any(e["event"] == "search" and e["life"] == life for e in project.events())


def journal_lines(done: Done) -> list[str]:
    return [ln for ln in done.output.splitlines() if "restore journal pending: " in ln]


def one_pending_line(done: Done, project: Project, trial: int) -> bool:
    """Exactly one line: the journal, whose (the killed apply and its trial), what a
    replay restores (the config) and the command that resolves it."""
    lines = journal_lines(done)
    return len(lines) == 1 and all(needle in lines[0] for needle in (
        f"restore journal pending: {JOURNAL}", f"tuner apply of trial #{trial} (study 'crash')",
        "no longer running", f"a replay restores {CONFIG}", f"`tuner apply {project.experiment} --recover`"))


def served_damage(what: str, served: str | None, on_disk: bytes) -> list[str]:
    return [] if served == sha(on_disk) else [f"{what}: fingerprint {served} is not the file's {sha(on_disk)}"]


def kill_apply_mid_check(project: Project, trial: int) -> tuple[int, int]:
    """`tuner apply --trial N` killed while it re-measures the trial's config (its
    searches held); returns (the apply's backend life, apply's exit code)."""
    apply_life = project.lives() + 1
    project.plan_file.write_text(json.dumps({str(apply_life): {"hold_until": str(project.root / "release")}}))
    running = project.start("apply", "--trial", str(trial))
    try:
        wait_until(lambda: searched(project, apply_life) or not running.alive(), "apply re-measured the trial")
        assert running.alive(), running.wait().output
        running.send_signal(signal.SIGKILL)
        done = running.wait()
    finally:
        running.kill_quietly()
        project.plan_file.write_text("{}")
    return apply_life, done.returncode


# ---------------------------------------------------------------- sigkill-apply


@pytest.fixture(scope="module")
def studied(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    root = tmp_path_factory.mktemp("crash-recovery") / "apply"
    project = Project.create(root, study="crash", n_trials=2)
    done = project.tuner("run", "--no-cache")
    assert done.returncode == 0, done.output
    trials = project.trials()
    assert states(trials) == ["COMPLETE", "COMPLETE"], fail_reasons(trials)
    other = next(t for t in trials if depth_of(t) != 4)
    yield {"project": project, "trial": other.number, "depth": depth_of(other)}


def test_a_killed_apply_is_reported_by_every_reader_and_recovered_onto_the_original(
        studied: dict[str, Any], calibration: Calibration, fault_log: FaultLog) -> None:
    project: Project = studied["project"]
    trial = studied["trial"]
    journal = project.root / "state" / "restore-journal.json"
    _life, killed_rc = kill_apply_mid_check(project, trial)
    left = {"killed by SIGKILL": killed_rc == -signal.SIGKILL,
            "the kill left the trial's config and its journal": project.config.read_bytes() != project.original
            and journal.exists()}
    readers = {name: project.tuner(*argv) for name, argv in {
        "apply --dry-run": ("apply", "--dry-run", "--trial", str(trial)),
        "best": ("best",),
        "report": ("report",),
        "check": ("check",),
    }.items()}
    reader_checks = {f"{name}: one line naming the journal, what it restores and the fix":
                     one_pending_line(done, project, trial) for name, done in readers.items()}
    reader_checks["the readers left the journal pending"] = journal.exists()
    for name, done in readers.items():
        print(f"--- {name} (exit {done.returncode})\n{done.output}")

    lives_before = project.lives()
    recovered = project.tuner("apply", "--recover")
    print(f"--- apply --recover (exit {recovered.returncode})\n{recovered.output}")
    replayed = [ln for ln in recovered.stdout.splitlines() if ln.startswith("replayed the restore journal ")]
    restart = [e for e in starts(project) if e["life"] > lives_before]
    damage = assess(project, calibration)
    damage.served += served_damage("after apply --recover", restart[-1].get("config_fingerprint") if restart else None,
                                   project.config.read_bytes())
    record = fault_log.add(judge("sigkill-apply", damage, {}, injections={
        "SIGKILL inside apply": {
            **left, **reader_checks,
            "apply --recover exit 0": recovered.returncode == 0,
            "it says what it restored, from whose journal": len(replayed) == 1 and all(needle in replayed[0] for needle in (
                JOURNAL, f"left by tuner apply of trial #{trial} (study 'crash')", f"restored {CONFIG}")),
            "it restarted the backend on the original": len(restart) == 1 and restart[0]["depth"] == 4,
            "no journal left": not journal.exists(),
            "locks free": project.locks_free(),
        },
    }))
    assert_survived(record)


def test_the_next_apply_after_a_killed_one_says_what_it_replayed_and_applies(
        studied: dict[str, Any], calibration: Calibration, fault_log: FaultLog) -> None:
    project: Project = studied["project"]
    trial = studied["trial"]
    journal = project.root / "state" / "restore-journal.json"
    _life, killed_rc = kill_apply_mid_check(project, trial)
    lives_before = project.lives()
    applied = project.tuner("apply", "--trial", str(trial))
    print(f"--- apply (exit {applied.returncode})\n{applied.output}")
    replayed = [ln for ln in applied.stdout.splitlines() if ln.startswith("replayed the restore journal ")]
    restarts = [e for e in starts(project) if e["life"] > lives_before]
    trial_config = project.original.replace(b"depth: 4   #", f"depth: {studied['depth']}   #".encode())
    project.original = trial_config  # what apply must leave
    damage = assess(project, calibration)
    checks = {
        "killed by SIGKILL": killed_rc == -signal.SIGKILL,
        "exit 0": applied.returncode == 0,
        "it says what it replayed, from whose journal": len(replayed) == 1
        and f"left by tuner apply of trial #{trial} (study 'crash')" in replayed[0]
        and f"restored {CONFIG}" in replayed[0],
        "the backend served the restored original before the apply's write": bool(restarts)
        and restarts[0]["depth"] == 4,
        "then the trial's config": bool(restarts) and restarts[-1]["depth"] == studied["depth"],
        "no journal left": not journal.exists(),
    }
    record = fault_log.add(judge("sigkill-apply", damage, checks, injections={"SIGKILL inside apply, then apply": {}}))
    assert_survived(record)
