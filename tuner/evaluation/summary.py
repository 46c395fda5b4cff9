"""A batch's scorecard from its per-query columns: pure numpy, no frames.

``batch_scorecard`` is the summary of a BatchResult (tuner.evaluation.result): the
in-scope mean of every ranking metric, the OOS / handoff metrics, latency, coverage
and the counts. It takes the per-query columns as arrays rather than slicing the
per-query frame, since it runs after a trial's last answer and again for every
re-gated batch (tuner.evaluation.regate).

``column_mean`` (``column_means``) is the mean pandas takes of a float column (``Series.mean``,
``DataFrame.mean``, so ``tuner.metrics.aggregate``), computed the same way: NaN
entries count as 0 in the sum, which is divided by the number of the others; the
sum is numpy's pairwise sum over the column in row order, as pandas does it. So a
mean taken here equals the frame's to the last bit (tests/threshold checks it
against the frames the scorecard used to be taken from).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import pandas as pd

from tuner.evaluation import oos


def column_mean(values: np.ndarray) -> float:
    """pandas' skipna mean of a float column (see the module doc); NaN when every value is NaN."""
    return next(iter(column_means({"": values}).values()))


def column_means(columns: Mapping[str, np.ndarray]) -> dict[str, float]:
    """``column_mean`` of each column (all of one length), taken at once as pandas takes a
    frame's: the columns stacked as rows, each row's pairwise sum in one reduction."""
    names = list(columns)
    if not names:
        return {}
    stack = np.array([np.asarray(columns[n], dtype=np.float64) for n in names], dtype=np.float64, ndmin=2)
    missing = np.isnan(stack)
    if missing.any():
        stack = np.where(missing, 0.0, stack)
    counts = (stack.shape[1] - missing.sum(axis=1)).astype(np.float64)
    with np.errstate(invalid="ignore", divide="ignore"):
        means = np.add.reduce(stack, axis=1) / counts
    return {str(n): float(m) for n, m in zip(names, means.tolist(), strict=True)}


def batch_scorecard(
    info: pd.DataFrame,
    scores: Mapping[str, np.ndarray],
    metric_names: Sequence[str],
    is_oos: np.ndarray,
    answered: np.ndarray,
    failures: Sequence[Any],
    judged_depths: Sequence[int],
) -> dict[str, float]:
    """The summary of a batch from its exchange rows (``info``: the columns of
    tuner.evaluation.result.INFO_COLUMNS) and its per-query ``scores`` (Judged@k and the
    metrics, one value per row, NaN for OOS queries)."""
    ins = ~is_oos
    n_in = int(ins.sum())
    if n_in:
        summary = column_means({name: np.asarray(scores[name], dtype=np.float64)[ins] for name in metric_names})
    else:
        summary = dict.fromkeys(metric_names, 0.0)
    summary.update(oos.handoff_metrics(is_oos, answered))
    ok = info["status"].to_numpy(dtype=object) == "ok"
    latency = info["latency_ms"].to_numpy(dtype=np.float64)[ok]
    latency = latency[~np.isnan(latency)]
    summary["Latency_Avg_ms"] = float(latency.mean()) if latency.size else 0.0
    # the median beside the tail: less swayed by a few requests a busy machine delayed (a latency objective)
    summary["Latency_P50_ms"] = float(np.percentile(latency, 50)) if latency.size else 0.0
    summary["Latency_P95_ms"] = float(np.percentile(latency, 95)) if latency.size else 0.0
    for k in judged_depths:
        col = np.asarray(scores[f"Judged@{k}"], dtype=np.float64)[ins]
        col = col[~np.isnan(col)]
        # Coverage of what was shown: over the queries that returned something. When
        # nothing came back, coverage is undefined (NaN), never "fully judged".
        summary[f"Judged@{k}"] = column_mean(col) if len(col) else math.nan
    summary["Failed_Queries"] = float(len(failures))
    # beside Judged@k: the in-scope queries that came back without a single result
    n_results = info["n_results"].to_numpy()
    summary["Empty_Queries"] = float((ok[ins] & (n_results[ins] == 0)).sum())
    # a backend that ignores top_k: what was cut off (OOS queries too; nothing of it is kept)
    summary["N_Truncated_Hits"] = float(info["n_truncated"].to_numpy().sum())
    # a backend that lists a document twice in one answer: the later copies, removed before ranking
    summary["N_Repeated_Hits"] = float(info["n_repeats"].to_numpy().sum())
    summary["N_Queries"] = float(len(info))
    summary["N_InScope_Queries"] = float(n_in)
    summary["N_OOS_Queries"] = float(is_oos.sum())
    return summary
