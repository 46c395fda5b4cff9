"""MLflow tracking against a real SQLite tracking store in tmp_path."""

from __future__ import annotations

from pathlib import Path

import optuna
import pytest
from mlflow import MlflowClient
from study.fakes import score
from study.test_trial_runner import make_runner

from tuner.config.experiment import resolve_sqlite
from tuner.report.tracking import (
    TAG_ROLE,
    TAG_STATE,
    TAG_STUDY,
    TAG_TRIAL,
    MlflowTracker,
    NullTracker,
    TrialRecord,
    mlflow_name,
)
from tuner.study.loop import StudyLoop
from tuner.study.storage.queue import Variant, enqueue_initial
from tuner.study.storage.study_storage import open_study
from tuner.study.trial.bookkeeping import Bookkeeper

optuna.logging.set_verbosity(optuna.logging.WARNING)


@pytest.fixture()
def tracker(tmp_path: Path, tracking_uri: str) -> MlflowTracker:
    assert tracking_uri == resolve_sqlite("sqlite:///mlruns/mlflow.db", tmp_path)
    return MlflowTracker(tracking_uri, "fusion-tuner")


def child_runs(client: MlflowClient, experiment_id: str, parent: str):
    runs = client.search_runs([experiment_id], filter_string=f"tags.mlflow.parentRunId = '{parent}'")
    return sorted(runs, key=lambda r: int(r.data.tags[TAG_TRIAL]))


def downloaded_text(client: MlflowClient, run_id: str, path: str, tmp_path: Path) -> str:
    local = client.download_artifacts(run_id, path, str(tmp_path / "dl" / run_id))
    return Path(local).read_text()


def test_relative_sqlite_uri_resolves_against_the_project(tmp_path: Path) -> None:
    assert resolve_sqlite("sqlite:///mlruns/mlflow.db", tmp_path) == f"sqlite:///{tmp_path}/mlruns/mlflow.db"
    assert resolve_sqlite("sqlite:////abs/x.db", tmp_path) == "sqlite:////abs/x.db"
    assert resolve_sqlite("http://mlflow:5000", tmp_path) == "http://mlflow:5000"


def test_metric_names_are_made_mlflow_safe() -> None:
    assert mlflow_name("NDCG@20") == "NDCG_at_20"
    assert mlflow_name("Strong_Precision@10") == "Strong_Precision_at_10"
    assert mlflow_name("p95 latency (ms)") == "p95 latency _ms_"


def test_parent_and_child_runs_with_artifacts_and_exact_config_text(tmp_path: Path, tracker: MlflowTracker) -> None:
    crash = lambda c: "exit code 1" if c["fusion"]["k"] == 60 else None  # noqa: E731
    runner, _, _, cfg = make_runner(tmp_path, tracker=tracker, crash_when=crash, bookkeeper=Bookkeeper(threaded=True))
    study = open_study("s1", f"sqlite:///{tmp_path / 'study.db'}", sampler=optuna.samplers.RandomSampler(seed=1))
    enqueue_initial(study, [Variant("baseline", {"x": 0.8, "k": 20}), Variant("bad", {"x": 0.3, "k": 60}),
                            Variant("again", {"x": 0.8, "k": 20})])
    parent = tracker.start_study("s1", params={"sampler": "random"}, tags={"tuner.experiment": "exp.yaml"})
    StudyLoop(study, runner).run(n_trials=3, timeout=None)  # flushes the bookkeeper at the end
    assert runner.bookkeeper.errors == []
    tracker.end_study(status="FINISHED", summary={"best_feasible_value": 0.5})

    client = MlflowClient(tracker.tracking_uri)
    # The artifact store lives under mlruns/ next to the database.
    assert (tmp_path / "mlruns" / "mlflow.db").is_file()
    parent_run = client.get_run(parent)
    assert parent_run.data.tags[TAG_ROLE] == "study" and parent_run.data.tags[TAG_STUDY] == "s1"
    assert parent_run.data.params == {"sampler": "random"}
    assert parent_run.info.status == "FINISHED"

    runs = child_runs(client, tracker.experiment_id, parent)
    assert [r.data.tags[TAG_TRIAL] for r in runs] == ["0", "1", "2"]
    assert [r.data.tags[TAG_STATE] for r in runs] == ["COMPLETE", "FAIL", "COMPLETE"]
    assert [r.info.status for r in runs] == ["FINISHED", "FAILED", "FINISHED"]
    trials = study.get_trials()
    assert [t.user_attrs["mlflow_run_id"] for t in trials] == [r.info.run_id for r in runs]

    first, failed, cached = runs
    assert first.data.params == {"fusion.x": "0.8", "fusion.k": "20"}
    assert first.data.metrics["Primary_Metric_Score"] == pytest.approx(score(0.8, 20))
    assert first.data.metrics["NDCG_at_20"] == pytest.approx(score(0.8, 20) / 2)
    assert first.data.metrics["violation.OOS_FP_Rate"] == pytest.approx(trials[0].constraints["OOS_FP_Rate"])
    assert first.data.metrics["objective"] == pytest.approx(trials[0].value)
    # Named after the trial and its score; failed runs after their state.
    assert f"trial-0 {trials[0].value:.4f}" in first.info.run_name
    assert failed.info.run_name == "trial-1 FAIL"
    assert failed.data.tags["tuner.fail_reason"].startswith("BackendExited")
    assert cached.data.tags["tuner.cache_hit"] == "true"

    listed = {a.path for a in client.list_artifacts(first.info.run_id, "reports")}
    assert listed == {"reports/report.json", "reports/report.md", "reports/per_query.csv"}
    # Byte for byte the text the backend read (log_text, not log_dict): comments kept.
    written = (tmp_path / "trials" / "0" / "config.yaml").read_text()
    assert "# a comment that must survive" in written
    assert downloaded_text(client, first.info.run_id, "config/config.yaml", tmp_path) == written
    assert "fusion.x" not in {a.path for a in client.list_artifacts(failed.info.run_id)}


