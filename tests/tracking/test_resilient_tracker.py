"""ResilientTracker: a tracking store that fails or hangs holds up neither a trial nor
a stop; its calls are replayed in order when it answers again, and what it never got
is listed, never dropped silently. The inner tracker here is a fake whose store can be
taken down (calls raise) or hung (calls block until released)."""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import pytest

from tuner.report.resilient import (
    ATTEMPTS,
    DRAIN_S,
    PROBE_EVERY_S,
    RUN_ID_WAIT_S,
    STUCK_S,
    ResilientTracker,
    fail_fast_http,
    number_ranges,
)
from tuner.report.tracker import Tracker, TrialRecord

DEADLINE_S = 60.0  # generous: outcomes are asserted, never speed


class FakeStore(Tracker):
    """Records the calls that reached the store, in order."""

    def __init__(self) -> None:
        self.calls: list[tuple[Any, ...]] = []
        self.down = False  # calls and the probe raise
        self.hung = threading.Event()  # set: calls block until released
        self.release = threading.Event()
        self.refuse: set[tuple[str, int]] = set()  # (method, trial) the store rejects while up
        self.runs = 0
        self.lose_answer: set[int] = set()  # start_trial of these makes the run, then its answer is lost
        self.open_runs: dict[int, str] = {}

    def _call(self, *what: Any) -> None:
        if self.hung.is_set():
            self.release.wait()
        if self.down:
            raise ConnectionError("connection refused")
        if (what[0], what[1] if len(what) > 1 else None) in self.refuse:
            raise ValueError(f"{what[0]} refused")
        self.calls.append(what)

    def probe(self) -> None:
        if self.down or self.hung.is_set():
            raise ConnectionError("no /health")

    def start_study(self, study_name: str, *, params: Mapping[str, Any], tags: Mapping[str, str]) -> str:
        self._call("start_study", study_name)
        return "parent"

    def start_trial(self, number: int, params: Mapping[str, Any], *, start_time: int | None = None) -> str:
        self._call("start_trial", number)
        self.runs += 1
        self.open_runs[number] = f"run-{number}"
        if number in self.lose_answer:
            self.lose_answer.discard(number)
            raise TimeoutError("read timed out")
        return f"run-{number}"

    def find_trial_run(self, number: int) -> str | None:
        self._call("find_trial_run", number)
        return self.open_runs.get(number)

    def finish_trial(self, run_id: str | None, record: TrialRecord) -> None:
        if run_id is None:
            run_id = f"late-run-{record.number}"
            self.runs += 1
        self._call("finish_trial", record.number, run_id)

    def summarize_study(self, *, note: str, metrics: Mapping[str, float], tags: Mapping[str, str],
                        step: int | None = None) -> None:
        self._call("summarize_study", note)

    def end_study(self, *, status: str, summary: Mapping[str, float]) -> None:
        self._call("end_study", status)


def make(store: FakeStore, notes: list[str], **kw: Any) -> ResilientTracker:
    options = {"drain_s": 5.0, "run_id_wait_s": 2.0, "stuck_s": 0.5, "probe_every_s": 0.05} | kw
    return ResilientTracker(store, probe=store.probe, on_note=notes.append, where="http://mlflow.test", **options)


def record(number: int) -> TrialRecord:
    return TrialRecord(number=number, state="COMPLETE", params={"x": number}, metrics={"m": 0.5})


def within(fn: Callable[[], Any], deadline_s: float = DEADLINE_S) -> Any:
    """``fn()`` in a thread; fails when it has not returned by the deadline (it is stuck)."""
    box: dict[str, Any] = {}
    thread = threading.Thread(target=lambda: box.update(value=fn()), daemon=True)
    thread.start()
    thread.join(deadline_s)
    assert not thread.is_alive(), f"still waiting after {deadline_s:g} s"
    return box.get("value")


