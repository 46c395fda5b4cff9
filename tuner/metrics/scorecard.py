"""The scorecard: which metrics a report shows and how they fold into one objective.

Primary_Metric_Score is the mean of the primary scorecard, each metric first divided
by its best possible value (only Avg_Grade@10 is not already in 0..1; it is divided
by 3). It is what the tuner maximises.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING

import numpy as np

from tuner.metrics.batch import MAX_GRADE, RankingBatch, prepare
from tuner.metrics.registry import Metric, MetricFamily, families, resolve

if TYPE_CHECKING:
    # The functions that build frames import pandas: the scorecard's names and arrays serve
    # commands that never load it (`tuner best`'s cross-validation).
    import pandas as pd

#: Bump when a formula, a denominator or the scorecard membership changes, so
#: reports computed under different definitions are never compared silently.
SCORECARD_VERSION = "scorecard-1"

PRIMARY_SCORECARD: tuple[str, ...] = (
    "NDCG@20",
    "NDCG@50",
    "ERR@10",
    "Strong_Precision@10",
    "Strong_Precision@20",
    "Useful_Precision@50",
    "Avg_Grade@10",
    "Gain_Recall@20",
)

SECONDARY_METRICS: tuple[str, ...] = (
    "NDCG@5",
    "NDCG@10",
    "ERR@5",
    "ERR@20",
    "ERR@50",
    "Exact_Precision@10",
    "Exact_Success@10",
    "Strong_Success@10",
    "MRR_Exact@10",
    "MRR_Strong@10",
    "MAP@10",
    "P@1",
    "Recall@50",
)

DEFAULT_METRICS: tuple[str, ...] = PRIMARY_SCORECARD + SECONDARY_METRICS

PRIMARY_METRIC = "Primary_Metric_Score"

#: Human-readable formula, for report headers.
SCORECARD_FORMULA = (
    "Primary_Metric_Score = mean("
    + ", ".join(f"{name}/{MAX_GRADE}" if name.startswith("Avg_Grade") else name for name in PRIMARY_SCORECARD)
    + ")"
)


def score_rankings(
    rankings: dict[str, list[str]],
    qrels: dict[str, dict[str, int]],
    query_ids: list[str],
    gains: str = "linear",
    metrics: list[str] | None = None,
    *,
    relevance_level: int = 1,
) -> pd.DataFrame:
    """Score every query: index = query_ids (in order), a column per metric + Primary_Metric_Score.

    ``rankings`` are doc ids in system order; a query absent from ``rankings`` or with
    an empty list (handed off, no results) scores 0 on every ranking metric. Grades
    must be 0..3; unjudged documents count as grade 0. ``metrics`` defaults to the
    primary scorecard + the secondary set; any registered ``FAMILY@k`` is accepted.
    ``relevance_level`` is trec_eval's ``-l``: binary metrics (P, Recall,
    Success, MRR, AP) count grade >= it as relevant (Useful_/Strong_/Exact_ name their own); the default 1 is the
    live scorecard. The aggregate of a column is its mean (see ``aggregate``).
    """
    wanted = [resolve(name) for name in (DEFAULT_METRICS if metrics is None else metrics)]
    needed = wanted + [resolve(name) for name in PRIMARY_SCORECARD]
    batch = prepare(
        rankings,
        qrels,
        query_ids,
        gains=gains,
        relevance_level=relevance_level,
        depth=_deepest(needed),
        ideal_depth=_deepest(m for m in needed if m.family.uses_ideal),
    )
    return score_batch(batch, [m.name for m in wanted])


def score_rankings_with_coverage(
    rankings: dict[str, list[str]],
    qrels: dict[str, dict[str, int]],
    query_ids: list[str],
    gains: str = "linear",
    metrics: list[str] | None = None,
    judged_depths: Sequence[int] = (10, 20),
    *,
    relevance_level: int = 1,
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """``score_rankings`` plus ``judged_at_k`` for each of ``judged_depths``, from one
    prepared batch (the label lookups are the costly part; this does them once).
    Returns (scores, coverage) with the same values the separate calls return."""
    import pandas as pd

    batch, scores, judged = score_arrays(
        rankings, qrels, query_ids, gains, metrics, judged_depths, relevance_level=relevance_level
    )
    index = pd.Index(batch.query_ids, name="query_id")
    frame = pd.DataFrame(scores, index=index)
    frame.attrs.update(_attrs(batch))
    return frame, pd.DataFrame(judged, index=index)


def score_arrays(
    rankings: Mapping[str, Sequence[str]],
    qrels: Mapping[str, Mapping[str, int]],
    query_ids: Sequence[str],
    gains: str = "linear",
    metrics: Sequence[str] | None = None,
    judged_depths: Sequence[int] = (10, 20),
    *,
    relevance_level: int = 1,
) -> tuple[RankingBatch, dict[str, np.ndarray], dict[str, np.ndarray]]:
    """The arrays behind ``score_rankings_with_coverage``, without building frames:
    (batch, {metric: per-query values, ..., Primary_Metric_Score}, {Judged@k: ...}).
    For per-query callers (a query's row as its answer arrives) where a DataFrame
    would cost more than the scoring."""
    depth, ideal_depth = batch_depths(metrics, judged_depths)
    batch = prepare(
        rankings,
        qrels,
        query_ids,
        gains=gains,
        relevance_level=relevance_level,
        depth=depth,
        ideal_depth=ideal_depth,
    )
    return batch, *score_prepared(batch, metrics, judged_depths)


def batch_depths(
    metrics: Sequence[str] | None = None,
    judged_depths: Sequence[int] = (10, 20),
) -> tuple[int | None, int | None]:
    """The (depth, ideal_depth) ``score_arrays`` prepares its batch with for these metrics
    and coverage depths: the largest cutoff asked for (None: a metric reads the whole
    ranking). A batch built elsewhere (``from_grades``) at these depths scores the same."""
    needed = _needed(metrics)
    coverage = [resolve(f"Judged@{k}") for k in judged_depths]
    return _deepest(needed + coverage), _deepest(m for m in needed if m.family.uses_ideal)


def score_prepared(
    batch: RankingBatch,
    metrics: Sequence[str] | None = None,
    judged_depths: Sequence[int] = (10, 20),
) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    """``score_arrays``' ({metric: values, ..., Primary_Metric_Score}, {Judged@k: values})
    on a batch prepared at ``batch_depths(metrics, judged_depths)``."""
    wanted = [resolve(name) for name in (DEFAULT_METRICS if metrics is None else metrics)]
    judged = {m.name: m.compute(batch) for m in (resolve(f"Judged@{k}") for k in judged_depths)}
    return _score_columns(batch, wanted), judged


def _needed(metrics: Sequence[str] | None) -> list[Metric]:
    """The metrics asked for, then the primary scorecard (Primary_Metric_Score needs it)."""
    wanted = [resolve(name) for name in (DEFAULT_METRICS if metrics is None else metrics)]
    return wanted + [resolve(name) for name in PRIMARY_SCORECARD]


def score_batch(batch: RankingBatch, metrics: Sequence[str] | None = None) -> pd.DataFrame:
    """Like score_rankings, on an already prepared batch (e.g. prepare(max_grade=4))."""
    import pandas as pd

    wanted = [resolve(name) for name in (DEFAULT_METRICS if metrics is None else metrics)]
    frame = pd.DataFrame(_score_columns(batch, wanted), index=pd.Index(batch.query_ids, name="query_id"))
    frame.attrs.update(_attrs(batch))
    return frame


def _attrs(batch: RankingBatch) -> dict[str, object]:
    """What a frame's numbers were computed under, so two frames are never compared blind."""
    return {
        "gains": batch.gains,
        "scorecard_version": SCORECARD_VERSION,
        "max_grade": batch.max_grade,
        "relevance_level": batch.relevance_level,
    }


def _score_columns(batch: RankingBatch, wanted: Sequence[Metric]) -> dict[str, np.ndarray]:
    primary = [resolve(name) for name in PRIMARY_SCORECARD]
    columns: dict[str, np.ndarray] = {}
    for metric in {m.name: m for m in [*wanted, *primary]}.values():
        _check_depth(metric, batch)
        columns[metric.name] = metric.compute(batch)
    scores = {m.name: columns[m.name] for m in wanted}
    scores[PRIMARY_METRIC] = primary_metric_score(columns, batch)
    return scores


def primary_metric_score(columns: Mapping[str, np.ndarray], batch: RankingBatch) -> np.ndarray:
    """Per query: mean over PRIMARY_SCORECARD of value / best possible value."""
    parts = [np.asarray(columns[name]) / resolve(name).upper_bound(batch) for name in PRIMARY_SCORECARD]
    return np.mean(parts, axis=0) if parts else np.zeros(batch.n_queries)


def aggregate(df: pd.DataFrame) -> dict[str, float]:
    """Column means (NaN entries, e.g. Judged@k of an empty ranking, are skipped)."""
    return {str(column): float(value) for column, value in df.mean(numeric_only=True).items()}


def judged_at_k(
    rankings: dict[str, list[str]],
    qrels: dict[str, dict[str, int]],
    query_ids: list[str],
    k: int,
) -> pd.Series:
    """Coverage per query: share of the first min(k, length) results that carry a label.

    NaN for an empty ranking (nothing was shown, so nothing is missing a label).
    """
    import pandas as pd

    batch = prepare(rankings, qrels, query_ids, depth=k, ideal_depth=0)
    return pd.Series(
        resolve(f"Judged@{k}").compute(batch), index=pd.Index(batch.query_ids, name="query_id"), name=f"Judged@{k}"
    )


def list_metrics() -> list[MetricFamily]:
    """Every metric family (name, description, whether it needs @k, uses gains)."""
    return families()


def _deepest(metrics: Iterable[Metric]) -> int | None:
    """Largest cutoff among metrics; None when one of them reads the whole ranking."""
    deepest = 0
    for metric in metrics:
        if metric.k is None:
            return None
        deepest = max(deepest, metric.k)
    return deepest


def _check_depth(metric: Metric, batch: RankingBatch) -> None:
    limits = [batch.depth_limit] + ([batch.ideal_depth_limit] if metric.family.uses_ideal else [])
    for limit in limits:
        if limit is not None and (metric.k is None or metric.k > limit):
            raise ValueError(f"{metric.name} needs a batch prepared deeper than {limit}; pass depth=None or >= k")
