"""`tuner dashboard` after a real `tuner run`, looked at in headless Debian Chromium.

optuna-dashboard must list the study with its trials and tell the infeasible ones
apart; the MLflow UI must show the study's parent run with its child runs and a
trial's config snapshot. Assertions read the DOM (and the plots' data behind it),
never pixels; screenshots go to test-artifacts/browser/ for a person to look at.
The expected values come from the study's own storage, not from this file.
"""

from __future__ import annotations

import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import optuna
import pytest
from browser_support import (
    STUDY,
    DashboardProcess,
    all_gone,
    chromium,
    chromium_available,
    make_study_project,
    run_study,
    screenshot,
    wait_for,
)
from mlflow import MlflowClient
from support.integration import need

pytestmark = [pytest.mark.integration, pytest.mark.slow]


@pytest.fixture(scope="module")
def project(tmp_path_factory: pytest.TempPathFactory) -> Path:
    reason = chromium_available()
    need(reason is None, reason or "")
    p = make_study_project(tmp_path_factory.mktemp("browser"))
    run_study(p)
    return p.root


@pytest.fixture(scope="module")
def study(project: Path) -> optuna.Study:
    return optuna.load_study(study_name=STUDY, storage=f"sqlite:///{project / '.tuner' / 'optuna.db'}")


@pytest.fixture(scope="module")
def dashboard(project: Path) -> Iterator[DashboardProcess]:
    with DashboardProcess(project / "experiment.yaml") as d:
        yield d


@pytest.fixture(scope="module")
def browser(dashboard: DashboardProcess) -> Iterator[Any]:
    with chromium() as driver:
        yield driver


def body_text(driver: Any) -> str:
    from selenium.webdriver.common.by import By

    return str(driver.find_element(By.TAG_NAME, "body").text)


def plot_traces(driver: Any) -> dict[str, dict[str, list[Any]]]:
    """plot id -> trace name -> its y values, read from the plotly divs in the page."""
    raw = driver.execute_script(
        "return Array.from(document.querySelectorAll('.js-plotly-plot'))"
        ".map(p => [p.id, (p.data || []).map(t => [t.name, Array.from(t.y || [])])])"
    )
    return {pid: {name: ys for name, ys in traces} for pid, traces in raw}


def test_optuna_dashboard_lists_the_study_and_its_trials(
    dashboard: DashboardProcess, browser: Any, study: optuna.Study
) -> None:
    base = dashboard.urls["optuna-dashboard"]
    browser.get(base)
    wait_for(lambda: STUDY in body_text(browser), what="the study on the dashboard's home page")
    screenshot(browser, "optuna-studies")
    study_id = study._study_id
    browser.get(f"{base}studies/{study_id}/trials")
    n = len(study.trials)
    text = wait_for(lambda: (t := body_text(browser)) and f"{n} Trials" in t and t, what="the trial list")
    for t in study.trials:
        assert f"Trial {t.number}" in text
    screenshot(browser, "optuna-trials")


def test_optuna_dashboard_shows_which_trials_are_infeasible(
    dashboard: DashboardProcess, browser: Any, study: optuna.Study
) -> None:
    # The legacy `constraints` system attr is what optuna-dashboard 0.21 reads.
    infeasible = sorted(t.number for t in study.trials if any(c > 0 for c in t.system_attrs["constraints"]))
    feasible = sorted(t.number for t in study.trials if t.number not in infeasible)
    assert infeasible and feasible, "the study should have both kinds (answer-all / hand-off-all variants)"
    browser.get(f"{dashboard.urls['optuna-dashboard']}studies/{study._study_id}")
    timeline = wait_for(lambda: plot_traces(browser).get("graph-timeline", {}).get("Infeasible"),
                        what="the timeline's Infeasible trace")
    assert sorted(timeline) == infeasible
    assert sorted(plot_traces(browser)["graph-timeline"]["Complete"]) == feasible
    assert "Infeasible" in body_text(browser)  # the legend a person reads
    browser.execute_script("document.getElementById('graph-timeline').scrollIntoView()")
    screenshot(browser, "optuna-study-infeasible")


def _mlflow_runs(project: Path) -> tuple[str, str, dict[str, str]]:
    client = MlflowClient(f"sqlite:///{project / 'mlruns' / 'mlflow.db'}")
    exp = client.get_experiment_by_name(STUDY)
    runs = client.search_runs([exp.experiment_id])
    [parent] = [r for r in runs if "mlflow.parentRunId" not in r.data.tags]
    children = {r.info.run_name: r.info.run_id for r in runs if r.data.tags.get("mlflow.parentRunId") == parent.info.run_id}
    return exp.experiment_id, parent.info.run_id, children


def test_mlflow_ui_shows_the_parent_run_with_its_child_runs(
    dashboard: DashboardProcess, browser: Any, project: Path, study: optuna.Study
) -> None:
    from selenium.webdriver.common.by import By

    exp_id, parent_id, children = _mlflow_runs(project)
    assert sorted(children) == sorted(f"trial-{t.number}" for t in study.trials)
    browser.get(f"{dashboard.urls['mlflow']}#/experiments/{exp_id}/runs")
    row = wait_for(lambda: browser.find_elements(By.CSS_SELECTOR, f'.ag-row[row-id="{parent_id}"]'),
                   what="the parent run's row")[0]
    assert STUDY in row.text
    # Children are folded under their parent until its expander is clicked.
    row.find_element(By.CSS_SELECTOR, '[col-id="attributes.`Run Name`"] button').click()
    shown = wait_for(
        lambda: (ids := {r.get_attribute("row-id") for r in browser.find_elements(By.CSS_SELECTOR, ".ag-row")})
        >= set(children.values()) and ids,
        what="the child runs under the parent",
    )
    assert shown == {parent_id, *children.values()}
    text = body_text(browser)
    for name in children:
        assert name in text
    screenshot(browser, "mlflow-runs")


def test_mlflow_ui_shows_a_trial_config_snapshot(
    dashboard: DashboardProcess, browser: Any, project: Path, study: optuna.Study
) -> None:
    exp_id, _, children = _mlflow_runs(project)
    trial = study.trials[1]
    browser.get(f"{dashboard.urls['mlflow']}#/experiments/{exp_id}/runs/{children['trial-1']}/artifacts/config/config.yaml")
    # The snapshot is the file the backend ran on: comments kept, this trial's values in it.
    k = trial.params["fusion.rrf_k"]
    text = wait_for(lambda: (t := body_text(browser)) and f"rrf_k: {k}" in t and t, what="the config snapshot text")
    assert "config.yaml" in text
    assert "# Reference hybrid search service: configuration." in text
    screenshot(browser, "mlflow-config-snapshot")


def test_ctrl_c_stops_both_uis_without_orphans(dashboard: DashboardProcess) -> None:
    below = dashboard.descendants()
    assert len(below) >= 2  # optuna-dashboard, mlflow server (+ its uvicorn)
    code = dashboard.signal_and_wait(signal.SIGINT)
    assert code == 0, "".join(dashboard.output)
    assert "stopped." in "".join(dashboard.output)
    assert all_gone(below) == []
