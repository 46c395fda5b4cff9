"""optuna-dashboard as `tuner dashboard` serves it, on a two-objective study
(``secondary_objective``: quality maximised, Latency_P95_ms minimised), looked at in
headless Debian Chromium: the study page draws its Pareto-front plot, and the points it
marks "Best Trial" are the feasible front `tuner best --pareto` prints
(tuner.study.pareto): a trial dominated only by an infeasible one is on it, the
infeasible one is not. The trials are told as the trial runner records them
(`set_constraint` and the legacy list, two values)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import optuna
import pytest
from browser_support import chromium, screenshot, wait_for
from support.optuna_dashboard import optuna_dashboard

from tuner.optuna_adapter import set_legacy_constraints
from tuner.study.pareto import feasible_front

pytestmark = [pytest.mark.integration]

# (quality, Latency_P95_ms, OOS_FP_Rate violation, rerank.depth)
TRIALS = [
    (0.29, 12.0, -0.05, 0),  # 0: fastest: on the front
    (0.36, 20.0, -0.01, 50),  # 1: on the front
    (0.34, 25.0, -0.02, 75),  # 2: dominated by 1
    (0.41, 31.0, -0.01, 150),  # 3: on the front (quality-best)
    (0.45, 15.0, 0.08, 25),  # 4: infeasible: dominates 1, 2 and 3 but is not on the feasible front
    (0.40, 40.0, -0.03, 300),  # 5: dominated by 3
]
FRONT = [3, 1, 0]  # the expected feasible front, best quality first


@pytest.fixture(scope="module")
def study(tmp_path_factory: pytest.TempPathFactory, chromium_browser: None) -> tuple[str, optuna.Study]:
    url = f"sqlite:///{tmp_path_factory.mktemp('pareto') / 'study.db'}"
    study = optuna.create_study(storage=url, study_name="quality-vs-latency", directions=["maximize", "minimize"])
    with pytest.warns(optuna.exceptions.ExperimentalWarning):  # as open_study sets them
        study.set_metric_names(["Primary_Metric_Score", "Latency_P95_ms"])
    for quality, latency, violation, depth in TRIALS:
        study.enqueue_trial({"rerank.depth": depth})
        trial = study.ask()
        trial.suggest_int("rerank.depth", 0, 300, step=25)
        trial.set_constraint("OOS_FP_Rate <= 0.1", violation)
        set_legacy_constraints(trial, [violation])
        study.tell(trial, [quality, latency])
    return url, study


@pytest.fixture(scope="module")
def browser_at(study: tuple[str, optuna.Study]) -> Iterator[tuple[Any, str]]:
    url, s = study
    with optuna_dashboard(url) as base, chromium() as driver:
        yield driver, f"{base}studies/{s._study_id}"


# plotly keeps each trace's data on the plot's div; optuna-dashboard draws four traces
# (unselected, infeasible, feasible, "Best Trial": the feasible front) with each point's
# text the trial as JSON
_TRACES = """
const plot = document.getElementById('graph-pareto-front');
if (!plot || !plot.data) return null;
return plot.data.map(t => ({template: t.hovertemplate || '', text: Array.from(t.text || []),
                             x: Array.from(t.x || []), y: Array.from(t.y || [])}));
"""


def _numbers(trace: dict[str, Any]) -> list[int]:
    return sorted(int(json.loads(text.replace("<br>", ""))["number"]) for text in trace["text"])


def test_the_pareto_front_plot_marks_the_feasible_front(browser_at: tuple[Any, str], study: tuple[str, Any]) -> None:
    driver, base = browser_at
    assert [t.number for t in feasible_front(study[1].get_trials(), maximize=(True, False))] == FRONT
    driver.get(base)
    traces = wait_for(
        lambda: (ts := driver.execute_script(_TRACES)) and sum(len(t["text"]) for t in ts) == len(TRIALS) and ts,
        timeout=60,
        what="the Pareto-front plot with every trial",
    )
    by_kind = {
        kind: t
        for t in traces
        for kind in ("Best Trial", "Infeasible Trial", "Feasible Trial")
        if kind in t["template"]
    }
    assert _numbers(by_kind["Best Trial"]) == sorted(FRONT)
    assert _numbers(by_kind["Infeasible Trial"]) == [4]
    assert _numbers(by_kind["Feasible Trial"]) == [2, 5]
    # x is the first objective, y the second: the front's points at their values
    best = by_kind["Best Trial"]
    assert sorted(zip(best["x"], best["y"], strict=True)) == sorted((TRIALS[n][0], TRIALS[n][1]) for n in FRONT)
    text = driver.find_element("tag name", "body").text
    assert "Pareto Front" in text and "Objective X:" in text
    driver.execute_script("document.getElementById('graph-pareto-front').scrollIntoView({block: 'center'});")
    screenshot(driver, "optuna-pareto-front")
