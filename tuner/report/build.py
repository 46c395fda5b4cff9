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
from typing import TYPE_CHECKING, Any

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
PRIMARY = "Primary_Metric_Score"
GROUP_BY: tuple[str, ...] = ("query_type", "source")
#: context keys that hold the trial's parameters (search-space names -> values)
_PARAMETER_KEYS = ("assignment", "solved_gates")
#: coverage below this share of judged top-10 hits gets a tip in the report
COVERAGE_TIP_BELOW = 0.9


def label_token(grade: int | None) -> str:
    """``L0``..``L3`` for a judged hit, ``U`` for an unjudged one."""
    return "U" if grade is None else f"L{grade}"


def label_sequence(grades: Sequence[int | None], depth: int) -> str:
    """``1:L3 | 2:L1 | 3:U`` for the first ``depth`` hits."""
    return " | ".join(f"{rank}:{label_token(g)}" for rank, g in enumerate(grades[:depth], start=1))


def build_report(
    result: BatchResult, context: ReportContext | None = None, *, config_snapshot: str | None = None
) -> dict[str, Any]:
    ctx = context or ReportContext()
    report: dict[str, Any] = {
        "schema": REPORT_SCHEMA,
        "generated_at": datetime.now(UTC).isoformat(timespec="seconds"),
        "title": ctx.title,
        "context": _context(result, ctx),
        "scorecard": dict(result.metrics),
        "metric_groups": _metric_groups(result),
        "label_distribution": _label_distribution(result),
        "coverage": _coverage(result),
        "groups": _groups(result),
        "oos": _oos(result),
        "failed": [secrets.redact_mapping(f.to_dict(), _secret_names(ctx)) for f in result.failed],
        "queries": _queries(result),
        "unjudged": [u.to_dict() for u in result.unjudged],
        "config_snapshot": config_snapshot,
    }
    return jsonable(report)


def per_query_table(result: BatchResult) -> pd.DataFrame:
    """per_query plus the label sequences: the per-query CSV."""
    frame = result.per_query.copy()
    for depth in SEQUENCE_DEPTHS:
        frame[f"labels_top{depth}"] = [
            label_sequence(_grades(result, qid), depth) for qid in frame.index
        ]
    return frame


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
        "gain_values": {f"L{g}": float(v) for g, v in enumerate(scorecard.gain_table(result.gains, scorecard.MAX_GRADE))},
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


def _label_distribution(result: BatchResult) -> dict[str, Any]:
    """Grades in the label cache for this query set, and the label mix of what the
    service returned in its top 20 for in-scope queries (U = unjudged)."""
    cached = {f"L{g}": 0 for g in range(scorecard.MAX_GRADE + 1)}
    for labels in result.qrels.values():
        for grade in labels.values():
            cached[f"L{grade}"] += 1
    returned = {**{f"L{g}": 0 for g in range(scorecard.MAX_GRADE + 1)}, "U": 0}
    in_scope = result.per_query.index[result.per_query["scope"] == "in"]
    for qid in in_scope:
        for grade in _grades(result, qid)[:SNAPSHOT_DEPTH]:
            returned[label_token(grade)] += 1
    judged_queries = sum(1 for qid in in_scope if result.qrels.get(qid))
    return {
        "labels": cached,
        "n_labels": sum(cached.values()),
        "in_scope_queries_with_labels": judged_queries,
        "in_scope_queries": len(in_scope),
        f"returned_top{SNAPSHOT_DEPTH}": returned,
    }


def _coverage(result: BatchResult) -> dict[str, Any]:
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
            "`tuner labels import todo.csv --dataset-id ID`."
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


def _group_summary(frame: pd.DataFrame, primary: Sequence[str]) -> dict[str, Any]:
    in_scope = frame[frame["scope"] == "in"]
    oos = frame[frame["scope"] == "oos"]
    row: dict[str, Any] = {
        "n_queries": int(len(frame)),
        "n_in_scope": int(len(in_scope)),
        "n_oos": int(len(oos)),
    }
    for name in [PRIMARY, *primary, "Judged@10"]:
        row[name] = float(in_scope[name].mean()) if len(in_scope) and name in in_scope else None
    row["InScope_Handoff_Rate"] = float((~in_scope["answered"].astype(bool)).mean()) if len(in_scope) else None
    row["OOS_FP_Rate"] = float(oos["answered"].astype(bool).mean()) if len(oos) else None
    row["Failed_Queries"] = int((frame["status"] == "failed").sum())
    row["Latency_Avg_ms"] = float(frame["latency_ms"].mean()) if frame["latency_ms"].notna().any() else None
    return row


def _groups(result: BatchResult) -> dict[str, Any]:
    pq = result.per_query
    primary = [m for m in scorecard.PRIMARY_SCORECARD if m in pq.columns]
    groups: dict[str, Any] = {"overall": _group_summary(pq, primary)}
    for column in GROUP_BY:
        groups[column] = {
            str(name): _group_summary(part, primary) for name, part in pq.groupby(column, sort=True)
        }
    return groups


def _oos(result: BatchResult) -> dict[str, Any]:
    sweep = result.threshold_sweep
    hist = result.fallback_histogram
    return {
        "metrics": {name: result.metrics.get(name) for name in OOS_METRICS},
        "threshold_sweep": None if sweep is None else sweep.reset_index().to_dict(orient="records"),
        "fallback_histogram": None if hist is None else {
            str(qt): {str(level): int(n) for level, n in row.items()} for qt, row in hist.iterrows()
        },
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


def jsonable(value: Any) -> Any:
    """Plain JSON types only: NaN/inf -> None, numpy scalars -> Python, keys -> str."""
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
