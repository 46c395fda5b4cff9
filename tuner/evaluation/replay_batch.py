"""A whole explained batch replayed at one fusion setting in a few array operations (pure).

``tuner.evaluation.fusion_replay.replay`` answers one query at a time: a few dozen numpy
calls per query, ~70 us each time, which is most of a fusion search's cost. Here the
explanations of every query are flattened once per *active pattern* (which sources weigh
more than 0, since a source of weight 0 adds no candidates and can change the answering
date tier): per query the first tier with candidates, its candidates (the union of the
active sources' lists, in corpus order) and each source's entries with their rank and
their min-max and z-normalised scores. A setting is then a handful of flat operations:
each entry's contribution, one ``bincount`` into the candidates, the recency factor, one
``lexsort`` by (query, score desc, corpus order), the citation cut and the top-k cut.

Every operation is the one ``replay`` does, on the same values in the same order (the
contributions to a candidate are added source by source, as ``replay``'s bincount adds
them), so the result is the same to the last bit; the confidence is each query's own
``mean`` over its top ``top_m`` cosines, as there. tests/evaluation/test_fusion_replay.py
compares the two at every setting it serves live.

``ReplayBatch.table(setting)`` gives the replayed hits as the gate solver reads them
(a ``HitTable`` graded by the query's labels, each query's confidence and handoff).
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import Any

import numpy as np
from numpy.typing import ArrayLike

from tuner.errors import ResponseMappingError
from tuner.evaluation.fusion_replay import (
    _EPS,
    Explained,
    FusionSetting,
    _minmax,
    _total,
    _z_cdf,
)
from tuner.evaluation.hits import UNLABELLED, HitTable


@dataclass(frozen=True)
class Replayed:
    """A batch replayed at one setting: the hits (graded), and per query its confidence
    (-inf for a failed query), whether it is handed off, and whether it failed."""

    table: HitTable
    confidence: np.ndarray
    handoff: np.ndarray
    failed: np.ndarray


@dataclass(frozen=True, eq=False)
class _Flat:
    """One active pattern's candidates and entries over the whole batch."""

    seg: np.ndarray  # (C,) the candidate's query position
    doc: np.ndarray  # (C,) corpus index
    cos: np.ndarray  # (C,) dense cosine
    day: np.ndarray  # (C,) day number (today's for undated)
    dated: np.ndarray  # (C,) bool
    today: np.ndarray  # (C,) the query's today
    doc_id: np.ndarray  # (C,) object: the document's id
    grade: np.ndarray  # (C,) its label for the query, UNLABELLED without
    answered: np.ndarray  # (Q,) bool: some tier had candidates
    cand: np.ndarray  # (E,) the entry's candidate
    src: np.ndarray  # (E,) the entry's source index
    rank: np.ndarray  # (E,) float64 rank in its source's list (1-based)
    minmax: np.ndarray  # (E,) min-max normalised score within its list
    zcdf: np.ndarray  # (E,) z-score normalised (normal CDF) within its list

    @cached_property
    def layout(self) -> _Layout:
        return _Layout.of(self.seg, len(self.answered))

    @cached_property
    def stacked_layouts(self) -> dict[int, tuple[_Layout, np.ndarray]]:
        """``stacked(n)`` by n (a grid's chunks are mostly of one size)."""
        return {}

    def stacked(self, n: int) -> tuple[_Layout, np.ndarray]:
        """The layout of ``n`` settings' candidates one after the other, and each of their
        entries' candidate there."""
        if (out := self.stacked_layouts.get(n)) is None:
            copies = np.arange(n, dtype=np.int64)[:, None]
            entries = (copies * len(self.seg) + self.cand[None, :]).ravel()
            out = self.stacked_layouts[n] = (self.layout.stacked(n), entries)
        return out


