"""Today's tuner.evaluation.result (evaluate_responses and its helpers), kept verbatim
as the slow reference of regate (reference_solve.regate scores through it), so the
vectorised scoring path is compared with the code it replaced (the BatchResult class
is the live one). Do not edit, but to follow the live columns (issue 27 added n_repeats
and N_Repeated_Hits: an answer's repeats are removed when it is parsed).

The original module docstring:
From collected responses and labels to a BatchResult: pure, no I/O.

Rules that make the numbers comparable across trials:

- Ranking metrics are averaged over **in-scope** queries; OOS queries have no
  ranking metrics (NaN per query) and feed the OOS / handoff metrics instead.
- The ranking scored is what the service returned, in its order, except that a
  handed-off query scores 0 (its scored ranking is empty). The raw results are kept
  for the threshold sweep, coverage and the report.
- Unlabelled hits count as Irrelevant; Judged@10 / Judged@20 say how many were labelled.
- Hits beyond ``top_k`` were cut when the response was parsed (mapping.parse_response):
  ``n_truncated`` per query and ``N_Truncated_Hits`` in total say how many.
- A failed query counts against the backend everywhere: in scope it scores 0 and
  counts as handed off; out of scope it counts as answered (a false positive). So a
  config can never look better by failing on hard queries. No query is dropped.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np
import pandas as pd

from tuner import metrics as scorecard
from tuner.data.dataset import Query, QuerySet
from tuner.errors import EvaluationError
from tuner.evaluation import oos
from tuner.evaluation.mapping import Hit
from tuner.evaluation.outcomes import FailedQuery, QueryResponse, UnjudgedHit
from tuner.evaluation.result import BatchResult  # the class itself is unchanged

JUDGED_DEPTHS: tuple[int, ...] = (10, 20)
PRIMARY = "Primary_Metric_Score"

#: per-query columns that describe the exchange (metric columns follow them)
INFO_COLUMNS: tuple[str, ...] = (
    "query",
    "query_type",
    "source",
    "scope",
    "split",
    "status",
    "failure_reason",
    "request_id",
    "attempts",
    "latency_ms",
    "n_results",
    "n_truncated",
    "n_repeats",
    "handoff",
    "answered",
    "handoff_reason",
    "confidence",
    "fallback_level",
)


#: scorecard keys besides the ranking metrics, in report order
OPERATION_KEYS: tuple[str, ...] = (
    "Latency_Avg_ms",
    "Latency_P50_ms",
    "Latency_P95_ms",
    *(f"Judged@{k}" for k in JUDGED_DEPTHS),
    "Failed_Queries",
    "Empty_Queries",
    "N_Truncated_Hits",
    "N_Repeated_Hits",
    "N_Queries",
    "N_InScope_Queries",
    "N_OOS_Queries",
)


def scorecard_keys(metrics: Sequence[str] | None = None) -> tuple[str, ...]:
    """Every key ``BatchResult.metrics`` will hold for this metric selection, known
    before a batch runs (so gates with a typo fail before any traffic)."""
    ranking = tuple(scorecard.DEFAULT_METRICS if metrics is None else metrics)
    return (*ranking, PRIMARY, *oos.OOS_METRICS, *OPERATION_KEYS)


def evaluate_responses(
    queries: QuerySet,
    qrels: Mapping[str, Mapping[str, int]],
    responses: Iterable[QueryResponse],
    failed: Iterable[FailedQuery] = (),
    *,
    gains: str = "linear",
    metrics: Sequence[str] | None = None,
    sweep_thresholds: Sequence[float] | None = None,
    threshold_in_effect: float | None = None,
) -> BatchResult:
    """Score collected outcomes. Every query of ``queries`` must have exactly one
    outcome (a response or a failure): EvaluationError otherwise, since a missing
    query would silently raise the average. ``sweep_thresholds``: the threshold
    sweep's grid (default: oos.threshold_grid over the observed confidences);
    ``threshold_in_effect`` is recorded on the result as given."""
    builder = ResultBuilder(queries, qrels, gains=gains, metrics=metrics, sweep_thresholds=sweep_thresholds,
                            threshold_in_effect=threshold_in_effect)
    for outcome in [*responses, *failed]:
        builder.add(outcome)
    return builder.finish()


class ResultBuilder:
    """``evaluate_responses`` one outcome at a time.

    ``add`` does the per-query work (the exchange row, the unjudged hits) as each
    outcome arrives, so a live batch does it in the gaps while it waits for the next
    answers; ``finish`` is left with the vectorised scoring only, which is what stands
    between the last answer and the trial's result.
    """

    def __init__(
        self,
        queries: QuerySet,
        qrels: Mapping[str, Mapping[str, int]],
        *,
        gains: str = "linear",
        metrics: Sequence[str] | None = None,
        sweep_thresholds: Sequence[float] | None = None,
        threshold_in_effect: float | None = None,
    ) -> None:
        self.queries = queries
        self.qrels = qrels
        self.gains = gains
        self.metrics = metrics
        self.sweep_thresholds = sweep_thresholds
        self.threshold_in_effect = threshold_in_effect
        self._by_id: dict[str, QueryResponse | FailedQuery] = {}
        self._rows: dict[str, dict[str, Any]] = {}
        self._unjudged: dict[str, list[UnjudgedHit]] = {}
        self._labels: dict[str, dict[str, int]] = {}

    def add(self, outcome: QueryResponse | FailedQuery) -> None:
        qid = outcome.query_id
        if qid not in self.queries:
            raise EvaluationError(
                f"outcome for query {qid!r}, which is not in query set {self.queries.dataset_id!r}; "
                "evaluate against the query set the batch was run with"
            )
        if qid in self._by_id:
            raise EvaluationError(f"query {qid}: two outcomes collected; each query needs exactly one")
        self._by_id[qid] = outcome
        query = self.queries[qid]
        self._rows[qid] = _info_row(query, outcome)
        if qid in self.qrels:
            self._labels[qid] = dict(self.qrels[qid])
        if query.scope != "oos" and isinstance(outcome, QueryResponse):
            self._unjudged[qid] = _unjudged_of(qid, outcome.response.hits, self._labels.get(qid, {}))

    def finish(self) -> BatchResult:
        queries, gains, metrics, by_id = self.queries, self.gains, self.metrics, self._by_id
        qs = list(queries)
        ids = [q.query_id for q in qs]
        missing = [q for q in ids if q not in by_id]
        if missing:
            raise EvaluationError(
                f"{len(missing)} queries have no outcome (first: {', '.join(missing[:3])}); "
                "record a FailedQuery for every query that got no response"
            )
        outcomes = [by_id[q] for q in ids]
        hits = {qid: (o.response.hits if isinstance(o, QueryResponse) else ()) for qid, o in zip(ids, outcomes)}
        labels = {qid: self._labels[qid] for qid in ids if qid in self._labels}

        info = _info_frame_from_rows([self._rows[q] for q in ids], ids)
        is_oos = (info["scope"] == "oos").to_numpy()
        answered = _answered(info, is_oos)
        info["answered"] = answered

        in_ids = [qid for qid, o in zip(ids, is_oos, strict=True) if not o]
        rankings = {q: [h.doc_id for h in hits[q]] for q in in_ids}
        raw, judged = scorecard.score_rankings_with_coverage(
            rankings, labels, in_ids, gains=gains, metrics=None if metrics is None else list(metrics),
            judged_depths=JUDGED_DEPTHS,
        )
        if not in_ids:
            judged = pd.DataFrame(columns=[f"Judged@{k}" for k in JUDGED_DEPTHS], dtype=float)
        metric_names = tuple(str(c) for c in raw.columns)
        keep = answered[~is_oos]
        scored = raw.mul(keep.astype(float), axis=0)  # a handed-off / failed query scores 0
        per_query = info.join(judged).join(scored)

        raw_primary = raw[PRIMARY].reindex(ids).to_numpy(dtype=float)
        seen_primary = per_query[PRIMARY].to_numpy(dtype=float)
        sweep = oos.threshold_sweep(
            is_oos, info["confidence"].tolist(), info["n_results"].tolist(), raw_primary,
            self.sweep_thresholds, observed_scores=seen_primary,
        )
        histogram = oos.fallback_histogram(info["query_type"].tolist(), info["fallback_level"].tolist())

        failures = [o for o in outcomes if isinstance(o, FailedQuery)]
        summary = _scorecard(per_query, metric_names, is_oos, answered, failures)
        return BatchResult(
            metrics=summary,
            per_query=per_query,
            unjudged=[u for q in in_ids for u in self._unjudged.get(q, ())],
            threshold_sweep=sweep,
            fallback_histogram=histogram,
            failed=failures,
            queries=queries,
            hits=hits,
            qrels=labels,
            gains=gains,
            scorecard_version=str(raw.attrs.get("scorecard_version", scorecard.SCORECARD_VERSION)),
            metric_names=metric_names,
            threshold_in_effect=self.threshold_in_effect,
        )


def query_record(
    query: Query,
    outcome: QueryResponse | FailedQuery,
    qrels: Mapping[str, Mapping[str, int]],
    *,
    gains: str = "linear",
    metrics: Sequence[str] | None = None,
) -> dict[str, Any]:
    """The per-query row for one outcome as soon as it arrives: the same values the
    final ``per_query`` frame holds for it (plus ``query_id``). For per-query
    callbacks such as pruning; about 0.3 ms (one prepared batch, no frames), so it can
    run for every query."""
    row = _info_row(query, outcome)
    row["answered"] = bool(_answered_one(row, query.scope == "oos"))
    row["query_id"] = query.query_id
    if query.scope == "oos":
        return row
    qid = query.query_id
    ranking = {qid: [h.doc_id for h in outcome.response.hits]} if isinstance(outcome, QueryResponse) else {}
    labels = {qid: qrels[qid]} if qid in qrels else {}
    # arrays, not frames: this runs on the event loop for every answer of a pruned batch
    _, scores, judged = scorecard.score_arrays(ranking, labels, [qid], gains=gains, metrics=metrics,
                                               judged_depths=JUDGED_DEPTHS)
    row.update({name: float(values[0]) for name, values in judged.items()})
    keep = 1.0 if row["answered"] else 0.0
    row.update({str(name): float(values[0]) * keep for name, values in scores.items()})
    return row


# --------------------------------------------------------------------------- helpers


def _info_row(q: Query, o: QueryResponse | FailedQuery) -> dict[str, Any]:
    r = o.response if isinstance(o, QueryResponse) else None
    return {
        "query": q.query,
        "query_type": q.query_type,
        "source": q.source,
        "scope": q.scope,
        "split": q.split,
        "status": "ok" if r is not None else "failed",
        "failure_reason": o.reason if isinstance(o, FailedQuery) else None,
        "request_id": o.request_id,
        "attempts": o.attempts,
        "latency_ms": np.nan if o.latency_ms is None else float(o.latency_ms),
        "n_results": len(r.hits) if r is not None else 0,
        "n_truncated": r.truncated if r is not None else 0,
        "n_repeats": r.repeats if r is not None else 0,
        "handoff": r.handoff if r is not None else None,
        "handoff_reason": r.handoff_reason if r is not None else None,
        "confidence": np.nan if r is None or r.confidence is None else r.confidence,
        "fallback_level": r.fallback_level if r is not None else None,
    }


def _info_frame_from_rows(rows: list[dict[str, Any]], ids: list[str]) -> pd.DataFrame:
    columns = [c for c in INFO_COLUMNS if c != "answered"]
    frame = pd.DataFrame.from_records(rows, columns=columns, index=pd.Index(ids, name="query_id"))
    frame["handoff"] = frame["handoff"].astype(object)
    frame["confidence"] = frame["confidence"].astype(float)
    return frame


def _answered_one(row: Mapping[str, Any], is_oos: bool) -> bool:
    if row["status"] == "failed":
        return is_oos  # failures count against the backend (see module doc)
    return bool(oos.answered_mask([row["handoff"]], [row["n_results"]])[0])


def _answered(info: pd.DataFrame, is_oos: np.ndarray) -> np.ndarray:
    answered = oos.answered_mask(info["handoff"].tolist(), info["n_results"].tolist())
    failed = (info["status"] == "failed").to_numpy()
    # failures count against the backend (see module doc)
    return np.where(failed, is_oos, answered)


def _scorecard(
    per_query: pd.DataFrame,
    metric_names: Sequence[str],
    is_oos: np.ndarray,
    answered: np.ndarray,
    failures: Sequence[FailedQuery],
) -> dict[str, float]:
    in_scope = per_query.loc[~is_oos]
    summary = scorecard.aggregate(in_scope[list(metric_names)]) if len(in_scope) else dict.fromkeys(metric_names, 0.0)
    summary.update(oos.handoff_metrics(is_oos, answered))
    ok = per_query["status"] == "ok"
    latency = per_query.loc[ok, "latency_ms"].dropna().to_numpy(dtype=float)
    summary["Latency_Avg_ms"] = float(latency.mean()) if latency.size else 0.0
    summary["Latency_P50_ms"] = float(np.percentile(latency, 50)) if latency.size else 0.0
    summary["Latency_P95_ms"] = float(np.percentile(latency, 95)) if latency.size else 0.0
    for k in JUDGED_DEPTHS:
        col = in_scope[f"Judged@{k}"].dropna() if len(in_scope) else pd.Series(dtype=float)
        # Coverage of what was shown: over the queries that returned something. When
        # nothing came back, coverage is undefined (NaN), never "fully judged".
        summary[f"Judged@{k}"] = float(col.mean()) if len(col) else math.nan
    summary["Failed_Queries"] = float(len(failures))
    # beside Judged@k: the in-scope queries that came back without a single result
    summary["Empty_Queries"] = float(((in_scope["status"] == "ok") & (in_scope["n_results"] == 0)).sum())
    # a backend that ignores top_k: what was cut off (OOS queries too; nothing of it is kept)
    summary["N_Truncated_Hits"] = float(per_query["n_truncated"].sum())
    summary["N_Repeated_Hits"] = float(per_query["n_repeats"].sum())
    summary["N_Queries"] = float(len(per_query))
    summary["N_InScope_Queries"] = float((~is_oos).sum())
    summary["N_OOS_Queries"] = float(is_oos.sum())
    return summary


def _unjudged_of(qid: str, hits: Sequence[Hit], judged: Mapping[str, int]) -> list[UnjudgedHit]:
    """The returned documents of one query without a label, first occurrence only."""
    out: list[UnjudgedHit] = []
    seen: set[str] = set()
    for rank, h in enumerate(hits, start=1):
        doc = h.doc_id
        if doc not in judged and doc not in seen:
            seen.add(doc)
            out.append(UnjudgedHit(qid, rank, doc, h.title))
    return out
