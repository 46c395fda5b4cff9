"""Fusion replay in real studies against the reference backend (a process on the demo data):
each trial retrieves once, explained, scores a fusion grid from it with the gates solved
(bounded first, so only the settings that can be among the best are scored exactly; the
same best as scoring them all), and serves the best settings live; the trial reports the
best live value. A replay model that differs from the backend is caught, loudly, and no
config is left patched.

The study is also looked at in optuna-dashboard in headless Debian Chromium (the last
test): a replay trial's record (the settings scored, those verified live) is the
`tuner.replay` system attribute and its user attributes stay scalars; as a nested user
attribute that record made the study page's trial rows 593-714 px tall and a trial's page
6,678 px wide in a 1,440 px window. Screenshots go to test-artifacts/browser/."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import optuna
import pandas as pd
import pytest
from support.demo_data import copy_demo_subset
from support.reference_experiment import FULL_SPACE, FUSION_SPACE, copy_backend_config, write_reference_experiment

from tuner.config.experiment import load_experiment
from tuner.ops.run import run_experiment
from tuner.study.trial.attrs import ATTR_REPLAY, ATTR_REPLAY_SETTINGS, assignment_of, reports_of, trial_attr

pytestmark = [pytest.mark.slow, pytest.mark.integration]
optuna.logging.set_verbosity(optuna.logging.WARNING)

N_IN_SCOPE = 80
FUSION = {"fusion.method": "method", "fusion.rrf_k": "rrf_k", "fusion.weights": "weights",
          "fusion.normalization": "normalization"}
#: 5 weight splits x 4 RRF k + 5 x 2 linear
GRID_SIZE = 5 * 4 + 5 * 2


@pytest.fixture(scope="module")
def demo_data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return copy_demo_subset(tmp_path_factory.mktemp("replay-demo") / "data", N_IN_SCOPE)


def make_project(root: Path, data: Path, *, study: str, n_trials: int, verify_top: int = 2, tracking: bool = False,
                 space: Path = FULL_SPACE, **replay: Any) -> Path:
    (root / "data").mkdir(parents=True)
    for name in ("queries.jsonl", "qrels.txt", "corpus.jsonl"):
        (root / "data" / name).write_bytes((data / name).read_bytes())
    copy_backend_config(root)
    return write_reference_experiment(
        root, study=study, n_trials=n_trials, project_root=".", state_dir=".tuner",
        sampler={"type": "tpe", "seed": 3, "multivariate": True, "n_startup_trials": 4},
        timeout_s=600, constraints=["OOS_FP_Rate <= 0.10"], failure_budget={"max_consecutive": 2, "max_total": 3},
        evaluation={"top_k": 50, "concurrency": 4}, search_space=space,
        replay={"params": FUSION, "points": 4, "weight_step": 0.25, "verify_top": verify_top, **replay},
        tracking={"enabled": tracking},
    )


@pytest.fixture(scope="module")
def replay_run(demo_data: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    root = tmp_path_factory.mktemp("replay-project")
    exp = load_experiment(make_project(root, demo_data, study="replay", n_trials=3, tracking=True,
                                       workers=1)).bind_port()  # one helper process scores beside the tuner
    original = (root / "backend" / "config.yaml").read_bytes()
    summary = run_experiment(exp)
    study = optuna.load_study(study_name="replay", storage=exp.storage)
    return {"root": root, "exp": exp, "study": study, "summary": summary, "original": original}


def test_the_baseline_is_measured_as_found_and_later_trials_replay_the_fusion(replay_run: dict[str, Any]) -> None:
    trials = replay_run["study"].trials
    assert [t.state for t in trials] == [optuna.trial.TrialState.COMPLETE] * 3
    assert trial_attr(trials[0], ATTR_REPLAY) is None  # queued with every param: nothing left to replay
    for t in trials:  # scalars only: optuna-dashboard shows a column per user attribute
        assert not [k for k, v in t.user_attrs.items() if isinstance(v, (dict, list))], t.user_attrs
    for t in trials[1:]:
        replay = trial_attr(t, ATTR_REPLAY)
        assert t.user_attrs[ATTR_REPLAY_SETTINGS] == GRID_SIZE  # a scalar column; the record is a system attr
        assert ATTR_REPLAY not in t.user_attrs
        assert replay["chosen_by"].startswith(f"grid of {GRID_SIZE}, bounded; {replay['scored']} scored exactly")
        assert replay["settings"] == GRID_SIZE and 2 <= replay["scored"] < GRID_SIZE
        assert replay["served_check"].endswith("answers replayed exactly at the served setting")


def test_the_preflight_checked_the_explanations_before_the_first_trial(replay_run: dict[str, Any]) -> None:
    findings = replay_run["study"].user_attrs["tuner.preflight"]["findings"]
    replay = [f for f in findings if f["code"] == "replay"]
    assert len(replay) == 1 and replay[0]["level"] == "info"
    assert "explained answers replay exactly" in replay[0]["message"]
    assert f"each trial bounds a grid of {GRID_SIZE} settings, scores exactly those that can be among the best, " \
           "then serves the best 2 live" in replay[0]["message"]


def test_every_verified_setting_measured_live_what_replay_predicted(replay_run: dict[str, Any]) -> None:
    for t in replay_run["study"].trials[1:]:
        verified = trial_attr(t, ATTR_REPLAY)["verified"]
        assert len(verified) == 2
        assert verified[0]["assignment"] != verified[1]["assignment"]
        for v in verified:
            assert math.isclose(v["replayed"], v["live"], rel_tol=0, abs_tol=1e-9)
            assert math.isclose(v["replayed_violation"], v["live_violation"], rel_tol=0, abs_tol=1e-9)


def test_a_replay_trial_reports_its_best_live_setting_and_records_the_whole_sweep(
        replay_run: dict[str, Any]) -> None:
    for t in replay_run["study"].trials[1:]:
        verified = trial_attr(t, ATTR_REPLAY)["verified"]
        feasible = [v for v in verified if v["live_violation"] <= 0] or verified
        best = max(feasible, key=lambda v: v["live"])
        assert math.isclose(t.value, best["live"], rel_tol=0, abs_tol=1e-12)
        assignment = assignment_of(t)
        for name, value in best["assignment"].items():
            assert assignment[name] == value  # what `tuner apply` would write
        assert t.params["fusion.method"] == assignment["fusion.method"]  # a param for the dashboards too
        plot = Path(reports_of(t)["fusion_sweep_png"]).read_bytes()
        assert plot.startswith(b"\x89PNG") and len(plot) > 5000  # what was scored, drawn
        sweep = pd.read_csv(reports_of(t)["fusion_sweep_csv"])
        assert len(sweep) == GRID_SIZE and sweep["rank"].tolist() == list(range(1, GRID_SIZE + 1))
        assert math.isclose(sweep["objective"].iloc[0], verified[0]["replayed"], rel_tol=0, abs_tol=1e-12)
        exact = sweep["exact"].astype(bool)
        assert exact.sum() == trial_attr(t, ATTR_REPLAY)["scored"] and exact.iloc[:2].all()
        assert (sweep.loc[~exact, "objective_bound"] < verified[1]["replayed"]).all()  # below the runner-up
        snapshot = (Path(reports_of(t)["json"]).parent / "config.yaml").read_text()
        assert f"method: {assignment['fusion.method']}" in snapshot  # the snapshot is the served best


def test_mlflow_runs_of_replay_trials_hold_the_sweep_and_the_replay_figures(replay_run: dict[str, Any]) -> None:
    from mlflow import MlflowClient

    from tuner.report.tracking import TAG_TRIAL

    client = MlflowClient(replay_run["exp"].tracking.mlflow_uri)
    experiment = client.get_experiment_by_name("replay")
    runs = {int(r.data.tags[TAG_TRIAL]): r for r in client.search_runs([experiment.experiment_id])
            if TAG_TRIAL in r.data.tags}
    for t in replay_run["study"].trials[1:]:
        run = runs[t.number]
        assert run.data.metrics["replay.settings"] == GRID_SIZE
        assert run.data.metrics["replay.settings_scored"] == trial_attr(t, ATTR_REPLAY)["scored"]
        assert run.data.metrics["replay.max_live_gap"] <= 1e-9
        reports = {a.path for a in client.list_artifacts(run.info.run_id, "reports")}
        assert {"reports/fusion_sweep.csv", "reports/fusion_sweep.png"} <= reports
    assert "replay.settings_scored" not in runs[0].data.metrics  # the baseline replayed nothing


def test_the_config_is_restored_and_no_helper_is_left_after_a_replay_study(replay_run: dict[str, Any]) -> None:
    import subprocess

    assert (replay_run["root"] / "backend" / "config.yaml").read_bytes() == replay_run["original"]
    ps = subprocess.run(["ps", "-eo", "ppid,args"], capture_output=True, text=True, check=True).stdout
    mine = [line for line in ps.splitlines() if "tuner.study.replay.replay_pool" in line
            and line.split()[0] == str(__import__("os").getpid())]
    assert mine == []


def test_scoring_every_setting_exactly_finds_what_the_bounded_grid_found(
        replay_run: dict[str, Any], demo_data: Path, tmp_path: Path) -> None:
    """The same study with ``bound: false``: every trial scores the whole grid exactly, and
    verifies, reports and samples exactly what the bounded study did."""
    exp = load_experiment(make_project(tmp_path, demo_data, study="replay", n_trials=3, bound=False)).bind_port()
    run_experiment(exp)
    full = optuna.load_study(study_name="replay", storage=exp.storage).trials
    bounded = replay_run["study"].trials
    assert [t.state for t in full] == [optuna.trial.TrialState.COMPLETE] * 3
    for a, b in zip(full[1:], bounded[1:], strict=True):
        ra, rb = trial_attr(a, ATTR_REPLAY), trial_attr(b, ATTR_REPLAY)
        assert ra["chosen_by"] == f"grid of {GRID_SIZE}" and ra["scored"] == GRID_SIZE
        assert [v["assignment"] for v in ra["verified"]] == [v["assignment"] for v in rb["verified"]]
        assert [v["live"] for v in ra["verified"]] == [v["live"] for v in rb["verified"]]
        assert a.value == b.value and a.params == b.params


def test_a_replay_model_that_differs_from_the_backend_fails_the_trial_loudly(
        demo_data: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A model that agrees with the backend at the served setting (equal weights) but not
    elsewhere, as a backend with its own fusion would: the live verification catches it."""
    from tuner.evaluation.replay_batch import ReplayBatch

    real = ReplayBatch.table

    def skewed(self: ReplayBatch, setting: Any) -> Any:
        weights = dict(setting.weights)
        if len(set(weights.values())) > 1:  # any setting but the served one: bm25 weighs more than declared
            weights["bm25"] = weights.get("bm25", 1.0) * 1.5 + 0.1
        return real(self, type(setting)(**{**setting.__dict__, "weights": weights}))

    monkeypatch.setattr(ReplayBatch, "table", skewed)
    exp_path = make_project(tmp_path, demo_data, study="skewed", n_trials=3, verify_top=3)
    original = (tmp_path / "backend" / "config.yaml").read_bytes()
    exp = load_experiment(exp_path).bind_port()
    run_experiment(exp)
    trials = optuna.load_study(study_name="skewed", storage=exp.storage).trials
    failed = [t for t in trials if t.state == optuna.trial.TrialState.FAIL]
    assert failed, "a replay model that differs from the backend must fail its trials"
    reason = failed[0].user_attrs["fail_reason"]
    assert "fusion replay is not exact for this backend" in reason and "measured" in reason and "live" in reason
    assert all("replay" not in t.user_attrs or t.state != optuna.trial.TrialState.COMPLETE for t in trials[1:])
    assert (tmp_path / "backend" / "config.yaml").read_bytes() == original


