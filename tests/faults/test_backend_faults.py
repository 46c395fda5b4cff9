"""Faults of the backend under a `tuner run`: a crash mid-batch, a backend that never
becomes healthy, 5xx storms, timeouts and malformed JSON.

Each scenario is one `tuner run --no-cache` on the fault backend (faultlib), whose plan
breaks chosen lives: life 1 is the preflight's start, life k >= 2 serves trial k - 2,
the last life the restore. A fault that a retry can absorb must leave a COMPLETE trial
with its own config's score; one it cannot must fail that trial with a one-line reason
under the failure budget, and the study goes on. Either way the run ends cleanly:
config restored, no lost trial, no process left, the study free to resume.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from faults.faultlib import Calibration, FaultLog, Project, assert_survived, assess, fail_reasons, judge, states

pytestmark = [pytest.mark.slow]


def life_of(trial: int) -> str:
    return str(trial + 2)


def run_plan(root: Path, study: str, n_trials: int, plan: dict[str, Any], **overrides: Any) -> tuple[Project, Any]:
    project = Project.create(root / study, study=study, n_trials=n_trials, plan=plan, **overrides)
    return project, project.tuner("run", "--no-cache")


def ended_cleanly(project: Project, done: Any) -> dict[str, bool]:
    return {
        "exit 0": done.returncode == 0,
        "nothing on stderr": done.stderr.strip() == "",
        "original config restored (said)": "original config restored" in done.stdout,
        "no restore journal left": not project.journal_left(),
        "study and config locks free (resumable)": project.locks_free(),
    }


def failed_with(reasons: dict[int, str], number: int, *needles: str) -> dict[str, bool]:
    reason = reasons.get(number, "")
    return {f"trial #{number} FAIL": number in reasons,
            f"trial #{number} reason is one line": bool(reason) and "\n" not in reason,
            f"trial #{number} reason names {' or '.join(needles)}": any(n in reason for n in needles)}


def test_backend_crash_mid_batch(tmp_path: Path, calibration: Calibration, fault_log: FaultLog) -> None:
    # The backend of trial 1 exits hard on its 3rd search, with requests in flight.
    project, done = run_plan(tmp_path, "crash", 4, {life_of(1): {"crash_after": 2}})
    trials = project.trials()
    reasons = fail_reasons(trials)
    record = fault_log.add(judge("backend-crash-mid-batch", assess(project, calibration), {
        **ended_cleanly(project, done),
        "the other trials completed": states(trials) == ["COMPLETE", "FAIL", "COMPLETE", "COMPLETE"],
        **failed_with(reasons, 1, "ConnectError", "BackendExited", "exited with code"),
    }))
    assert project.lives() == 6 and any(e["event"] == "crash" for e in project.events())
    assert_survived(record)


def test_backend_never_healthy(tmp_path: Path, calibration: Calibration, fault_log: FaultLog) -> None:
    # (a) one trial's backend never answers /health with 200: that trial fails, the study goes on.
    health = {"target": {"health": {"deadline_s": 6}}}
    one, done = run_plan(tmp_path, "unhealthy-one", 3, {life_of(1): {"never_healthy": True}}, **health)
    trials = one.trials()
    damage_one = assess(one, calibration)
    # (b) no backend ever becomes healthy: the preflight stops the run with one line, nothing patched.
    every, refused = run_plan(tmp_path, "unhealthy-all", 3, {"*": {"never_healthy": True}}, **health)
    damage = damage_one.merged(assess(every, calibration))
    record = fault_log.add(judge("backend-never-healthy", damage, {}, injections={
        "one trial": {**ended_cleanly(one, done),
                      "the other trials completed": states(trials) == ["COMPLETE", "FAIL", "COMPLETE"],
                      **failed_with(fail_reasons(trials), 1, "HealthTimeout")},
        "every start": {"exit 2": refused.returncode == 2,
                        "one-line error naming the health URL": refused.one_line_error("/health", "not healthy"),
                        "no trial ran": not [t for t in every.trials() if t.state.is_finished()],
                        "no restore journal left": not every.journal_left(),
                        "locks free": every.locks_free(),
                        "only the preflight's start": every.lives() == 1},
    }))
    assert_survived(record)


def test_http_5xx_storms(tmp_path: Path, calibration: Calibration, fault_log: FaultLog) -> None:
    # Trial 1: every search answers 503 (a storm retries cannot outlast); trial 2: the
    # first four searches answer 500 (one the retries absorb).
    plan = {life_of(1): {"status": 503}, life_of(2): {"status": 500, "status_first": 4}}
    project, done = run_plan(tmp_path, "storm", 4, plan)
    trials = project.trials()
    record = fault_log.add(judge("http-5xx-storm", assess(project, calibration), ended_cleanly(project, done),
                                 injections={
        "503 for ever": failed_with(fail_reasons(trials), 1, "HTTP 503"),
        "500 x4, retried": {"trial #2 COMPLETE": states(trials)[2] == "COMPLETE"},
    }))
    assert states(trials) == ["COMPLETE", "FAIL", "COMPLETE", "COMPLETE"]
    assert_survived(record)


def test_timeouts(tmp_path: Path, calibration: Calibration, fault_log: FaultLog) -> None:
    # evaluation.timeout_s 1: trial 1's backend stalls every search 3 s; trial 2's only its first two.
    plan = {life_of(1): {"stall_s": 3}, life_of(2): {"stall_s": 3, "stall_first": 2}}
    project, done = run_plan(tmp_path, "stall", 4, plan, evaluation={"timeout_s": 1})
    trials = project.trials()
    record = fault_log.add(judge("timeouts", assess(project, calibration), ended_cleanly(project, done), injections={
        "every search stalls": failed_with(fail_reasons(trials), 1, "Timeout"),
        "two searches stall, retried": {"trial #2 COMPLETE": states(trials)[2] == "COMPLETE"},
    }))
    assert states(trials) == ["COMPLETE", "FAIL", "COMPLETE", "COMPLETE"]
    assert_survived(record)


def test_malformed_json(tmp_path: Path, calibration: Calibration, fault_log: FaultLog) -> None:
    # Three trials in a row get 200s whose bodies are no usable JSON.
    kinds = {"truncated": "not JSON (application/json)", "html": "not JSON (text/html)", "wrong-shape": "not a list"}
    plan = {life_of(n): {"malformed": kind} for n, kind in enumerate(kinds, start=1)}
    project, done = run_plan(tmp_path, "malformed", 5, plan, failure_budget={"max_consecutive": 4})
    trials = project.trials()
    reasons = fail_reasons(trials)
    record = fault_log.add(judge("malformed-json", assess(project, calibration), ended_cleanly(project, done),
                                 injections={
        kind: failed_with(reasons, n, said) for n, (kind, said) in enumerate(kinds.items(), start=1)
    }))
    assert states(trials) == ["COMPLETE", "FAIL", "FAIL", "FAIL", "COMPLETE"], reasons
    assert_survived(record)
