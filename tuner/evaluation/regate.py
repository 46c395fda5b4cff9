"""A batch re-scored as if the backend had applied post-retrieval gates: pure, no I/O.

A trial that solves its gates (tuner.study.threshold: a ``confidence`` and/or a ``min_score``
gate, whatever their config keys) retrieves with the gates at the low end of their
ranges, then scores the solved values client-side. The gates come in by role, never by
key, so any backend's gates re-score the same way. ``regate`` turns that retrieval into the BatchResult the backend
would have produced at the solved values, so the trial's reports (report.json,
report.md, the per-query CSV) describe the same numbers as the trial's score.

Gate model (the same as tuner.study.threshold's, so both give the same metrics):

- a hit is kept when its score >= min_score (up to rounding); a hit without a score
  is kept, since nothing can be compared;
- an answered query is handed off when its confidence < threshold (no confidence:
  handed off once a threshold is set) or when no hit survives the filter;
- a failed query stays failed.

The rebuilt responses go through ``evaluate_responses``, the one scoring path. The
re-scored batch's threshold sweep covers the confidence gate's declared range
(``sweep_range``) plus the threshold in effect, exactly, so the trial's PR plot and sweep
table show the trial's own operating point (``BatchResult.threshold_in_effect``).
"""

from __future__ import annotations

import math

from tuner.evaluation.mapping import Hit, ParsedResponse
from tuner.evaluation.oos import threshold_grid
from tuner.evaluation.outcomes import QueryResponse
from tuner.evaluation.result import PRIMARY, BatchResult, evaluate_responses

#: the reference backend keeps scores equal to min_score up to rounding (as tuner.study.threshold)
_EPS = 1e-9


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
    pq = result.per_query
    failed_ids = {f.query_id for f in result.failed}
    responses: list[QueryResponse] = []
    for q in result.queries:
        qid = q.query_id
        if qid in failed_ids:
            continue
        row = pq.loc[qid]
        hits = result.hits[qid]
        kept = hits if min_score is None else tuple(h for h in hits if _kept(h, min_score))
        conf = None if _missing(row["confidence"]) else float(row["confidence"])
        handoff = row["handoff"]
        handoff = None if _missing(handoff) else bool(handoff)
        if confidence_threshold is not None:
            handoff = conf is None or conf < confidence_threshold
        if min_score is not None and not kept:
            handoff = True  # an emptied result list is handed off
        fallback = row["fallback_level"]
        responses.append(QueryResponse(
            qid, str(row["request_id"]),
            ParsedResponse(kept, conf, handoff, None if _missing(fallback) else str(fallback),
                           handoff_reason=None if _missing(row.get("handoff_reason")) else str(row["handoff_reason"]),
                           truncated=int(row["n_truncated"]) if not _missing(row.get("n_truncated")) else 0),
            latency_ms=float(row["latency_ms"]), attempts=int(row["attempts"]),
        ))
    ranking = [m for m in result.metric_names if m != PRIMARY]
    in_effect = confidence_threshold if confidence_threshold is not None else result.threshold_in_effect
    grid = threshold_grid(pq["confidence"].tolist(), sweep_range=sweep_range, include=(in_effect,))
    return evaluate_responses(
        result.queries, result.qrels, responses, result.failed,
        gains=result.gains, metrics=ranking or None, sweep_thresholds=grid, threshold_in_effect=in_effect,
    )


def _kept(hit: Hit, min_score: float) -> bool:
    return hit.score is None or math.isnan(hit.score) or hit.score >= min_score - _EPS


def _missing(value: object) -> bool:
    return value is None or (isinstance(value, float) and math.isnan(value))

