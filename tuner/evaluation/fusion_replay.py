"""Fusion replayed from one retrieval: the response a backend would give at another
fusion setting, computed from its per-source candidate lists (pure).

A hybrid backend asked to explain a search (the reference backend: ``"explain": true``
in the request body, docs/backend.md) returns, for every date tier it tries, each
source's candidates in rank order with their raw scores, and per candidate its dense
cosine and day. Fusion weights, the RRF k, the score normalisation, the recency boost,
the citation cut and the confidence gate only recombine those lists; which candidates
each source returns does not depend on them. So one retrieval answers for every such
setting: ``replay(explain, setting, top_k)`` gives the ``ParsedResponse`` the backend
would have returned, and ``evaluate_responses`` scores it like a live one.

The model is the standard one, and the reference backend's exactly (a test compares
replayed and live responses, scores to the last bit):

- RRF: ``sum_s w_s / (k + rank_s) / (sum(w) / (k + 1))``;
- linear: ``sum_s w_s * norm_s(score) / sum(w)``, ``norm`` min-max over the source's
  candidates (all 1.0 when they tie) or the z-score through the normal CDF (all 0.5);
- a source of weight 0 adds no candidates; ``sum(w)`` is over every source;
- ``plain_sum``: the weighted sum itself (no division, no scaling), as Azure AI Search
  fuses (``sum_s w_s / (60 + rank_s)``);
- recency: ``score * (1 + weight * 0.5 ** (age / half_life)) / (1 + weight)``, undated
  documents never boosted (factor ``1 / (1 + weight)``), future ones age 0;
- ranking by score, ties by corpus order; the first date tier with any fused candidate
  answers (its level is the fallback level), none: ``empty``;
- confidence: the mean cosine of the top ``top_m`` before the citation cut, floored at
  0; ``min_score`` keeps scores >= it (less 1e-9); handoff when confidence < threshold
  or nothing is kept.

A backend whose fusion differs from this model is not replayed correctly; a study
verifies its best replayed settings live for that reason.

The arithmetic parallels backend/fusion_backend/fusion.py on purpose: the tuner never
imports a backend (it is the model the tuner declares, for any backend), and importing
the reference one would make the exactness test compare the code with itself. That
test is what keeps the two in step.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np

from tuner.errors import ResponseMappingError
from tuner.evaluation.mapping import Hit, ParsedResponse

#: fallback level of a response no tier answered
EMPTY_LEVEL = "empty"
_EPS = 1e-9  # a score equal to min_score up to float rounding is kept (as the backend does)


@dataclass(frozen=True)
class FusionSetting:
    """One setting of everything replay recombines. ``weights``: per source (a source the
    explanation lists but ``weights`` omits weighs 1.0, as in the backend's config)."""

    method: Literal["rrf", "linear"] = "rrf"
    weights: Mapping[str, float] = field(default_factory=dict)
    rrf_k: float = 60.0
    normalization: Literal["minmax", "z"] = "minmax"
    recency_weight: float = 0.0
    recency_half_life_days: float = 30.0
    min_score: float = 0.0
    confidence_threshold: float = 0.0
    top_m: int = 3
    normalize_weights: bool = True  # False: fused scores not divided by the weight sum (as served)
    #: True: the fused score is the plain weighted sum, ``sum_s w_s / (k + rank_s)`` or
    #: ``sum_s w_s * norm_s``, neither divided by the weights nor scaled to 1 (Azure AI
    #: Search's RRF; a setting read from an engine's sub-scores, tuner.evaluation.subscores)
    plain_sum: bool = False

    @classmethod
    def served(cls, explain: Mapping[str, Any]) -> FusionSetting:
        """The setting the explained response was computed at."""
        f, r = explain["fusion"], explain["recency"]
        return cls(
            method=f["method"],
            weights=dict(f["weights"]),
            rrf_k=float(f["rrf_k"]),
            normalization=f["normalization"],
            recency_weight=float(r["weight"]),
            recency_half_life_days=float(r["half_life_days"]),
            min_score=float(explain["citation"]["min_score"]),
            confidence_threshold=float(explain["confidence"]["threshold"]),
            top_m=int(explain["confidence"]["top_m"]),
            normalize_weights=bool(f.get("normalize_weights", True)),
        )


@dataclass(frozen=True)
class Explained:
    """An explanation decoded once into arrays (per tier, per source: corpus indices and
    raw scores; per candidate: id, title, day, cosine), replayed at many settings."""

    sources: tuple[str, ...]
    today: int
    tiers: tuple[tuple[str, dict[str, tuple[np.ndarray, np.ndarray]]], ...]
    doc_ids: dict[int, str]
    titles: dict[int, str | None]
    days: dict[int, int | None]
    cosines: dict[int, float]

    @classmethod
    def parse(cls, explain: Mapping[str, Any], query_id: str = "?") -> Explained:
        if explain.get("rerank"):
            raise ResponseMappingError(
                f"query {query_id}: the backend reranks its hits from their text (rerank.depth "
                f"{explain['rerank'].get('depth')}), which fusion replay cannot redo: set rerank.depth: 0 "
                "in the backend config for a replay study, or tune it with measured trials"
            )
        try:
            sources = tuple(explain["sources"])
            tiers = tuple(
                (
                    str(t["level"]),
                    {
                        name: (np.asarray(lst["docs"], dtype=np.int64), np.asarray(lst["scores"], dtype=np.float64))
                        for name, lst in t["sources"].items()
                    },
                )
                for t in explain["tiers"]
            )
            docs = {int(k): v for k, v in explain["docs"].items()}
            today = int(explain["recency"]["today"])
        except (KeyError, TypeError, ValueError) as exc:
            raise ResponseMappingError(
                f"query {query_id}: the explanation lacks {exc} or is malformed; fusion replay needs the backend's "
                'per-tier, per-source candidate lists (reference backend: "explain": true in the request)'
            ) from None
        return cls(
            sources,
            today,
            tiers,
            {d: v["doc_id"] for d, v in docs.items()},
            {d: v.get("title") for d, v in docs.items()},
            {d: v.get("day") for d, v in docs.items()},
            {d: float(v["similarity"]) for d, v in docs.items()},
        )


@dataclass(frozen=True)
class Replayed:
    """A replayed answer as arrays: corpus indices and scores of the hits (best first,
    cut to ``top_k``), the confidence, whether it is handed off, the fallback level."""

    docs: np.ndarray
    scores: np.ndarray
    confidence: float
    handoff: bool
    level: str


def replay(explained: Explained, setting: FusionSetting, top_k: int) -> ParsedResponse:
    """The response at ``setting`` (module doc), cut to ``top_k``."""
    r = replay_arrays(explained, setting, top_k)
    e = explained
    hits = tuple(
        Hit(e.doc_ids[d], float(v), e.titles[d]) for d, v in zip(r.docs.tolist(), r.scores.tolist(), strict=True)
    )
    return ParsedResponse(hits, r.confidence, r.handoff, r.level)


def replay_arrays(explained: Explained, setting: FusionSetting, top_k: int) -> Replayed:
    """``replay`` without building the response's objects (a search scores thousands)."""
    weights = {name: float(setting.weights.get(name, 1.0)) for name in explained.sources}
    total = _total(weights, setting)
    for level, lists in explained.tiers:
        parts = [
            (lists[name][0], lists[name][1], weights[name])
            for name in explained.sources
            if name in lists and weights[name] > 0
        ]
        docs, scores = _fuse(parts, setting, total)
        if len(docs):
            scores = scores * _recency(docs, explained, setting)
            return _answer(level, docs, scores, explained, setting, top_k)
    return Replayed(np.empty(0, dtype=np.int64), np.empty(0, dtype=np.float64), 0.0, True, EMPTY_LEVEL)


def _total(weights: Mapping[str, float], s: FusionSetting) -> float:
    """What the weighted sum is divided by (``_fuse``'s ``total``)."""
    return sum(weights.values()) if s.normalize_weights and not s.plain_sum else 1.0


def _fuse(
    parts: Sequence[tuple[np.ndarray, np.ndarray, float]], s: FusionSetting, total: float
) -> tuple[np.ndarray, np.ndarray]:
    if s.method == "rrf":
        contrib = [(d, w / (s.rrf_k + np.arange(1, len(d) + 1, dtype=np.float64))) for d, _, w in parts]
        scale = 1.0 if s.plain_sum else total / (s.rrf_k + 1.0)
    else:
        normalise = _minmax if s.normalization == "minmax" else _z_cdf
        contrib = [(d, w * normalise(sc)) for d, sc, w in parts]
        scale = total
    if not contrib or all(len(d) == 0 for d, _ in contrib):
        return np.empty(0, dtype=np.int64), np.empty(0, dtype=np.float64)
    docs = np.concatenate([d for d, _ in contrib])
    values = np.concatenate([c for _, c in contrib])
    unique, inverse = np.unique(docs, return_inverse=True)
    return unique, np.bincount(inverse, weights=values) / scale


def _minmax(scores: np.ndarray) -> np.ndarray:
    if scores.size == 0:
        return scores
    lo, hi = scores.min(), scores.max()
    if hi == lo:
        return np.ones_like(scores)
    return (scores - lo) / (hi - lo)


def _z_cdf(scores: np.ndarray) -> np.ndarray:
    if scores.size == 0:
        return scores
    std = scores.std()
    if std == 0:
        return np.full_like(scores, 0.5)
    z = (scores - scores.mean()) / std
    return np.array([0.5 * (1.0 + math.erf(v / math.sqrt(2.0))) for v in z])


def _recency(docs: np.ndarray, e: Explained, s: FusionSetting) -> np.ndarray:
    if s.recency_weight == 0:
        return np.ones(docs.shape, dtype=np.float64)
    days = [e.days[d] for d in docs.tolist()]
    dated = np.array([d is not None for d in days])
    day = np.array([e.today if d is None else d for d in days], dtype=np.int64)
    age = np.maximum(e.today - day, 0).astype(np.float64)
    decay = np.where(dated, np.power(0.5, age / s.recency_half_life_days), 0.0)
    return (1.0 + s.recency_weight * decay) / (1.0 + s.recency_weight)


def _answer(level: str, docs: np.ndarray, scores: np.ndarray, e: Explained, s: FusionSetting, top_k: int) -> Replayed:
    order = np.lexsort((docs, -scores))  # score desc, then corpus order
    docs, scores = docs[order], scores[order]
    top = np.asarray([e.cosines[d] for d in docs[: s.top_m].tolist()], dtype=np.float64)
    confidence = max(0.0, float(top.mean())) if top.size else 0.0
    kept = scores >= s.min_score - _EPS
    docs, scores = docs[kept][:top_k], scores[kept][:top_k]
    handoff = confidence < s.confidence_threshold or not len(docs)
    return Replayed(docs, scores, confidence, handoff, level)
