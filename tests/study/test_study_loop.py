"""The study loop: enqueue once, resume, failure budget, stop flag, best feasible."""

from __future__ import annotations

import itertools
from pathlib import Path

import optuna
import pytest
from optuna.trial import TrialState

from study.fakes import oos_rate, score
from study.test_trial_runner import OOS_LIMIT, make_runner
from tuner.errors import StudyError
from tuner.study.feasibility import best_feasible_trial
from tuner.config.objective import FailureBudget
from tuner.study.loop import FailureTally, StudyLoop
from tuner.study.stop import StopFlag
from tuner.study.storage.queue import Variant, count_finished, enqueue_initial, fail_stale_trials, remaining_trials
from tuner.study.storage.study_storage import open_study

optuna.logging.set_verbosity(optuna.logging.WARNING)


def sqlite_storage(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'study.db'}"


def sampler() -> optuna.samplers.BaseSampler:
    return optuna.samplers.TPESampler(seed=7, multivariate=True, n_startup_trials=3)


def test_baseline_and_shortlist_enqueued_once_across_resume(tmp_path: Path) -> None:
    runner, backend, _, _ = make_runner(tmp_path)
    storage = sqlite_storage(tmp_path)
    variants = [Variant("baseline", {"x": 0.8, "k": 20}), Variant("short-1", {"x": 0.3, "k": 40})]

    study = open_study("s", storage, sampler=sampler())
    assert enqueue_initial(study, variants) == 2
    StudyLoop(study, runner).run(n_trials=1, timeout=None)

    resumed = open_study("s", storage, sampler=sampler())
    assert enqueue_initial(resumed, variants) == 0
    result = StudyLoop(resumed, runner).run(n_trials=3, timeout=None)

    trials = resumed.get_trials()
    assert [t.number for t in trials] == [0, 1, 2, 3]
    assert [t.user_attrs.get("variant") for t in trials[:2]] == ["baseline", "short-1"]
    # the sampled params, plus each applied value under its config key
    assert trials[0].params == {"x": 0.8, "k": 20, "fusion.x": 0.8, "fusion.k": 20}
    assert trials[0].value == pytest.approx(score(0.8, 20))
    assert resumed.metric_names == ["Primary_Metric_Score"]
    assert [o.number for o in result.ran] == [1, 2, 3]
    assert not any(t.user_attrs.get("variant") for t in trials[2:])
    assert backend.restarts == 4 - sum(o.cache_hit for o in result.ran)


def test_a_queued_variant_a_killed_run_left_running_is_queued_again_not_lost(tmp_path: Path) -> None:
    runner, _, _, _ = make_runner(tmp_path)
    storage = sqlite_storage(tmp_path)
    study = open_study("s", storage, sampler=sampler())
    enqueue_initial(study, [Variant("baseline", {"x": 0.8, "k": 20}), Variant("short-1", {"x": 0.3, "k": 40})])
    killed = study.ask()  # the baseline, taken from the queue by a run then killed with SIGKILL
    assert killed.user_attrs["variant"] == "baseline"
    killed.suggest_float("x", 0.0, 1.0)  # it had drawn one of its params

    resumed = open_study("s", storage, sampler=sampler())
    requeued: dict[int, int] = {}
    assert fail_stale_trials(resumed, requeued=requeued) == [0]
    assert requeued == {0: 2}  # after short-1, still waiting as #1
    stale = resumed.get_trials()[0]
    assert stale.state == TrialState.FAIL
    assert stale.user_attrs["fail_reason"].startswith("stale") and "queued again as trial #2" in stale.user_attrs["fail_reason"]
    StudyLoop(resumed, runner).run(n_trials=2, timeout=None)
    done = [t for t in resumed.get_trials() if t.state == TrialState.COMPLETE]
    assert sorted(t.user_attrs["variant"] for t in done) == ["baseline", "short-1"]
    baseline = next(t for t in done if t.user_attrs["variant"] == "baseline")
    assert baseline.params["x"] == 0.8 and baseline.params["k"] == 20  # the variant's own params, not resampled


