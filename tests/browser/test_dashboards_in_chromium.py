"""`tuner dashboard` after a real `tuner run`, looked at in headless Debian Chromium.

optuna-dashboard must list the study with its trials and tell the infeasible ones
apart; the MLflow UI must show the study's parent run with its child runs and a
trial's config snapshot. Assertions read the DOM (and the plots' data behind it),
never pixels; screenshots go to test-artifacts/browser/ for a person to look at.
The expected values come from the study's own storage, not from this file.

A second study in the same storage, told as the trial runner records its trials, has no
feasible trial at all: its Best Trial card names none (it reads "Best Trials" with nothing
under it), no trial carries the badge, and its page still lists every trial.
"""

from __future__ import annotations

import math
import re
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
    free_port,
    make_study_project,
    run_study,
    screenshot,
    wait_for,
)
from mlflow import MlflowClient
from support.constrained_study import constrained_study

from tuner.numbers import num, rounded
from tuner.report.tracking import CLASSIC_VIEW

pytestmark = [pytest.mark.integration, pytest.mark.slow]


@pytest.fixture(scope="module")
def ports() -> tuple[int, int]:
    """optuna-dashboard's and the MLflow UI's ports: the study's links point at them."""
    return free_port(), free_port()


@pytest.fixture(scope="module")
def project(tmp_path_factory: pytest.TempPathFactory, ports: tuple[int, int], chromium_browser: None) -> Path:
    optuna_port, mlflow_port = ports
    p = make_study_project(tmp_path_factory.mktemp("browser"), tracking={
        "optuna_dashboard_url": f"http://127.0.0.1:{optuna_port}/dashboard/",
        "mlflow_ui_url": f"http://127.0.0.1:{mlflow_port}/"})
    run_study(p)
    return p.root


@pytest.fixture(scope="module")
def study(project: Path) -> optuna.Study:
    return optuna.load_study(study_name=STUDY, storage=f"sqlite:///{project / '.tuner' / 'optuna.db'}")


@pytest.fixture(scope="module")
def dashboard(project: Path, ports: tuple[int, int]) -> Iterator[DashboardProcess]:
    with DashboardProcess(project / "experiment.yaml", optuna_port=ports[0], mlflow_port=ports[1]) as d:
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


def test_param_importance_plot_lists_config_keys_only(
    dashboard: DashboardProcess, browser: Any, study: optuna.Study
) -> None:
    # the storage keeps the sampler's coordinate; the dashboard `tuner dashboard` serves does not list it
    assert any("fusion.weights:bm25" in t.params for t in study.trials)
    browser.get(f"{dashboard.urls['optuna-dashboard']}studies/{study._study_id}")

    def importance_bars() -> list[str]:  # the bar chart's y values: the param names it ranks
        raw = browser.execute_script(
            "const p = document.getElementById('graph-hyperparameter-importances');"
            "return p && p.data ? p.data.flatMap(t => Array.from(t.y || [])) : [];"
        )
        return [str(v) for v in raw]

    names = wait_for(lambda: (n := importance_bars()) and "fusion.weights.bm25" in n and n, timeout=60,
                     what="the hyperparameter importance plot")
    assert {"fusion.weights.bm25", "fusion.weights.dense", "confidence.threshold"} <= set(names), names
    assert [n for n in names if ":" in n] == [], names
    browser.execute_script("document.getElementById('graph-hyperparameter-importances').scrollIntoView()")
    screenshot(browser, "optuna-param-importances")


def _mlflow_runs(project: Path) -> tuple[str, str, dict[str, str]]:
    client = MlflowClient(f"sqlite:///{project / 'mlruns' / 'mlflow.db'}")
    exp = client.get_experiment_by_name(STUDY)
    runs = client.search_runs([exp.experiment_id])
    [parent] = [r for r in runs if "mlflow.parentRunId" not in r.data.tags]
    children = {int(r.data.tags["tuner.trial_number"]): r.info.run_id for r in runs
                if r.data.tags.get("mlflow.parentRunId") == parent.info.run_id}
    return exp.experiment_id, parent.info.run_id, children


def _run_names(project: Path) -> dict[str, str]:
    """run id -> run name."""
    client = MlflowClient(f"sqlite:///{project / 'mlruns' / 'mlflow.db'}")
    exp = client.get_experiment_by_name(STUDY)
    return {r.info.run_id: r.info.run_name for r in client.search_runs([exp.experiment_id])}


