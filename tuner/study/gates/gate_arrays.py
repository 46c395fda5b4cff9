"""One retrieval as arrays, for the gate solver (tuner.study.gates.threshold): pure numpy.

``HitArrays`` holds one array per query field and the retrieval's hits as a
``HitTable`` (tuner.evaluation.hits: flat arrays, each document graded once; a
BatchResult carries its own), so every (threshold, min_score) pair is counted and
scored with array operations instead of per-query Python loops.

The filtered rankings are scored by the scorecard's own metric functions on a
``RankingBatch`` equal, array for array, to the one ``tuner.metrics.prepare`` builds
from the same rankings as doc-id lists: the same rows in the same order, the same
depths, grades, judged flags (a repeated document counts once), lengths, ideal grades
and grade counts. So every value is the one the ranking would score on its own, to
the last bit.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from operator import itemgetter
from typing import Any

import numpy as np

from tuner import metrics as scorecard
from tuner.errors import EvaluationError, InputError
from tuner.evaluation import oos
from tuner.evaluation.hits import UNLABELLED, HitTable
from tuner.evaluation.summary import column_means

_EPS = 1e-9  # as tuner.study.gates.threshold: scores equal to min_score up to rounding are kept


@dataclass(frozen=True, eq=False)
class HitArrays:
    """A retrieval's queries (in order) and their hits."""

    query_ids: tuple[str, ...]
    is_oos: np.ndarray  # (Q,) bool
    failed: np.ndarray  # (Q,) bool
    handoff: np.ndarray  # (Q,) bool: the backend handed it off
    conf: np.ndarray  # (Q,) float, -inf without a confidence
    hits: HitTable  # graded: the in-scope queries
    gains: str

    @classmethod
    def from_retrieval(cls, retrieval: Any) -> HitArrays:
        """From a tuner.study.gates.threshold.Retrieval (hits as (doc_id, score) pairs)."""
        qs = retrieval.queries
        ids = [q.query_id for q in qs]
        is_oos = np.array([q.scope == "oos" for q in qs], dtype=bool)
        return cls(
            tuple(ids),
            is_oos,
            np.array([q.failed for q in qs], dtype=bool),
            np.array([q.handoff for q in qs], dtype=bool),
            np.array([-math.inf if q.confidence is None else q.confidence for q in qs], dtype=np.float64),
            HitTable.build(
                ids, [q.hits for q in qs], retrieval.qrels, ~is_oos, doc_of=itemgetter(0), score_of=itemgetter(1)
            ),
            retrieval.gains,
        )

    @classmethod
    def from_batch(cls, batch: Any) -> HitArrays:
        """From a BatchResult, as Retrieval.from_batch reads it (no per-query objects)."""
        ids = [q.query_id for q in batch.queries]
        pq = batch.per_query
        rows = pq.index.get_indexer(ids)
        if (rows < 0).any():
            raise KeyError(ids[int(np.flatnonzero(rows < 0)[0])])
        conf = pq["confidence"].to_numpy(dtype=np.float64)[rows]
        failed = pq["status"].to_numpy(dtype=object)[rows] == "failed"
        answered = pq["answered"].to_numpy(dtype=bool)[rows]
        is_oos = np.array([q.scope == "oos" for q in batch.queries], dtype=bool)
        hit_lists = [batch.hits[qid] for qid in ids]
        table = batch.hit_table
        if (
            table is None
            or not np.array_equal(table.counts, [len(hs) for hs in hit_lists])
            or not np.array_equal(table.graded, ~is_oos)
        ):
            table = HitTable.build(ids, hit_lists, batch.qrels, ~is_oos)
        return cls(
            tuple(ids),
            is_oos,
            failed,
            ~failed & ~answered,
            np.where(np.isnan(conf), -math.inf, conf),
            table,
            batch.gains,
        )

    def __len__(self) -> int:
        return len(self.query_ids)

    def kept_counts(self, min_scores: np.ndarray) -> np.ndarray:
        """(M, Q): how many hits of each query score >= each min_score (unscored hits always)."""
        t, n_cuts = self.hits, len(min_scores)
        s = np.nan_to_num(t.scores, nan=math.inf)
        bars = min_scores - _EPS
        if np.all(bars[1:] >= bars[:-1]):  # ascending: each hit passes the first k cuts
            passed = np.searchsorted(bars, s, side="right")  # k = #(bar <= s), the comparisons below
            owner = np.repeat(np.arange(len(self)), t.counts)
            last = np.bincount(owner * (n_cuts + 1) + passed, minlength=len(self) * (n_cuts + 1))
            # kept[m] = hits that pass more than m cuts
            return np.cumsum(last.reshape(len(self), n_cuts + 1)[:, ::-1], axis=1)[:, ::-1][:, 1:].T.copy()
        out = np.zeros((n_cuts, len(self)), dtype=np.int64)
        some = np.flatnonzero(t.counts > 0)
        if some.size:
            ge = s[None, :] >= bars[:, None]
            out[:, some] = np.add.reduceat(ge, t.starts[some], axis=1, dtype=np.int64)
        return out

    def ranking_batch(
        self, rows: np.ndarray, cuts: np.ndarray, lengths: np.ndarray, depth: int | None, ideal_depth: int | None
    ) -> scorecard.RankingBatch:
        """The RankingBatch ``prepare`` builds, at these depths, from one ranking per entry
        of ``rows`` (in-scope query positions): the query's hits scoring >= ``cuts`` (or
        unscored), ``lengths`` many (``kept_counts``; 0: an empty ranking)."""
        width = int(lengths.max(initial=0)) if depth is None else depth
        # Scores that never rise down the list keep a prefix at any cut: the first ``lengths``
        # hits, cut from the table. The other lists are filtered hit by hit.
        prefix = (lengths == 0) | self._descending()[rows]
        grades, judged = self.hits.grade_rows(rows, np.where(prefix, lengths, 0), width)
        if (other := np.flatnonzero(~prefix)).size:
            self._filtered_rows(rows[other], cuts[other], other, grades, judged)
        return scorecard.from_grades(
            [self.query_ids[j] for j in rows],
            grades,
            judged,
            lengths.astype(np.int64),
            self.hits.label_counts[rows],
            gains=self.gains,
            depth=depth,
            ideal_depth=ideal_depth,
        )

    def _filtered_rows(
        self, queries: np.ndarray, cuts: np.ndarray, out_rows: np.ndarray, grades: np.ndarray, judged: np.ndarray
    ) -> None:
        """Fill rows ``out_rows`` of ``grades`` / ``judged`` with the hits of ``queries`` kept at ``cuts``."""
        t = self.hits
        width = grades.shape[1]
        n_hits = t.counts[queries]
        owner = np.repeat(np.arange(len(queries)), n_hits)
        hit = t.starts[queries][owner] + np.arange(owner.size) - np.repeat(np.cumsum(n_hits) - n_hits, n_hits)
        s = t.scores[hit]
        keep = np.isnan(s) | (s >= (cuts - _EPS)[owner])
        hit, owner = hit[keep], owner[keep]
        n_kept = np.bincount(owner, minlength=len(queries))
        pos = np.arange(owner.size) - np.repeat(np.cumsum(n_kept) - n_kept, n_kept)
        top = pos < width
        hit, owner, pos = hit[top], owner[top], pos[top]
        grade = t.grades[hit]
        # a document shown higher in the same ranking: a kept later copy, after its first kept copy
        repeat = np.zeros(hit.size, dtype=bool)
        if (t.first[hit] != hit).any():
            _, where = np.unique(owner * len(t.docs) + t.first[hit], return_index=True)
            repeat[:] = True
            repeat[where] = False
        grades[out_rows[owner], pos] = np.where(repeat, 0, np.maximum(grade, 0))
        judged[out_rows[owner], pos] = repeat | (grade != UNLABELLED)

    def _descending(self) -> np.ndarray:
        """(Q,): the query's scores never rise down its list (an unscored hit counts as +inf)."""
        t = self.hits
        s = np.where(np.isnan(t.scores), math.inf, t.scores)
        rises = np.zeros(s.size, dtype=np.int64)
        rises[1:] = s[1:] > s[:-1]
        rises[t.starts[t.counts > 0]] = 0  # a query's first hit follows another query's
        before = np.concatenate([[0], np.cumsum(rises)])
        return before[t.starts + t.counts] == before[t.starts]