def test_failure_budget_stops_the_study_with_a_clear_message(tmp_path: Path) -> None:
    runner, _, _, _ = make_runner(tmp_path, crash_when=lambda c: "exit code 3" if c["fusion"]["k"] >= 30 else None)
    study = open_study("s", sqlite_storage(tmp_path), sampler=sampler())
    enqueue_initial(study, [Variant("ok", {"x": 0.3, "k": 20}), Variant("bad1", {"x": 0.3, "k": 30}),
                            Variant("ok2", {"x": 0.4, "k": 20}), Variant("bad2", {"x": 0.3, "k": 40}),
                            Variant("bad3", {"x": 0.3, "k": 50})])
    loop = StudyLoop(study, runner, budget=FailureBudget(max_consecutive=2, max_total=10))
    with pytest.raises(StudyError) as err:
        loop.run(n_trials=20, timeout=None)
    msg = str(err.value)
    assert "2 consecutive failed trials (failure_budget.max_consecutive=2)" in msg
    assert "BackendExited" in msg and "\n" not in msg
    states = [t.state for t in study.get_trials()]
    assert states == [TrialState.COMPLETE, TrialState.FAIL, TrialState.COMPLETE, TrialState.FAIL, TrialState.FAIL]


def test_failure_budget_total() -> None:
    from tuner.study.trial.outcome import TrialOutcome

    budget = FailureTally(FailureBudget(max_consecutive=3, max_total=2))  # never 3 in a row below
    budget.record(TrialOutcome(0, "FAIL", fail_reason="a"))
    budget.record(TrialOutcome(1, "COMPLETE", value=1.0))
    assert budget.exceeded() is None
    budget.record(TrialOutcome(2, "FAIL", fail_reason="b", interrupted=True))  # interrupts do not count
    assert budget.exceeded() is None
    budget.record(TrialOutcome(3, "FAIL", fail_reason="c"))
    assert budget.exceeded() == "2 failed trials in this run (failure_budget.max_total=2)"


def test_stop_flag_ends_the_loop_after_the_current_trial(tmp_path: Path) -> None:
    stop = StopFlag()
    runner, _, _, _ = make_runner(tmp_path, stop=stop)
    study = open_study("s", sqlite_storage(tmp_path), sampler=sampler())

    class StopAfterFirstEvaluation:
        def __init__(self, inner):
            self.inner = inner

        def __getattr__(self, name):
            return getattr(self.inner, name)

        def evaluate(self, **kw):
            result = self.inner.evaluate(**kw)
            stop.set("interrupted by SIGTERM")  # the signal arrives mid-evaluation
            return result

    runner.measurer.evaluator = StopAfterFirstEvaluation(runner.measurer.evaluator)
    result = StudyLoop(study, runner, stop=stop).run(n_trials=5, timeout=None)
    assert result.stopped_by == "signal"
    assert [t.state for t in study.get_trials()] == [TrialState.COMPLETE]  # finished, then stopped


def test_timeout_stops_before_starting_another_trial(tmp_path: Path) -> None:
    runner, _, _, _ = make_runner(tmp_path)
    study = open_study("s", sqlite_storage(tmp_path), sampler=sampler())
    # start, check before trial 0, before trial 1, before trial 2 (past the timeout), then the end
    ticks = itertools.chain([0.0, 0.0, 5.0, 11.0], itertools.repeat(11.0))
    result = StudyLoop(study, runner, clock=lambda: next(ticks)).run(n_trials=None, timeout=10.0)
    assert result.stopped_by == "timeout" and len(result.ran) == 2