def test_mlflow_ui_shows_the_parent_run_with_its_child_runs(
    dashboard: DashboardProcess, browser: Any, project: Path, study: optuna.Study
) -> None:
    from selenium.webdriver.common.by import By

    exp_id, parent_id, children = _mlflow_runs(project)
    assert sorted(children) == sorted(t.number for t in study.trials)
    # the tag that makes MLflow open the experiment on its runs (training) view, not the GenAI overview
    client = MlflowClient(f"sqlite:///{project / 'mlruns' / 'mlflow.db'}")
    assert client.get_experiment(exp_id).tags.get("mlflow.experimentKind") == "custom_model_development"
    browser.get(f"{dashboard.urls['mlflow']}#/experiments/{exp_id}/runs")
    row = wait_for(lambda: browser.find_elements(By.CSS_SELECTOR, f'.ag-row[row-id="{parent_id}"]'),
                   what="the parent run's row")[0]
    assert STUDY in row.text
    # Children are folded under their parent until its expander is clicked.
    if not browser.find_elements(By.CSS_SELECTOR, f'.ag-row[row-id="{children[0]}"]'):
        row.find_element(By.CSS_SELECTOR, '[col-id="attributes.`Run Name`"] button').click()  # folded: unfold
    shown = wait_for(
        lambda: (ids := {r.get_attribute("row-id") for r in browser.find_elements(By.CSS_SELECTOR, ".ag-row")})
        >= set(children.values()) and ids,
        what="the child runs under the parent",
    )
    assert shown == {parent_id, *children.values()}
    text = body_text(browser)
    names = _run_names(project)
    for t in study.trials:  # run names lead with the verdict, then the trial number and its score
        name = names[children[t.number]]
        mark = "✓" if t.user_attrs.get("feasible") else "✗"
        assert name.startswith(f"{mark} trial-{t.number} ") and f"{t.values[0]:.4f}" in name and name in text
    screenshot(browser, "mlflow-runs")


def test_mlflow_ui_shows_a_trial_config_snapshot(
    dashboard: DashboardProcess, browser: Any, project: Path, study: optuna.Study
) -> None:
    exp_id, _, children = _mlflow_runs(project)
    trial = study.trials[1]
    browser.get(f"{dashboard.urls['mlflow']}#/experiments/{exp_id}/runs/{children[1]}/artifacts/config/config.yaml")
    # The snapshot is the file the backend ran on: comments kept, this trial's values in it.
    k = trial.params["fusion.rrf_k"]
    text = wait_for(lambda: (t := body_text(browser)) and f"rrf_k: {k}" in t and t, what="the config snapshot text")
    assert "config.yaml" in text
    assert "# Reference hybrid search service: configuration." in text
    screenshot(browser, "mlflow-config-snapshot")


def _best(study: optuna.Study) -> optuna.trial.FrozenTrial:
    from tuner.study.feasibility import best_feasible_trial

    best = best_feasible_trial(study.get_trials(deepcopy=False), maximize=True)
    assert best is not None
    return best


def test_best_trial_page_shows_the_solved_gate_and_every_weight(
    dashboard: DashboardProcess, browser: Any, study: optuna.Study
) -> None:
    best = _best(study)
    # what `tuner apply` writes, under the config keys: the solved gate and both weights
    for key in ("confidence.threshold", "fusion.weights.bm25", "fusion.weights.dense"):
        assert key in best.params, (key, best.params)
    browser.get(f"{dashboard.urls['optuna-dashboard']}studies/{study._study_id}/trials?numbers={best.number}")
    text = wait_for(lambda: (t := body_text(browser)) and "fusion.weights.dense" in t and t,
                    what="the best trial's params")
    for key in ("confidence.threshold", "fusion.weights.bm25", "fusion.weights.dense"):
        assert key in text
    assert f"{best.params['confidence.threshold']}" in text
    screenshot(browser, "optuna-best-trial-params")


def _top_scorer(study: optuna.Study) -> optuna.trial.FrozenTrial:
    done = [t for t in study.trials if t.state == optuna.trial.TrialState.COMPLETE]
    return max(done, key=lambda t: (t.values[0], -t.number))  # what optuna-dashboard on its own calls best


def test_study_note_names_the_best_feasible_trial(dashboard: DashboardProcess, browser: Any,
                                                  study: optuna.Study) -> None:
    from tuner.study.feasibility import is_feasible

    best, top = _best(study), _top_scorer(study)
    browser.get(f"{dashboard.urls['optuna-dashboard']}studies/{study._study_id}/note")
    text = wait_for(lambda: (t := body_text(browser)) and "Best feasible" in t and t, what="the study note")
    assert f"Best feasible: trial #{best.number}, Primary_Metric_Score {num(best.values[0])}" in text
    if not is_feasible(top):
        assert f"The highest Primary_Metric_Score, #{top.number}" in text and "infeasible" in text
    screenshot(browser, "optuna-study-note")