def test_resumed_study_reuses_its_parent_run(tmp_path: Path, tracker: MlflowTracker) -> None:
    first = tracker.start_study("s2", params={"a": 1}, tags={})
    tracker.end_study(status="KILLED", summary={})
    again = MlflowTracker(tracker.tracking_uri, "fusion-tuner")
    assert again.start_study("s2", params={"a": 2}, tags={"tuner.resumed": "yes"}) == first
    other = again.find_parent_run("another study")
    assert other is None
    client = MlflowClient(tracker.tracking_uri)
    run = client.get_run(first)
    assert run.info.status == "RUNNING" and run.data.tags["tuner.resumed"] == "yes"
    assert run.data.params == {"a": "1"}  # params are immutable; the first run's stay


def test_finish_without_start_opens_the_run(tmp_path: Path, tracker: MlflowTracker) -> None:
    parent = tracker.start_study("s3", params={}, tags={})
    tracker.finish_trial(None, TrialRecord(number=4, state="PRUNED", params={"x": 1}, fail_reason="pruned at step 3"))
    client = MlflowClient(tracker.tracking_uri)
    (run,) = child_runs(client, tracker.experiment_id, parent)
    assert run.info.status == "KILLED" and run.data.tags[TAG_STATE] == "PRUNED"
    assert run.data.tags["tuner.fail_reason"] == "pruned at step 3"


def test_null_tracker_records_nothing(tmp_path: Path) -> None:
    t = NullTracker()
    assert t.start_study("s", params={}, tags={}) is None
    assert t.start_trial(0, {}) is None
    t.finish_trial(None, TrialRecord(number=0, state="COMPLETE", params={}))
    assert not list(tmp_path.iterdir())


def test_a_trial_is_logged_in_as_few_batches_as_mlflow_allows(tmp_path: Path, tracker: MlflowTracker, monkeypatch) -> None:
    """Metrics, params and tags go in one log_batch (each is a transaction): split only at
    MLflow's caps (100 params, 100 tags, 1000 entities a call), nothing lost."""
    parent = tracker.start_study("s4", params={}, tags={})
    run_id = tracker.start_trial(0, {})
    calls: list[tuple[int, int, int]] = []
    real = tracker.client.log_batch

    def counting(run, metrics=(), params=(), tags=(), **kw):
        calls.append((len(metrics), len(params), len(tags)))
        return real(run, metrics=metrics, params=params, tags=tags, **kw)

    monkeypatch.setattr(tracker.client, "log_batch", counting)
    tracker._log(run_id, metrics={"m1": 0.5, "m2": 1.0}, params={"p": "1"}, tags={"t": "x"})
    assert calls == [(2, 1, 1)]
    calls.clear()
    metrics = {f"m{i}": i / 7 for i in range(1500)}
    params = {f"p{i}": str(i) for i in range(150)}
    tags = {f"t{i}": f"v{i}" for i in range(120)}
    tracker._log(run_id, metrics=metrics, params=params, tags=tags)
    assert calls == [(800, 100, 100), (700, 50, 20)]
    assert all(m + p + t <= 1000 and p <= 100 and t <= 100 for m, p, t in calls)
    data = MlflowClient(tracker.tracking_uri).get_run(run_id).data
    assert {f"p{i}" for i in range(150)} <= set(data.params) and {f"t{i}" for i in range(120)} <= set(data.tags)
    assert all(data.metrics[f"m{i}"] == i / 7 for i in range(1500)) and parent
