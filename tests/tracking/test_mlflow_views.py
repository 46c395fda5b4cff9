"""What the MLflow UI shows of a study (issue 13), against a real SQLite tracking store
in tmp_path: runs view, params per component, run names, descriptions with links, the
parent's study summary, clean metric names."""

from __future__ import annotations

import pytest
from mlflow import MlflowClient

from tuner.report.tracking import (
    EXPERIMENT_KIND,
    TAG_EXPERIMENT_KIND,
    TAG_NOTE,
    TAG_TRIAL,
    MlflowTracker,
    NullTracker,
    TrialRecord,
    flat_params,
    mlflow_name,
    trial_run_name,
)


@pytest.fixture()
def tracker(tracking_uri: str) -> MlflowTracker:
    return MlflowTracker(tracking_uri, "fusion-tuner")


def test_a_new_experiment_opens_on_its_runs(tracker: MlflowTracker) -> None:
    experiment = tracker.client.get_experiment(tracker.experiment_id)
    assert experiment.tags[TAG_EXPERIMENT_KIND] == "custom_model_development"


def test_an_existing_experiment_gets_the_kind_it_lacks(tracking_uri: str) -> None:
    client = MlflowClient(tracking_uri)
    cases = {
        "older tuner": (None, EXPERIMENT_KIND),
        "opened in the UI": ("genai_development_inferred", EXPERIMENT_KIND),  # the UI stores its guess
        "user's choice": ("genai_development", "genai_development"),  # stays
    }
    for name, (before, after) in cases.items():
        experiment_id = client.create_experiment(name, tags={TAG_EXPERIMENT_KIND: before} if before else None)
        MlflowTracker(tracking_uri, name)
        assert client.get_experiment(experiment_id).tags.get(TAG_EXPERIMENT_KIND) == after, name


def test_dict_and_list_params_are_logged_per_component(tracker: MlflowTracker) -> None:
    tracker.start_study("s", params={"sampler": "tpe", "search": {"api_key": "k-1", "url": "http://h"}}, tags={})
    params = {"fusion.weights": {"bm25": 0.6, "dense": 0.4}, "fallback.windows_days": [39, 111],
              "nested": {"a": [1.5, {"b": 2}]}, "fusion.k": 60, "empty": [], "rerank.key_boost": 0.5}
    run_id = tracker.start_trial(0, params)
    # Solved during the trial: logged at the finish; a param logged at the start keeps its value.
    tracker.finish_trial(run_id, TrialRecord(number=0, state="COMPLETE", value=0.4,
                                             params={**params, "fusion.k": 61, "confidence.threshold": 0.29}))
    logged = tracker.client.get_run(run_id).data.params
    assert logged == {
        "fusion.weights.bm25": "0.6", "fusion.weights.dense": "0.4",
        "fallback.windows_days.0": "39", "fallback.windows_days.1": "111",
        "nested.a.0": "1.5", "nested.a.1.b": "2", "fusion.k": "60", "empty": "[]",
        "rerank.key_boost": "0.5", "confidence.threshold": "0.29",
    }
    numeric = {k: v for k, v in logged.items() if k != "empty"}
    assert all(isinstance(float(v), float) for v in numeric.values())  # plottable
    # The study's own params: a secret name hides its whole subtree.
    parent = tracker.client.get_run(tracker.parent_run_id).data.params
    assert parent == {"sampler": "tpe", "search.api_key": "***", "search.url": "http://h"}
    assert flat_params({"token": ["a", "b"]}) == {"token.0": "***", "token.1": "***"}


def test_runs_are_named_after_trial_and_score(tracker: MlflowTracker) -> None:
    parent = tracker.start_study("s", params={}, tags={})
    # the verdict leads: the runs table cuts a long name at its end ("trial-16 0.3812 ...")
    cases = [("COMPLETE", 0.43071, True, "✓ trial-15 0.4307"), ("COMPLETE", 0.38118, False, "✗ trial-16 0.3812 infeasible"),
             ("COMPLETE", None, None, "trial-17"), ("FAIL", None, None, "trial-18 FAIL"),
             ("PRUNED", 0.2, None, "trial-19 PRUNED")]
    for number, (state, value, feasible, _) in enumerate(cases, start=15):
        run_id = tracker.start_trial(number, {"x": 1})
        tracker.finish_trial(run_id, TrialRecord(number=number, state=state, params={"x": 1}, value=value,
                                                 feasible=feasible))
    for number, (*_, name) in enumerate(cases, start=15):
        (run,) = tracker.client.search_runs([tracker.experiment_id], filter_string=(
            f"tags.`{TAG_TRIAL}` = '{number}' and tags.mlflow.parentRunId = '{parent}'"))
        assert run.info.run_name == name and run.data.tags["mlflow.runName"] == name