def test_an_explanation_that_does_not_reproduce_the_answer_fails_before_any_replayed_number(
        demo_data: Path, tmp_path: Path) -> None:
    """The explained request asks for 5 hits while the replay cuts at top_k 50: the live
    answers are not what the explanation replays to. The preflight stops the run before
    the first trial; run anyway, each replay trial fails on it."""
    exp_path = make_project(tmp_path, demo_data, study="short", n_trials=2, request={"explain": True, "top_k": 5})
    exp = load_experiment(exp_path).bind_port()
    assert exp.replay is not None and exp.replay.request == {"explain": True, "top_k": 5}
    from tuner.study.preflight import PreflightError

    with pytest.raises(PreflightError, match="fusion replay does not reproduce the backend's own answers"):
        run_experiment(exp)  # the preflight finds it before the first trial
    ran = optuna.load_study(study_name="short", storage=exp.storage).trials
    assert all(t.state == optuna.trial.TrialState.WAITING for t in ran)  # the baseline queued, nothing run
    run_experiment(exp, skip_checks=True)  # and each trial checks it again
    trials = optuna.load_study(study_name="short", storage=exp.storage).trials
    assert trials[0].state == optuna.trial.TrialState.COMPLETE  # the baseline replays nothing
    reason = trials[1].user_attrs["fail_reason"]
    assert trials[1].state == optuna.trial.TrialState.FAIL
    assert "does not reproduce the backend's own answers at the setting it served" in reason
    assert "ranking differs at rank 6" in reason


