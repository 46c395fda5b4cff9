"""A trial the study's storage fails under is queued again (issue 27 item 5): the same
params and variant, its fail_reason naming the retry, the run's summary listing it, and
neither n_trials nor the failure budget spent on it.

The storage failure is real: while the shortlist variant's trial records its result,
another connection holds the study's SQLite file locked (``BEGIN IMMEDIATE``), so its
write fails as a locked database does, wrapped by Optuna in StorageInternalError. The
lock is taken from the trial's own constraint (the last thing computed before the
write) and let go on the first storage error the engine sees.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

import optuna
import pytest
import sqlalchemy as sa
from optuna.trial import TrialState

from study.fakes import MetricNamed, score
from study.test_trial_runner import OOS_LIMIT, make_runner
from tuner.config.objective import FailureBudget
from tuner.report.tracker import NullTracker, TrialRecord
from tuner.study.loop import FailureTally, StudyLoop, StudyObserver
from tuner.study.storage.queue import Variant, count_finished, enqueue_initial
from tuner.study.storage.retry import infra_summary
from tuner.study.storage.study_storage import open_study
from tuner.study.trial.bookkeeping import Bookkeeper
from tuner.study.trial.outcome import TrialOutcome

optuna.logging.set_verbosity(optuna.logging.WARNING)

VARIANTS = [Variant("baseline", {"x": 0.8, "k": 20}), Variant("linear-minmax-balanced", {"x": 0.3, "k": 40}),
            Variant("short-2", {"x": 0.5, "k": 30})]
LOCKED_ON = score(0.3, 40)  # the variant's score: its trial's write meets the lock


class Notes(StudyObserver):
    def __init__(self) -> None:
        self.notes: list[str] = []

    def note(self, text: str) -> None:
        self.notes.append(text)


class LockOnce:
    """Holds the SQLite file locked from the moment ``arm`` is called until the engine
    reports its first error; ``times`` arms at most."""

    def __init__(self, path: Path, engine: sa.engine.Engine, times: int = 1) -> None:
        self.path, self.left, self.errors = path, times, 0
        self.conn: sqlite3.Connection | None = None
        sa.event.listen(engine, "handle_error", self._release)

    def arm(self) -> None:
        if self.left and self.conn is None:
            self.left -= 1
            self.conn = sqlite3.connect(str(self.path), isolation_level=None, check_same_thread=False)
            self.conn.execute("BEGIN IMMEDIATE")  # writers wait (0.2 s here), then "database is locked"

    def _release(self, context: Any) -> None:
        self.errors += 1
        if self.conn is not None:
            self.conn.rollback()
            self.conn.close()
            self.conn = None


def locked_study(tmp_path: Path, *, times: int = 1) -> tuple[optuna.Study, LockOnce, Any]:
    path = tmp_path / "study.db"
    storage = optuna.storages.RDBStorage(f"sqlite:///{path}", engine_kwargs={"connect_args": {"timeout": 0.2}})
    study = open_study("s", storage, sampler=optuna.samplers.TPESampler(seed=7, n_startup_trials=3))
    enqueue_initial(study, VARIANTS)
    lock = LockOnce(path, storage.engine, times=times)

    runners: list[Any] = []

    class ArmsTheLock(MetricNamed):
        def violation(self, metrics) -> float:
            if metrics["Primary_Metric_Score"] == LOCKED_ON and lock.left:
                # the bookkeeping of the trials before (threaded: their artifact names, written
                # to the study) first, so the next write, this trial's constraint, meets the lock
                runners[0].recorder.bookkeeper.flush()
                lock.arm()
            return super().violation(metrics)

    constraint = ArmsTheLock(metric="OOS_FP_Rate", op="<=", bound=OOS_LIMIT)
    runner, backend, _, _ = make_runner(tmp_path, constraints=[constraint])
    runners.append(runner)
    return study, lock, runner


@pytest.mark.parametrize("pipeline", [False, True], ids=["one-at-a-time", "pipelined"])
def test_a_storage_failure_queues_the_variant_again_and_it_completes(tmp_path: Path, pipeline: bool) -> None:
    study, lock, runner = locked_study(tmp_path)
    notes = Notes()
    loop = StudyLoop(study, runner, budget=FailureBudget(max_consecutive=1, max_total=1), observer=notes,
                     pipeline=pipeline)
    result = loop.run(n_trials=4, timeout=None)  # a budget of one failure: the blip must not spend it

    assert lock.errors >= 1
    trials = study.get_trials()
    failed = trials[1]
    assert failed.state == TrialState.FAIL and failed.user_attrs["variant"] == "linear-minmax-balanced"
    reason = failed.user_attrs["fail_reason"]
    assert reason.startswith("infrastructure: the study's storage failed: StorageInternalError (OperationalError: "
                             "database is locked)"), reason
    retry = next(t for t in trials if t.system_attrs.get("failed_trial") == 1)
    assert reason.endswith(f"(retried as trial #{retry.number})")
    # the same variant, the same params, measured to the end
    assert retry.state == TrialState.COMPLETE and retry.user_attrs["variant"] == "linear-minmax-balanced"
    assert {k: retry.params[k] for k in ("x", "k")} == {"x": 0.3, "k": 40}
    assert retry.value == pytest.approx(score(0.3, 40))
    assert retry.system_attrs["retry_history"] == [1]
    assert retry.system_attrs["failed_trial"] == 1  # as Optuna's heartbeat retry records it
    # every variant completed; the retry stands for the failed trial in n_trials
    done = {t.user_attrs.get("variant") for t in trials if t.state == TrialState.COMPLETE}
    assert {"baseline", "linear-minmax-balanced", "short-2"} <= done
    assert result.counted == 4 and len(result.ran) == 5 and count_finished(study) == 4
    assert result.stopped_by == "n_trials"
    assert [f.describe() for f in result.infra_failed] == [f"#1 (linear-minmax-balanced) retried as #{retry.number}"]
    assert infra_summary(result.infra_failed) == (
        "trials failed for an infrastructure reason (the study's storage, not their config): "
        f"#1 (linear-minmax-balanced) retried as #{retry.number}")
    assert not [n for n in notes.notes if "NOT retried" in n]


def test_retries_are_bounded_and_a_variant_not_retried_is_said_out_loud(tmp_path: Path) -> None:
    study, lock, runner = locked_study(tmp_path, times=5)  # the variant's retry meets the lock too
    notes = Notes()
    loop = StudyLoop(study, runner, budget=FailureBudget(max_consecutive=3, max_total=10), observer=notes,
                     max_retry=1)
    result = loop.run(n_trials=4, timeout=None)

    trials = {t.number: t for t in study.get_trials()}
    variant = [t for t in trials.values() if t.user_attrs.get("variant") == "linear-minmax-balanced"]
    assert [t.state for t in variant] == [TrialState.FAIL, TrialState.FAIL]
    first, retry = variant
    assert first.user_attrs["fail_reason"].endswith(f"(retried as trial #{retry.number})")
    assert retry.user_attrs["fail_reason"].endswith(
        "(not retried: it is a retry already, 1 of workers.max_retry=1)"), retry.user_attrs["fail_reason"]
    assert [f.describe() for f in result.infra_failed] == [
        f"#1 (linear-minmax-balanced) retried as #{retry.number}",
        f"#{retry.number} (linear-minmax-balanced) NOT retried (it is a retry already, 1 of workers.max_retry=1)"]
    assert notes.notes == [
        f"warning: trial #{retry.number} (variant linear-minmax-balanced) failed because the study's storage failed, "
        "and was NOT retried: it is a retry already, 1 of workers.max_retry=1; it counts as a failed trial"]
    # the one not retried counts, in n_trials and in the failure budget; its retried first try does not
    assert loop.failures.total == 1 and result.counted == 4 and count_finished(study) == 4


def test_a_retried_failure_spends_no_failure_budget() -> None:
    budget = FailureTally(FailureBudget(max_consecutive=1, max_total=1))
    budget.record(TrialOutcome(0, "FAIL", fail_reason="infrastructure: ... (retried as trial #3)", infrastructure=True,
                               retried_as=3))
    assert budget.exceeded() is None and budget.total == 0
    budget.record(TrialOutcome(1, "FAIL", fail_reason="infrastructure: ... (not retried: ...)", infrastructure=True))
    assert budget.exceeded() is not None



class Records(NullTracker):
    """The MLflow records the runner logs, by trial number."""

    def __init__(self) -> None:
        self.records: dict[int, TrialRecord] = {}

    def start_trial(self, number: int, params: Any, *, start_time: int | None = None) -> str | None:
        return f"run-{number}"

    def finish_trial(self, run_id: str | None, record: TrialRecord) -> None:
        self.records[record.number] = record


@pytest.mark.parametrize("threaded", [False, True], ids=["inline-bookkeeping", "threaded-bookkeeping"])
def test_the_mlflow_record_and_note_of_a_retried_trial_name_the_retry_as_optuna_does(
        tmp_path: Path, threaded: bool) -> None:
    study, _, runner = locked_study(tmp_path)
    runner.recorder.tracker = tracker = Records()
    runner.recorder.bookkeeper = Bookkeeper(threaded=threaded)
    try:
        StudyLoop(study, runner, budget=FailureBudget(max_consecutive=1, max_total=1)).run(n_trials=4, timeout=None)
    finally:
        runner.bookkeeper.close()
    failed = study.get_trials()[1]
    retry = next(t for t in study.get_trials() if t.system_attrs.get("failed_trial") == 1)
    reason = failed.user_attrs["fail_reason"]
    assert reason.endswith(f"(retried as trial #{retry.number})"), reason
    assert tracker.records[1].fail_reason == reason, "MLflow's fail_reason is Optuna's"
    assert f"(retried as trial #{retry.number})" in tracker.records[1].summary, "the trial note names it too"