# --------------------------------------------------------------------------- the solver's two scorings


def scores_by_cut(arrays: HitArrays, min_scores: np.ndarray, kept: np.ndarray, objective: str) -> np.ndarray:
    """(M, Q): the objective of each in-scope answered query's ranking filtered at each
    min_score (0 for the other queries), each distinct (query, filtered list) scored once.

    A higher cut keeps a subset of a lower one, so a query's filtered lists are told
    apart by their length: one ranking per distinct kept count, filtered at the first
    cut with that count, in query order then cut order (the rows ``score_arrays`` was
    given before), and the grid is filled from the scores by position."""
    out = np.zeros(kept.shape)
    sel = np.flatnonzero(~arrays.is_oos & ~arrays.failed)
    if not sel.size:
        return out
    n_cuts = kept.shape[0]
    column_major = kept[:, sel].T.ravel()  # index = query * M + cut
    key = np.repeat(np.arange(sel.size, dtype=np.int64), n_cuts) * (int(kept.max()) + 1) + column_major
    _, first, inverse = np.unique(key, return_index=True, return_inverse=True)
    order = np.argsort(first, kind="stable")  # by query, then by the first cut with that count
    slot = np.empty_like(order)
    slot[order] = np.arange(order.size)
    rows, cut = sel[first[order] // n_cuts], first[order] % n_cuts
    # the depths score_arrays(metrics=None or [objective], judged_depths=()) prepared at
    names = None if objective == scorecard.PRIMARY_METRIC else [objective]
    depth, ideal_depth = scorecard.batch_depths(names, ())
    batch = arrays.ranking_batch(rows, min_scores[cut], kept[cut, rows], depth, ideal_depth)
    columns, _ = scorecard.score_prepared(batch, [] if names is None else names, ())
    values = np.asarray(columns[objective], dtype=float)
    out[:, sel] = values[slot[inverse.reshape(-1)]].reshape(sel.size, n_cuts).T
    return out


def per_query_at(
    arrays: HitArrays, threshold: float, min_score: float, objective: str, *, backend_handoff: bool
) -> tuple[np.ndarray, np.ndarray]:
    """The objective of each in-scope query (0 when handed off, emptied or failed) and
    whether each OOS query is answered, with the gates at (threshold, min_score): the
    sweep's row at that pair, query by query (its objective is their mean; its OOS_FP_Rate
    the share answered), for the cross-validated estimate of a replayed grid
    (tuner.study.query_scores). -inf: no such gate."""
    ts, ms = np.array([threshold], dtype=float), np.array([min_score], dtype=float)
    g = _Grid(arrays, ts, ms, backend_handoff)
    answered = g.live[0] & g.shown[0]
    scores = np.where(answered, scores_by_cut(arrays, ms, g.kept, objective)[0], 0.0)
    oos = arrays.is_oos
    return scores[~oos], (answered | arrays.failed)[oos]


def sweep_columns(
    arrays: HitArrays,
    thresholds: np.ndarray,
    min_scores: np.ndarray,
    objective: str,
    backend_handoff: bool,
    names: tuple[str | None, str | None],
    top_m: int | None,
) -> dict[str, np.ndarray]:
    """``sweep``'s columns from arrays, the grid as (T, M, Q) broadcasts: rows threshold-major,
    as ``np.meshgrid(thresholds, min_scores, indexing="ij")`` ravels."""
    g = _Grid(arrays, thresholds, min_scores, backend_handoff)
    scores = scores_by_cut(arrays, min_scores, g.kept, objective)  # (M, Q), 0 for OOS
    ins, n_m = g.ins, len(min_scores)
    live_in, shown_in = g.live[:, ins], g.shown[:, ins]
    if ins.any():
        # The in-scope mean of each row is a sum taken query by query, in query order, as the
        # sweep has always summed it (numpy's pairwise sum along a row would move last bits):
        # the queries are the outer axis of a C-ordered grid. Thresholds that answer as many
        # queries answer the same ones (a higher threshold keeps a subset): each set is summed once.
        _, first, which = np.unique(live_in.sum(axis=1), return_index=True, return_inverse=True)
        value = np.zeros((int(ins.sum()), first.size, n_m))
        np.copyto(value, np.where(shown_in, scores[:, ins], 0.0).T[:, None, :], where=live_in[first].T[:, :, None])
        objective_col = (np.add.reduce(value, axis=0) / int(ins.sum()))[which].ravel()
    else:
        objective_col = np.zeros(len(thresholds) * n_m)
    return g.columns(objective, objective_col, names, top_m)


def bound_columns(
    arrays: HitArrays,
    thresholds: np.ndarray,
    min_scores: np.ndarray,
    objective: str,
    backend_handoff: bool,
    names: tuple[str | None, str | None],
    top_m: int | None,
) -> dict[str, np.ndarray] | None:
    """``sweep_columns`` with an upper bound in place of the objective (every other column
    exact), at a fraction of the cost; None where no bound holds.

    A min_score cut keeps a prefix of a list whose scores never rise (a replayed one always),
    and no metric the objective averages gains from losing hits at the end of a ranking
    (``truncation_safe``): so each answered query scores at most what its whole list
    scores, and the row's objective is at most the mean of those over the queries it
    answers, one matrix product for the whole grid (+1e-9 for the order of the sums)."""
    if not truncation_safe(objective) or not bool(arrays._descending().all()):
        return None
    g = _Grid(arrays, thresholds, min_scores, backend_handoff)
    whole = scores_by_cut(arrays, min_scores[:1], g.kept[:1], objective)[0]  # (Q,): the uncut lists
    ins = g.ins
    if ins.any():
        upper = (g.live[:, ins] * whole[ins]) @ g.shown[:, ins].T.astype(float) / int(ins.sum())
        objective_col = upper.ravel() + 1e-9
    else:
        objective_col = np.zeros(len(thresholds) * len(min_scores))
    return g.columns(objective, objective_col, names, top_m)


def bound_columns_stacked(
    stack: Any,
    is_oos: np.ndarray,
    failed: np.ndarray,
    label_counts: np.ndarray,
    gains: str,
    thresholds: np.ndarray,
    min_scores: np.ndarray,
    objective: str,
    backend_handoff: bool,
    names: tuple[str | None, str | None],
    top_m: int | None,
    wanted: frozenset[str],
) -> dict[str, np.ndarray] | None:
    """``bound_columns`` of each setting of ``stack`` (tuner.evaluation.replay_batch.Stacked:
    one batch's queries at several settings, every list in score order), the grids one after
    the other (setting-major, each threshold-major): the same arrays, every setting's at
    once: the uncut lists scored in one scorecard call, the grids' counts and products
    stacked. Only the objective and the ``wanted`` columns (those the constraints read) are
    given. None where these columns do not apply (a metric reading whole rankings, a
    wanted column that is not one of ``bound_columns``): bound each setting on its own."""
    depth, ideal_depth = scorecard.batch_depths(None if objective == scorecard.PRIMARY_METRIC else [objective], ())
    if not truncation_safe(objective) or depth is None:
        return None
    n_s, n_q, n_t, n_m = stack.n, len(is_oos), len(thresholds), len(min_scores)
    rows = n_s * n_q
    bars = min_scores - _EPS
    if not np.all(bars[1:] >= bars[:-1]):
        return None
    passed = np.searchsorted(bars, stack.scores, side="right")  # as HitArrays.kept_counts
    owner = np.repeat(np.arange(rows), stack.counts)
    last = np.bincount(owner * (n_m + 1) + passed, minlength=rows * (n_m + 1)).reshape(rows, n_m + 1)
    kept = np.cumsum(last[:, ::-1], axis=1)[:, ::-1][:, 1:].reshape(n_s, n_q, n_m).transpose(0, 2, 1)  # (S, M, Q)
    shown = kept > 0
    conf_ok = stack.confidence[:, None, :] >= thresholds[None, :, None]  # (S, T, Q)
    if backend_handoff:
        conf_ok &= ~stack.handoff[:, None, :]
    live = conf_ok & ~failed[None, None, :]
    ins = ~is_oos
    # each setting's uncut list of each in-scope answered query, scored as scores_by_cut scores it
    whole = np.zeros((n_s, n_q))
    sel = np.flatnonzero(ins & ~failed)
    if sel.size:
        at = (np.arange(n_s)[:, None] * n_q + sel[None, :]).ravel()
        lengths = kept[:, 0, :][:, sel].ravel()
        shown_n = np.minimum(lengths, depth)
        grades = np.zeros((at.size, depth), dtype=np.int8)
        judged = np.zeros((at.size, depth), dtype=bool)
        r = np.repeat(np.arange(at.size), shown_n)
        pos = np.arange(r.size) - np.repeat(np.cumsum(shown_n) - shown_n, shown_n)
        grade = stack.grades[stack.starts[at][r] + pos]
        grades[r, pos] = np.maximum(grade, 0)
        judged[r, pos] = grade != UNLABELLED
        names_ = None if objective == scorecard.PRIMARY_METRIC else [objective]
        batch = scorecard.from_grades(
            ("",) * at.size,  # rows, not queries: only their number is read
            grades,
            judged,
            lengths.astype(np.int64),
            np.tile(label_counts[sel], (n_s, 1)),
            gains=gains,
            depth=depth,
            ideal_depth=ideal_depth,
        )
        columns, _ = scorecard.score_prepared(batch, [] if names_ is None else names_, ())
        whole[:, sel] = np.asarray(columns[objective], dtype=float).reshape(n_s, sel.size)
    live_in, shown_in = live[:, :, ins], shown[:, :, ins].transpose(0, 2, 1).astype(float)
    n_in = int(ins.sum())
    if n_in:
        upper = np.stack([(live_in[i] * whole[i, ins]) @ shown_in[i] / n_in for i in range(n_s)])
        objective_col = upper.ravel() + 1e-9
    else:
        objective_col = np.zeros(n_s * n_t * n_m)
    # the other columns as _Grid.columns computes them, one setting after the other
    ans_in = np.stack([live_in[i].astype(float) @ shown_in[i] for i in range(n_s)])
    live_oos, shown_oos = live[:, :, is_oos].astype(float), shown[:, :, is_oos].transpose(0, 2, 1).astype(float)
    ans_oos = np.stack([live_oos[i] @ shown_oos[i] for i in range(n_s)]) + (failed & is_oos).sum()
    ans_in, ans_oos = ans_in.astype(np.int64).ravel(), ans_oos.astype(np.int64).ravel()
    out: dict[str, np.ndarray] = {objective: objective_col}
    for n, v in zip(names, (np.repeat(thresholds, n_m), np.tile(min_scores, n_t)), strict=True):
        if n in wanted:
            out[n] = np.tile(v, n_s)
    out.update(_oos_rates(is_oos, ans_oos, ans_in, wanted))
    if "n_answered" in wanted:
        out["n_answered"] = ans_in + ans_oos
    if "n_emptied" in wanted:
        has_hits = stack.counts.reshape(n_s, n_q) > 0
        per_cut = ((kept == 0) & has_hits[:, None, :]).sum(axis=2)  # (S, M)
        out["n_emptied"] = np.broadcast_to(per_cut[:, None, :], (n_s, n_t, n_m)).ravel()
    if top_m is not None and "n_below_top_m" in wanted:
        below = (shown & (kept < top_m)).sum(axis=2)
        out["n_below_top_m"] = np.broadcast_to(below[:, None, :], (n_s, n_t, n_m)).ravel()
    return out if wanted <= out.keys() else None


def truncation_safe(objective: str) -> bool:
    """Whether dropping hits from the end of a ranking can never raise ``objective`` (the
    primary score, or a metric whose family says so: every one but coverage)."""
    if objective == scorecard.PRIMARY_METRIC:
        return all(scorecard.resolve(name).family.truncation_safe for name in scorecard.PRIMARY_SCORECARD)
    try:
        return scorecard.resolve(objective).family.truncation_safe
    except InputError:  # not a scorecard metric: no bound
        return False


class _Grid:
    """What every (threshold, min_score) row answers, and the columns that depend only on that."""

    def __init__(
        self, arrays: HitArrays, thresholds: np.ndarray, min_scores: np.ndarray, backend_handoff: bool
    ) -> None:
        if not len(arrays):
            raise EvaluationError("threshold sweep over an empty batch; evaluate at least one query")
        self.arrays, self.thresholds, self.min_scores = arrays, thresholds, min_scores
        self.kept = arrays.kept_counts(min_scores)  # (M, Q)
        self.shown = self.kept > 0  # (M, Q)
        conf_ok = arrays.conf[None, :] >= thresholds[:, None]  # (T, Q)
        if backend_handoff:
            conf_ok &= ~arrays.handoff[None, :]
        # answered[t, m, q] = conf_ok[t, q] & shown[m, q], except a failed query: answered iff OOS
        self.live = conf_ok & ~arrays.failed[None, :]
        self.ins = ~arrays.is_oos

    def columns(
        self, objective: str, objective_col: np.ndarray, names: tuple[str | None, str | None], top_m: int | None
    ) -> dict[str, np.ndarray]:
        arrays, live, shown, kept = self.arrays, self.live, self.shown, self.kept
        is_oos, failed, ins = arrays.is_oos, arrays.failed, self.ins
        n_t, n_m = len(self.thresholds), len(self.min_scores)
        # answered counts as 0/1 products summed (exact integers)
        ans_in = live[:, ins].astype(float) @ shown[:, ins].T.astype(float)
        ans_oos = live[:, is_oos].astype(float) @ shown[:, is_oos].T.astype(float) + (failed & is_oos).sum()
        ans_in, ans_oos = ans_in.astype(np.int64).ravel(), ans_oos.astype(np.int64).ravel()
        gate_cols = {
            n: v
            for n, v in zip(names, (np.repeat(self.thresholds, n_m), np.tile(self.min_scores, n_t)), strict=True)
            if n is not None
        }
        columns: dict[str, np.ndarray] = {**gate_cols, objective: objective_col}
        columns.update(_oos_rates(is_oos, ans_oos, ans_in))
        columns["n_answered"] = ans_in + ans_oos
        has_hits = arrays.hits.counts > 0
        columns["n_emptied"] = np.tile(((kept == 0) & has_hits[None, :]).sum(axis=1), n_t)
        if top_m is not None:
            columns["n_below_top_m"] = np.tile((shown & (kept < top_m)).sum(axis=1), n_t)
        return columns


def hits_shown(
    arrays: HitArrays, thresholds: np.ndarray, min_scores: np.ndarray, backend_handoff: bool, rows: np.ndarray
) -> np.ndarray:
    """For each of ``rows`` of the sweep grid (threshold-major, as ``sweep_columns``): the hits
    the gates there leave shown, over every query (in scope and OOS; a handed-off, failed
    or emptied query shows none). The fewer a row shows, the more its gates cut."""
    rows = np.asarray(rows, dtype=np.int64)
    n_m = len(min_scores)
    # each distinct threshold and min_score once: a (T', Q) @ (Q, M') product of exact small integers
    ts, t_at = np.unique(rows // n_m, return_inverse=True)
    ms, m_at = np.unique(rows % n_m, return_inverse=True)
    kept = arrays.kept_counts(min_scores[ms])  # (M', Q), cuts ascending
    live = (arrays.conf[None, :] >= thresholds[ts][:, None]) & ~arrays.failed[None, :]
    if backend_handoff:
        live &= ~arrays.handoff[None, :]
    shown = live.astype(float) @ kept.T.astype(float)  # (T', M')
    return np.rint(shown[t_at.ravel(), m_at.ravel()]).astype(np.int64)


def _oos_rates(
    is_oos: np.ndarray, ans_oos: np.ndarray, ans_in: np.ndarray, wanted: frozenset[str] | None = None
) -> dict[str, np.ndarray]:
    """oos.oos_rates of every row from its answered counts (those ``wanted``, default all):
    the rates depend on the counts only, so each distinct (OOS answered, in-scope answered)
    pair is rated once, on a mask with those counts."""
    n_in = int((~is_oos).sum())
    key = ans_oos * (n_in + 1) + ans_in
    seen = np.zeros(int(key.max(initial=0)) + 1, dtype=bool)
    seen[key] = True
    pairs = np.flatnonzero(seen)
    row = np.cumsum(seen) - 1  # key -> its pair's row
    rank = np.where(is_oos, np.cumsum(is_oos) - 1, np.cumsum(~is_oos) - 1)  # each query's place in its scope
    limit = np.where(is_oos[None, :], (pairs // (n_in + 1))[:, None], (pairs % (n_in + 1))[:, None])
    rates = oos.oos_rates(is_oos, rank[None, :] < limit)
    return {name: values[row[key]] for name, values in rates.items() if wanted is None or name in wanted}


def scorecard_values(
    arrays: HitArrays, threshold: float, min_score: float, *, backend_handoff: bool = False
) -> dict[str, float]:
    """Mean of every scorecard metric over the in-scope queries with the gates at
    (threshold, min_score): a handed-off, emptied or failed query scores 0 (see
    tuner.study.gates.threshold.scorecard_at). Each mean is ``frame[c].mean()``'s
    (tuner.evaluation.summary.column_means)."""
    rows = np.flatnonzero(~arrays.is_oos)
    if not rows.size:
        return {}
    handed_off = (arrays.conf[rows] < threshold) | (backend_handoff & arrays.handoff[rows])
    cut = np.array([min_score], dtype=np.float64)
    lengths = np.where(arrays.failed[rows] | handed_off, 0, arrays.kept_counts(cut)[0, rows])
    depth, ideal_depth = scorecard.batch_depths(None, ())
    batch = arrays.ranking_batch(rows, np.repeat(cut, rows.size), lengths, depth, ideal_depth)
    columns, _ = scorecard.score_prepared(batch, None, ())
    return column_means(columns)
