"""What a fusion-replay trial scored, as a PNG (its ``fusion_sweep.csv`` drawn).

With a two-source weights simplex among the replayed params, the objective is drawn
against the first source's weight share: one line per RRF k (darker: larger k) and one
per linear normalisation (dashed), infeasible settings as grey crosses, the trial's
best replayed setting as a star. Without one, the objective of every setting, best
first. A bounded sweep (``exact`` False on some rows: tuner.study.replay.fusion_search) draws
those rows at their upper bound and dots the settings scored exactly; the title counts
both. Object API with the Agg canvas (never pyplot), as tuner.report.plots.
"""

from __future__ import annotations

import io
import math

import numpy as np
import pandas as pd

DPI = 80


def fusion_sweep_png(
    table: pd.DataFrame, *, objective: str = "objective", title: str = "Fusion settings scored"
) -> bytes:
    """PNG bytes of ``table`` (tuner.study.replay.fusion_search.sweep_frame: one row per setting,
    ``objective``, ``feasible`` and ``rank`` columns, the params flattened)."""
    from matplotlib import colormaps
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(8, 3.8), dpi=DPI)
    FigureCanvasAgg(fig)
    ax = fig.subplots()
    weight = _share_column(table)
    feasible = table["feasible"].astype(bool).to_numpy()
    y = table["objective"].to_numpy(dtype=float)
    exact = table["exact"].astype(bool).to_numpy() if "exact" in table else np.ones(len(table), dtype=bool)
    if not exact.all():  # bounded rows at their bound (none without a feasible gate setting)
        bound = table["objective_bound"].to_numpy(dtype=float)
        y = np.where(exact, y, np.where(np.isfinite(bound), bound, np.nan))
    if weight is None:
        order = np.argsort(table["rank"].to_numpy())
        x = np.arange(1, len(table) + 1)
        ax.plot(x, y[order], color="tab:blue", lw=1)
        ax.scatter(x[~feasible[order]], y[order][~feasible[order]], marker="x", color="grey", s=14, label="infeasible")
        ax.set_xlabel("setting, best first")
    else:
        x = table[weight].to_numpy(dtype=float)
        method = table.get("fusion.method", pd.Series(["?"] * len(table))).astype(str).to_numpy()
        groups = _groups(table, method)
        cmap = colormaps["viridis"]
        ks = sorted({k for kind, k in groups if kind == "rrf"}, key=_order)
        ordered = sorted(groups.items(), key=lambda g: (g[0][0] != "rrf", str(g[0][0]), _order(g[0][1])))
        for (kind, key), rows in ordered:
            rows = rows[np.argsort(x[rows], kind="stable")]
            if kind == "rrf":
                shade = 0.15 + 0.7 * (ks.index(key) / max(len(ks) - 1, 1))
                ax.plot(x[rows], y[rows], color=cmap(shade), lw=1, label=f"rrf k={_fmt(key)}")
            else:
                ax.plot(x[rows], y[rows], ls="--", lw=1.4, label=f"{kind} {key}".strip())
        ax.scatter(x[~feasible], y[~feasible], marker="x", color="grey", s=14, zorder=3, label="infeasible")
        if not exact.all():
            ax.scatter(x[exact], y[exact], marker="o", s=12, color="black", zorder=3, label="scored exactly")
        best = int(np.argmin(table["rank"].to_numpy()))
        ax.scatter([x[best]], [y[best]], marker="*", s=160, color="crimson", zorder=4, label="best replayed")
        ax.set_xlabel(f"{weight} (share)")
    ax.set_ylabel(objective)
    counted = f"{len(table)}" if exact.all() else f"{len(table)}: {int(exact.sum())} exact, the rest at their bound"
    ax.set_title(f"{title} ({counted})")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=6, loc="center left", bbox_to_anchor=(1.01, 0.5), frameon=False)
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=DPI)
    return buf.getvalue()


def _share_column(table: pd.DataFrame) -> str | None:
    """The first of exactly two weight columns of one simplex param (``x.weights.a``)."""
    cols = [c for c in table.columns if c.count(".") >= 2 and table[c].dtype.kind == "f"]
    prefixes = {c.rsplit(".", 1)[0] for c in cols}
    for prefix in sorted(prefixes):
        own = [c for c in cols if c.rsplit(".", 1)[0] == prefix]
        if len(own) == 2:
            return own[0]
    return None


def _groups(table: pd.DataFrame, method: np.ndarray) -> dict[tuple[str, object], np.ndarray]:
    k = table["fusion.rrf_k"].to_numpy() if "fusion.rrf_k" in table else np.full(len(table), np.nan)
    norm = (
        table["fusion.normalization"].astype(str).to_numpy()
        if "fusion.normalization" in table
        else np.full(len(table), "")
    )
    out: dict[tuple[str, object], list[int]] = {}
    for i, m in enumerate(method.tolist()):
        key: tuple[str, object] = ("rrf", float(k[i])) if m == "rrf" else (m, norm[i] if norm[i] != "nan" else "")
        out.setdefault(key, []).append(i)
    return {g: np.array(rows) for g, rows in out.items()}


def _order(key: object) -> tuple[float, str]:
    return (float(key), "") if isinstance(key, float) else (math.inf, str(key))


def _fmt(k: object) -> str:
    return f"{k:g}" if isinstance(k, float) and math.isfinite(k) else str(k)
