"""The production-safety behaviours of the tuner, as faults on the fault backend.

Each scenario is one fault class of the suite's summary: a small project (faultlib),
`tuner` run as a user runs it, and the damage measured the way the harness measures
it (lost trials, configs left patched, processes left behind). A fault is survived
when the user got the right one-line message and nothing was lost.

- apply-breaks-constraint: the backend apply restarts is slow (a latency constraint
  the study met breaks on the re-measured batch): apply rolls back, naming it;
- drift-since-study: a key the trial writes was edited by hand since the study: apply
  stops, naming the key; --force writes the trial anyway;
- every-trial-fails: every trial's backend answers HTML: the run exits 1 saying so;
- unwritable-config-tag: the config holds ``x: !vault abc``: the preflight stops the
  run (exit 2) before a backend starts;
- config-owned-by-service-user: the config is nobody:nogroup 0640 through run, restore
  and apply (root only);
- planted-secret: a bearer token and a URL token from the environment appear nowhere
  under the project or in the output, not even in a failed trial's reason;
- failed-label-import: a label file with a bad line stores nothing, whether the
  experiment imports it or `tuner labels import` does.
"""

from __future__ import annotations

import grp
import json
import os
import pwd
import secrets as stdlib_secrets
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from faults.faultlib import (
    PYTHON,
    Calibration,
    Damage,
    Done,
    FaultLog,
    Project,
    Running,
    all_gone,
    assert_survived,
    assess,
    fail_reasons,
    judge,
    processes_naming,
    states,
)
from tuner.study.trial.attrs import assignment_of

pytestmark = [pytest.mark.slow]

LATENCY_BOUND_MS = 1500
APPLY_STALL_S = 2.5  # well above the bound, well below evaluation.timeout_s (10 s)


# ---------------------------------------------------------------- helpers


def study_db(project: Project) -> Path:
    return project.root / "state" / "optuna.db"


def damage_of(project: Project, calibration: Calibration) -> Damage:
    """`assess`, also for a scenario stopped before its study was created (no trial
    could be lost then; opening the storage would create the database)."""
    if study_db(project).exists():
        return assess(project, calibration)
    all_gone(str(project.root), 30.0)
    return Damage(orphans=processes_naming(str(project.root)),
                  patched=[str(c) for c in project.configs() if c.read_bytes() != project.original])


def error_lines(text: str) -> list[str]:
    return [ln for ln in text.splitlines() if ln.startswith("error:")]


def one_line_on_stdout(done: Done, prefix: str, *needles: str) -> bool:
    """stdout has exactly one line starting ``prefix`` and it holds every needle, and
    stderr is empty (the commands that print their verdict rather than raise)."""
    lines = [ln for ln in done.stdout.splitlines() if ln.startswith(prefix)]
    return done.stderr.strip() == "" and len(lines) == 1 and all(n in lines[0] for n in needles)


def depth_of(trial: Any) -> int:
    return int(assignment_of(trial)["fusion.depth"])


def with_depth(text: bytes, old: int, new: int) -> bytes:
    """The config as the tuner writes ``fusion.depth: new`` into it (comments, order kept)."""
    before, after = f"depth: {old}   #".encode(), f"depth: {new}   #".encode()
    assert text.count(before) == 1
    return text.replace(before, after)


def starts(project: Project) -> list[dict[str, Any]]:
    return [e for e in project.events() if e["event"] == "start"]


def files_holding(root: Path, needle: bytes) -> list[str]:
    out = []
    for path in root.rglob("*"):
        if path.is_file() and not path.is_symlink():
            try:
                if needle in path.read_bytes():
                    out.append(str(path.relative_to(root)))
            except OSError:
                continue
    return out


def tuner_cli(project: Project, name: str, *argv: str) -> Done:
    """`tuner ARGV` in the project (for commands that take no experiment)."""
    project.runs += 1
    logs = project.root / "logs"
    logs.mkdir(exist_ok=True)
    return Running([PYTHON, "-m", "tuner", *argv], project.root, logs / f"{project.runs:02d}-{name}").wait()


def meta(path: Path) -> tuple[int, int, int]:
    st = path.stat()
    return st.st_uid, st.st_gid, stat.S_IMODE(st.st_mode)


# ---------------------------------------------------------------- a measured study for apply


