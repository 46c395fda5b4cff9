"""The handoff precision-recall curve from a confidence threshold sweep (PNG).

Uses matplotlib's object API with the Agg canvas directly, never pyplot, so drawing
a report changes no global backend state of the calling program.
"""

from __future__ import annotations

import io

import pandas as pd


def pr_curve_png(sweep: pd.DataFrame, *, title: str = "Handoff detection") -> bytes:
    """PNG bytes: precision vs recall of 'hand off' (left), rates vs threshold (right)."""
    # imported here: matplotlib costs ~0.2 s and most importers of tuner.report never plot
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(10, 4.2), dpi=100)
    FigureCanvasAgg(fig)
    left, right = fig.subplots(1, 2)
    thresholds = sweep.index.to_numpy(dtype=float)
    defined = sweep["n_handoff"].to_numpy() > 0  # precision is undefined without any handoff
    rec = sweep["Handoff_Recall"].to_numpy(dtype=float)
    prec = sweep["Handoff_Precision"].to_numpy(dtype=float)
    left.plot(rec[defined], prec[defined], marker="o", markersize=3)
    for t, x, y in zip(thresholds[defined][::4], rec[defined][::4], prec[defined][::4], strict=True):
        left.annotate(f"{t:.2f}", (x, y), textcoords="offset points", xytext=(4, 4), fontsize=7)
    left.set(xlabel="recall (OOS handed off)", ylabel="precision (handoffs that were OOS)",
             xlim=(-0.02, 1.02), ylim=(-0.02, 1.02), title=title)
    left.grid(alpha=0.3)
    for column in ("OOS_FP_Rate", "InScope_Handoff_Rate", "Handoff_F1", "Primary_Metric_Score"):
        if column in sweep:
            right.plot(thresholds, sweep[column].to_numpy(dtype=float), label=column)
    right.set(xlabel="confidence threshold (answer when >=)", ylim=(-0.02, 1.02), title="per threshold")
    right.grid(alpha=0.3)
    right.legend(fontsize=7)
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    return buf.getvalue()
