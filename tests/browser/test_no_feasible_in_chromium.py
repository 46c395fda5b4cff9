"""optuna-dashboard as `tuner dashboard` serves it, on a study where every completed
trial breaks its constraint, looked at in headless Debian Chromium: the Best Trial card
names no trial (it reads "Best Trials" with nothing under it), no trial carries the
"Best Trial" badge, and the study page still shows every trial. The trials are told
as the trial runner records them (`set_constraint` and the legacy list)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import optuna
import pytest
from browser_support import chromium, optuna_dashboard, screenshot, wait_for

from tuner.optuna_adapter import set_legacy_constraints

pytestmark = [pytest.mark.integration]

SCORES = [(0.47, 0.20), (0.30, 0.05), (0.41, 0.10)]  # (value, OOS_FP_Rate violation): all broken


@pytest.fixture(scope="module")
def study(tmp_path_factory: pytest.TempPathFactory, chromium_browser: None) -> tuple[str, optuna.Study]:
    url = f"sqlite:///{tmp_path_factory.mktemp('no-feasible') / 'study.db'}"
    study = optuna.create_study(storage=url, study_name="none-feasible", direction="maximize")
    for value, violation in SCORES:
        trial = study.ask()
        trial.suggest_int("fusion.rrf_k", 1, 200)
        trial.set_constraint("OOS_FP_Rate <= 0.1", violation)
        set_legacy_constraints(trial, [violation])
        study.tell(trial, value)
    return url, study


@pytest.fixture(scope="module")
def browser_at(study: tuple[str, optuna.Study]) -> Iterator[tuple[Any, str]]:
    url, s = study
    with optuna_dashboard(url) as base, chromium() as driver:
        yield driver, f"{base}studies/{s._study_id}"


def _text(driver: Any) -> str:
    return str(driver.find_element("tag name", "body").text)


def test_the_card_names_no_trial_when_none_is_feasible(browser_at: tuple[Any, str]) -> None:
    driver, base = browser_at
    driver.get(base)
    # the study's answer has arrived when its name is in the title ("Study #1" before)
    text = wait_for(lambda: (t := _text(driver)) and "none-feasible" in t and "Best Trials" in t and t, timeout=60,
                    what="the study page with its Best Trials card")
    assert "Best Trial (number=" not in text
    driver.execute_script(
        "Array.from(document.querySelectorAll('h6')).find(e => e.innerText === 'Best Trials')"
        ".scrollIntoView({block: 'center'});")
    screenshot(driver, "optuna-no-feasible-card")
    driver.get(f"{base}/trials")
    text = wait_for(lambda: (t := _text(driver)) and f"{len(SCORES)} Trials" in t and t, what="the trial list")
    assert "Best Trial" not in text.replace("Best Trial (0)", "")  # the list's filter reads "Best Trial (0)"
    screenshot(driver, "optuna-no-feasible-trials")

