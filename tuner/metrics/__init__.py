"""The graded scorecard: pure numpy metrics over all queries at once.

Public API (other modules code against exactly this):

- ``score_rankings(rankings, qrels, query_ids, gains="linear", metrics=None, *, relevance_level=1) -> DataFrame``
- ``aggregate(df) -> dict[str, float]`` (column means)
- ``judged_at_k(rankings, qrels, query_ids, k) -> Series`` (coverage)
- ``score_rankings_with_coverage(..., judged_depths=(10, 20)) -> (scores, coverage)``: both from one batch
- ``score_arrays(...) -> (batch, {metric: array}, {Judged@k: array})``: the same without frames
- ``batch_depths(metrics, judged_depths)``, ``score_prepared(batch, ...)``, ``from_grades(...)``: the same
  on rankings already turned into grade rows (each document graded once, many rankings of it scored)
- ``list_metrics()``, ``PRIMARY_SCORECARD``, ``SECONDARY_METRICS``, ``SCORECARD_VERSION``
"""

from tuner.metrics.batch import MAX_GRADE, RankingBatch, check_relevance_level, from_grades, prepare
from tuner.metrics.gains import GAIN_SCHEMES, gain_table
from tuner.metrics.registry import Metric, MetricFamily, resolve
from tuner.metrics.scorecard import (
    DEFAULT_METRICS,
    PRIMARY_METRIC,
    PRIMARY_SCORECARD,
    SCORECARD_FORMULA,
    SCORECARD_VERSION,
    SECONDARY_METRICS,
    aggregate,
    batch_depths,
    judged_at_k,
    list_metrics,
    primary_metric_score,
    score_arrays,
    score_batch,
    score_prepared,
    score_rankings,
    score_rankings_with_coverage,
)

__all__ = [
    "DEFAULT_METRICS",
    "GAIN_SCHEMES",
    "MAX_GRADE",
    "PRIMARY_METRIC",
    "PRIMARY_SCORECARD",
    "SCORECARD_FORMULA",
    "SCORECARD_VERSION",
    "SECONDARY_METRICS",
    "Metric",
    "MetricFamily",
    "RankingBatch",
    "aggregate",
    "batch_depths",
    "check_relevance_level",
    "from_grades",
    "gain_table",
    "judged_at_k",
    "list_metrics",
    "prepare",
    "primary_metric_score",
    "resolve",
    "score_arrays",
    "score_batch",
    "score_prepared",
    "score_rankings",
    "score_rankings_with_coverage",
]