def test_stale_running_trials_are_failed_on_resume_and_not_counted_when_interrupted(tmp_path: Path) -> None:
    storage = sqlite_storage(tmp_path)
    study = open_study("s", storage, sampler=sampler())
    study.ask()  # a run killed with SIGKILL leaves this RUNNING
    resumed = open_study("s", storage, sampler=sampler())
    assert fail_stale_trials(resumed) == [0]
    assert resumed.get_trials()[0].state == TrialState.FAIL
    assert count_finished(resumed) == 0  # killed before it finished: its measurement is still owed
    assert remaining_trials(resumed, 5) == 5

    stop = StopFlag()
    stop.set()
    runner, _, _, _ = make_runner(tmp_path, stop=stop)
    StudyLoop(resumed, runner, stop=StopFlag()).run(n_trials=1, timeout=None)
    last = resumed.get_trials()[-1]
    assert last.state == TrialState.FAIL and last.user_attrs["fail_reason"].startswith("interrupted")
    assert count_finished(resumed) == 0  # the interrupted trial never ran


def test_open_study_refuses_a_direction_change(tmp_path: Path) -> None:
    storage = sqlite_storage(tmp_path)
    open_study("s", storage, sampler=sampler(), maximize=True)
    with pytest.raises(StudyError, match="exists with direction maximize, the experiment asks minimize"):
        open_study("s", storage, sampler=sampler(), maximize=False)


def test_best_feasible_ignores_a_better_infeasible_trial() -> None:
    study = optuna.create_study(direction="maximize")
    dist = {"x": optuna.distributions.FloatDistribution(0, 1)}

    def add(x: float, k: int = 40) -> None:
        trial = optuna.trial.create_trial(params={"x": x}, distributions=dist, value=score(x, k),
                                          system_attrs={"constraints:OOS_FP_Rate": oos_rate(x) - OOS_LIMIT})
        study.add_trial(trial)

    add(0.9)   # infeasible (0.18 > 0.10)
    assert best_feasible_trial(study.trials) is None
    add(0.6)   # infeasible, best value so far
    add(0.45)  # feasible
    add(0.1)   # feasible, lower score than 0.45
    best = best_feasible_trial(study.trials)
    assert best is not None and best.params == {"x": 0.45}
    assert score(0.6, 40) > score(0.45, 40)  # the infeasible trial really scored higher
    lowest = best_feasible_trial(study.trials, maximize=False)
    assert lowest is not None and lowest.params == {"x": 0.1}  # score(0.1) < score(0.45)


def test_an_ask_cut_after_its_commit_leaves_no_trial_running_and_loses_no_variant(tmp_path: Path) -> None:
    """A database restart can cut an ask after its commit: the trial exists, RUNNING, but
    the loop never received it and asks again. The run fails it (not counted) and queues
    the variant it had popped again, instead of leaving it RUNNING past the run."""
    import sqlalchemy as sa

    runner, _, _, _ = make_runner(tmp_path)
    study = open_study("s", sqlite_storage(tmp_path), sampler=sampler())
    enqueue_initial(study, [Variant("baseline", {"x": 0.8, "k": 20})])
    real_ask, cut = study.ask, []

    def ask(*args, **kwargs):  # type: ignore[no-untyped-def]
        trial = real_ask(*args, **kwargs)
        if not cut:  # the first ask's commit went through, its answer was lost
            cut.append(trial.number)
            raise sa.exc.OperationalError("COMMIT", {}, ConnectionError("server closed the connection unexpectedly"))
        return trial

    study.ask = ask  # type: ignore[method-assign]
    result = StudyLoop(study, runner).run(n_trials=2, timeout=None)

    trials = study.get_trials()
    assert [t.number for t in trials if t.state == TrialState.RUNNING] == []
    orphan = trials[cut[0]]
    assert orphan.state == TrialState.FAIL and "connection was lost" in orphan.user_attrs["fail_reason"]
    assert orphan.user_attrs["fail_reason"].startswith("stale") and "queued again" in orphan.user_attrs["fail_reason"]
    assert result.stale_failed == [cut[0]]
    done = [t for t in trials if t.state == TrialState.COMPLETE]
    assert len(done) == 2 and [t.user_attrs.get("variant") for t in done].count("baseline") == 1
    assert count_finished(study) == 2
