"""Storage rules and settings of the workers (tuner.study.storage.study_storage) that need no database server."""

from __future__ import annotations

import optuna
import pytest
from optuna.trial import TrialState
from support.workers import ObjectiveRunner

from tuner.config.workers import WorkerSettings
from tuner.dburl import redact, sqlalchemy_url
from tuner.errors import StudyError
from tuner.study.loop import StudyLoop
from tuner.study.stop import StopFlag
from tuner.study.storage.queue import enqueue_once
from tuner.study.storage.study_storage import check_storage, make_storage, storage_dialect


def test_sqlite_with_several_workers_is_refused_with_the_reason():
    check_storage("sqlite:///study.db", 1)
    with pytest.raises(StudyError, match="queued trials race") as info:
        check_storage("sqlite:///study.db", 2)
    assert "postgresql://" in str(info.value)
    check_storage("postgresql://u:p@127.0.0.1/db", 3)
    with pytest.raises(StudyError, match="unsupported"):
        check_storage("oracle://x", 1)


def test_urls():
    assert storage_dialect("postgresql+psycopg2://u@h/db") == "postgresql"
    assert sqlalchemy_url("postgresql://u:p@h:5432/db").startswith("postgresql+psycopg")
    assert sqlalchemy_url("postgresql+psycopg2://u@h/db") == "postgresql+psycopg2://u@h/db"
    assert sqlalchemy_url("sqlite:///x.db") == "sqlite:///x.db"
    assert redact("postgresql://user:secret@h:5432/db") == "postgresql://user:***@h:5432/db"


def test_settings_reject_a_grace_period_shorter_than_the_heartbeat():
    assert WorkerSettings(heartbeat_interval_s=10).grace == 40
    with pytest.raises(ValueError, match="must exceed"):
        WorkerSettings(heartbeat_interval_s=10, grace_period_s=10)
    with pytest.raises(ValueError):
        WorkerSettings(heartbeat=3)


def test_single_worker_on_sqlite_runs_to_the_study_wide_count(tmp_path):
    """The loop on a real SQLite storage: budget counted study-wide, pruned and failed
    trials handled, variants queued once even when enqueue runs twice."""
    from tuner.study.storage.queue import Variant, enqueue_initial

    storage = make_storage(f"sqlite:///{tmp_path / 'study.db'}", WorkerSettings(heartbeat_interval_s=1))
    study = optuna.create_study(study_name="s", storage=storage, direction="maximize")
    for _ in range(2):
        enqueue_once(study, lambda s: enqueue_initial(s, [Variant("baseline", {"x": 0.5})]))

    def objective(trial):
        x = trial.suggest_float("x", 0, 1)
        if trial.number == 1:
            raise optuna.TrialPruned()
        if trial.number == 2:
            raise RuntimeError("boom")
        return x

    report = StudyLoop(study, ObjectiveRunner(objective), study_total=5, replica=0).run(n_trials=None, timeout=None)
    states = [t.state for t in study.get_trials()]
    # a failed trial counts (the failure budget bounds them); only interrupted ones do not
    assert len(states) == 5 and states[1] == TrialState.PRUNED and states[2] == TrialState.FAIL
    assert [o.number for o in report.ran] == list(range(5)) and report.stopped_by == "n_trials"
    assert study.trials[0].params == {"x": 0.5}
    assert [t.system_attrs.get("tuner.replica") for t in study.trials] == [0] * 5
    stop = StopFlag()
    stop.set("test")
    assert StudyLoop(study, ObjectiveRunner(objective), stop=stop).run(n_trials=None, timeout=None).stopped_by == "signal"


def test_tuner_worker_refuses_sqlite_before_starting_anything(tmp_path):
    import subprocess
    import sys

    from workers.replica_setup import write_experiment

    for rel in ("data/queries.jsonl", "data/qrels.txt", "backend/config.yaml"):
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text("")
    exp = write_experiment(tmp_path, study="s", storage=f"sqlite:///{tmp_path / 'optuna.db'}", n_trials=3)
    proc = subprocess.run([sys.executable, "-m", "tuner", "worker", str(exp), "--replica", "1"],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2, proc.stderr
    assert "SQLite" in proc.stderr and "queued trials race" in proc.stderr
    assert not (tmp_path / "optuna.db").exists()
    assert not (tmp_path / "backend" / "config.replica-1.yaml").exists()
