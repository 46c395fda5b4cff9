"""SIGTERM and SIGKILL of `tuner run --parallel 4` (target.channel: request) while four
trials are measured at once on the one backend.

The fault backend takes ``fusion.depth`` per request (``overrides.fusion.depth``), and a
trial's score is a known function of it (the suite's `Calibration`, measured one depth at
a time): a trial scored on another trial's values would show as lost. Four shortlist
variants (depths 6 to 9) are queued; every search of theirs waits for the test's release
file, so the signal lands when the backend's event log shows all four depths in flight
(an outcome of what ran, never a speed).

- SIGTERM: the four trials under way are measured to the end, none begins after, exit
  143; the next run measures exactly what the study still lacks.
- SIGKILL: the four trials are left RUNNING; the next run fails them as stale, queues
  each variant again and measures it, so no variant is lost and n_trials is exact.
"""

from __future__ import annotations

import signal
from pathlib import Path
from typing import Any

import pytest
from optuna.trial import TrialState

from faults.faultlib import (
    DEPTH_AS_FOUND,
    RELEASE,
    Calibration,
    FaultLog,
    Project,
    assert_survived,
    assess,
    judge,
    wait_until,
)

pytestmark = [pytest.mark.slow]
DEPTHS = (6, 7, 8, 9)
N_TRIALS = 8
PARALLEL = "4"


def parallel_project(root: Path, study: str) -> Project:
    """The fault project with its depth in the request: the variants' searches are held."""
    config = root / "backend" / "config.yaml"
    project = Project.create(
        root, study=study, n_trials=N_TRIALS,
        plan={f"request:depth={d}": {"hold_until": RELEASE} for d in DEPTHS},
        baseline=False,
        shortlist=[{"name": f"depth-{d}", "fusion.depth": d} for d in DEPTHS],
        target={"channel": "request", "config_files": [], "request": {"bind": {"fusion.depth":
                                                                                 "body.overrides.fusion.depth"}}},
        evaluation={"request": {"body": {"query": "{query}", "query_id": "{query_id}", "top_k": "{top_k}",
                                         "overrides": {"fusion": {"depth": DEPTH_AS_FOUND}}}}},
    )
    # no config file is tuned: the process command names the backend's config itself
    doc = project.experiment.read_text().replace("{config}", str(config))
    project.experiment.write_text(doc)
    return project


def in_flight(project: Project) -> set[int]:
    """The variants' depths the backend has been asked for."""
    return {e["depth"] for e in project.events() if e["event"] == "search" and e.get("depth") in DEPTHS}


def start_and_wait_for_four(project: Project) -> Any:
    run = project.start("run", "--parallel", PARALLEL, "--no-cache")
    wait_until(lambda: in_flight(project) == set(DEPTHS) or not run.alive(), "four trials in flight at once")
    assert run.alive(), run.stdout_so_far()
    return run


def by_depth(trials: list[Any]) -> dict[int, list[Any]]:
    out: dict[int, list[Any]] = {}
    for t in trials:
        if "fusion.depth" in t.params:
            out.setdefault(int(t.params["fusion.depth"]), []).append(t)
    return out


def test_sigterm_mid_parallel_measures_the_trials_under_way_and_begins_none(
        tmp_path: Path, calibration: Calibration, fault_log: FaultLog) -> None:
    project = parallel_project(tmp_path / "term-parallel", "term-parallel")
    run = start_and_wait_for_four(project)
    try:
        run.send_signal(signal.SIGTERM)
        wait_until(lambda: "SIGTERM" in run.stdout_so_far() or not run.alive(), "the run acknowledged SIGTERM")
        project.release()
        first = run.wait()
    finally:
        project.release()
        run.kill_quietly()
    before = project.trials()
    again = project.tuner("run", "--parallel", PARALLEL, "--no-cache")
    after = project.trials()
    checks = {
        "exit 143": first.returncode == 143,
        "said SIGTERM": "SIGTERM" in first.stdout,
        "the four under way were measured to the end": sorted(t.state.name for t in before) == ["COMPLETE"] * 4,
        "each under way was a variant": sorted(int(t.params["fusion.depth"]) for t in before) == list(DEPTHS),
        "the config file was never touched": project.config.read_bytes() == project.original,
        "the resumed run exits 0": again.returncode == 0,
        "n_trials exact": [t.state for t in after] == [TrialState.COMPLETE] * N_TRIALS,
        "locks free": project.locks_free(),
    }
    record = fault_log.add(judge("sigterm-parallel", assess(project, calibration), checks))
    assert_survived(record)


def test_sigkill_mid_parallel_then_restart_retries_every_trial_under_way(
        tmp_path: Path, calibration: Calibration, fault_log: FaultLog) -> None:
    project = parallel_project(tmp_path / "kill-parallel", "kill-parallel")
    run = start_and_wait_for_four(project)
    try:
        run.send_signal(signal.SIGKILL)
        run.proc.wait(timeout=60)
    finally:
        project.release()
        run.kill_quietly()
    at_kill = project.trials()
    again = project.tuner("run", "--parallel", PARALLEL, "--no-cache")
    after = project.trials()
    stale = [t for t in after if t.number in {s.number for s in at_kill}]
    depths = by_depth(after)
    checks = {
        "four trials were RUNNING at the kill": sorted(t.state.name for t in at_kill) == ["RUNNING"] * 4,
        "the restart exits 0": again.returncode == 0,
        "they were failed as stale": all(t.state == TrialState.FAIL
                                         and str(t.user_attrs.get("fail_reason", "")).startswith("stale")
                                         for t in stale),
        "each variant was queued again and measured": all(
            any(t.state == TrialState.COMPLETE for t in depths.get(d, [])) for d in DEPTHS),
        "n_trials exact": sum(t.state == TrialState.COMPLETE for t in after) == N_TRIALS,
        "nothing RUNNING": not [t for t in after if t.state == TrialState.RUNNING],
        "the config file was never touched": project.config.read_bytes() == project.original,
        "locks free": project.locks_free(),
    }
    record = fault_log.add(judge("sigkill-parallel", assess(project, calibration), checks))
    assert_survived(record)
