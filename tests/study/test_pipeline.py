"""The pipelined loop (tuner.study.pipeline): the next trial begins and the last one ends
while a trial is measured. Each trial must still be measured on its own config, every
asked trial must be told, and the stops (n_trials, failure budget, stop flag, second
Ctrl-C, an error) must leave nothing RUNNING."""

from __future__ import annotations

import threading
from pathlib import Path

import optuna
import pytest
from optuna.trial import TrialState

from study.fakes import score
from study.test_trial_runner import make_runner
from tuner.errors import StudyError
from tuner.config.objective import FailureBudget
from tuner.study.loop import StudyLoop
from tuner.study.stop import StopFlag
from tuner.study.storage.queue import Variant, enqueue_initial, remaining_trials
from tuner.study.storage.study_storage import open_study
from tuner.study.trial.attrs import assignment_of

optuna.logging.set_verbosity(optuna.logging.WARNING)


def study_at(tmp_path: Path, name: str = "s") -> optuna.Study:
    sampler = optuna.samplers.TPESampler(seed=7, multivariate=True, n_startup_trials=3)
    return open_study(name, f"sqlite:///{tmp_path / 'study.db'}", sampler=sampler)


class Recording:
    """An evaluator wrapper that notes, per evaluate, the trial numbers the storage holds
    as RUNNING: proof that another trial was begun while this one was measured."""

    def __init__(self, inner, study: optuna.Study, hook=None) -> None:
        self.inner, self.study, self.hook = inner, study, hook
        self.running: list[set[int]] = []
        self.threads: set[str] = set()

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def evaluate(self, **kw):
        self.threads.add(threading.current_thread().name)
        result = self.inner.evaluate(**kw)
        if self.hook is not None:
            self.hook(len(self.running))
        # give the helper thread time to begin the next trial (it runs while we measure)
        deadline = threading.Event()
        for _ in range(200):
            running = {t.number for t in self.study.get_trials(deepcopy=False, states=(TrialState.RUNNING,))}
            if len(running) > 1:
                break
            deadline.wait(0.01)
        self.running.append(running)
        return result


def test_every_trial_is_measured_on_its_own_config_and_the_next_one_begins_meanwhile(tmp_path: Path) -> None:
    runner, backend, evaluator, _ = make_runner(tmp_path)
    study = study_at(tmp_path)
    runner.measurer.evaluator = rec = Recording(evaluator, study)

    result = StudyLoop(study, runner, pipeline=True).run(n_trials=6, timeout=None)

    trials = study.get_trials()
    assert result.stopped_by == "n_trials" and len(result.ran) == 6
    assert [t.state for t in trials] == [TrialState.COMPLETE] * 6  # exactly n_trials, nothing begun ahead left
    for t in trials:  # the value is the formula of the trial's own params: no config mix-up between trials
        a = assignment_of(t)
        assert t.value == pytest.approx(score(a["fusion.x"], a["fusion.k"]))
    # while trial n was measured, trial n+1 was already asked (for all but the last)
    assert sum(len(r) > 1 for r in rec.running) >= 4
    assert rec.threads == {threading.main_thread().name}  # the backend is driven from the loop's thread only
    assert backend.restarts == 6 - sum(o.cache_hit for o in result.ran)


def test_the_helper_ends_and_begins_trials_only_once_the_measured_trials_config_is_written(tmp_path: Path) -> None:
    """The patch is tuner time on the backend's path: the helper's Python (end N-1, begin
    N+1) starts after trial N's config is written, so the write never waits on the GIL."""
    runner, _backend, _evaluator, _ = make_runner(tmp_path)
    study = study_at(tmp_path)
    events: list[tuple[str, int]] = []
    write, end = runner.writer.write, runner.end

    def slow_write(texts):
        threading.Event().wait(0.2)  # long enough for a helper started with the measure to be seen
        write(texts)
        events.append(("written", sum(e == "written" for e, _ in events)))

    def noted_end(job):
        events.append(("end", job.trial.number))
        return end(job)

    runner.writer.write, runner.end = slow_write, noted_end
    result = StudyLoop(study, runner, pipeline=True).run(n_trials=5, timeout=None)

    assert result.stopped_by == "n_trials" and len(result.ran) == 5
    ends = [(i, n) for i, (e, n) in enumerate(events) if e == "end"]
    assert [n for _, n in ends] == [0, 1, 2, 3, 4]
    for i, number in ends[:-1]:  # trial n is ended while n+1 is measured, after n+1's config was written
        assert ("written", number + 1) in events[:i], events


def test_a_seeded_pipelined_study_is_reproducible(tmp_path: Path) -> None:
    values = []
    for run in ("a", "b"):
        (tmp_path / run).mkdir()
        runner, _, _, _ = make_runner(tmp_path / run)
        study = study_at(tmp_path / run)
        StudyLoop(study, runner, pipeline=True).run(n_trials=8, timeout=None)
        values.append([(t.params["x"], t.params["k"]) for t in study.get_trials()])
    assert values[0] == values[1]