def wait_until(condition: Callable[[], Any]) -> None:
    done = threading.Event()
    for _ in range(int(DEADLINE_S / 0.02)):
        if condition():
            return
        done.wait(0.02)
    raise AssertionError("condition not met in time")


def test_a_healthy_store_gets_every_call_in_order_with_the_trials_run_ids() -> None:
    store, notes = FakeStore(), []
    tracker = make(store, notes)
    tracker.start_study("s", params={}, tags={})
    assert tracker.start_trial(0, {"x": 0}) == "run-0"
    tracker.finish_trial("run-0", record(0))
    tracker.summarize_study(note="n", metrics={}, tags={})
    tracker.end_study(status="FINISHED", summary={})
    assert tracker.close() is None
    assert store.calls == [("start_study", "s"), ("start_trial", 0), ("finish_trial", 0, "run-0"),
                           ("summarize_study", "n"), ("end_study", "FINISHED")]
    assert notes == []


def test_a_dead_store_opens_the_breaker_and_its_calls_are_replayed_in_order_when_it_returns() -> None:
    store, notes = FakeStore(), []
    tracker = make(store, notes)
    tracker.start_study("s", params={}, tags={})
    assert tracker.start_trial(0, {}) == "run-0"
    store.down = True
    tracker.finish_trial("run-0", record(0))
    wait_until(lambda: tracker.behind)
    for n in (1, 2, 3):  # trials go on: no run id, no wait
        assert within(lambda n=n: tracker.start_trial(n, {})) is None
        tracker.finish_trial(None, record(n))
    tracker.summarize_study(note="old", metrics={}, tags={})
    tracker.summarize_study(note="new", metrics={}, tags={})
    assert store.calls == [("start_study", "s"), ("start_trial", 0)]  # nothing got through meanwhile
    store.down = False
    wait_until(lambda: not tracker.behind)
    tracker.end_study(status="FINISHED", summary={})
    assert tracker.close() is None
    assert store.calls == [
        ("start_study", "s"), ("start_trial", 0), ("finish_trial", 0, "run-0"),
        # each record goes into the run its own start made: one run per trial
        ("start_trial", 1), ("finish_trial", 1, "run-1"), ("start_trial", 2), ("finish_trial", 2, "run-2"),
        ("start_trial", 3), ("finish_trial", 3, "run-3"),
        ("summarize_study", "new"),  # only the latest summary
        ("end_study", "FINISHED"),
    ]
    assert store.runs == 4
    behind = [n for n in notes if "behind" in n]
    assert len(behind) == 1 and behind[0].startswith("warning: MLflow tracking is behind: http://mlflow.test")
    assert "ConnectionError: connection refused" in behind[0]
    assert [n for n in notes if "caught up" in n] == [notes[-1]] and notes[-1].startswith("MLflow tracking caught up")
    assert len(notes) == 2


def test_a_hung_store_holds_up_neither_a_trial_nor_the_stop_and_the_missing_trials_are_listed() -> None:
    store, notes = FakeStore(), []
    tracker = make(store, notes, drain_s=1.0)
    tracker.start_study("s", params={}, tags={})
    store.hung.set()  # accepts, never answers (a SIGSTOPped server)
    for n in range(4):
        assert within(lambda n=n: tracker.start_trial(n, {})) is None
        tracker.finish_trial(None, record(n))
    tracker.end_study(status="KILLED", summary={})
    line = within(tracker.close)
    assert line is not None and line.startswith("MLflow at http://mlflow.test is missing trials #0-3 and "
                                                "the study's summary:")
    assert "Optuna study" in line
    assert sum("behind" in n for n in notes) == 1
    store.release.set()


def test_a_start_whose_answer_was_lost_reuses_its_run_when_tried_again() -> None:
    store, notes = FakeStore(), []
    store.lose_answer = {1}
    tracker = make(store, notes)
    tracker.start_study("s", params={}, tags={})
    tracker.start_trial(1, {})
    tracker.finish_trial(None, record(1))
    assert tracker.close() is None
    assert store.runs == 1  # one run for the trial, not two
    assert store.calls[-2:] == [("find_trial_run", 1), ("finish_trial", 1, "run-1")]


