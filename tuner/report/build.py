"""BatchResult -> the report as a plain, JSON-ready dict (pure).

The Markdown report and the per-query CSV are rendered from this same dict or the
same helpers, so the two never disagree.

Nothing secret gets into the dict (tuner.secrets): the request spec, the URL, the
caller's context and the failure reasons are redacted here; tuner.report.writer
scrubs the remembered secret values from the finished texts as a last line.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, Literal

import numpy as np
import pandas as pd

from tuner import metrics as scorecard
from tuner import secrets
from tuner.evaluation.oos import OOS_METRICS
from tuner.evaluation.result import OPERATION_KEYS
from tuner.report.context import REPORT_SCHEMA, ReportContext

if TYPE_CHECKING:
    from tuner.evaluation.result import BatchResult

SNAPSHOT_DEPTH = 20
SEQUENCE_DEPTHS: tuple[int, ...] = (10, 20)
#: the deepest rank of a response's hits any report reads (the unjudged list is its own field)
REPORT_HIT_DEPTH = max(SNAPSHOT_DEPTH, *SEQUENCE_DEPTHS)
PRIMARY = "Primary_Metric_Score"
GROUP_BY: tuple[str, ...] = ("query_type", "source")
#: context keys that hold the trial's parameters (search-space names -> values)
_PARAMETER_KEYS = ("assignment", "solved_gates")
#: coverage below this share of judged top-10 hits gets a tip in the report
COVERAGE_TIP_BELOW = 0.9

Detail = Literal["slim", "full"]
DETAILS: tuple[str, ...] = ("slim", "full")
#: what a slim report leaves out, and where the full data is kept
#: a slim report lists the unjudged hits down to this rank (what the label queue pools by default)
SLIM_UNJUDGED_DEPTH = 10
SLIM_NOTE = (
    "slim report: no per-query top-20 snapshots, unjudged hits only down to rank "
    f"{SLIM_UNJUDGED_DEPTH} (counts of all are kept; per-query rows are in the per-query CSV), "
    "and no PR-curve "
    "PNG (oos.threshold_sweep keeps the rows around the threshold in effect); the baseline, the best trials "
    "and `tuner apply` keep the full "
    "reports"
)
#: per-query CSV columns of a slim report (then Judged@10, the scorecard's primary metrics and labels_top10)
SLIM_CSV_COLUMNS: tuple[str, ...] = (
    "query_type",
    "source",
    "scope",
    "status",
    "handoff",
    "handoff_reason",
    "confidence",
    "fallback_level",
    "n_results",
    "n_repeats",
)


def label_token(grade: int | None) -> str:
    """``L0``..``L3`` for a judged hit, ``U`` for an unjudged one."""
    return "U" if grade is None else f"L{grade}"


def label_sequence(grades: Sequence[int | None], depth: int) -> str:
    """``1:L3 | 2:L1 | 3:U`` for the first ``depth`` hits."""
    return " | ".join(f"{rank}:{label_token(g)}" for rank, g in enumerate(grades[:depth], start=1))


def build_report(
    result: BatchResult,
    context: ReportContext | None = None,
    *,
    config_snapshot: str | None = None,
    detail: Detail = "full",
) -> dict[str, Any]:
    """The report dict. ``detail="slim"`` leaves out the per-query entries (top-20
    snapshots included): ``queries`` is None, ``query_texts`` maps the ids of the queries
    with an unjudged hit to their text, and ``unjudged`` lists the unjudged hits down to
    rank ``unjudged_depth`` (SLIM_UNJUDGED_DEPTH) only."""
    check_detail(detail)
    ctx = context or ReportContext()
    slim = detail == "slim"
    report: dict[str, Any] = {
        "schema": REPORT_SCHEMA,
        "detail": detail,
        "detail_note": SLIM_NOTE if slim else None,
        "generated_at": datetime.now(UTC).isoformat(timespec="seconds"),
        "title": ctx.title,
        "context": _context(result, ctx),
        "scorecard": dict(result.metrics),
        "metric_groups": _metric_groups(result),
        "label_distribution": _label_distribution(result),
        "coverage": _coverage(result, slim=slim),
        "groups": _groups(result),
        "oos": _oos(result, slim=slim),
        "failed": [secrets.redact_mapping(f.to_dict(), _secret_names(ctx)) for f in result.failed],
        "queries": None if slim else _queries(result),
        "unjudged": [u.to_dict() for u in result.unjudged if not slim or u.rank <= SLIM_UNJUDGED_DEPTH],
        "unjudged_depth": SLIM_UNJUDGED_DEPTH if slim else None,
        "query_texts": _query_texts(result) if slim else None,
        "config_snapshot": config_snapshot,
    }
    return jsonable(report)


def per_query_table(result: BatchResult, detail: Detail = "full") -> pd.DataFrame:
    """per_query plus the label sequences: the per-query CSV. ``slim``: SLIM_CSV_COLUMNS,
    Judged@10, the scorecard's primary metrics, Primary_Metric_Score and labels_top10."""
    check_detail(detail)
    if detail == "full":
        frame = result.per_query.copy()
        depths = SEQUENCE_DEPTHS
    else:
        pq = result.per_query
        primary = [m for m in scorecard.PRIMARY_SCORECARD if m in pq.columns]
        frame = pq[[c for c in (*SLIM_CSV_COLUMNS, "Judged@10", *primary, PRIMARY) if c in pq.columns]].copy()
        depths = (10,)
    for depth in depths:
        frame[f"labels_top{depth}"] = [label_sequence(_grades(result, qid), depth) for qid in frame.index]
    return frame


