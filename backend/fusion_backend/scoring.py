"""Recency boost and the confidence gate, pure functions.

Recency: ``score * (1 + weight * 0.5 ** (age_days / half_life_days)) / (1 + weight)``.
The division keeps scores in 0..1 (a document dated ``now`` keeps its fused score,
older ones lose up to a factor ``1 / (1 + weight)``); weight 0 leaves scores unchanged.
Future-dated documents count as age 0, undated ones as infinitely old.

Confidence: the mean cosine between the query and its top-m hits in the dense space,
floored at 0; no hits means confidence 0.
"""

from __future__ import annotations

import numpy as np

from .corpus import NO_DATE


def recency_factor(days: np.ndarray, today: int, half_life_days: float, weight: float) -> np.ndarray:
    days = np.asarray(days)
    if weight == 0:
        return np.ones(days.shape, dtype=np.float64)
    age = np.maximum(today - days.astype(np.int64), 0).astype(np.float64)
    decay = np.where(days == NO_DATE, 0.0, np.power(0.5, age / half_life_days))
    return (1.0 + weight * decay) / (1.0 + weight)


def confidence(cosines_of_ranked_hits: np.ndarray, top_m: int) -> float:
    top = np.asarray(cosines_of_ranked_hits, dtype=np.float64)[:top_m]
    if top.size == 0:
        return 0.0
    return max(0.0, float(top.mean()))