def test_nothing_is_lost_silently_when_the_queue_bound_is_hit() -> None:
    store, notes = FakeStore(), []
    tracker = make(store, notes, drain_s=0.5, max_queued_trials=2)
    tracker.start_study("s", params={}, tags={})
    store.down = True
    for n in range(5):
        tracker.start_trial(n, {})
        tracker.finish_trial(None, record(n))
    assert sum("as many as it keeps queued" in n for n in notes) == 1
    line = tracker.close()
    assert line is not None and "trials #0-4" in line  # two queued, three never kept: all listed


def test_a_call_the_store_refuses_while_it_answers_is_dropped_said_and_listed() -> None:
    store, notes = FakeStore(), []
    store.refuse = {("finish_trial", 1)}
    tracker = make(store, notes)
    for n in range(3):
        tracker.start_trial(n, {})
        tracker.finish_trial(None, record(n))
    tracker.end_study(status="FINISHED", summary={})
    line = tracker.close()
    assert [c for c in store.calls if c[0] == "finish_trial"] == [("finish_trial", 0, "run-0"),
                                                                   ("finish_trial", 2, "run-2")]
    assert ("end_study", "FINISHED") in store.calls  # the rest goes on
    refused = [n for n in notes if "did not take" in n]
    assert refused == [f"warning: MLflow did not take finish_trial of trial #1 ({ATTEMPTS} tries): "
                       "ValueError: finish_trial refused"]
    assert line is not None and "missing trial #1:" in line
    assert not any("behind" in n for n in notes)  # the store answered all along


def test_mlflow_http_retries_are_cut_only_where_the_user_set_none(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", raising=False)
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_TIMEOUT", "300")
    assert fail_fast_http() == {"MLFLOW_HTTP_REQUEST_MAX_RETRIES": "0"}
    import os

    assert os.environ["MLFLOW_HTTP_REQUEST_TIMEOUT"] == "300"


def test_number_ranges() -> None:
    assert number_ranges([7, 1, 2, 3, 9, 10]) == "#1-3, #7, #9-10"
    assert number_ranges([4]) == "#4"


def test_a_run_takes_its_tracking_waits_from_the_experiment(tmp_path: Path) -> None:
    # tracking.waits is the knob (the fault suite runs with short waits); unset, the
    # documented defaults: 5 s for a run id, 15 s before a call is stuck, probes every 5 s, 20 s at the end
    from support.reference_experiment import write_reference_experiment

    from tuner.config.experiment import load_experiment
    from tuner.study.wiring import make_tracker

    waits = {"run_id_s": 0.5, "stuck_s": 2.0, "probe_every_s": 0.25, "drain_s": 3.0}
    seen = []
    for name, tracking in (("short", {"waits": waits}), ("default", {})):
        root = tmp_path / name
        root.mkdir()
        exp = write_reference_experiment(root, study=name, n_trials=1, storage=f"sqlite:///{root / 'optuna.db'}",
                                         tracking={"enabled": True, **tracking})
        tracker = make_tracker(load_experiment(exp, check_paths=False))
        try:
            assert isinstance(tracker, ResilientTracker)
            seen.append((tracker.run_id_wait_s, tracker.stuck_s, tracker.probe_every_s, tracker.drain_s))
        finally:
            tracker.close()
    assert seen == [(0.5, 2.0, 0.25, 3.0), (RUN_ID_WAIT_S, STUCK_S, PROBE_EVERY_S, DRAIN_S)]
    assert (RUN_ID_WAIT_S, STUCK_S, PROBE_EVERY_S, DRAIN_S) == (5.0, 15.0, 5.0, 20.0)