def for_reports(result: BatchResult) -> BatchResult:
    """A copy of ``result`` with only what reports read: each response's hits down to
    REPORT_HIT_DEPTH, no hit table. The reports it gives are the same bytes (tested); a
    study sends it to its report helper process, a third of the pickle of a batch of
    50-hit responses."""
    from dataclasses import replace

    return replace(result, hits={qid: hits[:REPORT_HIT_DEPTH] for qid, hits in result.hits.items()}, hit_table=None)


def check_detail(detail: str) -> None:
    if detail not in DETAILS:
        raise ValueError(f"report detail {detail!r}: use one of {', '.join(DETAILS)}")


# --------------------------------------------------------------------------- sections


def _secret_names(ctx: ReportContext) -> tuple[str, ...]:
    return secrets.secret_fields(ctx.spec) if ctx.spec is not None else ()


def _context(result: BatchResult, ctx: ReportContext) -> dict[str, Any]:
    names = _secret_names(ctx)
    return {
        "dataset_id": result.dataset_id,
        "dataset_hash": result.dataset_hash,
        "queries_file": ctx.queries_file,
        "labels_fingerprint": ctx.labels_fingerprint,
        "labels_db": ctx.labels_db,
        "gains": result.gains,
        "gain_values": {
            f"L{g}": float(v) for g, v in enumerate(scorecard.gain_table(result.gains, scorecard.MAX_GRADE))
        },
        "scorecard_version": result.scorecard_version,
        "scorecard_formula": scorecard.SCORECARD_FORMULA,
        "url": secrets.redact_url(ctx.url, names) if ctx.url is not None else None,
        "spec": secrets.redact_spec(ctx.spec) if ctx.spec is not None else None,
        **_redact_extra(ctx.extra, names),
    }


def _redact_extra(extra: Mapping[str, Any], names: tuple[str, ...]) -> dict[str, Any]:
    """The caller's context, redacted. Tuned parameters keep their values whatever their
    names (``rerank.key_boost`` is a number of the search space, not a credential)."""
    out = secrets.redact_mapping({str(k): v for k, v in extra.items() if k not in _PARAMETER_KEYS}, names)
    for key in _PARAMETER_KEYS:
        if key in extra:
            out[key] = extra[key]
    return {str(k): out[str(k)] for k in extra}


def _metric_groups(result: BatchResult) -> dict[str, list[str]]:
    names = set(result.metric_names)
    primary = [m for m in scorecard.PRIMARY_SCORECARD if m in names]
    return {
        "primary": [PRIMARY, *primary],
        "secondary": [m for m in result.metric_names if m not in primary and m != PRIMARY],
        "oos": list(OOS_METRICS),
        "operations": list(OPERATION_KEYS),
    }


def _grades(result: BatchResult, qid: str) -> list[int | None]:
    judged = result.qrels.get(qid, {})
    return [judged.get(h.doc_id) for h in result.hits.get(qid, ())]


#: the last labels counted and their counts: the report helper holds one study's labels
#: (tuner.report.report_worker) and counts them once, not again for every trial
#: (a batch's labels are a new dict each trial elsewhere: counted each time)
_counted: list[Any] = [None, {}]


def _grade_counts(qrels: Mapping[str, Mapping[str, int]]) -> dict[str, int]:
    """How many labels of each grade ``qrels`` holds (L0..L3)."""
    seen, counts = _counted
    if seen is not qrels or sum(counts.values()) != sum(map(len, qrels.values())):
        counts = {f"L{g}": 0 for g in range(scorecard.MAX_GRADE + 1)}
        for labels in qrels.values():
            for grade in labels.values():
                counts[f"L{grade}"] += 1
        _counted[:] = [qrels, counts]
    return dict(counts)


