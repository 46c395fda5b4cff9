"""Two runs on one study (or on one config file) at once.

While a `tuner run` holds trial 1 (its searches wait for the test's release file), a
second `tuner run` of the same experiment and a run of another experiment that
patches the same config file (its own study and state dir) start. Both must be
refused at once with one line naming the holder (exit 2), without starting a backend
or touching the config; the first run then finishes as if alone.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from faults.faultlib import RELEASE, Calibration, FaultLog, Project, assert_survived, assess, judge, states, wait_until

pytestmark = [pytest.mark.slow]


def test_a_second_run_is_refused_naming_the_holder(tmp_path: Path, calibration: Calibration,
                                                    fault_log: FaultLog) -> None:
    root = tmp_path / "two"
    project = Project.create(root, study="two", n_trials=3, plan={"3": {"hold_until": RELEASE}})
    other = project.write_experiment("other.yaml", study="other", state_dir="state-other")
    first = project.start("run", "--no-cache")
    try:
        wait_until(lambda: project.serving(3) or not first.alive(), "trial 1 is evaluating")
        assert first.alive(), "the first run ended before trial 1"
        same = project.start("run", "--no-cache")
        shared_config = project.start("run", "--no-cache", experiment=other)
        same_done, shared_done = same.wait(), shared_config.wait()
        lives_while_held = project.lives()
        project.release()
        done = first.wait()
    finally:
        project.release()
        first.kill_quietly()
    holder = f"pid {first.pid}"
    record = fault_log.add(judge("two-runs-one-study", assess(project, calibration), {
        "the first run exits 0": done.returncode == 0,
        "the first run measured every trial": states(project.trials()) == ["COMPLETE"] * 3,
        "no backend started by a refused run": lives_while_held == 3,
        "locks free at the end": project.locks_free(),
    }, injections={
        "same experiment": {"exit 2": same_done.returncode == 2,
                            "one line naming the holder": same_done.one_line_error("study 'two'", holder,
                                                                                   "tuner run")},
        "other study, same config file": {"exit 2": shared_done.returncode == 2,
                                          "one line naming the holder": shared_done.one_line_error(
                                              str(project.config), holder),
                                          "its study was never created": not (root / "state-other" / "optuna.db").exists()},
    }))
    assert_survived(record)