def test_the_landing_page_names_the_best_feasible_trial(dashboard: DashboardProcess, browser: Any,
                                                        study: optuna.Study) -> None:
    """The Best Trial card on the study's landing page, and its badge in the trial list,
    name the best feasible trial even when the top scorer broke its constraint."""
    from tuner.study.feasibility import is_feasible

    best, top = _best(study), _top_scorer(study)
    assert not is_feasible(top) and top.number != best.number, "the study must have an infeasible top scorer"
    base = f"{dashboard.urls['optuna-dashboard']}studies/{study._study_id}"
    browser.get(base)
    # "Best Trials" (no number) is the card before the study's answer arrives
    text = wait_for(lambda: (t := body_text(browser)) and "Best Trial (number=" in t and t, timeout=60,
                    what="the Best Trial card")
    assert f"Best Trial (number={best.number})" in text and f"(number={top.number})" not in text
    card = browser.execute_script(
        "const h = Array.from(document.querySelectorAll('h6')).find(e => e.innerText.startsWith('Best Trial'));"
        "h.scrollIntoView({block: 'center'}); return h.parentElement.innerText;")
    shown = str(rounded(best.values[0])).removesuffix(".0")  # as JavaScript prints the number
    assert card.splitlines()[1] == shown, card  # the card's large value: the best feasible trial's, 4 digits
    long = [n for n in re.findall(r"\d+\.\d+", card) if len(n.replace(".", "").lstrip("0")) > 4]
    assert long == [], card  # 4 significant digits on the card, never 0.30000000000000004
    screenshot(browser, "optuna-landing-best-feasible")
    # the trial list: the "Best Trial" chip sits on the best feasible trial's entry only
    browser.get(f"{base}/trials")
    wait_for(lambda: f"{len(study.trials)} Trials" in body_text(browser), what="the trial list")
    badged = browser.execute_script(
        "return Array.from(document.querySelectorAll('li')).filter(li => /^Trial \\d+/.test(li.innerText)"
        " && li.innerText.includes('Best Trial')).map(li => li.innerText.split('\\n')[0])")
    assert badged == [f"Trial {best.number}"], badged
    screenshot(browser, "optuna-trial-list-best-badge")


def test_trial_pages_fit_a_screen(dashboard: DashboardProcess, browser: Any, study: optuna.Study) -> None:
    """Scalar user attributes only: the study page's tables keep rows a line or two high and
    a trial's page no wider than the window (it was 10,095 px with JSON-blob attributes)."""
    base = f"{dashboard.urls['optuna-dashboard']}studies/{study._study_id}"
    browser.get(base)
    rows = wait_for(lambda: browser.execute_script(
        "return Array.from(document.querySelectorAll('tbody tr')).map(r => r.getBoundingClientRect().height)"),
        timeout=60, what="the study page's tables")
    assert max(rows) <= 150, rows
    screenshot(browser, "optuna-study-page")
    window = browser.execute_script("return window.innerWidth")
    for t in study.trials:
        assert "feasible" in t.user_attrs and "OOS_FP_Rate" in t.user_attrs  # scalar columns
        assert not [k for k, v in t.user_attrs.items() if isinstance(v, (dict, list))], t.user_attrs
    browser.get(f"{base}/trials?numbers={study.trials[-1].number}")
    wait_for(lambda: "OOS_FP_Rate" in body_text(browser), what="the trial page's user attributes")
    width = browser.execute_script("return document.documentElement.scrollWidth")
    assert width <= window * 1.1, (width, window)
    screenshot(browser, "optuna-trial-page")


def _links_in(browser: Any) -> list[str]:
    from selenium.webdriver.common.by import By

    return [a.get_attribute("href") or "" for a in browser.find_elements(By.TAG_NAME, "a")]


def test_links_go_both_ways(dashboard: DashboardProcess, browser: Any, project: Path, study: optuna.Study) -> None:
    exp_id, _, children = _mlflow_runs(project)
    best = _best(study)
    run_url = f"{dashboard.urls['mlflow']}#/experiments/{exp_id}/runs/{children[best.number]}{CLASSIC_VIEW}"
    trial_url = f"{dashboard.urls['optuna-dashboard']}studies/{study._study_id}/trials?numbers={best.number}"
    browser.get(trial_url)
    wait_for(lambda: run_url in _links_in(browser), what="the trial note's link to its MLflow run")
    screenshot(browser, "optuna-trial-note-link")
    browser.get(run_url)
    wait_for(lambda: trial_url in _links_in(browser), what="the MLflow run's link to its Optuna trial page")
    screenshot(browser, "mlflow-run-link")


