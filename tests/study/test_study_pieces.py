"""Result cache, pruning path, bookkeeping errors, signals, demo set-up helpers."""

from __future__ import annotations

import io
import os
import signal
from pathlib import Path

import optuna
import pytest
from optuna.trial import TrialState
from rich.console import Console

from study.fakes import score
from study.test_trial_runner import make_runner, run_one
from tuner.errors import ConfigError, TargetError
from tuner.config.objective import FailureBudget
from tuner.study.loop import StudyLoop
from tuner.study.stop import StopFlag
from tuner.study.storage.result_cache import CachedResult, ResultCache, cache_key
from tuner.study.trial.bookkeeping import Bookkeeper
from tuner.study.trial.live import spec_fingerprint

optuna.logging.set_verbosity(optuna.logging.WARNING)
REPO = Path(__file__).resolve().parents[2]


def test_cache_key_ignores_file_order_but_not_boundaries() -> None:
    parts = {"dataset_hash": "d", "labels_fingerprint": "l", "eval_spec_json": "{}"}
    a = cache_key({"a.yaml": "x: 1\n", "b.yaml": "y: 2\n"}, **parts)
    assert a == cache_key({"b.yaml": "y: 2\n", "a.yaml": "x: 1\n"}, **parts)
    assert a != cache_key({"a.yaml": "x: 1\ny: 2\n", "b.yaml": ""}, **parts)
    assert a != cache_key({"a.yaml": "x: 1\n", "b.yaml": "y: 2\n"}, **{**parts, "labels_fingerprint": "l2"})
    assert len(a) == 64


def test_result_cache_persists_across_instances(tmp_path: Path) -> None:
    first = ResultCache(tmp_path / "c.sqlite")
    first.put("k", CachedResult({"m": 0.5}, {"json": "/r.json"}, 3, "s"))
    again = ResultCache(tmp_path / "c.sqlite")
    assert again.get("k") == CachedResult({"m": 0.5}, {"json": "/r.json"}, 3, "s")
    assert again.get("missing") is None and len(again) == 1


def test_spec_fingerprint_ignores_host_port_and_speed_settings() -> None:
    from tuner.evaluation import EvalSpec

    a = EvalSpec(request={"url": "http://127.0.0.1:4001/search"}, concurrency=4, timeout_s=5)
    b = EvalSpec(request={"url": "http://127.0.0.1:5999/search"}, concurrency=16, timeout_s=30, retries=0)
    assert spec_fingerprint(a) == spec_fingerprint(b)
    assert spec_fingerprint(a) != spec_fingerprint(a.model_copy(update={"top_k": 10}))
    other_path = a.model_copy(update={"request": a.request.model_copy(update={"url": "http://h:1/v2/search"})})
    assert spec_fingerprint(a) != spec_fingerprint(other_path)


def test_pruned_trials_are_told_pruned_and_do_not_spend_the_failure_budget(tmp_path: Path) -> None:
    def reporter(trial: optuna.Trial):
        def on_result(query_id: str, row) -> None:
            step = int(query_id[1:])
            trial.report(row["Primary_Metric_Score"], step)
            if trial.should_prune():
                raise optuna.TrialPruned(f"pruned at step {step}")
        return on_result

    runner, _, _, _ = make_runner(tmp_path, reporter_factory=reporter)
    pruner = optuna.pruners.MedianPruner(n_startup_trials=1, n_warmup_steps=0)
    study = optuna.create_study(direction="maximize", pruner=pruner)
    for params in ({"x": 0.7, "k": 40}, {"x": 0.0, "k": 10}, {"x": 0.1, "k": 10}):
        study.enqueue_trial(params)
    loop = StudyLoop(study, runner, budget=FailureBudget(max_consecutive=1, max_total=1))
    result = loop.run(n_trials=3, timeout=None)  # would raise if a prune counted as a failure
    states = [t.state for t in study.get_trials()]
    assert states == [TrialState.COMPLETE, TrialState.PRUNED, TrialState.PRUNED]
    assert score(0.0, 10) < score(0.7, 40)  # the pruned ones really were worse at step 0
    assert study.get_trials()[1].user_attrs["fail_reason"] == "pruned at step 0"
    assert [o.state for o in result.ran] == ["COMPLETE", "PRUNED", "PRUNED"]


def test_a_bookkeeping_error_is_reported_but_the_trial_stays_complete(tmp_path: Path) -> None:
    notes: list[str] = []
    runner, _, evaluator, _ = make_runner(tmp_path, bookkeeper=Bookkeeper(threaded=True, on_error=notes.append))

    def broken(*args, **kwargs):
        raise OSError("disk full")

    evaluator.write_reports = broken
    study = optuna.create_study(direction="maximize")
    outcome, frozen = run_one(study, runner, {"x": 0.3, "k": 40})
    runner.flush()
    assert outcome.state == "COMPLETE" and frozen.state == TrialState.COMPLETE
    assert notes == ["bookkeeping of trial #0: OSError: disk full"]


def test_first_signal_requests_a_stop_second_sigint_aborts() -> None:
    from tuner.cli.run_cmd import graceful_signals

    stop = StopFlag()
    console = Console(file=io.StringIO())
    before = signal.getsignal(signal.SIGTERM)
    with graceful_signals(stop, console) as received:
        os.kill(os.getpid(), signal.SIGTERM)
        assert stop.is_set() and stop.reason == "interrupted by SIGTERM"
        assert received["signal"] == signal.SIGTERM
        with pytest.raises(KeyboardInterrupt):
            os.kill(os.getpid(), signal.SIGINT)
    assert signal.getsignal(signal.SIGTERM) is before


