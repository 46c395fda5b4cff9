"""From collected responses and labels to a BatchResult: pure, no I/O.

Rules that make the numbers comparable across trials:

- Ranking metrics are averaged over **in-scope** queries; OOS queries have no
  ranking metrics (NaN per query) and feed the OOS / handoff metrics instead.
- The ranking scored is what the service returned, in its order, except that a
  handed-off query scores 0 (its scored ranking is empty). The raw results are kept
  for the threshold sweep, coverage and the report.
- Unlabelled hits count as Irrelevant; Judged@10 / Judged@20 say how many were labelled.
- Hits beyond ``top_k`` were cut when the response was parsed (mapping.parse_response):
  ``n_truncated`` per query and ``N_Truncated_Hits`` in total say how many.
- A document listed twice in one answer counts once, at its first place: the later
  copies were removed when the response was parsed (mapping.first_occurrences), before
  ranks were assigned, so the metrics, the reports' label sequences and the unjudged
  hits all read the same list; ``n_repeats`` per query and ``N_Repeated_Hits`` in total
  say how many were removed.
- A failed query counts against the backend everywhere: in scope it scores 0 and
  counts as handed off; out of scope it counts as answered (a false positive). So a
  config can never look better by failing on hard queries. No query is dropped.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from tuner import metrics as scorecard
from tuner.data.dataset import Query, QuerySet
from tuner.errors import EvaluationError
from tuner.evaluation import oos
from tuner.evaluation.hits import HitTable
from tuner.evaluation.mapping import Hit
from tuner.evaluation.outcomes import FailedQuery, QueryResponse, UnjudgedHit
from tuner.evaluation.summary import batch_scorecard

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


@dataclass(repr=False)
class BatchResult:
    """Everything one batch evaluation produced; ``metrics`` is the scorecard."""

    metrics: dict[str, float]
    per_query: pd.DataFrame
    unjudged: list[UnjudgedHit]
    threshold_sweep: pd.DataFrame | None
    fallback_histogram: pd.DataFrame | None
    failed: list[FailedQuery]
    queries: QuerySet
    #: query_id -> hits as returned, repeats removed (also for handed-off queries); empty when failed
    hits: dict[str, tuple[Hit, ...]]
    #: labels of the queries in this set only
    qrels: dict[str, dict[str, int]]
    gains: str = "linear"
    scorecard_version: str = scorecard.SCORECARD_VERSION
    metric_names: tuple[str, ...] = field(default_factory=tuple)
    #: the confidence threshold the batch's handoffs stand for, when known (a solved gate:
    #: tuner.evaluation.regate); the threshold sweep has a row at exactly this value
    threshold_in_effect: float | None = None
    #: ``hits`` as flat arrays with each document's grade (tuner.evaluation.hits), so a re-gated
    #: batch or the gate solver never looks a document up again; None: build it when needed
    hit_table: HitTable | None = field(default=None, compare=False)

    def __repr__(self) -> str:
        # short on purpose: asyncio and debuggers repr results, and the full frames are large
        return (
            f"BatchResult(dataset_id={self.dataset_id!r}, n_queries={len(self.per_query)}, "
            f"failed={len(self.failed)}, Primary_Metric_Score={self.metrics.get(PRIMARY, float('nan')):.4f})"
        )

    @property
    def dataset_id(self) -> str:
        return self.queries.dataset_id

    @property
    def dataset_hash(self) -> str:
        return self.queries.content_hash

    @property
    def primary(self) -> float:
        return self.metrics[PRIMARY]

    @property
    def truncated_hits(self) -> int:
        """Hits the service returned beyond top_k, cut off, over every query."""
        return int(self.metrics.get("N_Truncated_Hits", 0))

    @property
    def repeated_hits(self) -> int:
        """Later copies of a document already in the same answer, removed, over every query."""
        return int(self.metrics.get("N_Repeated_Hits", 0))


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
    builder = ResultBuilder(
        queries,
        qrels,
        gains=gains,
        metrics=metrics,
        sweep_thresholds=sweep_thresholds,
        threshold_in_effect=threshold_in_effect,
    )
    outcomes: list[QueryResponse | FailedQuery] = [*responses, *failed]
    for outcome in outcomes:
        builder.add(outcome)
    return builder.finish()


class ResultBuilder:
    """``evaluate_responses`` one outcome at a time.

    ``add`` only checks and keeps each outcome as it arrives: it runs on the event loop
    that sends the requests, so everything it does is tuner time on the backend's path.
    ``finish`` builds the exchange rows and the unjudged hits and scores the batch; a
    pipelined study calls it on its helper thread, while the next trial is measured.
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

    def empty_in_scope(self) -> tuple[list[str], int]:
        """The in-scope queries answered with no results (in query order), and how many
        in-scope queries were answered: what ``empty_results_problem`` judges, known before
        ``finish`` (a trial checks it before the next one is measured)."""
        empty: list[str] = []
        answered = 0
        for q in self.queries:
            outcome = self._by_id.get(q.query_id)
            if q.scope != "oos" and isinstance(outcome, QueryResponse):
                answered += 1
                if not outcome.response.hits:
                    empty.append(q.query_id)
        return empty, answered

    def failed_outcomes(self) -> list[FailedQuery]:
        """The failures collected so far, in query order."""
        return [o for q in self.queries if isinstance(o := self._by_id.get(q.query_id), FailedQuery)]

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
        hits = {
            qid: (o.response.hits if isinstance(o, QueryResponse) else ()) for qid, o in zip(ids, outcomes, strict=True)
        }
        labels = {qid: dict(self.qrels[qid]) for qid in ids if qid in self.qrels}
        info = _info_frame_from_rows([_info_row(q, o) for q, o in zip(qs, outcomes, strict=True)], ids)
        unjudged = [  # in-scope answers only
            u
            for q, o in zip(qs, outcomes, strict=True)
            if q.scope != "oos" and isinstance(o, QueryResponse)
            for u in _unjudged_of(q.query_id, o.response.hits, labels.get(q.query_id, {}))
        ]
        return score_result(
            queries,
            info,
            hits,
            labels,
            [o for o in outcomes if isinstance(o, FailedQuery)],
            unjudged,
            gains=gains,
            metrics=metrics,
            sweep_thresholds=self.sweep_thresholds,
            threshold_in_effect=self.threshold_in_effect,
        )


