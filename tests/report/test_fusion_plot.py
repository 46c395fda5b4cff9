"""The fusion sweep plot of a replay trial: drawn from the sweep table with a weights
simplex (objective vs the first source's share, one line per RRF k and per linear
normalisation) or without one (objective by rank); the image changes with the data."""

from __future__ import annotations

import io

import numpy as np
import pandas as pd
from PIL import Image

from tuner.report.fusion_plot import _groups, _share_column, fusion_sweep_png


def sweep(seed: int) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    rows = []
    for w in np.linspace(0, 1, 11):
        for k in (1.0, 10.0, 60.0):
            rows.append({"fusion.method": "rrf", "fusion.rrf_k": k, "fusion.weights.bm25": w,
                         "fusion.weights.dense": 1 - w})
        for norm in ("minmax", "z"):
            rows.append({"fusion.method": "linear", "fusion.weights.bm25": w, "fusion.weights.dense": 1 - w,
                         "fusion.normalization": norm})
    table = pd.DataFrame(rows)
    table["objective"] = rng.random(len(table))
    table["violation"] = rng.normal(size=len(table)) * 0.05
    table["feasible"] = table["violation"] <= 0
    table["rank"] = np.arange(1, len(table) + 1)
    return table


def test_the_weights_view_groups_by_family_and_draws_a_png() -> None:
    table = sweep(0)
    assert _share_column(table) == "fusion.weights.bm25"
    groups = _groups(table, table["fusion.method"].to_numpy())
    assert sorted(groups, key=str) == sorted([("rrf", 1.0), ("rrf", 10.0), ("rrf", 60.0), ("linear", "minmax"),
                                              ("linear", "z")], key=str)
    assert all(len(rows) == 11 for rows in groups.values())
    png = fusion_sweep_png(table, objective="Primary_Metric_Score")
    image = Image.open(io.BytesIO(png))
    assert image.format == "PNG" and image.size == (640, 304)
    assert png != fusion_sweep_png(sweep(1), objective="Primary_Metric_Score")


def test_without_a_two_source_simplex_the_settings_are_drawn_best_first() -> None:
    table = sweep(0).drop(columns=["fusion.weights.bm25", "fusion.weights.dense"])
    assert _share_column(table) is None
    png = fusion_sweep_png(table)
    assert Image.open(io.BytesIO(png)).format == "PNG"
    assert png != fusion_sweep_png(sweep(0))


def test_a_bounded_sweep_draws_its_bounded_rows_at_their_bound() -> None:
    table = sweep(0)
    bounded = table.index >= 5
    table["exact"] = ~bounded
    table["objective_bound"] = np.where(bounded, table["objective"] + 0.01, np.nan)
    table.loc[bounded, "objective"] = np.nan
    table.loc[table.index[-1], "objective_bound"] = -np.inf  # no feasible gates: not drawn
    png = fusion_sweep_png(table)
    assert Image.open(io.BytesIO(png)).format == "PNG"
    moved = table.copy()
    moved.loc[bounded, "objective_bound"] += 0.2  # the bounds are what is drawn
    assert png != fusion_sweep_png(moved)
