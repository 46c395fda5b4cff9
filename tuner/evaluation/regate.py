"""A batch re-scored as if the backend had applied post-retrieval gates: pure, no I/O.

A trial that solves its gates (tuner.study.gates.threshold: a ``confidence`` and/or a ``min_score``
gate, whatever their config keys) retrieves with the gates at the low end of their
ranges, then scores the solved values client-side. The gates come in by role, never by
key, so any backend's gates re-score the same way. ``regate`` turns that retrieval into the BatchResult the backend
would have produced at the solved values, so the trial's reports (report.json,
report.md, the per-query CSV) describe the same numbers as the trial's score.

Gate model (the same as tuner.study.gates.threshold's, so both give the same metrics):

- a hit is kept when its score >= min_score (up to rounding); a hit without a score
  is kept, since nothing can be compared;
- an answered query is handed off when its confidence < threshold (no confidence:
  handed off once a threshold is set) or when no hit survives the filter;
- a failed query stays failed.

The rebuilt responses go through the evaluation core's one scoring step
(``tuner.evaluation.result.score_result``, where ``evaluate_responses`` ends too): only
what a gate changes is rebuilt (the kept hits, ``n_results``, ``handoff``, the unjudged
hits), the rest of each exchange row is the batch's own, so a re-gated batch equals
``evaluate_responses`` on the rebuilt responses (tests/threshold/test_solve_vectorised.py).
The re-scored batch's threshold sweep covers the confidence gate's declared range
(``sweep_range``) plus the threshold in effect, exactly, so the trial's PR plot and sweep
table show the trial's own operating point (``BatchResult.threshold_in_effect``).
"""

from __future__ import annotations

import math
from itertools import compress
from typing import Any

import numpy as np
import pandas as pd

from tuner.evaluation.hits import HitTable
from tuner.evaluation.mapping import Hit
from tuner.evaluation.oos import threshold_grid
from tuner.evaluation.outcomes import UnjudgedHit
from tuner.evaluation.result import INFO_COLUMNS, PRIMARY, BatchResult, score_result

#: the reference backend keeps scores equal to min_score up to rounding (as tuner.study.gates.threshold)
_EPS = 1e-9
_ROW_COLUMNS = [c for c in INFO_COLUMNS if c != "answered"]  # what score_result takes


def regate(
    result: BatchResult,
    *,
    confidence_threshold: float | None,
    min_score: float | None,
    sweep_range: tuple[float, float, float] | None = None,
) -> BatchResult:
    """``result`` as if the backend had run with these gates (None: that gate as retrieved).

    Exact when the batch was retrieved with both gates at or below the given values
    (hits the backend already dropped cannot come back). ``sweep_range``
    ``(low, high, step)``: the confidence gate's declared range, the grid of the
    result's threshold sweep (default: oos.threshold_grid over the observed
    confidences); ``confidence_threshold`` is always one of its rows."""
    ids = [q.query_id for q in result.queries]
    pq = result.per_query
    if pq.index.tolist() != ids:
        pq = pq.loc[ids]
    failed_ids = {f.query_id for f in result.failed}
    answers = [qid not in failed_ids for qid in ids]
    hits = {qid: result.hits[qid] if ok else () for qid, ok in zip(ids, answers, strict=True)}
    labels = {qid: dict(result.qrels[qid]) for qid in ids if qid in result.qrels}
    graded = np.array([q.scope != "oos" for q in result.queries], dtype=bool)
    table = result.hit_table  # the batch's own, unless it does not describe these hits
    if table is None or not (
        np.array_equal(table.counts, [len(hs) for hs in hits.values()]) and np.array_equal(table.graded, graded)
    ):
        table = HitTable.build(ids, list(hits.values()), labels, graded)
    reordered: set[str] = set()
    if min_score is not None:
        hits, table, reordered = _filtered(hits, table, min_score)

    # the batch's exchange rows, but for what the gates change
    rows: dict[str, Any] = {c: pq[c].array for c in _ROW_COLUMNS}
    rows["n_results"] = table.counts
    # bools and None, as the rebuilt responses say
    rows["handoff"] = np.array(_handoffs(pq, answers, hits, confidence_threshold, min_score), dtype=object)
    info = pd.DataFrame(rows, index=pq.index, copy=False)
    in_scope = [qid for qid, ok, q in zip(ids, answers, result.queries, strict=True) if ok and q.scope != "oos"]
    ranking = [m for m in result.metric_names if m != PRIMARY]
    in_effect = confidence_threshold if confidence_threshold is not None else result.threshold_in_effect
    grid = threshold_grid(pq["confidence"].tolist(), sweep_range=sweep_range, include=(in_effect,))
    by_id = {f.query_id: f for f in result.failed}
    return score_result(
        result.queries,
        info,
        hits,
        labels,
        [by_id[q] for q in ids if q in by_id],
        _unjudged(result, in_scope, hits, labels, reordered),
        gains=result.gains,
        metrics=ranking or None,
        sweep_thresholds=grid,
        threshold_in_effect=in_effect,
        table=table,
        histogram_of=result,  # the query types and fallback levels are the batch's
    )