def test_mlflow_compare_view_plots_numeric_weights(dashboard: DashboardProcess, browser: Any, project: Path,
                                                   study: optuna.Study) -> None:
    import json as _json

    exp_id, _, children = _mlflow_runs(project)
    done = [t for t in study.trials if "fusion.weights.bm25" in t.params]
    runs = [children[t.number] for t in done]
    url = (f"{dashboard.urls['mlflow']}#/compare-runs?runs={_json.dumps(runs)}"
           f"&experiments={_json.dumps([exp_id])}")
    browser.get(url)

    def dimensions() -> dict[str, list[Any]]:
        raw = browser.execute_script(
            "return Array.from(document.querySelectorAll('.js-plotly-plot')).flatMap(p => (p.data || [])"
            ".flatMap(t => (t.dimensions || []).map(d => [d.label, Array.from(d.values || [])])))")
        return {label: values for label, values in raw}

    dims = wait_for(lambda: (d := dimensions()) and "fusion.weights.bm25" in d and d,
                    timeout=60, what="the parallel coordinates axis of fusion.weights.bm25")
    values = sorted(float(v) for v in dims["fusion.weights.bm25"])  # numbers, not text categories
    assert values == pytest.approx(sorted(t.params["fusion.weights.bm25"] for t in done), abs=1e-9)
    screenshot(browser, "mlflow-compare-weights")


def _cells(browser: Any, run_id: str, column: str) -> list[str]:
    """The texts of a runs-table row's cells in ``column`` (ag-grid splits a row over containers)."""
    from selenium.webdriver.common.by import By

    return [c.text for c in browser.find_elements(By.CSS_SELECTOR, f'.ag-row[row-id="{run_id}"] [col-id="{column}"]')
            if c.text]


def test_mlflow_run_durations_are_the_trials_durations(dashboard: DashboardProcess, browser: Any, project: Path,
                                                       study: optuna.Study) -> None:
    """A trial's run starts when the trial began and lasts the trial's duration (issue 31: a
    3.7 s trial showed 16.7 s): the Duration column shows the trial's ``duration_s``."""
    from selenium.webdriver.common.by import By

    exp_id, parent_id, children = _mlflow_runs(project)
    client = MlflowClient(f"sqlite:///{project / 'mlruns' / 'mlflow.db'}")
    infos = {n: client.get_run(run_id).info for n, run_id in children.items()}
    for t in study.trials:
        info = infos[t.number]
        assert (info.end_time - info.start_time) / 1000 == pytest.approx(t.user_attrs["duration_s"], abs=0.0011)
        assert t.datetime_start.timestamp() * 1000 - 1 <= info.start_time <= t.datetime_complete.timestamp() * 1000
    browser.get(f"{dashboard.urls['mlflow']}#/experiments/{exp_id}/runs{CLASSIC_VIEW}")
    row = wait_for(lambda: browser.find_elements(By.CSS_SELECTOR, f'.ag-row[row-id="{parent_id}"]'),
                   what="the parent run's row")[0]
    if not browser.find_elements(By.CSS_SELECTOR, f'.ag-row[row-id="{children[0]}"]'):
        row.find_element(By.CSS_SELECTOR, '[col-id="attributes.`Run Name`"] button').click()  # folded: unfold
    shown = wait_for(lambda: (d := {n: _cells(browser, r, "duration") for n, r in children.items()})
                     and all(d.values()) and d, what="the child runs' Duration cells")
    for t in study.trials:  # MLflow shows seconds with one decimal
        ms = infos[t.number].end_time - infos[t.number].start_time
        # its rounding of a half (1250 ms) need not be Python's: 1.2s and 1.3s both say 1250 ms
        # (CI: '1.3s' shown, '1.2s' expected), and nothing else does
        assert len(shown[t.number]) == 1, shown
        assert shown[t.number][0] in {f"{ms / 1000:.1f}s", f"{math.floor(ms / 100 + 0.5) / 10:.1f}s"}, ms
    screenshot(browser, "mlflow-run-durations")


