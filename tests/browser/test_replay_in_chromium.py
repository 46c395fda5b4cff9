"""A fusion-replay study in optuna-dashboard, looked at in headless Debian Chromium.

A replay trial records how it chose its fusion setting (the settings scored, those
verified live) as a `tuner.replay` system attribute; its user attributes stay scalars.
As a nested user attribute that record made the study page's trial rows 593-714 px tall
and a trial's page 6,678 px wide in a 1,440 px window. Assertions read the DOM's boxes;
screenshots go to test-artifacts/browser/.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import optuna
import pytest
from browser_support import chromium, optuna_dashboard, screenshot, wait_for
from e2e.test_replay_e2e import make_project
from support.demo_data import copy_demo_subset

from tuner.config.experiment import load_experiment
from tuner.ops.run import run_experiment
from tuner.study.trial.attrs import ATTR_REPLAY, ATTR_REPLAY_SETTINGS, trial_attr

pytestmark = [pytest.mark.integration, pytest.mark.slow]

WINDOW = (1440, 900)  # the window the issue measured in


@pytest.fixture(scope="module")
def replay_study(tmp_path_factory: pytest.TempPathFactory, chromium_browser: None) -> tuple[str, optuna.Study]:
    data = copy_demo_subset(tmp_path_factory.mktemp("replay-demo") / "data", 40)
    exp = load_experiment(make_project(tmp_path_factory.mktemp("replay-browser"), data, study="replay",
                                       n_trials=2)).bind_port()
    run_experiment(exp)
    return exp.storage, optuna.load_study(study_name="replay", storage=exp.storage)


@pytest.fixture(scope="module")
def dashboard_url(replay_study: tuple[str, optuna.Study]) -> Iterator[str]:
    with optuna_dashboard(replay_study[0]) as base:
        yield base


@pytest.fixture(scope="module")
def browser(dashboard_url: str) -> Iterator[Any]:
    with chromium(*WINDOW) as driver:
        yield driver


def test_a_replay_trial_keeps_its_record_out_of_the_user_attributes(replay_study: tuple[str, optuna.Study]) -> None:
    _, study = replay_study
    replayed = [t for t in study.trials if trial_attr(t, ATTR_REPLAY)]
    assert replayed, "the study should hold a replay trial"
    for t in study.trials:
        assert not [k for k, v in t.user_attrs.items() if isinstance(v, (dict, list))], t.user_attrs
    for t in replayed:
        assert t.user_attrs[ATTR_REPLAY_SETTINGS] == trial_attr(t, ATTR_REPLAY)["settings"]


def test_replay_rows_and_pages_fit_the_window(dashboard_url: str, browser: Any,
                                              replay_study: tuple[str, optuna.Study]) -> None:
    _, study = replay_study
    replayed = next(t for t in study.trials if trial_attr(t, ATTR_REPLAY))
    base = f"{dashboard_url}studies/{study._study_id}"
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
