"""Parallel trials on one backend (tuner.study.parallel, `tuner run --parallel N`): N lanes
measure at once, each batch with its own trial's request. Every trial must be scored on its
own values, n_trials must be exact, and a stop, the failure budget or an error must leave
nothing RUNNING. The "backend" here scores the request each batch carries (the request
channel's shape: nothing is written, nothing restarts)."""

from __future__ import annotations

import json
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import optuna
import pytest
from optuna.trial import TrialState

from study.fakes import FakeResult, TwoParamSpace, oos_constraint, oos_rate, score
from tuner.config.objective import FailureBudget
from tuner.errors import BackendExited, StudyError
from tuner.study.loop import StudyLoop
from tuner.study.stop import StopFlag
from tuner.study.storage.result_cache import ResultCache
from tuner.study.storage.study_storage import open_study
from tuner.study.trial.attrs import assignment_of
from tuner.study.trial.request_channel import REQUEST_TEXT, RequestServe
from tuner.study.trial.runner import compose_runner

optuna.logging.set_verbosity(optuna.logging.WARNING)
LANES = 4
WAIT_S = 120.0  # a generous deadline for the lanes to meet on a busy machine (an outcome, not a speed)


class RequestWriter:
    """The request channel's writer shape: a trial's values become its request."""

    touches_backend = False

    def render(self, assignment: Mapping[str, Any]) -> dict[Path, str]:
        return {REQUEST_TEXT: json.dumps({"x": assignment["fusion.x"], "k": assignment["fusion.k"]})}

    def write(self, texts: Mapping[Path, str]) -> None:
        return None

    def request_of(self, texts: Mapping[Path, str]) -> dict[str, Any]:
        return dict(json.loads(texts[REQUEST_TEXT]))


class RequestBackend:
    """Scores the request each batch carries; the first ``meet`` batches wait until that
    many are in flight together (a barrier: proof that the lanes measure at once)."""

    def __init__(self, meet: int = LANES, fail_when: Any = None, on_batch: Any = None) -> None:
        self.barrier = threading.Barrier(meet, timeout=WAIT_S)
        self.meet = meet
        self.fail_when = fail_when or (lambda request: None)
        self.on_batch = on_batch
        self.lock = threading.Lock()
        self.batches = 0
        self.in_flight = 0
        self.most_in_flight = 0
        self.threads: set[str] = set()
        self.sent: list[tuple[int, dict[str, Any]]] = []  # (batch number, the request it carried)
        self.last_search_seconds = 0.0

    dataset_hash, labels_fingerprint, spec_fingerprint = "dataset-hash", "labels-fp", "spec"

    def restart(self) -> None:
        raise AssertionError("the request channel never restarts the backend")

    def evaluate(self, *, order_seed: int, on_result: Any, request: dict[str, Any]) -> FakeResult:
        with self.lock:
            self.batches += 1
            number = self.batches
            self.in_flight += 1
            self.most_in_flight = max(self.most_in_flight, self.in_flight)
            self.threads.add(threading.current_thread().name)
            self.sent.append((number, dict(request)))
        try:
            if number <= self.meet:
                self.barrier.wait()
            if self.on_batch is not None:
                self.on_batch(number)
            why = self.fail_when(request)
            if why is not None:
                raise BackendExited(why)
            x, k = float(request["x"]), int(request["k"])
            return FakeResult({"Primary_Metric_Score": score(x, k), "OOS_FP_Rate": oos_rate(x)})
        finally:
            with self.lock:
                self.in_flight -= 1

    def report_paths(self, result: Any, out_dir: Path, *, detail: str = "full") -> dict[str, Path]:
        return {"json": out_dir / "report.json"}

    def write_reports(self, result: Any, out_dir: Path, **kw: Any) -> dict[str, Path]:
        out_dir.mkdir(parents=True, exist_ok=True)
        (out_dir / "report.json").write_text(json.dumps(result.metrics))
        return {"json": out_dir / "report.json"}