def _label_distribution(result: BatchResult) -> dict[str, Any]:
    """Grades in the label cache for this query set, and the label mix of what the
    service returned in its top 20 for in-scope queries (U = unjudged)."""
    cached = _grade_counts(result.qrels)
    returned = {**{f"L{g}": 0 for g in range(scorecard.MAX_GRADE + 1)}, "U": 0}
    in_scope = result.per_query.index[result.per_query["scope"] == "in"]
    for qid in in_scope:
        for hit_grade in _grades(result, qid)[:SNAPSHOT_DEPTH]:
            returned[label_token(hit_grade)] += 1
    judged_queries = sum(1 for qid in in_scope if result.qrels.get(qid))
    return {
        "labels": cached,
        "n_labels": sum(cached.values()),
        "in_scope_queries_with_labels": judged_queries,
        "in_scope_queries": len(in_scope),
        f"returned_top{SNAPSHOT_DEPTH}": returned,
    }


def _coverage(result: BatchResult, *, slim: bool = False) -> dict[str, Any]:
    pq = result.per_query
    in_scope = pq.index[pq["scope"] == "in"]
    unlabelled = [qid for qid in in_scope if not result.qrels.get(qid)]
    top10_unjudged = sum(1 for u in result.unjudged if u.rank <= 10)
    tips: list[str] = []
    j10 = result.metrics.get("Judged@10", 1.0)
    if j10 < COVERAGE_TIP_BELOW:
        tips.append(
            f"Only {j10:.0%} of the top-10 hits are labelled, so ranking metrics are lower bounds "
            f"(unlabelled hits count as Irrelevant). Label the {top10_unjudged} unjudged top-10 hits first: "
            "`tuner labels export-unjudged --report REPORT.json --out todo.csv`, grade them, then "
            "`tuner labels import todo.csv --dataset-id ID`"
            + (
                f" (this slim report lists the unjudged hits down to rank {SLIM_UNJUDGED_DEPTH}; the baseline's and "
                "the best trials' full reports list all)."
                if slim
                else "."
            )
        )
    if unlabelled:
        shown = ", ".join(unlabelled[:10]) + (" ..." if len(unlabelled) > 10 else "")
        tips.append(
            f"{len(unlabelled)} in-scope queries have no labels at all and score 0 on every ranking metric: {shown}."
        )
    if not tips:
        tips.append("Coverage is good: at least 90% of the top-10 hits are labelled.")
    return {
        "Judged@10": result.metrics.get("Judged@10"),
        "Judged@20": result.metrics.get("Judged@20"),
        "unjudged_hits": len(result.unjudged),
        "unjudged_in_top10": top10_unjudged,
        "in_scope_queries_without_labels": unlabelled,
        "tips": tips,
    }


class _GroupColumns:
    """The per-query columns a group summary reads, as numpy arrays taken once: a batch's
    groups (overall, by query type, by source) are summaries of row masks, with pandas'
    own arithmetic (a mean skips NaN: the sum with NaN as 0, over the count of the rest),
    so the numbers are the ones ``frame[mask][name].mean()`` gives, at a fraction of the
    cost of a frame per group (40 ms a trial on the demo)."""

    def __init__(self, pq: pd.DataFrame, primary: Sequence[str]) -> None:
        scope = pq["scope"].to_numpy()
        self.in_scope, self.oos = scope == "in", scope == "oos"
        self.means = {
            name: pq[name].to_numpy(dtype=np.float64, na_value=np.nan)
            for name in (PRIMARY, *primary, "Judged@10")
            if name in pq
        }
        self.names = [PRIMARY, *primary, "Judged@10"]
        self.answered = pq["answered"].astype(bool).to_numpy()
        self.failed = (pq["status"] == "failed").to_numpy()
        self.latency = pq["latency_ms"].to_numpy(dtype=np.float64, na_value=np.nan)

    def summary(self, rows: np.ndarray) -> dict[str, Any]:
        in_scope, oos = rows & self.in_scope, rows & self.oos
        n_in, n_oos = int(in_scope.sum()), int(oos.sum())
        row: dict[str, Any] = {"n_queries": int(rows.sum()), "n_in_scope": n_in, "n_oos": n_oos}
        for name in self.names:
            row[name] = _mean(self.means[name][in_scope]) if n_in and name in self.means else None
        row["InScope_Handoff_Rate"] = _mean((~self.answered[in_scope]).astype(np.float64)) if n_in else None
        row["OOS_FP_Rate"] = _mean(self.answered[oos].astype(np.float64)) if n_oos else None
        row["Failed_Queries"] = int(self.failed[rows].sum())
        latency = self.latency[rows]
        row["Latency_Avg_ms"] = _mean(latency) if not np.isnan(latency).all() else None
        return row


