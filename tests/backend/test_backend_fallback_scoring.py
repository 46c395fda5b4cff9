"""Date tiers, the recency boost and the confidence, as pure functions."""

from __future__ import annotations

import datetime as dt

import numpy as np
import pytest
from fusion_backend.corpus import NO_DATE, day_number
from fusion_backend.fallback import plan_tiers
from fusion_backend.scoring import confidence, recency_factor

NOW = dt.date(2024, 6, 1)
TODAY = day_number(NOW)


def test_no_date_constraint_means_no_filter_only() -> None:
    tiers = plan_tiers(now=NOW, windows_days=[30, 90])
    assert [t.level for t in tiers] == ["no_filter"]


def test_hint_tiers_are_primary_then_windows_then_no_filter() -> None:
    tiers = plan_tiers(now=NOW, windows_days=[30, 90], date_hint_days=7)
    assert [t.level for t in tiers] == ["primary", "date_30d", "date_90d", "no_filter"]
    assert (tiers[0].first_day, tiers[0].last_day) == (TODAY - 7, TODAY)
    assert (tiers[2].first_day, tiers[2].last_day) == (TODAY - 90, TODAY)
    assert [t.level for t in plan_tiers(now=NOW, windows_days=[14, 45, 400], date_hint_days=3)][1:4] == [
        "date_14d", "date_45d", "date_400d"]


def test_explicit_range_wins_over_hint_and_may_be_open() -> None:
    tiers = plan_tiers(now=NOW, windows_days=[30], date_from=dt.date(2020, 1, 1), date_hint_days=7)
    assert (tiers[0].first_day, tiers[0].last_day) == (day_number(dt.date(2020, 1, 1)), None)


def test_masks_are_inclusive_and_exclude_undated_documents() -> None:
    days = np.array([TODAY, TODAY - 7, TODAY - 8, NO_DATE, TODAY + 1], dtype=np.int32)
    primary, *_, no_filter = plan_tiers(now=NOW, windows_days=[30], date_hint_days=7)
    assert primary.mask(days).tolist() == [True, True, False, False, False]
    assert no_filter.mask(days) is None
    open_end = plan_tiers(now=NOW, windows_days=[], date_to=NOW)[0]
    assert open_end.mask(days).tolist() == [True, True, True, False, False]


def test_recency_factor_formula() -> None:
    w, h = 0.5, 30.0
    days = np.array([TODAY, TODAY - 30, TODAY - 90, TODAY + 5, NO_DATE], dtype=np.int32)
    got = recency_factor(days, TODAY, h, w)
    ages = [0, 30, 90, 0]
    expected = [(1 + w * 0.5 ** (a / h)) / (1 + w) for a in ages] + [1 / (1 + w)]
    assert got.tolist() == pytest.approx(expected)
    assert recency_factor(days, TODAY, h, 0.0).tolist() == [1.0] * 5


def test_confidence_is_mean_of_top_m_floored_at_zero() -> None:
    assert confidence(np.array([0.9, 0.6, 0.3, 0.0]), 2) == pytest.approx((0.9 + 0.6) / 2)
    assert confidence(np.array([0.9, 0.6]), 5) == pytest.approx(0.75)
    assert confidence(np.array([-0.4, 0.1]), 2) == 0.0
    assert confidence(np.array([]), 3) == 0.0