def test_when_every_param_is_replayed_one_replay_trial_ends_the_study(demo_data: Path, tmp_path: Path) -> None:
    """The fusion-only space replayed whole: nothing is left to sample, so a second replay
    trial would score the same grid on the same retrieval; the run says so and stops."""
    from tuner.study.loop import StudyObserver

    class Notes(StudyObserver):
        def __init__(self) -> None:
            self.lines: list[str] = []

        def note(self, line: str) -> None:
            self.lines.append(line)

    exp = load_experiment(make_project(tmp_path, demo_data, study="whole", n_trials=6, space=FUSION_SPACE)).bind_port()
    notes = Notes()
    run_experiment(exp, observer=notes)
    trials = optuna.load_study(study_name="whole", storage=exp.storage).trials
    assert len(trials) == 2 and trial_attr(trials[0], ATTR_REPLAY) is None and trial_attr(trials[1], ATTR_REPLAY)
    assert any("one replay trial covers the whole space, so this run stops after 2 trial(s)" in n for n in notes.lines)
    run_experiment(exp, observer=notes)  # run again: nothing new to learn
    assert len(optuna.load_study(study_name="whole", storage=exp.storage).trials) == 2


def test_replay_trials_record_their_scored_settings_for_the_cross_validation(replay_run: dict[str, Any]) -> None:
    """Each replay trial keeps the per-query scores of the settings it scored exactly (at
    most CV_SETTINGS, best first): each averages to its replayed score, and every one is a
    candidate of the cross-validated estimate beside the trials."""
    from tuner.study.query_scores import ATTR_PER_QUERY, study_crossval
    from tuner.study.trial.attrs import trial_attr
    from tuner.study.trial.replay_measure import CV_SETTINGS

    exp, study = replay_run["exp"], replay_run["study"]
    n_settings = 0
    for t in study.trials[1:]:
        replay, record = trial_attr(t, ATTR_REPLAY), trial_attr(t, ATTR_PER_QUERY)
        settings = record["settings"]
        assert len(settings) == min(replay["scored"], CV_SETTINGS)
        best = replay["verified"][0]  # the best replayed setting, verified live
        assert sum(settings[0]["objective"]) / N_IN_SCOPE == pytest.approx(best["replayed"], abs=1e-5)
        assert all(len(s["objective"]) == N_IN_SCOPE for s in settings)
        assert all(s["params"] for s in settings)  # where the robust pick's neighbourhood is measured
        n_settings += len(settings)
    cv = study_crossval(study, exp.objective, exp.constraints, exp.cv)
    assert cv is not None and cv.n_candidates == len(study.trials) + n_settings
    assert set(cv.rules) == {"best", "robust"} and cv.selection_line() is not None