def _mean(values: np.ndarray) -> float:
    """pandas' mean of a float column: NaN skipped (summed as 0, not counted)."""
    missing = np.isnan(values)
    count = int(values.size - missing.sum())
    return float(np.where(missing, 0.0, values).sum() / count) if count else math.nan


def _groups(result: BatchResult) -> dict[str, Any]:
    pq = result.per_query
    primary = [m for m in scorecard.PRIMARY_SCORECARD if m in pq.columns]
    columns = _GroupColumns(pq, primary)
    groups: dict[str, Any] = {"overall": columns.summary(np.ones(len(pq), dtype=bool))}
    for column in GROUP_BY:
        codes, names = pd.factorize(pq[column], sort=True)  # as groupby(sort=True): sorted, NaN left out
        groups[column] = {str(name): columns.summary(codes == i) for i, name in enumerate(names)}
    return groups


#: a slim report's JSON keeps the sweep rows this many either side of the threshold in effect
SLIM_SWEEP_ROWS = 10


def _oos(result: BatchResult, *, slim: bool = False) -> dict[str, Any]:
    sweep = result.threshold_sweep
    if slim and sweep is not None and result.threshold_in_effect is not None and len(sweep) > 2 * SLIM_SWEEP_ROWS + 1:
        at = int(abs(sweep.index.to_numpy(dtype=float) - result.threshold_in_effect).argmin())
        sweep = sweep.iloc[max(0, at - SLIM_SWEEP_ROWS) : at + SLIM_SWEEP_ROWS + 1]  # the PNG plots every row
    hist = result.fallback_histogram
    return {
        "metrics": {name: result.metrics.get(name) for name in OOS_METRICS},
        "threshold_in_effect": result.threshold_in_effect,
        "threshold_sweep": None if sweep is None else sweep.reset_index().to_dict(orient="records"),
        "fallback_histogram": None
        if hist is None
        else {str(qt): {str(level): int(n) for level, n in row.items()} for qt, row in hist.iterrows()},
    }


def _queries(result: BatchResult) -> list[dict[str, Any]]:
    pq = result.per_query
    metric_cols = [c for c in (*result.metric_names, "Judged@10", "Judged@20") if c in pq.columns]
    info_cols = [c for c in pq.columns if c not in metric_cols]
    out: list[dict[str, Any]] = []
    for qid, row in zip(pq.index, pq.to_dict(orient="records"), strict=True):
        grades = _grades(result, qid)
        hits = result.hits.get(qid, ())
        entry = {"query_id": qid, **{c: row[c] for c in info_cols}}
        entry["metrics"] = {c: row[c] for c in metric_cols}
        for depth in SEQUENCE_DEPTHS:
            entry[f"labels_top{depth}"] = label_sequence(grades, depth)
        entry[f"top{SNAPSHOT_DEPTH}"] = [
            {"rank": rank, "doc_id": h.doc_id, "label": label_token(g), "title": h.title, "score": h.score}
            for rank, (h, g) in enumerate(zip(hits[:SNAPSHOT_DEPTH], grades, strict=False), start=1)
        ]
        out.append(entry)
    return out


# --------------------------------------------------------------------------- JSON


_AS_IS = frozenset({str, int, bool, type(None)})  # exact types jsonable returns unchanged


def jsonable(value: Any) -> Any:
    """Plain JSON types only: NaN/inf -> None, numpy scalars -> Python, keys -> str.

    A report is mostly plain dicts, lists, strings and numbers: their exact types are
    taken first, each to what the general rules below give it (the ABC check of
    ``Mapping`` on every value was most of the time: a demo trial's report helper spent
    about a third of its CPU here)."""
    kind = type(value)
    if kind in _AS_IS:
        return value
    if kind is float:
        return value if math.isfinite(value) else None
    if kind is dict:
        return {str(k): jsonable(v) for k, v in value.items()}
    if kind is list or kind is tuple:
        return [jsonable(v) for v in value]
    if isinstance(value, Mapping):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [jsonable(v) for v in value]
    if isinstance(value, (bool, np.bool_)):
        return bool(value)
    if isinstance(value, (int, np.integer)):
        return int(value)
    if isinstance(value, (float, np.floating)):
        f = float(value)
        return f if math.isfinite(f) else None
    if value is None or isinstance(value, str):
        return value
    if value is pd.NA or value is pd.NaT:
        return None
    return str(value)


def _query_texts(result: BatchResult) -> dict[str, str]:
    """query id -> text, for the queries a slim report lists unjudged hits of."""
    wanted = {u.query_id for u in result.unjudged if u.rank <= SLIM_UNJUDGED_DEPTH}
    return {q.query_id: q.query for q in result.queries if q.query_id in wanted}