def test_demo_backend_config_points_at_the_data_and_keeps_comments(tmp_path: Path) -> None:
    from ruamel.yaml import YAML

    from tuner.config.configpatch import get_path
    from tuner.ops.demo import DEMO_BASELINE, write_backend_config

    template = REPO / "backend" / "config.yaml"
    dest = tmp_path / "demo" / "config.yaml"
    write_backend_config(template, dest, tmp_path / "demo" / "data" / "corpus.jsonl")
    text = dest.read_text()
    doc = YAML().load(text)
    assert get_path(doc, "data.corpus") == "data/corpus.jsonl"
    for key, value in DEMO_BASELINE.items():
        assert get_path(doc, key) == value
    original = template.read_text().splitlines()
    changed = [(a, b) for a, b in zip(original, text.splitlines()) if a != b]
    # only the corpus line and the baseline's lines differ; their comments are kept
    assert len(changed) == 1 + len(DEMO_BASELINE) and "corpus:" in changed[0][0]
    assert all("#" in b for a, b in changed[1:])
    assert len(text.splitlines()) == len(original)


def test_demo_data_generation_failure_is_one_clear_line(tmp_path: Path) -> None:
    from tuner.ops.demo import generate_data

    with pytest.raises(TargetError, match=r"demo data generation failed \(exit 1\)") as err:
        generate_data(tmp_path / "data", python="/bin/false")
    assert "\n" not in str(err.value)
    assert not (tmp_path / "data").exists() and not list(tmp_path.iterdir())


def test_find_project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import tuner.ops.demo as demo

    assert demo.find_project(REPO / "tests") == REPO
    nested = tmp_path / "a" / "b"
    nested.mkdir(parents=True)
    # Outside a checkout the package's own checkout is used (editable install).
    assert demo.find_project(nested) == REPO
    monkeypatch.setattr(demo, "DEMO_EXPERIMENT", Path("no") / "such.yaml")
    with pytest.raises(ConfigError, match="run `tuner demo` inside the fusion-tuner checkout"):
        demo.find_project(nested)


def test_the_bookkeeping_queue_is_bounded_and_a_full_queue_waits() -> None:
    import threading

    keeper = Bookkeeper(threaded=True, max_behind=2)
    release = threading.Event()
    done: list[int] = []

    def slow(i: int) -> None:
        release.wait(60)
        done.append(i)

    assert keeper.wait_for_room() == 0.0  # nothing queued: no wait
    keeper.submit("one", slow, 1)
    keeper.submit("two", slow, 2)
    waiter_result: list[float] = []
    waiter = threading.Thread(target=lambda: waiter_result.append(keeper.wait_for_room()))
    waiter.start()
    waiter.join(0.5)
    assert waiter.is_alive() and not waiter_result  # two unfinished of two allowed: it waits
    release.set()
    waiter.join(60)
    assert not waiter.is_alive() and waiter_result[0] > 0
    keeper.close()
    assert done == [1, 2]  # in order, nothing dropped


def test_slow_bookkeeping_makes_the_study_wait_not_pile_up(tmp_path: Path) -> None:
    import time as _time

    keeper = Bookkeeper(threaded=True, max_behind=1)
    runner, _, evaluator, _ = make_runner(tmp_path, bookkeeper=keeper)
    written: list[int] = []
    original = evaluator.write_reports

    def slow_reports(result, out_dir, **kwargs):
        _time.sleep(0.3)
        written.append(kwargs["context"]["trial"])
        return original(result, out_dir, **kwargs)

    evaluator.write_reports = slow_reports
    study = optuna.create_study(direction="maximize")
    outcomes = [run_one(study, runner, {"x": 0.1 * i, "k": 40})[0] for i in range(3)]
    runner.flush()
    assert set(written) == {0, 1, 2}  # every trial's reports were written (a superseded best twice)
    # the second and third trials found the one queued job unfinished and waited for it
    assert [("backlog" in o.phase_seconds) for o in outcomes] == [False, True, True]
    assert all(o.phase_seconds["backlog"] > 0 for o in outcomes[1:])


def test_a_stuck_bookkeeping_job_is_waited_for_once_then_the_study_goes_on() -> None:
    import threading

    notes: list[str] = []
    keeper = Bookkeeper(threaded=True, max_behind=1, max_wait_s=0.3, on_error=notes.append)
    release = threading.Event()
    keeper.submit("stuck", release.wait, 120)
    assert keeper.wait_for_room() >= 0.3  # waited its bound, then gave up
    assert len(notes) == 1 and "has not finished in 0.3 s" in notes[0]
    keeper.submit("next", lambda: None)
    assert keeper.wait_for_room() == 0.0  # the stuck job again: not waited for, not warned twice
    assert len(notes) == 1
    release.set()
    keeper.flush()
    later = threading.Event()
    keeper.submit("after", later.wait, 120)  # a new job at the head: waited for as usual
    waiter = threading.Thread(target=keeper.wait_for_room)
    waiter.start()
    waiter.join(0.1)
    assert waiter.is_alive()
    later.set()
    waiter.join(60)
    assert not waiter.is_alive()
    keeper.close()
