"""Graded labels by the four-tier rules, computed from a query's intent and a product.

* 3 Fully: the right product type and every stated attribute (and, for a temporal
  query, listed within its date hint).
* 2 Mostly: the right type, a strong substitute: exactly one stated attribute off, or
  every attribute right but listed just outside the date window (within twice the hint).
* 1 Weakly: the same broad category only: the right type with two or more things off,
  or another type of the same family (vocabulary.FAMILIES: seating, lamps, shoes ...).
* 0 Irrelevant: anything else.

A model-code query states the model line's brand, material, style and feature as well
as the code, so another line that differs only in its code is a strong substitute; a
reference-number query also states the colourway's colour.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass

from .catalog import Product
from .vocabulary import FAMILY

FULLY, MOSTLY, WEAKLY, IRRELEVANT = 3, 2, 1, 0

GRADED_ATTRIBUTES = ("colour", "material", "style", "feature", "brand", "model")


@dataclass(frozen=True)
class Intent:
    """What an in-scope query asks for: a product type plus stated attributes."""

    type: str
    colour: str | None = None
    material: str | None = None
    style: str | None = None
    feature: str | None = None
    brand: str | None = None
    model: str | None = None
    date_hint_days: int | None = None

    def stated(self) -> dict[str, str]:
        return {a: v for a in GRADED_ATTRIBUTES if (v := getattr(self, a)) is not None}

    def to_record(self) -> dict[str, object]:
        """The intent as JSON (written to the manifest, so every grade can be re-derived)."""
        record: dict[str, object] = {"type": self.type, **self.stated()}
        if self.date_hint_days is not None:
            record["date_hint_days"] = self.date_hint_days
        return record


def date_misses(hint_days: int | None, listed: dt.date, now: dt.date) -> int:
    """0 inside the hint window, 1 just outside (up to twice the hint), 2 beyond or in the future."""
    if hint_days is None:
        return 0
    age = (now - listed).days
    if 0 <= age <= hint_days:
        return 0
    if 0 <= age <= 2 * hint_days:
        return 1
    return 2


def grade(intent: Intent, product: Product, now: dt.date) -> int:
    if product.type != intent.type:
        return WEAKLY if FAMILY[product.type] == FAMILY[intent.type] else IRRELEVANT
    misses = sum(1 for attr, value in intent.stated().items() if getattr(product, attr) != value)
    misses += date_misses(intent.date_hint_days, product.date, now)
    if misses == 0:
        return FULLY
    return MOSTLY if misses == 1 else WEAKLY
