"""A batch's hits as flat arrays, each document graded once: pure, no I/O.

``HitTable`` holds the hits of every query (queries in order, each query's hits in the
order the service returned them) as flat arrays: the score, the document, and its
grade for the query's labels. ``score_result`` (tuner.evaluation.result) builds one per
batch and keeps it on the BatchResult (``hit_table``). The scorecard's grade rows are
cut from it (``batch``: each query's first n hits, through tuner.metrics.from_grades),
so a batch re-scored with fewer hits (tuner.evaluation.regate: ``filtered``) or at every
score cut-off (the gate solver, tuner.study.gates.threshold) never looks a document up again.

A live answer holds each document once (tuner.evaluation.mapping removes the later
copies before ranks are assigned). The grade rows are those ``tuner.metrics.prepare``
builds from the same rankings as doc-id lists: a list given here with a repeated
document counts it once (later copies: judged, grade 0, as ``prepare`` does), an
unlabelled one is not judged, positions past a ranking's end are neither; the grade
counts and ideal grades come from the same labels. So a ranking scores the same to the
last bit either way (tests/threshold/test_solve_vectorised.py).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from itertools import chain, compress
from operator import attrgetter
from typing import Any

import numpy as np

from tuner import metrics as scorecard

#: the grade of a hit whose document has no label (or whose query is not graded)
UNLABELLED = -1
DOC_ID, SCORE = attrgetter("doc_id"), attrgetter("score")


@dataclass(frozen=True, eq=False)
class HitTable:
    """Every query's hits, flat: query j's are ``[starts[j], starts[j] + counts[j])``."""

    starts: np.ndarray  # (Q,) int64
    counts: np.ndarray  # (Q,) int64
    scores: np.ndarray  # (H,) float64, NaN without a score
    docs: list[str]  # (H,)
    grades: np.ndarray  # (H,) int64: the document's label for its query, UNLABELLED without one
    first: np.ndarray  # (H,) int64: the flat index of the query's first hit with the same document
    graded: np.ndarray  # (Q,) bool: the queries whose hits were graded (the others are UNLABELLED)
    label_counts: np.ndarray  # (Q, MAX_GRADE + 1) int64: each graded query's labels per grade
    _rows: dict[int, tuple[np.ndarray, np.ndarray]] = field(default_factory=dict, repr=False)

    @classmethod
    def build(
        cls,
        query_ids: Sequence[str],
        hit_lists: Sequence[Sequence[Any]],
        qrels: Mapping[str, Mapping[str, int]],
        graded: np.ndarray,
        *,
        doc_of: Any = DOC_ID,
        score_of: Any = SCORE,
    ) -> HitTable:
        """The hits of ``query_ids`` (``hit_lists``: Hit objects, or anything ``doc_of`` and
        ``score_of`` read a document and a score from; a score of None is NaN), the
        queries where ``graded`` graded by their ``qrels`` (checked as ``prepare`` checks
        them: InputError for a grade outside 0..3)."""
        graded = np.asarray(graded, dtype=bool)
        ids = [q for q, g in zip(query_ids, graded.tolist(), strict=True) if g]
        labels = scorecard.prepare({}, qrels, ids, depth=0, ideal_depth=0)
        label_counts = np.zeros((len(query_ids), labels.grade_counts.shape[1]), dtype=np.int64)
        label_counts[graded] = labels.grade_counts
        counts = np.fromiter(map(len, hit_lists), dtype=np.int64, count=len(hit_lists))
        starts = np.cumsum(counts) - counts
        flat = list(chain.from_iterable(hit_lists))
        docs = list(map(doc_of, flat))
        grades = np.full(len(docs), UNLABELLED, dtype=np.int64)
        first = np.arange(len(docs), dtype=np.int64)
        no_labels: Mapping[str, int] = {}
        for j, (a, n) in enumerate(zip(starts.tolist(), counts.tolist(), strict=True)):
            if not n:
                continue
            own = docs[a : a + n]
            if len(set(own)) < n:
                seen: dict[str, int] = {}
                first[a : a + n] = [seen.setdefault(d, a + i) for i, d in enumerate(own)]
            if graded[j]:
                judged = qrels.get(query_ids[j]) or no_labels
                grades[a : a + n] = np.fromiter(map(judged.get, own, [UNLABELLED] * n), dtype=np.int64, count=n)
        scores = np.array(list(map(score_of, flat)), dtype=np.float64).reshape(-1)  # None -> NaN
        return cls(starts, counts, scores, docs, grades, first, graded, label_counts)

    def filtered(self, keep: np.ndarray) -> HitTable:
        """The table of the hits where ``keep`` (H,) holds, in the same order."""
        kept = np.flatnonzero(keep)
        counts = np.bincount(np.repeat(np.arange(len(self.counts)), self.counts)[keep], minlength=len(self.counts))
        starts = np.cumsum(counts) - counts
        docs = list(compress(self.docs, keep.tolist()))
        first = np.arange(kept.size, dtype=np.int64)
        repeated = self.first[kept] != kept
        if repeated.any():  # a kept later copy: point it at the first kept copy
            owner = np.repeat(np.arange(len(counts)), counts)
            for j in np.unique(owner[repeated]).tolist():
                a, n = int(starts[j]), int(counts[j])
                seen: dict[str, int] = {}
                first[a : a + n] = [seen.setdefault(d, a + i) for i, d in enumerate(docs[a : a + n])]
        return HitTable(
            starts, counts, self.scores[kept], docs, self.grades[kept], first, self.graded, self.label_counts
        )

    def grade_rows(self, rows: np.ndarray, lengths: np.ndarray, width: int) -> tuple[np.ndarray, np.ndarray]:
        """(grades, judged), (len(rows), width): the ranking of each query of ``rows`` made of
        its first ``lengths`` hits, as ``prepare`` sets the rows."""
        grades, judged = self._whole_lists(width)
        shown = np.arange(width)[None, :] < lengths[:, None]
        return np.where(shown, grades[rows], 0).astype(np.int8), judged[rows] & shown

    def _whole_lists(self, width: int) -> tuple[np.ndarray, np.ndarray]:
        """(grades, judged), (Q, width): every query's whole list as a ranking (computed once per width)."""
        if width not in self._rows:
            n = np.minimum(self.counts, width)
            owner = np.repeat(np.arange(len(self.counts)), n)
            pos = np.arange(owner.size) - np.repeat(np.cumsum(n) - n, n)
            hit = self.starts[owner] + pos
            grades = np.zeros((len(self.counts), width), dtype=np.int8)
            judged = np.zeros((len(self.counts), width), dtype=bool)
            grade, repeat = self.grades[hit], self.first[hit] != hit
            grades[owner, pos] = np.where(repeat, 0, np.maximum(grade, 0))
            judged[owner, pos] = repeat | (grade != UNLABELLED)
            self._rows[width] = grades, judged
        return self._rows[width]

    def batch(
        self,
        query_ids: Sequence[str],
        rows: np.ndarray,
        lengths: np.ndarray,
        *,
        gains: str,
        depth: int | None,
        ideal_depth: int | None,
    ) -> scorecard.RankingBatch:
        """The RankingBatch ``prepare`` builds, at these depths, from one ranking per entry of
        ``rows`` (graded queries): the query's first ``lengths`` hits."""
        width = int(lengths.max(initial=0)) if depth is None else depth
        grades, judged = self.grade_rows(rows, lengths, width)
        return scorecard.from_grades(
            query_ids,
            grades,
            judged,
            lengths.astype(np.int64),
            self.label_counts[rows],
            gains=gains,
            depth=depth,
            ideal_depth=ideal_depth,
        )