@pytest.fixture(scope="module")
def studied(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """A study of two trials (the baseline, depth 4, and one other depth) under a
    latency constraint that a healthy fault backend meets by far."""
    root = tmp_path_factory.mktemp("production-safety") / "apply"
    project = Project.create(root, study="apply", n_trials=2, constraints=[f"Latency_P95_ms <= {LATENCY_BOUND_MS}"])
    done = project.tuner("run", "--no-cache")
    assert done.returncode == 0, done.output
    trials = project.trials()
    assert states(trials) == ["COMPLETE", "COMPLETE"], fail_reasons(trials)
    other = next(t for t in trials if depth_of(t) != 4)
    yield {"project": project, "trial": other.number, "depth": depth_of(other)}


def test_apply_rolls_back_a_config_that_breaks_a_constraint(studied: dict[str, Any], calibration: Calibration,
                                                            fault_log: FaultLog) -> None:
    project: Project = studied["project"]
    # The backend apply restarts answers its first two searches slowly: the objective
    # (a function of depth) re-measures exactly, the latency constraint breaks.
    apply_life = project.lives() + 1
    project.plan_file.write_text(json.dumps({str(apply_life): {"stall_s": APPLY_STALL_S, "stall_first": 2}}))
    try:
        done = project.tuner("apply", "--trial", str(studied["trial"]))
    finally:
        project.plan_file.write_text("{}")
    back = starts(project)[-1]
    record = fault_log.add(judge("apply-breaks-constraint", damage_of(project, calibration), {
        "exit 1": done.returncode == 1,
        "one line naming the broken constraint": one_line_on_stdout(
            done, "rolled back: ", "constraint violated on the re-measured batch: Latency_P95_ms = ",
            f"breaks Latency_P95_ms <= {LATENCY_BOUND_MS}", "original config restored",
            "backend restarted on the original config"),
        "the faulted life served the trial's config": any(
            e["life"] == apply_life and e.get("depth") == studied["depth"] for e in starts(project)),
        "the backend restarted on the original config": back["life"] == apply_life + 1 and back["depth"] == 4,
        "no restore journal left": not project.journal_left(),
        "locks free": project.locks_free(),
    }))
    assert_survived(record)


def test_apply_stops_on_drift_since_the_study_unless_forced(studied: dict[str, Any], calibration: Calibration,
                                                            fault_log: FaultLog) -> None:
    project: Project = studied["project"]
    original, trial, depth = project.original, studied["trial"], studied["depth"]
    edited = with_depth(original, 4, 7)  # a hand edit of the key the trial writes
    project.config.write_bytes(edited)
    try:
        lives, backups = project.lives(), set((project.root / "state" / "backups").glob("*"))
        refused = project.tuner("apply", "--trial", str(trial))
        refused_checks = {
            "exit 2": refused.returncode == 2,
            "one line naming the key, both values and --force": refused.one_line_error(
                f"fusion.depth: study saw 4, now 7, trial writes {depth}", "--force"),
            "the hand edit kept": project.config.read_bytes() == edited,
            "no backend started": project.lives() == lives,
            "no backup taken": set((project.root / "state" / "backups").glob("*")) == backups,
        }
        forced = project.tuner("apply", "--trial", str(trial), "--force")
        project.original = with_depth(edited, 7, depth)  # what --force must leave: the trial, comments kept
        record = fault_log.add(judge("drift-since-study", damage_of(project, calibration), {
            "no restore journal left": not project.journal_left(),
            "locks free": project.locks_free(),
        }, injections={
            "apply": refused_checks,
            "apply --force": {"exit 0": forced.returncode == 0,
                              "one line saying it applied": one_line_on_stdout(
                                  forced, "applied trial #", f"applied trial #{trial}: Primary_Metric_Score"),
                              "drift shown as forced": "drift (--force given: written anyway)" in forced.stdout,
                              "the backend served the trial's depth": starts(project)[-1]["depth"] == depth},
        }))
    finally:
        project.original = original
        project.config.write_bytes(original)
    assert_survived(record)


# ---------------------------------------------------------------- a run whose every trial fails


def test_a_run_whose_every_trial_fails_exits_1(tmp_path: Path, calibration: Calibration,
                                               fault_log: FaultLog) -> None:
    # Life 1 is the preflight (healthy); lives 2 and 3 serve trials 0 and 1: HTML.
    plan = {"2": {"malformed": "html"}, "3": {"malformed": "html"}}
    project = Project.create(tmp_path / "allfail", study="allfail", n_trials=2, plan=plan)
    done = project.tuner("run", "--no-cache")
    trials = project.trials()
    record = fault_log.add(judge("every-trial-fails", damage_of(project, calibration), {
        "exit 1": done.returncode == 1,
        "one line saying every trial failed, with the last reason": one_line_on_stdout(
            done, "error:", "every trial of this run failed (2); last: FailureBudgetExceeded",
            "not JSON (text/html)"),
        "both trials recorded FAIL": states(trials) == ["FAIL", "FAIL"],
        "original config restored (said)": "original config restored" in done.stdout,
        "no restore journal left": not project.journal_left(),
        "locks free (resumable)": project.locks_free(),
    }))
    assert_survived(record)


# ---------------------------------------------------------------- a config the tuner cannot write back


def test_a_config_tag_the_tuner_cannot_write_back_stops_the_run(tmp_path: Path, calibration: Calibration,
                                                                fault_log: FaultLog) -> None:
    project = Project.create(tmp_path / "tag", study="tag", n_trials=2)
    project.config.write_bytes(project.original + b"x: !vault abc\n")
    project.original = project.config.read_bytes()
    done = project.tuner("run", "--no-cache")
    said = error_lines(done.stderr)
    checks = {
        "exit 2": done.returncode == 2,
        "the error names the tag and why": bool(said) and "!vault" in said[0]
        and "every trial would fail on it" in done.stderr,
        "no backend started": project.lives() == 0,
        "no trial recorded": not study_db(project).exists() or not project.trials(),
        "no restore journal left": not project.journal_left(),
        "locks free": project.locks_free(),
    }
    record = fault_log.add(judge("unwritable-config-tag", damage_of(project, calibration), {
        **checks, "a one-line error": done.one_line_error("!vault", "every trial would fail on it")}))
    assert all(checks.values()) and not record.trials_lost and not record.configs_left_patched, record.problems
    assert_survived(record)


# ---------------------------------------------------------------- a config owned by the service's user


def service_ids() -> tuple[int, int]:
    try:
        return pwd.getpwnam("nobody").pw_uid, grp.getgrnam("nogroup").gr_gid
    except KeyError:
        pytest.skip("no nobody user / nogroup group on this machine")


@pytest.mark.skipif(os.geteuid() != 0, reason="giving the config another user's owner (chown) needs root")
def test_a_config_owned_by_the_service_user_keeps_owner_and_mode(tmp_path: Path, calibration: Calibration,
                                                                fault_log: FaultLog) -> None:
    uid, gid = service_ids()
    project = Project.create(tmp_path / "owner", study="owner", n_trials=2)
    os.chown(project.config, uid, gid)
    project.config.chmod(0o640)
    want = (uid, gid, 0o640)
    run = project.tuner("run", "--no-cache")
    after_run = (project.config.read_bytes(), meta(project.config))
    trials = project.trials()
    other = next((t for t in trials if t.state.name == "COMPLETE" and depth_of(t) != 4), None)
    assert other is not None, states(trials)
    applied = project.tuner("apply", "--trial", str(other.number))
    backups = sorted((project.root / "state" / "backups").glob("*/0-config.yaml"))
    run_damage = Damage(patched=[f"{project.config} after the run"] if after_run[0] != project.original else [])
    project.original = with_depth(project.original, 4, depth_of(other))  # what apply must leave
    record = fault_log.add(judge("config-owned-by-service-user", damage_of(project, calibration).merged(run_damage),
                                 {"locks free": project.locks_free(), "no restore journal left": not project.journal_left()},
                                 injections={
        "run and restore": {"exit 0": run.returncode == 0,
                            "original config restored (said)": "original config restored" in run.stdout,
                            "owner and mode kept": after_run[1] == want,
                            "every trial COMPLETE": states(trials) == ["COMPLETE", "COMPLETE"]},
        "apply": {"exit 0": applied.returncode == 0,
                  "one line saying it applied": one_line_on_stdout(applied, "applied trial #",
                                                                   f"applied trial #{other.number}"),
                  "owner and mode kept": meta(project.config) == want,
                  "one backup, the original, no more open than the config": len(backups) == 1
                  and backups[0].read_bytes() == after_run[0]
                  and stat.S_IMODE(backups[0].stat().st_mode) & ~0o640 == 0},
    }))
    assert_survived(record)


# ---------------------------------------------------------------- a planted secret


def test_a_planted_secret_appears_nowhere(tmp_path: Path, calibration: Calibration, fault_log: FaultLog,
                                         monkeypatch: pytest.MonkeyPatch) -> None:
    planted = {name: f"planted-{stdlib_secrets.token_hex(12)}" for name in ("TUNER_TEST_BEARER", "TUNER_TEST_QUERY_TOKEN")}
    for name, value in planted.items():  # the harness loads the experiment in this process too
        monkeypatch.setenv(name, value)
    # Trial 1's backend answers 503: the token must stay out of a failed trial's records too.
    project = Project.create(
        tmp_path / "secret", study="secret", n_trials=2, plan={"3": {"status": 503}},
        evaluation={"request": {"url": "http://127.0.0.1:{port}/search?access_token=${TUNER_TEST_QUERY_TOKEN}",
                                "headers": {"Authorization": "Bearer ${TUNER_TEST_BEARER}"}}})
    done = project.tuner("run", "--no-cache", env=planted)
    trials = project.trials()
    reason = fail_reasons(trials).get(1, "")
    reports = sorted((project.root / "state" / "trials").rglob("report.json"))
    request = json.loads(reports[0].read_text())["context"]["spec"]["request"] if reports else {}

    def nowhere(name: str) -> dict[str, bool]:
        needle = planted[name].encode()
        return {f"{name} in no file under the project": files_holding(project.root, needle) == [],
                f"{name} not in the output": needle not in (done.stdout + done.stderr).encode()}

    record = fault_log.add(judge("planted-secret", damage_of(project, calibration), {
        "exit 0": done.returncode == 0,
        "trial 1 failed on the 503, the others completed": states(trials) == ["COMPLETE", "FAIL"],
        "original config restored (said)": "original config restored" in done.stdout,
        "locks free": project.locks_free(),
    }, injections={
        "Authorization header": {**nowhere("TUNER_TEST_BEARER"),
                                 "the report shows the header, masked": request.get("headers") == {
                                     "Authorization": "***"}},
        "URL query token": {**nowhere("TUNER_TEST_QUERY_TOKEN"),
                            "the failure reason is one line naming HTTP 503": "HTTP 503" in reason and "\n" not in reason,
                            "the report's URL is masked": str(request.get("url", "")).endswith("access_token=***")},
    }))
    assert_survived(record)


# ---------------------------------------------------------------- a failed label import


BAD_LABELS = "q0 0 q0-d0 2\nq1 0 q1-d0 not-a-grade\n"  # a valid line, then a bad one


def test_a_failed_label_import_stores_nothing(tmp_path: Path, calibration: Calibration,
                                             fault_log: FaultLog) -> None:
    from tuner.data.labels import LabelStore

    bad = tmp_path / "bad.txt"
    bad.write_text(BAD_LABELS)
    # (a) the experiment's second label file is bad: `tuner run` imports neither.
    labels = [{"path": "data/qrels.txt", "format": "qrels"}, {"path": str(bad), "format": "qrels"}]
    project = Project.create(tmp_path / "labels", study="labels", n_trials=2, dataset={"labels": labels})
    store_path = project.load().dataset.labels_db
    run = project.tuner("run", "--no-cache")
    by_run = {"exit 2": run.returncode == 2,
              "one line naming the bad file and line": run.one_line_error(f"{bad}:2", "not-a-grade"),
              "no label store created": not store_path.exists(),
              "no backend started": project.lives() == 0,
              "no study created": not study_db(project).exists()}
    # (b) `tuner labels import` of the same file into a store that holds the dataset.
    db = project.root / "in-use.db"
    good = tuner_cli(project, "labels-import", "labels", "import", str(project.root / "data" / "qrels.txt"),
                     "--dataset-id", "faults", "--db", str(db), "--format", "qrels")
    assert good.returncode == 0, good.output
    before = (LabelStore(db).qrels("faults"), LabelStore(db).fingerprint("faults"))
    into_used = tuner_cli(project, "labels-import-bad", "labels", "import", str(bad), "--dataset-id", "faults",
                          "--db", str(db), "--format", "qrels")
    # (c) the same into a new store.
    fresh = project.root / "fresh.db"
    into_fresh = tuner_cli(project, "labels-import-fresh", "labels", "import", str(bad), "--dataset-id", "faults",
                           "--db", str(fresh), "--format", "qrels")
    fresh_datasets = LabelStore(fresh).datasets() if fresh.exists() else []
    record = fault_log.add(judge("failed-label-import", damage_of(project, calibration), {}, injections={
        "experiment label file": by_run,
        "labels import into a store in use": {
            "exit 2": into_used.returncode == 2,
            "one line naming the bad file and line": into_used.one_line_error(f"{bad}:2", "not-a-grade"),
            "the store's labels unchanged (q0-d0 still 0)": (LabelStore(db).qrels("faults"),
                                                             LabelStore(db).fingerprint("faults")) == before
            and before[0]["q0"]["q0-d0"] == 0},
        "labels import into a new store": {
            "exit 2": into_fresh.returncode == 2,
            "one line naming the bad file and line": into_fresh.one_line_error(f"{bad}:2", "not-a-grade"),
            "no labels stored": fresh_datasets == []},
    }))
    assert_survived(record)