def parallel_study(tmp_path: Path, backend: RequestBackend, **loop: Any) -> tuple[optuna.Study, StudyLoop]:
    runner = compose_runner(
        study_name="s",
        space=TwoParamSpace(),
        writer=RequestWriter(),
        target=backend,
        wait_healthy=lambda: None,
        evaluator=backend,
        trials_dir=tmp_path / "trials",
        cache=ResultCache(tmp_path / "cache.sqlite"),
        constraints=[oos_constraint(0.1)],
        applier=RequestServe(lambda: None),
    )
    study = open_study("s", f"sqlite:///{tmp_path / 'study.db'}", sampler=optuna.samplers.RandomSampler(seed=3))
    return study, StudyLoop(study, runner, parallel=LANES, **loop)


def test_lanes_measure_at_once_and_each_trial_is_scored_on_its_own_request(tmp_path: Path) -> None:
    backend = RequestBackend()
    study, loop = parallel_study(tmp_path, backend)

    result = loop.run(n_trials=10, timeout=None)

    trials = study.get_trials()
    assert result.stopped_by == "n_trials" and len(result.ran) == 10
    assert [t.state for t in trials] == [TrialState.COMPLETE] * 10  # n_trials exact: none begun past it
    for t in trials:  # the value is the formula of the trial's own params: no request of another trial
        a = assignment_of(t)
        assert t.value == pytest.approx(score(a["fusion.x"], a["fusion.k"]))
    assert backend.most_in_flight == LANES and len(backend.threads) == LANES
    # each batch carried one trial's values, and every trial's values went out once
    sent = sorted((r["x"], r["k"]) for _, r in backend.sent)
    assert sent == sorted((assignment_of(t)["fusion.x"], assignment_of(t)["fusion.k"]) for t in trials)


def test_a_stop_begins_no_new_trial_and_the_trials_under_way_finish(tmp_path: Path) -> None:
    stop = StopFlag()
    backend = RequestBackend(on_batch=lambda number: stop.set("interrupted by SIGTERM") if number == 1 else None)
    study, loop = parallel_study(tmp_path, backend, stop=stop)

    result = loop.run(n_trials=12, timeout=None)

    trials = study.get_trials()
    assert result.stopped_by == "signal"
    # the four under way when the stop came were measured to the end; none began after it
    assert len(trials) == LANES and backend.batches == LANES
    assert all(t.state == TrialState.COMPLETE for t in trials)


def test_the_failure_budget_stops_the_run_and_leaves_nothing_running(tmp_path: Path) -> None:
    backend = RequestBackend(fail_when=lambda request: "exit code 3")
    study, loop = parallel_study(tmp_path, backend, budget=FailureBudget(max_consecutive=2, max_total=5))
    begun_when_spent = begun_after(loop, lambda: loop.failures.exceeded() is not None)

    with pytest.raises(StudyError, match="consecutive failed trials"):
        loop.run(n_trials=20, timeout=None)

    trials = study.get_trials()
    assert not [t for t in trials if t.state == TrialState.RUNNING]
    assert all(t.state == TrialState.FAIL for t in trials)
    assert begun_when_spent == []  # no trial began once the budget was spent
    # the four under way ended; a lane may have begun one more before the second failure was told
    assert LANES <= len(trials) <= LANES + 1


def test_an_error_in_one_lane_is_raised_once_every_lane_has_ended(tmp_path: Path) -> None:
    backend = RequestBackend()
    study, loop = parallel_study(tmp_path, backend)
    end = loop.runner.end
    broke = threading.Event()

    def broken_end(job: Any) -> Any:
        if job.trial.number == 1:
            broke.set()
            raise RuntimeError("the recorder broke")
        return end(job)

    loop.runner.end = broken_end
    begun_after_the_error = begun_after(loop, broke.is_set)

    with pytest.raises(RuntimeError, match="the recorder broke"):
        loop.run(n_trials=10, timeout=None)

    trials = study.get_trials()
    assert not [t for t in trials if t.state == TrialState.RUNNING]  # the broken trial was told, as failed
    assert study.get_trials()[1].state == TrialState.FAIL
    assert begun_after_the_error == []  # the other lanes finished their trial and began none after it
    assert len(trials) < 10


def begun_after(loop: StudyLoop, condition: Any) -> list[int]:
    """The numbers of the trials the loop begins while ``condition()`` holds (filled as it runs)."""
    begun: list[int] = []
    begin = loop.runner.begin

    def noted_begin(trial: Any) -> Any:
        if condition():
            begun.append(trial.number)
        return begin(trial)

    loop.runner.begin = noted_begin
    return begun