def test_replay_rows_and_pages_fit_the_window_in_optuna_dashboard(replay_run: dict[str, Any],
                                                                 chromium_browser: None) -> None:
    from browser_support import chromium, screenshot, wait_for  # tests/browser (the fixture put it on the path)
    from support.optuna_dashboard import optuna_dashboard

    study = replay_run["study"]
    replayed = next(t for t in study.trials if trial_attr(t, ATTR_REPLAY))
    with optuna_dashboard(replay_run["exp"].storage) as dashboard, chromium(1440, 900) as browser:  # the window
        base = f"{dashboard}studies/{study._study_id}"
        window = browser.execute_script("return window.innerWidth")
        browser.get(f"{base}/smartSelection")  # the page whose table has a row per trial, a column per user attribute
        rows = wait_for(lambda: (h := browser.execute_script(
            "return Array.from(document.querySelectorAll('tbody tr')).map(r => r.getBoundingClientRect().height)"))
            and len(h) >= len(study.trials) and h, timeout=60, what="the trial table's rows")
        assert max(rows) <= 150, rows  # a line or two each (593-714 px with the nested record)
        assert browser.execute_script("return document.documentElement.scrollWidth") <= window
        browser.execute_script("document.querySelector('tbody').scrollIntoView({block: 'center'})")
        screenshot(browser, "optuna-replay-trial-table")
        browser.get(f"{base}/trials?numbers={replayed.number}")
        wait_for(lambda: ATTR_REPLAY_SETTINGS in browser.find_element("tag name", "body").text,
                 timeout=60, what="the replay trial's user attributes")
        width = browser.execute_script("return document.documentElement.scrollWidth")
        assert width <= window, (width, window)  # 6,678 px with the nested record
        screenshot(browser, "optuna-replay-trial-page")
