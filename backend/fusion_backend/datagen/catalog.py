"""The demo catalog's ground truth: structured products (no text yet).

Products come in model lines (brand + type + material + style + feature, one model
code) sold in a few colourways; each colourway is one listing with its own reference
number. Listings go live in fortnightly "drops" (a real pattern in fashion and
furniture retail), and the catalog is seen ``DAYS_AFTER_LAST_DROP`` days after the
last drop: "this week" has no new listing at all, so a date-filtered search has to
fall back to a wider window (that is what makes the fallback windows matter).
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass

from .draw import Draw
from .vocabulary import CATEGORIES, COLOURS, PRODUCT_TYPES, SHADES, STYLES, colour_name

FIRST_DROP = dt.date(2023, 7, 6)
DROP_EVERY_DAYS = 14
N_DROPS = 52
LAST_DROP = FIRST_DROP + dt.timedelta(days=DROP_EVERY_DAYS * (N_DROPS - 1))
DAYS_AFTER_LAST_DROP = 9
NOW = LAST_DROP + dt.timedelta(days=DAYS_AFTER_LAST_DROP)

LINES_PER_TYPE = 20  # x 38 types x ~2.5 colourways: about 1,900 listings
MAX_COLOURWAYS = 4
PLAIN_COLOUR_P = 0.3  # colourways without a shade ("navy" rather than "deep navy")


@dataclass(frozen=True)
class Product:
    """One listing's ground truth; the labels are computed from these fields only."""

    doc_id: str
    type: str
    category: str
    colour: str
    material: str
    style: str
    brand: str
    model: str
    feature: str
    ref: str
    date: dt.date


def drop_dates() -> list[dt.date]:
    return [FIRST_DROP + dt.timedelta(days=DROP_EVERY_DAYS * i) for i in range(N_DROPS)]


def generate_products(draw: Draw) -> list[Product]:
    drops = drop_dates()
    products: list[Product] = []
    used_numbers: set[int] = set()
    for ptype in PRODUCT_TYPES.values():
        brands = CATEGORIES[ptype.category].brands
        for _ in range(LINES_PER_TYPE):
            brand = draw.pick(brands)
            material = draw.pick(ptype.materials)
            style = draw.pick(list(STYLES))
            feature = draw.pick(ptype.features)
            model = f"{brand[:2].upper()}-{_model_number(draw, used_numbers)}"
            for base in draw.sample(list(COLOURS), 1 + draw.index(MAX_COLOURWAYS)):
                colour = colour_name(None if draw.chance(PLAIN_COLOUR_P) else draw.pick(SHADES), base)
                # sqrt skews listings towards recent drops: the catalog grows over time.
                date = drops[min(int(N_DROPS * draw.uniform() ** 0.5), N_DROPS - 1)]
                doc_id = f"P{len(products) + 1:05d}"
                # 7919 is prime, so the reference numbers are distinct 6-digit strings.
                ref = str(100000 + (7919 * len(products)) % 900000)
                products.append(
                    Product(
                        doc_id, ptype.name, ptype.category, colour, material, style, brand, model, feature, ref, date
                    )
                )
    return products


def _model_number(draw: Draw, used: set[int]) -> int:
    while True:
        number = 1000 + draw.index(9000)
        if number not in used:
            used.add(number)
            return number