def test_the_failure_budget_stops_after_the_same_trial_as_one_at_a_time(tmp_path: Path) -> None:
    def crash(cfg):
        return "exit code 3" if cfg["fusion"]["k"] >= 30 else None

    states = {}
    for mode in (False, True):
        (tmp_path / str(mode)).mkdir()
        runner, _, _, _ = make_runner(tmp_path / str(mode), crash_when=crash)
        study = study_at(tmp_path / str(mode))
        enqueue_initial(study, [Variant("ok", {"x": 0.3, "k": 20}), Variant("bad1", {"x": 0.3, "k": 30}),
                                Variant("ok2", {"x": 0.4, "k": 20}), Variant("bad2", {"x": 0.3, "k": 40}),
                                Variant("bad3", {"x": 0.3, "k": 50}), Variant("never", {"x": 0.2, "k": 10})])
        loop = StudyLoop(study, runner, budget=FailureBudget(max_consecutive=2, max_total=10), pipeline=mode)
        with pytest.raises(StudyError, match="2 consecutive failed trials"):
            loop.run(n_trials=20, timeout=None)
        trials = study.get_trials()
        assert not [t for t in trials if t.state == TrialState.RUNNING]
        ran = [t for t in trials if "begun ahead" not in (t.user_attrs.get("fail_reason") or "")
               and t.state != TrialState.WAITING]
        states[mode] = [t.state for t in ran]
        ahead = [t for t in trials if "begun ahead" in (t.user_attrs.get("fail_reason") or "")]
        assert len(ahead) <= (1 if mode else 0)
        assert all(t.user_attrs.get("variant") == "never" for t in ahead)  # begun ahead, told FAIL, not run
        # the queued variant is not lost: waiting for the next run (queued again when begun ahead)
        waiting = [t for t in trials if t.state == TrialState.WAITING]
        assert [(t.user_attrs.get("variant"), t.system_attrs["fixed_params"]) for t in waiting] == [
            ("never", {"x": 0.2, "k": 10})]
        assert remaining_trials(study, 20) == 20 - len(ran)  # a trial that did not run uses up no n_trials
    assert states[True] == states[False] == [TrialState.COMPLETE, TrialState.FAIL, TrialState.COMPLETE,
                                             TrialState.FAIL, TrialState.FAIL]


def test_a_stop_lets_the_measured_trial_finish_and_fails_the_one_begun_ahead(tmp_path: Path) -> None:
    stop = StopFlag()
    runner, _, evaluator, _ = make_runner(tmp_path, stop=stop)
    study = study_at(tmp_path)
    runner.measurer.evaluator = Recording(evaluator, study, hook=lambda n: stop.set("interrupted by SIGTERM") if n == 1 else None)

    result = StudyLoop(study, runner, stop=stop, pipeline=True).run(n_trials=10, timeout=None)

    trials = study.get_trials()
    assert result.stopped_by == "signal"
    assert [t.state for t in trials[:2]] == [TrialState.COMPLETE, TrialState.COMPLETE]
    assert not [t for t in trials if t.state == TrialState.RUNNING]
    for t in trials[2:]:  # begun while #1 was measured: never measured
        assert t.state == TrialState.FAIL and "begun ahead" in t.user_attrs["fail_reason"]
        assert "signal" in t.user_attrs["fail_reason"]
    assert len(trials) <= 3


def test_a_second_interrupt_tells_every_trial_it_asked(tmp_path: Path) -> None:
    runner, _, evaluator, _ = make_runner(tmp_path)
    study = study_at(tmp_path)

    def interrupt(n: int) -> None:
        if n == 2:
            raise KeyboardInterrupt

    runner.measurer.evaluator = Recording(evaluator, study, hook=interrupt)
    with pytest.raises(KeyboardInterrupt):
        StudyLoop(study, runner, pipeline=True).run(n_trials=10, timeout=None)

    trials = study.get_trials()
    assert not [t for t in trials if t.state == TrialState.RUNNING]
    assert [t.state for t in trials[:2]] == [TrialState.COMPLETE, TrialState.COMPLETE]
    assert trials[2].state == TrialState.FAIL and "second interrupt" in trials[2].user_attrs["fail_reason"]


def test_an_error_between_trials_leaves_nothing_running(tmp_path: Path) -> None:
    runner, _, _, _ = make_runner(tmp_path)
    study = study_at(tmp_path)

    class Lease:
        calls = 0

        def lost(self):
            self.calls += 1
            return "the study lock was taken over by host x" if self.calls >= 3 else None

    with pytest.raises(StudyError, match="lock was taken over"):
        StudyLoop(study, runner, lease=Lease(), pipeline=True).run(n_trials=10, timeout=None)
    trials = study.get_trials()
    assert trials and not [t for t in trials if t.state == TrialState.RUNNING]
    assert trials[0].state == TrialState.COMPLETE
