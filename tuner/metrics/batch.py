"""Turn rankings + qrels (Python dicts) into padded numpy arrays, once per call.

Every metric then works on all queries at once. The only per-document Python work is
one dict lookup per ranked document, done here, so the metric functions stay pure
array arithmetic.
"""

from __future__ import annotations

import operator
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import cached_property
from itertools import repeat
from typing import NoReturn

import numpy as np

from tuner.errors import InputError
from tuner.metrics.gains import check_gain_scheme, gain_table

#: Top of the product's grade scale: Fully=3, Mostly=2, Weakly=1, Irrelevant=0.
MAX_GRADE = 3

# Marks a ranked document that has no judgment (grades travel as bytes);
# it becomes grade 0 with judged=False.
_UNJUDGED = 255


@dataclass(frozen=True, eq=False)
class RankingBatch:
    """All queries of one scoring call as padded arrays (row i = query_ids[i]).

    ``grades[i, r]`` is the grade of the document at rank r+1 (0 when unjudged, past
    the end of the ranking, or a repeat of a document already ranked above).
    ``grade_counts[i, g]`` counts query i's judged documents with grade g, so
    recall-style denominators never need the qrels again. ``ideal_grades[i]`` holds
    query i's judged grades sorted best first (the ideal ranking for NDCG).
    ``relevance_level`` is trec_eval's ``-l``: binary metrics count grade >= it as relevant.
    """

    query_ids: tuple[str, ...]
    grades: np.ndarray  # (n_queries, depth) int8
    judged: np.ndarray  # (n_queries, depth) bool
    lengths: np.ndarray  # (n_queries,) int64, ranking length (before truncation)
    ideal_grades: np.ndarray  # (n_queries, ideal_depth) int8, sorted descending
    grade_counts: np.ndarray  # (n_queries, max_grade + 1) int64
    gains: str = "linear"
    max_grade: int = MAX_GRADE
    relevance_level: int = 1
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
    relevance_level: int = 1,
) -> RankingBatch:
    """Build a RankingBatch.

    ``rankings`` are already in system order. A query missing from ``rankings`` (or
    with an empty list) was handed off / answered nothing and scores 0; a query
    missing from ``qrels`` has no relevant documents. ``depth`` keeps only the first
    ``depth`` ranks (None = the longest ranking); ``ideal_depth`` likewise bounds
    the ideal ranking (None = every judged document). Bounding both to the largest
    cutoff asked for saves work and changes no @k value. ``relevance_level`` (trec_eval
    ``-l``) is the grade from which binary metrics (P, Recall, Success, MRR, AP) count a
    document as relevant; graded metrics ignore it, as trec_eval's ndcg does.
    """
    check_gain_scheme(gains)
    if not 0 < max_grade < _UNJUDGED:
        raise ValueError(f"max_grade must be in 1..{_UNJUDGED - 1}, got {max_grade}")
    relevance_level = check_relevance_level(relevance_level, max_grade)
    query_ids = tuple(query_ids)
    _check_unique(query_ids)
    no_labels: Mapping[str, int] = {}
    labels = [qrels.get(qid) or no_labels for qid in query_ids]
    grade_counts = _grade_counts(labels, query_ids, max_grade)
    ranked = [rankings.get(qid) or () for qid in query_ids]
    lengths = np.fromiter(map(len, ranked), dtype=np.int64, count=len(ranked))
    width = int(lengths.max(initial=0)) if depth is None else depth
    raw = _pad(_ranked_grade_bytes(ranked, labels, width), np.minimum(lengths, width), width)
    judged = (raw != _UNJUDGED) & (np.arange(width) < lengths[:, None])
    grades = np.where(judged, raw, 0).astype(np.int8)
    ideal_grades = _ideal_grades(grade_counts, ideal_depth)
    return RankingBatch(
        query_ids=query_ids,
        grades=grades,
        judged=judged,
        lengths=lengths,
        ideal_grades=ideal_grades,
        grade_counts=grade_counts,
        gains=gains,
        max_grade=max_grade,
        relevance_level=relevance_level,
        depth_limit=depth,
        ideal_depth_limit=ideal_depth,
    )


def from_grades(
    query_ids: Sequence[str],
    grades: np.ndarray,
    judged: np.ndarray,
    lengths: np.ndarray,
    grade_counts: np.ndarray,
    *,
    gains: str = "linear",
    depth: int | None = None,
    ideal_depth: int | None = None,
    max_grade: int = MAX_GRADE,
    relevance_level: int = 1,
) -> RankingBatch:
    """The RankingBatch of rankings already turned into grade rows, equal to ``prepare``'s
    for the same rankings: ``grades`` / ``judged`` (n, width) as ``prepare`` sets them
    (width = ``depth``, or the longest ranking when None), ``lengths`` the rankings'
    lengths and ``grade_counts`` (n, max_grade + 1) each query's judged documents per
    grade (``prepare``'s, e.g. from ``prepare({}, qrels, ids, depth=0)``). For callers
    that grade every document once and score many rankings of those documents (the
    gate solver scores each query at every score cut-off)."""
    check_gain_scheme(gains)
    return RankingBatch(
        query_ids=tuple(query_ids),
        grades=grades,
        judged=judged,
        lengths=lengths,
        ideal_grades=_ideal_grades(grade_counts, ideal_depth),
        grade_counts=grade_counts,
        gains=gains,
        max_grade=max_grade,
        relevance_level=check_relevance_level(relevance_level, max_grade),
        depth_limit=depth,
        ideal_depth_limit=ideal_depth,
    )


