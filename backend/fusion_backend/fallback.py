"""Progressive date fallback: the ordered date tiers one request tries.

A request with a date constraint (explicit ``date_from``/``date_to``, or
``date_hint_days`` back from ``now``) tries: ``primary``, then each
``fallback.windows_days`` window back from ``now`` (named ``date_<w>d``), then
``no_filter``. A request without one tries ``no_filter`` only. The search reports the
first tier with a hit, or ``empty``. Windows are inclusive day ranges; undated
documents match only ``no_filter``.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from .corpus import NO_DATE, day_number

EMPTY = "empty"
NO_FILTER = "no_filter"


@dataclass(frozen=True)
class Tier:
    level: str
    first_day: int | None = None  # inclusive day numbers; None = open
    last_day: int | None = None

    @property
    def filtered(self) -> bool:
        return self.level != NO_FILTER

    def mask(self, days: np.ndarray) -> np.ndarray | None:
        """Boolean mask over documents, or None for no filter."""
        if not self.filtered:
            return None
        keep = days != NO_DATE
        if self.first_day is not None:
            keep &= days >= self.first_day
        if self.last_day is not None:
            keep &= days <= self.last_day
        return keep


def window_level(days: int) -> str:
    return f"date_{days}d"


def plan_tiers(
    *,
    now: dt.date,
    windows_days: Sequence[int],
    date_from: dt.date | None = None,
    date_to: dt.date | None = None,
    date_hint_days: int | None = None,
) -> list[Tier]:
    """Explicit dates win over ``date_hint_days`` when a request carries both."""
    today = day_number(now)
    if date_from is not None or date_to is not None:
        primary = Tier(
            "primary",
            None if date_from is None else day_number(date_from),
            None if date_to is None else day_number(date_to),
        )
    elif date_hint_days is not None:
        primary = Tier("primary", today - date_hint_days, today)
    else:
        return [Tier(NO_FILTER)]
    windows = [Tier(window_level(w), today - w, today) for w in windows_days]
    return [primary, *windows, Tier(NO_FILTER)]