def test_a_trial_run_page_opens_in_the_classic_view_with_its_verdict(
    dashboard: DashboardProcess, browser: Any, project: Path, study: optuna.Study
) -> None:
    """The links the notes carry open a run page under the experiment's Runs, not MLflow
    3.17's GenAI layout ("Evaluations"), which a link without ?workflowType opens in a
    fresh browser; the infeasible trial's run name says so first."""
    from selenium.webdriver.common.by import By

    exp_id, _, children = _mlflow_runs(project)
    infeasible = next(t for t in study.trials if t.user_attrs.get("feasible") is False)
    name = _run_names(project)[children[infeasible.number]]
    assert name.startswith(f"✗ trial-{infeasible.number} ")
    page = f"{dashboard.urls['mlflow']}#/experiments/{exp_id}/runs/{children[infeasible.number]}"

    def breadcrumb() -> str:
        found = browser.find_elements(By.CSS_SELECTOR, '[data-testid="experiment-observatory-link-runs"]')
        return found[0].text if found and name in body_text(browser) else ""

    browser.get(page)  # what MLflow does with a bare link: the GenAI layout
    assert wait_for(breadcrumb, what="the run page's breadcrumb") == "Evaluations"
    browser.get(page + CLASSIC_VIEW)  # the tuner's links
    assert wait_for(lambda: (b := breadcrumb()) != "Evaluations" and b, what="the classic breadcrumb") == "Runs"
    screenshot(browser, "mlflow-run-page-infeasible")


def test_the_mlflow_study_run_holds_the_study_report_and_plots(
    dashboard: DashboardProcess, browser: Any, project: Path, study: optuna.Study
) -> None:
    exp_id, parent_id, _ = _mlflow_runs(project)
    client = MlflowClient(f"sqlite:///{project / 'mlruns' / 'mlflow.db'}")
    listed = {a.path for a in client.list_artifacts(parent_id, "study")}
    assert listed == {"study/report.md", "study/trials.csv", "study/optimization_history.png",
                      "study/param_importances.png", "study/score_vs_oos_fp_rate.png"}
    browser.get(f"{dashboard.urls['mlflow']}#/experiments/{exp_id}/runs/{parent_id}/artifacts/study/report.md"
                f"{CLASSIC_VIEW}")
    wait_for(lambda: (t := body_text(browser)) and "report.md" in t and "Feasible trials (best first)" in t,
             what="the study report in the parent run's artifacts")
    screenshot(browser, "mlflow-study-run-artifacts")


NO_FEASIBLE = [(0.47, 0.20), (0.30, 0.05), (0.41, 0.10)]  # (value, OOS_FP_Rate violation): all broken


def test_the_card_names_no_trial_when_none_is_feasible(dashboard: DashboardProcess, browser: Any,
                                                       project: Path) -> None:
    none = constrained_study(f"sqlite:///{project / '.tuner' / 'optuna.db'}", "none-feasible", NO_FEASIBLE)
    base = f"{dashboard.urls['optuna-dashboard']}studies/{none._study_id}"
    browser.get(base)
    # the study's answer has arrived when its name is in the title ("Study #2" before)
    text = wait_for(lambda: (t := body_text(browser)) and "none-feasible" in t and "Best Trials" in t and t,
                    timeout=60, what="the study page with its Best Trials card")
    assert "Best Trial (number=" not in text
    browser.execute_script(
        "Array.from(document.querySelectorAll('h6')).find(e => e.innerText === 'Best Trials')"
        ".scrollIntoView({block: 'center'});")
    screenshot(browser, "optuna-no-feasible-card")
    browser.get(f"{base}/trials")
    text = wait_for(lambda: (t := body_text(browser)) and f"{len(NO_FEASIBLE)} Trials" in t and t,
                    what="the trial list")
    assert "Best Trial" not in text.replace("Best Trial (0)", "")  # the list's filter reads "Best Trial (0)"
    screenshot(browser, "optuna-no-feasible-trials")


def test_each_report_file_is_stored_once(project: Path, study: optuna.Study) -> None:
    """The Optuna artifact and the MLflow artifact of a trial's report are hard links to
    the trial's own file: one copy on disk."""
    import os

    trials_dir = project / ".tuner" / "trials" / STUDY
    checked = 0
    for t in study.trials:
        for path in (trials_dir / str(t.number)).glob("report*"):
            assert os.stat(path).st_nlink == 3, path  # trial folder + Optuna artifact + MLflow artifact
            checked += 1
    assert checked > 0


def test_ctrl_c_stops_both_uis_without_orphans(dashboard: DashboardProcess, study: optuna.Study) -> None:
    below = dashboard.descendants()
    assert len(below) >= 2  # optuna-dashboard, mlflow server (+ its uvicorn)
    code = dashboard.signal_and_wait(signal.SIGINT)
    assert code == 0, "".join(dashboard.output)
    assert "stopped." in "".join(dashboard.output)
    # `tuner dashboard` said which trial the Best Trial card names
    best = _best(study)
    assert f"study {STUDY}: best feasible trial #{best.number}, Primary_Metric_Score {num(best.values[0])} " \
           "(the Best Trial card)" in "".join(dashboard.output)
    assert all_gone(below) == []