def check_relevance_level(level: int, max_grade: int = MAX_GRADE) -> int:
    """Return ``level`` when it is a grade in 1..max_grade, else raise InputError with the fix."""
    # 0 would make every unjudged document (grade 0 here) relevant, unlike trec_eval,
    # and a level above the top grade would make every binary metric silently 0.
    if isinstance(level, bool) or not hasattr(level, "__index__") or not 1 <= operator.index(level) <= max_grade:
        raise InputError(
            f"relevance level {level!r} is not a grade in 1..{max_grade}; use 1 (grade >= 1 is relevant, "
            f"the default) up to {max_grade} (e.g. -l 2 for grade >= 2, as TREC DL reports MAP)"
        )
    return operator.index(level)


def _check_unique(query_ids: tuple[str, ...]) -> None:
    if len(set(query_ids)) != len(query_ids):
        seen: set[str] = set()
        dup = ""
        for q in query_ids:
            if q in seen:
                dup = q
                break
            seen.add(q)
        raise InputError(f"query id {dup!r} is listed twice in query_ids; give each query once")


def _ranked_grade_bytes(rankings: list[Sequence[str]], labels: list[Mapping[str, int]], width: int) -> bytes:
    """Grades of the first ``width`` ranked documents of every query, concatenated.

    One C-level dict lookup per document (map + dict.get, one byte per grade) is
    the hot path of the whole scorecard; everything after it is numpy.
    """
    chunks = []
    for ranking, judged in zip(rankings, labels, strict=True):
        top = ranking if len(ranking) <= width else ranking[:width]
        if len(set(top)) == len(top):
            chunks.append(bytes(map(judged.get, top, repeat(_UNJUDGED))))
        else:
            chunks.append(bytes(_grades_without_repeats(top, judged)))
    return b"".join(chunks)


def _grades_without_repeats(ranking: Sequence[str], judged: Mapping[str, int]) -> list[int]:
    # A repeated document is not credited twice: later copies count as judged
    # irrelevant, so a backend cannot inflate precision by echoing a hit.
    seen: set[str] = set()
    grades = []
    for doc in ranking:
        if doc in seen:
            grades.append(0)
        else:
            seen.add(doc)
            grades.append(judged.get(doc, _UNJUDGED))
    return grades


def _grade_counts(labels: list[Mapping[str, int]], query_ids: tuple[str, ...], max_grade: int) -> np.ndarray:
    """(n_queries, max_grade + 1): how many judged documents each query has per grade."""
    try:
        flat = np.frombuffer(b"".join([bytes(judged.values()) for judged in labels]), dtype=np.uint8)
    except (TypeError, ValueError):  # bytes() refuses negatives, > 255 and non-integers
        flat = None
    if flat is None or (flat.size and int(flat.max()) > max_grade):
        _raise_bad_grade(labels, query_ids, max_grade)
    counts = np.fromiter(map(len, labels), dtype=np.int64, count=len(labels))
    rows = np.repeat(np.arange(len(labels)), counts)
    per_grade = np.bincount(rows * (max_grade + 1) + flat, minlength=len(labels) * (max_grade + 1))
    return per_grade.reshape(len(labels), max_grade + 1)


def _raise_bad_grade(labels: list[Mapping[str, int]], query_ids: tuple[str, ...], max_grade: int) -> NoReturn:
    for qid, judged in zip(query_ids, labels, strict=True):
        for doc, grade in judged.items():
            if not (hasattr(grade, "__index__") and 0 <= operator.index(grade) <= max_grade):
                raise InputError(
                    f"query {qid!r} doc {doc!r}: grade {grade!r} is not an integer in 0..{max_grade}; "
                    "map the source grades onto 0..3 (e.g. --grade-map '1:3,2:2,3:1,4:1,-1:0')"
                )
    # not reached: the caller saw a grade that bytes() refuses, and the loop names it
    raise InputError(f"a grade is not an integer in 0..{max_grade}; map the source grades onto 0..3")


def _ideal_grades(grade_counts: np.ndarray, ideal_depth: int | None) -> np.ndarray:
    """Each query's judged grades sorted best first, built from the per-grade counts.

    The ideal grade at position j is the number of levels g >= 1 with more than j
    documents graded >= g, so no per-query sort is needed.
    """
    at_least = np.cumsum(grade_counts[:, ::-1], axis=1)[:, ::-1]  # at_least[:, g] = #docs with grade >= g
    width = int(at_least[:, 1].max(initial=0)) if ideal_depth is None else ideal_depth
    positions = np.arange(width)
    ideal = np.zeros((grade_counts.shape[0], width), dtype=np.int8)
    for level in range(1, grade_counts.shape[1]):
        ideal += positions < at_least[:, level, None]
    return ideal


def _pad(flat_bytes: bytes, kept: np.ndarray, width: int) -> np.ndarray:
    """Scatter concatenated rows (row i has kept[i] entries) into a padded matrix."""
    flat = np.frombuffer(flat_bytes, dtype=np.uint8)
    out = np.zeros((kept.size, width), dtype=np.uint8)
    if flat.size:
        rows = np.repeat(np.arange(kept.size), kept)
        starts = np.repeat(np.cumsum(kept) - kept, kept)
        out[rows, np.arange(flat.size) - starts] = flat
    return out
