"""Turn rankings + qrels (Python dicts) into padded numpy arrays, once per call.

Every metric then works on all queries at once. The only per-document Python work is
one dict lookup per ranked document, done here, so the metric functions stay pure
array arithmetic.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import cached_property

import numpy as np

from tuner.errors import InputError
from tuner.metrics.gains import check_gain_scheme, gain_table

#: Top of the product's grade scale: Fully=3, Mostly=2, Weakly=1, Irrelevant=0.
MAX_GRADE = 3

# Marks a ranked document that has no judgment; becomes grade 0 + judged=False.
_UNJUDGED = -1


@dataclass(frozen=True, eq=False)
class RankingBatch:
    """All queries of one scoring call as padded arrays (row i = query_ids[i]).

    ``grades[i, r]`` is the grade of the document at rank r+1 (0 when unjudged, past
    the end of the ranking, or a repeat of a document already ranked above).
    ``grade_counts[i, g]`` counts query i's judged documents with grade g, so
    recall-style denominators never need the qrels again. ``ideal_grades[i]`` holds
    query i's judged grades sorted best first (the ideal ranking for NDCG).
    """

    query_ids: tuple[str, ...]
    grades: np.ndarray  # (n_queries, depth) int8
    judged: np.ndarray  # (n_queries, depth) bool
    lengths: np.ndarray  # (n_queries,) int64, ranking length (before truncation)
    ideal_grades: np.ndarray  # (n_queries, ideal_depth) int8, sorted descending
    grade_counts: np.ndarray  # (n_queries, max_grade + 1) int64
    gains: str = "linear"
    max_grade: int = MAX_GRADE
    depth_limit: int | None = None  # prepare(depth=...): metrics may not cut deeper
    ideal_depth_limit: int | None = None

    @property
    def n_queries(self) -> int:
        return len(self.query_ids)

    @property
    def depth(self) -> int:
        return self.grades.shape[1]

    @cached_property
    def gain_values(self) -> np.ndarray:
        """Gain of each grade 0..max_grade under this batch's gain scheme."""
        return gain_table(self.gains, self.max_grade)

    @cached_property
    def gain_matrix(self) -> np.ndarray:
        """Gain of every ranked position (n_queries, depth), float64."""
        return self.gain_values[self.grades]

    @cached_property
    def ideal_gain_matrix(self) -> np.ndarray:
        """Gains of the ideal ranking (n_queries, ideal_depth), best first."""
        return self.gain_values[self.ideal_grades]

    @cached_property
    def total_gain(self) -> np.ndarray:
        """Sum of the gains of every judged document of each query."""
        return self.grade_counts @ self.gain_values

    def relevant_count(self, min_grade: int) -> np.ndarray:
        """Number of judged documents with grade >= min_grade, per query."""
        return self.grade_counts[:, min_grade:].sum(axis=1)

    def top(self, k: int | None) -> np.ndarray:
        """Grades of the first k positions (all positions when k is None)."""
        return self.grades if k is None else self.grades[:, :k]


def prepare(
    rankings: Mapping[str, Sequence[str]],
    qrels: Mapping[str, Mapping[str, int]],
    query_ids: Sequence[str],
    *,
    gains: str = "linear",
    depth: int | None = None,
    ideal_depth: int | None = None,
    max_grade: int = MAX_GRADE,
) -> RankingBatch:
    """Build a RankingBatch.

    ``rankings`` are already in system order. A query missing from ``rankings`` (or
    with an empty list) was handed off / answered nothing and scores 0; a query
    missing from ``qrels`` has no relevant documents. ``depth`` keeps only the first
    ``depth`` ranks (None = the longest ranking); ``ideal_depth`` likewise bounds
    the ideal ranking (None = every judged document). Bounding both to the largest
    cutoff asked for saves work and changes no @k value.
    """
    check_gain_scheme(gains)
    query_ids = tuple(query_ids)
    _check_unique(query_ids)
    empty: tuple[str, ...] = ()
    ranked = [_ranked_grades(rankings.get(qid, empty), qrels.get(qid, {}), qid) for qid in query_ids]
    lengths = np.fromiter((len(r) for r in ranked), dtype=np.int64, count=len(ranked))
    raw = _pad(ranked, lengths, depth, fill=0)
    in_ranking = np.arange(raw.shape[1]) < lengths[:, None]
    judged = (raw != _UNJUDGED) & in_ranking
    grades = np.where(judged, raw, 0).astype(np.int8)

    judged_grades = [_qrel_grades(qrels.get(qid, {}), qid, max_grade) for qid in query_ids]
    grade_counts = np.zeros((len(query_ids), max_grade + 1), dtype=np.int64)
    for row, values in enumerate(judged_grades):
        grade_counts[row] = np.bincount(values, minlength=max_grade + 1)
    ideal = [np.sort(values)[::-1] for values in judged_grades]
    ideal_lengths = np.fromiter((len(v) for v in ideal), dtype=np.int64, count=len(ideal))
    ideal_grades = _pad(ideal, ideal_lengths, ideal_depth, fill=0).astype(np.int8)
    return RankingBatch(
        query_ids=query_ids,
        grades=grades,
        judged=judged,
        lengths=lengths,
        ideal_grades=ideal_grades,
        grade_counts=grade_counts,
        gains=gains,
        max_grade=max_grade,
        depth_limit=depth,
        ideal_depth_limit=ideal_depth,
    )


def _check_unique(query_ids: tuple[str, ...]) -> None:
    if len(set(query_ids)) != len(query_ids):
        seen: set[str] = set()
        dup = next(q for q in query_ids if q in seen or seen.add(q))
        raise InputError(f"query id {dup!r} is listed twice in query_ids; give each query once")


def _ranked_grades(ranking: Sequence[str], judgments: Mapping[str, int], qid: str) -> list[int]:
    grades = [judgments.get(doc, _UNJUDGED) for doc in ranking]
    if len(set(ranking)) != len(grades):
        # A repeated document is not credited twice: later copies count as judged
        # irrelevant, so a backend cannot inflate precision by echoing a hit.
        seen: set[str] = set()
        grades = [0 if doc in seen or seen.add(doc) else g for doc, g in zip(ranking, grades)]
    return grades


def _qrel_grades(judgments: Mapping[str, int], qid: str, max_grade: int) -> np.ndarray:
    values = np.fromiter(judgments.values(), dtype=np.int64, count=len(judgments))
    if values.size and (values.min() < 0 or values.max() > max_grade):
        doc, grade = next((d, g) for d, g in judgments.items() if not 0 <= g <= max_grade)
        raise InputError(
            f"query {qid!r} doc {doc!r}: grade {grade} is outside 0..{max_grade}; "
            "map the source grades onto 0..3 (e.g. --grade-map '1:3,2:2,3:1,4:1,-1:0')"
        )
    return values


def _pad(rows: Sequence[Sequence[int]], lengths: np.ndarray, depth: int | None, fill: int) -> np.ndarray:
    """Stack ragged integer rows into a (len(rows), depth) matrix, padded with fill."""
    width = int(lengths.max(initial=0)) if depth is None else depth
    out = np.full((len(rows), width), fill, dtype=np.int64)
    if not rows or width == 0:
        return out
    kept = np.minimum(lengths, width)
    flat = np.fromiter(
        (g for row, n in zip(rows, kept) for g in row[:n]), dtype=np.int64, count=int(kept.sum())
    )
    row_index = np.repeat(np.arange(len(rows)), kept)
    starts = np.cumsum(kept) - kept
    col_index = np.arange(flat.size) - np.repeat(starts, kept)
    out[row_index, col_index] = flat
    return out
