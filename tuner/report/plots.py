"""The handoff precision-recall curve from a confidence threshold sweep (PNG).

Uses matplotlib's object API with the Agg canvas directly, never pyplot, so drawing
a report changes no global backend state of the calling program. The PNG is drawn at
a modest resolution and stored with a small palette: it is written for every trial.
"""

from __future__ import annotations

import functools
import io
import math
import threading
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

if TYPE_CHECKING:
    from matplotlib.figure import Figure

#: dots per inch of the PNG (the figure is 9 x 3.6 inches)
DPI = 80
#: colours kept in the PNG's palette (the plot uses a handful; anti-aliasing needs the rest)
PALETTE_COLOURS = 64
#: at most this many thresholds are written next to the PR curve
_ANNOTATED = 8
_IN_EFFECT_COLOUR = "black"  # the metric lines take the default colour cycle


def pr_curve_png(sweep: pd.DataFrame, *, title: str = "Handoff detection", threshold: float | None = None) -> bytes:
    """PNG bytes: precision vs recall of 'hand off' (left), rates vs threshold (right);
    ``threshold`` (the threshold in effect) is marked on both.

    Drawn on one figure per process, kept between calls: its axes, ticks and grid are
    built once (about a third of a plot's CPU went to creating those artists again for
    every trial); each call removes the previous curves, texts and legends first. The
    bytes are those of a fresh figure (tested)."""
    from PIL import Image  # a dependency of matplotlib

    with _REUSED_LOCK:
        fig, left, right = _reused_figure()
        for ax in (left, right):
            for artist in [*ax.lines, *ax.texts, *ax.collections, *ax.patches]:
                artist.remove()
            if ax.get_legend() is not None:
                ax.get_legend().remove()
            ax.set_prop_cycle(None)  # the colours start over, as on a fresh axes
        _draw(fig, left, right, sweep, title, threshold)
        fig.canvas.draw()
        rgba = np.asarray(fig.canvas.buffer_rgba())
        image = Image.fromarray(rgba[..., :3]).quantize(colors=PALETTE_COLOURS, method=Image.Quantize.FASTOCTREE)
    buf = io.BytesIO()
    image.save(buf, format="PNG", dpi=(DPI, DPI))  # optimize=True: 1 KB less, 10x the time
    return buf.getvalue()


_REUSED_LOCK = threading.Lock()


@functools.cache
def _reused_figure() -> tuple[Any, Any, Any]:
    """The process's kept figure and its two axes (built on first use)."""
    fig = _new_figure()
    left, right = fig.axes
    return fig, left, right


def _new_figure() -> Figure:
    # imported here: matplotlib costs ~0.2 s and most importers of tuner.report never plot
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(9, 3.6), dpi=DPI)
    FigureCanvasAgg(fig)
    fig.subplots(1, 2)
    return fig


def pr_curve_figure(sweep: pd.DataFrame, *, title: str = "Handoff detection", threshold: float | None = None) -> Figure:
    """The figure ``pr_curve_png`` renders, on a figure of its own (for callers that draw
    it elsewhere, and tests)."""
    fig = _new_figure()
    left, right = fig.axes
    _draw(fig, left, right, sweep, title, threshold)
    return fig


def _draw(fig: Figure, left: Any, right: Any, sweep: pd.DataFrame, title: str, threshold: float | None) -> None:
    thresholds = sweep.index.to_numpy(dtype=float)
    defined = sweep["n_handoff"].to_numpy() > 0  # precision is undefined without any handoff
    rec = sweep["Handoff_Recall"].to_numpy(dtype=float)
    prec = sweep["Handoff_Precision"].to_numpy(dtype=float)
    left.plot(rec[defined], prec[defined], marker="o", markersize=2.5)
    every = max(1, math.ceil(int(defined.sum()) / _ANNOTATED))
    last: tuple[float, float] | None = None
    for t, x, y in zip(thresholds[defined][::every], rec[defined][::every], prec[defined][::every], strict=True):
        if last is None or not np.allclose(last, (x, y), atol=0.02):  # one label per point of the curve
            left.annotate(f"{t:g}", (x, y), textcoords="offset points", xytext=(4, 4), fontsize=7)
            last = (x, y)
    left.set(
        xlabel="recall (OOS handed off)",
        ylabel="precision (handoffs that were OOS)",
        xlim=(-0.02, 1.02),
        ylim=(-0.02, 1.02),
        title=title,
    )
    left.grid(alpha=0.3)
    for column in ("OOS_FP_Rate", "InScope_Handoff_Rate", "Handoff_F1", "Primary_Metric_Score"):
        if column in sweep:
            right.plot(thresholds, sweep[column].to_numpy(dtype=float), label=column)
    low, high = float(thresholds.min()), float(thresholds.max())
    if threshold is not None and math.isfinite(threshold):
        low, high = min(low, threshold), max(high, threshold)
        right.axvline(
            threshold,
            color=_IN_EFFECT_COLOUR,
            linestyle="--",
            linewidth=1,
            label=f"threshold in effect ({threshold:g})",
        )
        at = np.flatnonzero(np.isclose(thresholds, threshold, rtol=0, atol=1e-9) & defined)
        if at.size:
            left.plot(
                [rec[at[0]]],
                [prec[at[0]]],
                marker="*",
                markersize=11,
                color=_IN_EFFECT_COLOUR,
                linestyle="none",
                label=f"in effect ({threshold:g})",
            )
            left.legend(fontsize=7, loc="lower left")
    pad = 0.02 * (high - low or 1.0)
    right.set(
        xlabel="confidence threshold (answer when >=)",
        xlim=(low - pad, high + pad),
        ylim=(-0.02, 1.02),
        title="per threshold",
    )
    right.grid(alpha=0.3)
    right.legend(fontsize=7)
    # fixed margins that fit the labels at this size: tight_layout measured every text
    # box first, a third of the drawing time, for every trial
    fig.subplots_adjust(left=0.07, right=0.985, bottom=0.14, top=0.9, wspace=0.22)