def score_result(
    queries: QuerySet,
    info: pd.DataFrame,
    hits: dict[str, tuple[Hit, ...]],
    labels: dict[str, dict[str, int]],
    failures: list[FailedQuery],
    unjudged: list[UnjudgedHit],
    *,
    gains: str = "linear",
    metrics: Sequence[str] | None = None,
    sweep_thresholds: Sequence[float] | None = None,
    threshold_in_effect: float | None = None,
    histogram_of: BatchResult | None = None,
    table: HitTable | None = None,
) -> BatchResult:
    """The scoring step of every BatchResult: ``ResultBuilder.finish`` and
    tuner.evaluation.regate both end here, so a batch and a re-gated batch are scored
    by the same code. ``info``: the exchange rows (INFO_COLUMNS but ``answered``, index
    query_id in ``queries`` order); ``hits``, ``labels``, ``failures`` (in query order)
    and ``unjudged`` as the BatchResult holds them. ``histogram_of``: a batch with the
    same query types and fallback levels, whose fallback histogram is copied rather
    than counted again; ``table``: ``hits`` with their grades (tuner.evaluation.hits),
    built from ``hits`` and ``labels`` when not given."""
    ids = [q.query_id for q in queries]
    is_oos = np.array([q.scope == "oos" for q in queries], dtype=bool)  # info's scope column
    answered = _answered(info, is_oos)

    # Each in-scope query's whole list is its ranking (a handed-off one is zeroed below).
    in_ids = [qid for qid, o in zip(ids, is_oos, strict=True) if not o]
    metrics = None if metrics is None else list(metrics)
    depth, ideal_depth = scorecard.batch_depths(metrics, JUDGED_DEPTHS)
    if table is None:
        table = HitTable.build(ids, [hits[q] for q in ids], labels, ~is_oos)
    rows = np.flatnonzero(~is_oos)
    batch = table.batch(in_ids, rows, table.counts[rows], gains=gains, depth=depth, ideal_depth=ideal_depth)
    raw, judged = scorecard.score_prepared(batch, metrics, JUDGED_DEPTHS)
    metric_names = tuple(str(c) for c in raw)
    keep = answered[rows].astype(float)  # a handed-off / failed query scores 0

    def column(values: Any, factor: Any = None) -> np.ndarray:  # OOS queries: NaN
        out = np.full(len(ids), np.nan)
        out[rows] = values if factor is None else np.asarray(values) * factor
        return out

    numeric = {name: column(v) for name, v in judged.items()} | {name: column(v, keep) for name, v in raw.items()}
    # the exchange rows, answered, then coverage and metrics (NaN for OOS queries), as one frame
    # (of its own: copied, so no other batch's rows share its memory)
    per_query = pd.DataFrame(
        {**{c: info[c].array for c in info.columns}, "answered": answered, **numeric}, index=info.index, copy=True
    )
    sweep = oos.threshold_sweep(
        is_oos,
        info["confidence"].tolist(),
        info["n_results"].tolist(),
        column(raw[PRIMARY]),
        sweep_thresholds,
        observed_scores=numeric[PRIMARY],
    )
    if histogram_of is None:
        histogram = oos.fallback_histogram(info["query_type"].tolist(), info["fallback_level"].tolist())
    else:
        histogram = None if histogram_of.fallback_histogram is None else histogram_of.fallback_histogram.copy()
    return BatchResult(
        metrics=batch_scorecard(info, numeric, metric_names, is_oos, answered, failures, JUDGED_DEPTHS),
        per_query=per_query,
        unjudged=unjudged,
        threshold_sweep=sweep,
        fallback_histogram=histogram,
        failed=failures,
        queries=queries,
        hits=hits,
        qrels=labels,
        gains=gains,
        scorecard_version=scorecard.SCORECARD_VERSION,
        metric_names=metric_names,
        threshold_in_effect=threshold_in_effect,
        hit_table=table,
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
    _, scores, judged = scorecard.score_arrays(
        ranking, labels, [qid], gains=gains, metrics=metrics, judged_depths=JUDGED_DEPTHS
    )
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
    failed = info["status"].to_numpy(dtype=object) == "failed"
    # failures count against the backend (see module doc)
    return np.where(failed, is_oos, answered)


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