class ReplayBatch:
    """The explained answers of one batch, replayed as arrays (module doc)."""

    def __init__(
        self,
        explained: Mapping[str, Explained],
        query_ids: Sequence[str],
        graded: ArrayLike,
        qrels: Mapping[str, Mapping[str, int]],
        top_k: int,
    ) -> None:
        self.query_ids = list(query_ids)
        self.graded = np.asarray(graded, dtype=bool)
        self.explained = [explained.get(q) for q in self.query_ids]
        self.failed = np.array([e is None for e in self.explained], dtype=bool)
        first = next((e for e in self.explained if e is not None), None)
        self.sources: tuple[str, ...] = first.sources if first is not None else ()
        self.qrels = qrels
        self.top_k = top_k
        self._flat: dict[tuple[bool, ...], _Flat] = {}
        self._docs: dict[int, _Docs] = {}
        self._lists: dict[tuple[int, int, str], tuple[np.ndarray, np.ndarray, np.ndarray]] = {}
        self.label_counts = HitTable.build(self.query_ids, [()] * len(self.query_ids), qrels, self.graded).label_counts

    def table(self, setting: FusionSetting) -> Replayed:
        """Every query answered as ``setting`` would answer it (module doc)."""
        weights = {name: float(setting.weights.get(name, 1.0)) for name in self.sources}
        total = _total(weights, setting)
        active = tuple(weights[name] > 0 for name in self.sources)
        f = self._flat.get(active)
        if f is None:
            f = self._flat[active] = self._flatten(active)
        w = np.array([weights[name] for name in self.sources], dtype=np.float64)
        n_cand, n_q = len(f.seg), len(self.query_ids)
        if setting.method == "rrf":
            values = w[f.src] / (setting.rrf_k + f.rank)
            scale = 1.0 if setting.plain_sum else total / (setting.rrf_k + 1.0)
        else:
            values = w[f.src] * (f.minmax if setting.normalization == "minmax" else f.zcdf)
            scale = total
        scores = np.bincount(f.cand, weights=values, minlength=n_cand) / scale
        if setting.recency_weight != 0:
            age = np.maximum(f.today - f.day, 0).astype(np.float64)
            decay = np.where(f.dated, np.power(0.5, age / setting.recency_half_life_days), 0.0)
            scores = scores * ((1.0 + setting.recency_weight * decay) / (1.0 + setting.recency_weight))
        else:
            scores = scores * np.ones(n_cand, dtype=np.float64)
        order = _ranked_order(scores, f.seg, f.layout)
        seg, scores = f.seg[order], scores[order]
        counts_all = np.bincount(seg, minlength=n_q)
        starts_all = np.cumsum(counts_all) - counts_all
        conf = self._confidence(f.cos[order], seg, counts_all, starts_all, setting.top_m)
        kept = np.flatnonzero(scores >= setting.min_score - _EPS)
        kept_seg = seg[kept]
        n_kept = np.bincount(kept_seg, minlength=n_q)
        pos = np.arange(kept.size) - np.repeat(np.cumsum(n_kept) - n_kept, n_kept)
        final = kept[pos < self.top_k]
        counts = np.bincount(seg[final], minlength=n_q)
        starts = np.cumsum(counts) - counts
        hit = order[final]
        handoff = ~self.failed & ((conf < setting.confidence_threshold) | (counts == 0))
        table = HitTable(
            starts,
            counts,
            scores[final],
            f.doc_id[hit].tolist(),
            f.grade[hit],
            np.arange(final.size, dtype=np.int64),
            self.graded,
            self.label_counts,
        )
        return Replayed(table, conf, handoff, self.failed)

    def stacked(self, settings: Sequence[FusionSetting], chunk: int = 24) -> Iterator[tuple[list[int], Stacked]]:
        """``settings`` replayed a ``chunk`` at a time, each chunk's settings stacked into one
        set of arrays (``Stacked``): (their positions in ``settings``, the stack), the settings
        of one active pattern together. Each value is the one ``table`` gives the setting:
        the same operations on the same values, row by row (contributions added entry by entry
        into each candidate, ranked by ``_ranked_order``'s order, cut as there), without the
        per-setting ``HitTable``; tests/evaluation/test_replay_stacked.py compares the two."""
        groups: dict[tuple[bool, ...], list[int]] = {}
        for i, setting in enumerate(settings):
            groups.setdefault(self._active(setting), []).append(i)
        for active, members in groups.items():
            for at in range(0, len(members), chunk):
                part = members[at : at + chunk]
                yield part, self._stack(active, [settings[i] for i in part])

    def _active(self, setting: FusionSetting) -> tuple[bool, ...]:
        return tuple(float(setting.weights.get(name, 1.0)) > 0 for name in self.sources)

    def _stack(self, active: tuple[bool, ...], settings: Sequence[FusionSetting]) -> Stacked:
        f = self._flat.get(active)
        if f is None:
            f = self._flat[active] = self._flatten(active)
        n_s, n_cand, n_q = len(settings), len(f.seg), len(self.query_ids)
        w = np.array([[float(s.weights.get(name, 1.0)) for name in self.sources] for s in settings], dtype=np.float64)
        w = w.reshape(n_s, len(self.sources))
        scale = np.empty(n_s, dtype=np.float64)
        values = np.empty((n_s, len(f.cand)), dtype=np.float64)
        for i, s in enumerate(settings):  # each row as ``table`` computes it
            total = _total(dict(zip(self.sources, w[i].tolist(), strict=True)), s)
            if s.method == "rrf":
                np.divide(w[i][f.src], s.rrf_k + f.rank, out=values[i])
                scale[i] = 1.0 if s.plain_sum else total / (s.rrf_k + 1.0)
            else:
                np.multiply(w[i][f.src], f.minmax if s.normalization == "minmax" else f.zcdf, out=values[i])
                scale[i] = total
        layout, entries = f.stacked(n_s)
        sums = np.bincount(entries, weights=values.ravel(), minlength=n_s * n_cand)
        scores = sums.reshape(n_s, n_cand) / scale[:, None]
        decays: dict[float, np.ndarray] = {}
        for i, s in enumerate(settings):
            if s.recency_weight != 0:
                if (decay := decays.get(s.recency_half_life_days)) is None:
                    age = np.maximum(f.today - f.day, 0).astype(np.float64)
                    decay = decays[s.recency_half_life_days] = np.where(
                        f.dated, np.power(0.5, age / s.recency_half_life_days), 0.0
                    )
                scores[i] = scores[i] * ((1.0 + s.recency_weight * decay) / (1.0 + s.recency_weight))
        flat = scores.ravel()
        if f.layout.bits <= 16 and len(flat) and bool((flat >= 0).all()):
            order = _ranked_rows(flat + 0.0, layout)
        else:  # the order _ranked_order gives each setting (a stable sort by score within its query)
            order = np.lexsort((-flat, layout.block))
        # A block's ranking is only read down to top_k (the shown hits: those scoring >= min_score,
        # a prefix of it) and top_m (the confidence): each block's first places, where they sit.
        failed = np.tile(self.failed, n_s)
        top_m = np.array([s.top_m for s in settings], dtype=np.int64)
        cell, block, at = layout.head(max(self.top_k, int(top_m.max(initial=0))))
        conf_at = at < top_m[block // max(n_q, 1)]
        conf = _confidence(f.cos[order[cell[conf_at]] % n_cand], block[conf_at], at[conf_at], n_s * n_q, failed)
        bar = np.array([s.min_score for s in settings], dtype=np.float64) - _EPS
        if n_cand and bool((scores.min(axis=1) >= bar).all()):
            passing = layout.counts  # every candidate scores >= min_score (a cut at the lowest)
        else:
            passing = np.bincount(layout.block, weights=flat >= np.repeat(bar, n_cand), minlength=n_s * n_q)
        final = cell[(at < self.top_k) & (at < passing[block])]
        counts = np.minimum(np.minimum(layout.counts, self.top_k), passing.astype(np.int64))
        threshold = np.repeat(np.array([s.confidence_threshold for s in settings], dtype=np.float64), n_q)
        handoff = ~failed & ((conf < threshold) | (counts == 0))
        hit = order[final]
        return Stacked(
            n_s,
            np.cumsum(counts) - counts,
            counts,
            flat[hit],
            f.grade[hit % max(n_cand, 1)],
            conf.reshape(n_s, n_q),
            handoff.reshape(n_s, n_q),
        )

    def _confidence(
        self, cos: np.ndarray, seg: np.ndarray, counts: np.ndarray, starts: np.ndarray, top_m: int
    ) -> np.ndarray:
        """Per query the mean cosine of its top ``top_m`` candidates (ranked order), floored
        at 0; 0 without candidates; -inf for a failed query. Rows of one length are averaged
        together: numpy reduces each row of a 2-D array as it reduces a 1-D one (the same
        pairwise sum), so each mean is the bits ``replay``'s own gives."""
        n_q = len(counts)
        conf = np.where(self.failed, -math.inf, 0.0)
        m = np.where(self.failed, 0, np.minimum(counts, top_m))
        if not m.any():
            return conf
        pos = np.arange(len(seg)) - starts[seg]
        top = pos < top_m
        padded = np.zeros((n_q, top_m), dtype=np.float64)
        padded[seg[top], pos[top]] = cos[top]
        for n in np.unique(m[m > 0]).tolist():
            rows = np.flatnonzero(m == n)
            conf[rows] = np.maximum(0.0, padded[rows][:, :n].mean(axis=1))
        return conf

    def _flatten(self, active: tuple[bool, ...]) -> _Flat:
        cols: dict[str, list[Any]] = {k: [] for k in ("seg", "doc", "cos", "day", "dated", "today", "doc_id", "grade")}
        ent: dict[str, list[np.ndarray]] = {k: [] for k in ("cand", "src", "rank", "minmax", "zcdf")}
        answered = np.zeros(len(self.query_ids), dtype=bool)
        offset = 0
        names = [name for name, on in zip(self.sources, active, strict=True) if on]
        index = {name: i for i, name in enumerate(self.sources)}
        for j, e in enumerate(self.explained):
            if e is None:
                continue
            for t, (_level, lists) in enumerate(e.tiers):
                parts = [(name, lists[name]) for name in names if name in lists]
                if not parts or all(len(d) == 0 for _, (d, _s) in parts):
                    continue
                docs = np.concatenate([d for _, (d, _s) in parts])
                unique, inverse = np.unique(docs, return_inverse=True)
                answered[j] = True
                table = self._doc_table(j)
                row = np.minimum(np.searchsorted(table.doc, unique), max(len(table.doc) - 1, 0))
                if len(table.doc) == 0 or (table.doc[row] != unique).any():
                    missing = unique[table.doc[row] != unique][0] if len(table.doc) else unique[0]
                    raise ResponseMappingError(
                        f"query {self.query_ids[j]}: the explanation lists candidate {int(missing)} but not in its "
                        "docs; fusion replay needs every candidate's id, day and similarity there"
                    )
                n = len(unique)
                cols["seg"].append(np.full(n, j, dtype=np.int64))
                cols["doc"].append(unique)
                cols["today"].append(np.full(n, e.today, dtype=np.int64))
                for key in ("cos", "day", "dated", "doc_id", "grade"):
                    cols[key].append(getattr(table, key)[row])
                at = 0
                for name, (d, _sc) in parts:
                    m = len(d)
                    rank, minmax, zcdf = self._normalised(j, t, name)
                    ent["cand"].append(offset + inverse[at : at + m])
                    ent["src"].append(np.full(m, index[name], dtype=np.int64))
                    ent["rank"].append(rank)
                    ent["minmax"].append(minmax)
                    ent["zcdf"].append(zcdf)
                    at += m
                offset += n
                break

        def cat(parts: list[Any], dtype: Any) -> np.ndarray:
            return np.concatenate(parts) if parts else np.empty(0, dtype=dtype)

        return _Flat(
            cat(cols["seg"], np.int64),
            cat(cols["doc"], np.int64),
            cat(cols["cos"], np.float64),
            cat(cols["day"], np.int64),
            cat(cols["dated"], bool),
            cat(cols["today"], np.int64),
            cat(cols["doc_id"], object),
            cat(cols["grade"], np.int64),
            answered,
            cat(ent["cand"], np.int64),
            cat(ent["src"], np.int64),
            cat(ent["rank"], np.float64),
            cat(ent["minmax"], np.float64),
            cat(ent["zcdf"], np.float64),
        )

    def _doc_table(self, j: int) -> _Docs:
        """Query ``j``'s explained documents as arrays sorted by corpus index (built once:
        every active pattern reads the same)."""
        if (table := self._docs.get(j)) is None:
            e = self.explained[j]
            assert e is not None
            doc = np.array(sorted(e.doc_ids), dtype=np.int64)
            order = doc.tolist()
            days = [e.days[d] for d in order]
            labels = (self.qrels.get(self.query_ids[j]) or {}) if self.graded[j] else {}
            ids = [e.doc_ids[d] for d in order]
            table = self._docs[j] = _Docs(
                doc,
                np.array([e.cosines[d] for d in order], dtype=np.float64),
                np.array([e.today if d is None else d for d in days], dtype=np.int64),
                np.array([d is not None for d in days], dtype=bool),
                np.array(ids, dtype=object),
                np.array([labels.get(i, UNLABELLED) for i in ids], dtype=np.int64),
            )
        return table

    def _normalised(self, j: int, tier: int, name: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(ranks, min-max, z-CDF) of one explained list, computed once (every active
        pattern that answers from this tier reads the same list the same way)."""
        key = (j, tier, name)
        if (out := self._lists.get(key)) is None:
            e = self.explained[j]
            assert e is not None
            d, sc = e.tiers[tier][1][name]
            out = self._lists[key] = (np.arange(1, len(d) + 1, dtype=np.float64), _minmax(sc), _z_cdf(sc))
        return out


@dataclass(frozen=True, eq=False)
class Stacked:
    """``n`` settings of one batch replayed together (``ReplayBatch.stacked``): row ``s * Q + q``
    is query q at the chunk's setting s. The hits of each row are its ``table`` hits in
    order: ``counts`` of them from ``starts``, their scores (descending within a row) and
    grades (``UNLABELLED`` without a label; no document twice in a row)."""

    n: int
    starts: np.ndarray  # (n * Q,) int64
    counts: np.ndarray  # (n * Q,) int64
    scores: np.ndarray  # (H,) float64
    grades: np.ndarray  # (H,) int64
    confidence: np.ndarray  # (n, Q) -inf for a failed query
    handoff: np.ndarray  # (n, Q) bool


def _confidence(cos: np.ndarray, row: np.ndarray, at: np.ndarray, n_rows: int, failed: np.ndarray) -> np.ndarray:
    """``ReplayBatch._confidence`` from each row's top cosines (``cos`` at place ``at`` of
    ``row``, each row's first places, in order): the rows of one length averaged together,
    as there, so each mean has the same bits."""
    conf = np.where(failed, -math.inf, 0.0)
    m = np.bincount(row, minlength=n_rows)
    m[failed] = 0
    if not m.any():
        return conf
    padded = np.zeros((n_rows, int(m.max())), dtype=np.float64)
    padded[row, at] = cos
    for n in np.unique(m[m > 0]).tolist():
        rows = np.flatnonzero(m == n)
        conf[rows] = np.maximum(0.0, padded[rows][:, :n].mean(axis=1))
    return conf


@dataclass(frozen=True)
class _Docs:
    """One query's explained documents, sorted by corpus index."""

    doc: np.ndarray  # corpus index
    cos: np.ndarray  # dense cosine
    day: np.ndarray  # day number (the query's today for undated)
    dated: np.ndarray  # bool
    doc_id: np.ndarray  # object: the document's id
    grade: np.ndarray  # its label for the query, UNLABELLED without


@dataclass(frozen=True)
class _Layout:
    """Candidates laid out by query: each one's position in its query's block, and the
    blocks' starts and sizes (what the per-query sort of ``_ranked_order`` needs)."""

    pos: np.ndarray  # (C,) int64
    starts: np.ndarray  # (Q,) int64
    counts: np.ndarray  # (Q,) int64
    bits: int  # low bits that hold a position

    @classmethod
    def of(cls, seg: np.ndarray, n_q: int) -> _Layout:
        counts = np.bincount(seg, minlength=n_q).astype(np.int64)
        starts = np.cumsum(counts) - counts
        width = int(counts.max(initial=1))
        return cls(np.arange(len(seg), dtype=np.int64) - starts[seg], starts, counts, max(1, (width - 1).bit_length()))

    @cached_property
    def width(self) -> int:
        """The row length of ``_ranked_rows``' key grid: the largest block."""
        return max(1, int(self.counts.max(initial=1)))

    @cached_property
    def slot(self) -> np.ndarray:
        """(C,) each candidate's cell in that grid (row-major); after the rows are sorted,
        the same cells hold each row's ranked keys, in order."""
        return np.repeat(np.arange(len(self.counts), dtype=np.int64) * self.width, self.counts) + self.pos

    @cached_property
    def base(self) -> np.ndarray:
        """(C,) the start of each candidate's block."""
        return np.repeat(self.starts, self.counts)

    @cached_property
    def block(self) -> np.ndarray:
        """(C,) each candidate's block."""
        return np.repeat(np.arange(len(self.counts), dtype=np.int64), self.counts)

    @cached_property
    def pos_bits(self) -> np.ndarray:
        return self.pos.astype(np.uint64)

    def stacked(self, n: int) -> _Layout:
        """The layout of ``n`` copies of these candidates one after the other (``ReplayBatch.stacked``)."""
        size = len(self.pos)
        out = _Layout(
            np.tile(self.pos, n),
            (np.arange(n, dtype=np.int64)[:, None] * size + self.starts[None, :]).ravel(),
            np.tile(self.counts, n),
            self.bits,
        )
        copies = np.arange(n, dtype=np.int64)[:, None]
        out.__dict__["width"] = self.width
        out.__dict__["slot"] = (copies * (len(self.counts) * self.width) + self.slot[None, :]).ravel()
        out.__dict__["base"] = (copies * size + self.base[None, :]).ravel()
        return out

    def head(self, n: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(cells, blocks, positions) of each block's first ``n`` places, blocks in order:
        where a block's ``n`` best candidates sit once ranked."""
        m = np.minimum(self.counts, n)
        block = np.repeat(np.arange(len(self.counts), dtype=np.int64), m)
        at = np.arange(block.size, dtype=np.int64) - np.repeat(np.cumsum(m) - m, m)
        return self.starts[block] + at, block, at


_ONES = np.uint64(0xFFFF_FFFF_FFFF_FFFF)


def _ranked_order(scores: np.ndarray, seg: np.ndarray, layout: _Layout | None = None) -> np.ndarray:
    """``np.lexsort((doc, -scores, seg))`` for candidates laid out by query, then corpus
    order: each query's candidates by score descending, ties in corpus order.

    Fast path (scores >= 0, as every replayed score is): the bits of a non-negative
    float64 sort as the number does, so each candidate's key is its inverted bits with the
    lowest ``bits`` replaced by its position, one row per query, and each row is sorted
    with numpy's (SIMD) quicksort. Cutting those low bits merges scores closer than about
    2^-44 of each other (RRF sums that differ in the last bit are common), so every run of
    keys that agree above the cut is re-sorted by (exact score descending, position):
    the order is the lexsort's exactly. Otherwise a stable sort by score, then a stable
    sort by query."""
    if layout is not None and layout.bits <= 16 and len(scores) and bool((scores >= 0).all()):
        return _ranked_rows(scores + 0.0, layout)  # + 0.0: no -0.0 (its bits would sort first)
    if len(seg) and seg[-1] >= 2**15:
        return np.lexsort((-scores, seg))  # the layout is (query, corpus) order already
    by_score = np.argsort(-scores, kind="stable")
    return by_score[np.argsort(seg[by_score].astype(np.int16), kind="stable")]


def _ranked_rows(scores: np.ndarray, layout: _Layout) -> np.ndarray:
    bits = np.uint64(layout.bits)
    low = np.uint64((1 << layout.bits) - 1)
    keys = np.full(len(layout.counts) * layout.width, _ONES)
    keys[layout.slot] = ((_ONES - scores.view(np.uint64)) & ~low) | layout.pos_bits
    keys.reshape(len(layout.counts), layout.width).sort(axis=1)
    ranked = keys[layout.slot]  # row by row: the queries' blocks in order
    order = (ranked & low).view(np.int64) + layout.base  # a position: < 2**63
    high = ranked >> bits
    same = (high[1:] == high[:-1]) & (layout.base[1:] == layout.base[:-1])  # runs the cut cannot order
    if same.any():
        member = np.zeros(len(order), dtype=bool)
        member[1:] |= same
        member[:-1] |= same
        at = np.flatnonzero(member)
        run = np.cumsum(~np.concatenate([[False], same])[at])  # a new run where the previous key differs
        sub = order[at]
        order[at] = sub[np.lexsort((sub, -scores[sub], run))]
    return order