def test_run_name_formats() -> None:
    assert trial_run_name(3, "COMPLETE", 0.0, True) == "✓ trial-3 0.0000"
    assert trial_run_name(3, "COMPLETE", 123456.0, True) == "✓ trial-3 1.235e+05"
    assert trial_run_name(3, "COMPLETE", 0.5, None) == "trial-3 0.5000"  # feasibility unknown: no verdict
    assert trial_run_name(3, "COMPLETE", float("nan"), False) == "trial-3"


def test_a_trial_run_describes_itself_with_links(tracker: MlflowTracker) -> None:
    tracker.start_study("s", params={}, tags={})
    run_id = tracker.start_trial(15, {})
    page = "http://127.0.0.1:8081/dashboard/studies/1/trials?numbers=15"
    tracker.finish_trial(run_id, TrialRecord(
        number=15, state="COMPLETE", params={}, value=0.43, feasible=True,
        summary="**NDCG@10 0.4307**, feasible\n", links={"Optuna trial page": page, "odd [label]": "http://h/a b"}))
    note = tracker.client.get_run(run_id).data.tags[TAG_NOTE]
    assert note == (f"**NDCG@10 0.4307**, feasible\n\n- [Optuna trial page]({page})\n"
                    "- [odd \\[label\\]](http://h/a%20b)")
    # A run without summary or links gets no description.
    bare = tracker.start_trial(16, {})
    tracker.finish_trial(bare, TrialRecord(number=16, state="FAIL", params={}))
    assert TAG_NOTE not in tracker.client.get_run(bare).data.tags


def test_ui_addresses(tracker: MlflowTracker) -> None:
    eid = tracker.experiment_id
    # the machine-learning layout, whatever the browser chose last (MLflow 3.17 reads it from the URL)
    view = "?workflowType=machine_learning"
    assert tracker.run_url("abc", "http://127.0.0.1:5000/") == f"http://127.0.0.1:5000/#/experiments/{eid}/runs/abc{view}"
    assert tracker.run_url("abc", "http://h:5000") == f"http://h:5000/#/experiments/{eid}/runs/abc{view}"
    assert tracker.experiment_url("http://h:5000/") == f"http://h:5000/#/experiments/{eid}/runs{view}"
    assert NullTracker().run_url("abc", "http://h/") is None and NullTracker().experiment_url("http://h/") is None


def test_the_parent_run_summarises_the_study(tracker: MlflowTracker) -> None:
    tracker.summarize_study(note="before any study", metrics={"n_feasible": 1}, tags={})  # no parent yet: nothing
    parent = tracker.start_study("s", params={}, tags={})
    for number in (0, 1):
        tracker.finish_trial(tracker.start_trial(number, {}), TrialRecord(number=number, state="COMPLETE", params={}))
        tracker.summarize_study(note=f"## Study s\nbest feasible: trial {number}",
                                metrics={"best_feasible.value": 0.4 + number / 10, "best_feasible.trial": number,
                                         "n_feasible": number + 1, "n_infeasible": 0},
                                tags={"tuner.optuna_study_page": "http://127.0.0.1:8081/dashboard/studies/1"})
    tracker.summarize_study(note="## Study s\nfinal", metrics={"n_feasible": 2}, tags={}, step=5)
    run = tracker.client.get_run(parent)
    assert run.data.tags[TAG_NOTE] == "## Study s\nfinal"  # the later call replaces the note
    assert run.data.tags["tuner.optuna_study_page"].endswith("/studies/1")
    assert run.data.metrics["best_feasible.value"] == pytest.approx(0.5)
    history = tracker.client.get_metric_history(parent, "n_feasible")
    assert sorted((m.step, m.value) for m in history) == [(0, 1.0), (1, 2.0), (5, 2.0)]
    NullTracker().summarize_study(note="x", metrics={"a": 1.0}, tags={})


def test_metric_names_stay_readable() -> None:
    for name in ("violation.OOS_FP_Rate", "feasible", "objective", "best_feasible.value"):
        assert mlflow_name(name) == name
    assert mlflow_name("NDCG@20") == "NDCG_at_20"
    assert mlflow_name("constraint.OOS_FP_Rate <= 0.1") == "constraint.OOS_FP_Rate _le_ 0.1"
    assert "__" not in mlflow_name("a >= 1") and "__" not in mlflow_name("a < 1")
