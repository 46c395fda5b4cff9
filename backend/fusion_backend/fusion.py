"""Rank fusion, pure functions over per-source candidate lists.

Every fused score is normalised to 0..1 so ``citation.min_score`` means the same for
both methods:

* RRF: ``sum_s w_s / (k + rank_s)`` divided by its maximum ``sum(w) / (k + 1)``
  (a document ranked first by every enabled source scores 1.0).
* linear: ``sum_s w_s * norm_s(score)`` divided by ``sum(w)``, where ``norm_s`` is
  min-max over that source's candidates, or the z-score mapped through the standard
  normal CDF (z-scores are unbounded; the CDF keeps their order and lands in 0..1).

``total_weight`` is the sum over *enabled* sources, including ones that returned
nothing for this query: a document found by one of two equal sources scores at most 0.5.
With ``fusion.normalize_weights: false`` the caller passes 1.0: scores are then not
divided by the weight sum and leave 0..1 when the weights sum to more than 1.
A document missing from a source gets nothing from it, and a source of weight 0
contributes no candidates at all (weight 0 means "off", not "present with score 0").
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Candidates:
    """One source's candidates in rank order (best first) with its raw scores."""

    docs: np.ndarray  # int64 document indices
    scores: np.ndarray  # raw source scores, same length


@dataclass(frozen=True)
class Fused:
    docs: np.ndarray  # unique document indices
    scores: np.ndarray  # fused scores in 0..1, aligned with docs


def rrf(candidates: Mapping[str, Candidates], weights: Mapping[str, float], k: float, total_weight: float) -> Fused:
    parts = []
    for name, cand in _weighted(candidates, weights).items():
        ranks = np.arange(1, len(cand.docs) + 1, dtype=np.float64)
        parts.append((cand.docs, weights[name] / (k + ranks)))
    return _accumulate(parts, total_weight / (k + 1.0))


def linear(
    candidates: Mapping[str, Candidates], weights: Mapping[str, float], normalization: str, total_weight: float
) -> Fused:
    normalise = NORMALIZATIONS[normalization]
    parts = [(c.docs, weights[name] * normalise(c.scores)) for name, c in _weighted(candidates, weights).items()]
    return _accumulate(parts, total_weight)


def minmax(scores: np.ndarray) -> np.ndarray:
    """(s - min) / (max - min); all 1.0 when every candidate scores the same."""
    scores = np.asarray(scores, dtype=np.float64)
    if scores.size == 0:
        return scores
    lo, hi = scores.min(), scores.max()
    if hi == lo:
        return np.ones_like(scores)
    return (scores - lo) / (hi - lo)


def z_cdf(scores: np.ndarray) -> np.ndarray:
    """Phi((s - mean) / std); all 0.5 when every candidate scores the same."""
    scores = np.asarray(scores, dtype=np.float64)
    if scores.size == 0:
        return scores
    std = scores.std()
    if std == 0:
        return np.full_like(scores, 0.5)
    z = (scores - scores.mean()) / std
    return np.array([0.5 * (1.0 + math.erf(v / math.sqrt(2.0))) for v in z])


NORMALIZATIONS = {"minmax": minmax, "z": z_cdf}


def _weighted(candidates: Mapping[str, Candidates], weights: Mapping[str, float]) -> dict[str, Candidates]:
    return {name: c for name, c in candidates.items() if weights[name] > 0}


def _accumulate(parts: Sequence[tuple[np.ndarray, np.ndarray]], scale: float) -> Fused:
    if not parts or all(len(d) == 0 for d, _ in parts):
        return Fused(np.empty(0, dtype=np.int64), np.empty(0, dtype=np.float64))
    docs = np.concatenate([d for d, _ in parts])
    contrib = np.concatenate([c for _, c in parts])
    unique, inverse = np.unique(docs, return_inverse=True)
    return Fused(unique, np.bincount(inverse, weights=contrib) / scale)