def _filtered(
    hits: dict[str, tuple[Hit, ...]],
    table: HitTable,
    min_score: float,
) -> tuple[dict[str, tuple[Hit, ...]], HitTable, set[str]]:
    """Each query's hits with score >= min_score (up to rounding) or without a score, their
    table, and the queries whose kept hits are not the first hits of their list."""
    keep = np.isnan(table.scores) | (table.scores >= min_score - _EPS)
    if keep.all():
        return hits, table, set()
    kept = table.filtered(keep)
    before = np.concatenate([[0], np.cumsum(keep)])
    # kept hits are the list's first n when the first n hits are all kept
    prefix = (before[table.starts + kept.counts] - before[table.starts] == kept.counts).tolist()
    flags = keep.tolist()
    out: dict[str, tuple[Hit, ...]] = {}
    reordered: set[str] = set()
    for (qid, hs), a, n, first_n in zip(hits.items(), table.starts.tolist(), kept.counts.tolist(), prefix, strict=True):
        if first_n:
            out[qid] = hs[:n]
        else:
            out[qid] = tuple(compress(hs, flags[a : a + len(hs)]))
            reordered.add(qid)
    return out, kept, reordered


def _handoffs(
    pq: pd.DataFrame,
    answers: list[bool],
    hits: dict[str, tuple[Hit, ...]],
    threshold: float | None,
    min_score: float | None,
) -> list[bool | None]:
    """The handoff field of each rebuilt response (a failed query's stays None)."""
    out: list[bool | None] = []
    for ok, handoff, conf, kept in zip(
        answers, pq["handoff"].tolist(), pq["confidence"].tolist(), hits.values(), strict=True
    ):
        if not ok:
            out.append(None)
            continue
        flag = None if _missing(handoff) else bool(handoff)
        if threshold is not None:
            flag = _missing(conf) or conf < threshold
        if min_score is not None and not kept:
            flag = True  # an emptied result list is handed off
        out.append(flag)
    return out


def _unjudged(
    result: BatchResult,
    in_scope: list[str],
    hits: dict[str, tuple[Hit, ...]],
    labels: dict[str, dict[str, int]],
    reordered: set[str],
) -> list[UnjudgedHit]:
    """The shown documents without a label, first occurrence only, of each answered
    in-scope query (what ResultBuilder.add records), in query order. When the kept hits
    are the first n of the list, those are the batch's own entries ranked <= n (a
    BatchResult's unjudged hits are its hits' unlabelled ones); otherwise they are
    found again."""
    own: dict[str, list[UnjudgedHit]] = {}
    for u in result.unjudged:
        own.setdefault(u.query_id, []).append(u)
    out: list[UnjudgedHit] = []
    for qid in in_scope:
        shown = hits[qid]
        if qid not in reordered:
            entries = own.get(qid, ())
            n = len(shown)
            out.extend(entries if n == len(result.hits[qid]) else (u for u in entries if u.rank <= n))
            continue
        seen: set[str] = set()
        judged = labels.get(qid, {})
        for rank, h in enumerate(shown, start=1):
            if h.doc_id not in judged and h.doc_id not in seen:
                seen.add(h.doc_id)
                out.append(UnjudgedHit(qid, rank, h.doc_id, h.title))
    return out


def _missing(value: object) -> bool:
    return value is None or (isinstance(value, float) and math.isnan(value))
