"""The Markdown report, rendered from the JSON report dict (pure).

A ``full`` report has every section; a ``slim`` one (report["detail"], a study's
ordinary trial) keeps what picks a winner: the context, the solved gates, the
scorecard, the handoff summary with the sweep rows around the threshold in effect,
the coverage numbers and the failed queries, and no per-query sections.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from tuner.numbers import num

#: the Markdown lists at most this many unjudged hits (the JSON report has them all)
MAX_UNJUDGED_LISTED = 200
#: a slim report shows the sweep rows this many either side of the threshold in effect
SLIM_SWEEP_NEIGHBOURS = 5
#: ... and, without a threshold in effect, about this many rows spread over the grid
SLIM_SWEEP_ROWS = 11
#: a slim report lists at most this many failed queries
SLIM_FAILED_LISTED = 20
#: context keys shown in their own section, not in the context table
_SOLVED_KEYS = ("solved_gates", "solved_gates_note")
#: said under the scorecard when answers listed a document twice (tuner.evaluation.mapping's rule)
_REPEATS_NOTE = (
    "N_Repeated_Hits = {n}: answers listed a doc id again after its first place; each document counts "
    "once, at its first place, and the later copies were removed before ranks were assigned "
    "(per query: n_repeats), as a run file without the repeats scores in `tuner score`."
)
_SUMMARY_METRICS = ("Primary_Metric_Score", "NDCG@20", "ERR@10", "Strong_Precision@10")


def render_markdown(report: Mapping[str, Any], *, pr_curve: str | None = None) -> str:
    """The whole report; ``pr_curve`` is the PNG's path relative to the Markdown file."""
    if report.get("detail") == "slim":
        return _slim(report, pr_curve)
    parts = [
        f"# {report['title']}: {report['context']['dataset_id']}",
        f"Generated {report['generated_at']} ({report['schema']}).",
        _context(report["context"]),
        _solved(report["context"]),
        _scorecard(report),
        _labels(report["label_distribution"]),
        _groups(report["groups"]),
        _oos(report["oos"], pr_curve),
        _coverage(report["coverage"], report["unjudged"]),
        _failed(report["failed"]),
        _queries(report["queries"]),
        _config(report.get("config_snapshot")),
    ]
    return "\n\n".join(p for p in parts if p).rstrip() + "\n"


def _slim(report: Mapping[str, Any], pr_curve: str | None) -> str:
    failed = report["failed"]
    parts = [
        f"# {report['title']}: {report['context']['dataset_id']}",
        f"Generated {report['generated_at']} ({report['schema']}, {report['detail_note']}).",
        _context(report["context"]),
        _solved(report["context"]),
        _scorecard(report),
        _oos(report["oos"], pr_curve, slim=True),
        _coverage(report["coverage"], ()),
        _failed(failed[:SLIM_FAILED_LISTED]),
        f"The first {SLIM_FAILED_LISTED} of {len(failed)} failed queries (all of them are in the JSON report)."
        if len(failed) > SLIM_FAILED_LISTED
        else "",
    ]
    return "\n\n".join(p for p in parts if p).rstrip() + "\n"


def fmt(value: Any, digits: int | None = None) -> str:
    """A cell: a float as people read it (tuner.numbers.num), or to ``digits`` decimals
    where a column wants them all alike (thresholds)."""
    if value is None:
        return "n/a"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return num(value) if digits is None else f"{value:.{digits}f}"
    return _cell(str(value))


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def table(headers: Sequence[str], rows: Iterable[Sequence[Any]]) -> str:
    lines = ["| " + " | ".join(_cell(h) for h in headers) + " |", "|" + "---|" * len(headers)]
    lines += ["| " + " | ".join(fmt(v) for v in row) + " |" for row in rows]
    return "\n".join(lines)


def _context(ctx: Mapping[str, Any]) -> str:
    keys = [
        "dataset_id",
        "dataset_hash",
        "queries_file",
        "labels_fingerprint",
        "labels_db",
        "gains",
        "scorecard_version",
        "scorecard_formula",
        "url",
    ]
    rows = [(k, ctx.get(k)) for k in keys]
    gains = ctx.get("gain_values") or {}
    rows.append(("gain_values", ", ".join(f"{k}={v:g}" for k, v in gains.items())))
    rows += [(k, v) for k, v in ctx.items() if k not in keys and k not in ("gain_values", "spec", *_SOLVED_KEYS)]
    return "## Metric context\n\n" + table(["key", "value"], rows)


def _solved(ctx: Mapping[str, Any]) -> str:
    gates = ctx.get("solved_gates")
    if not gates:
        return ""
    out = ["## Solved gates", table(["gate", "value"], [(k, v) for k, v in gates.items()])]
    if ctx.get("solved_gates_note"):
        out.append(str(ctx["solved_gates_note"]))
    return "\n\n".join(out)


def _scorecard(report: Mapping[str, Any]) -> str:
    card, groups = report["scorecard"], report["metric_groups"]
    out = ["## Scorecard", "Ranking metrics are means over in-scope queries; a handed-off or failed query scores 0."]
    for title, key in (
        ("Primary", "primary"),
        ("Secondary", "secondary"),
        ("Out of scope / handoff", "oos"),
        ("Operations and coverage", "operations"),
    ):
        rows = [(m, _metric_value(m, card.get(m))) for m in groups[key]]
        out.append(f"### {title}\n\n" + table(["metric", "value"], rows))
    if card.get("N_Repeated_Hits"):
        out.append(_REPEATS_NOTE.format(n=int(card["N_Repeated_Hits"])))
    return "\n\n".join(out)


def _metric_value(name: str, value: Any) -> Any:
    if isinstance(value, float) and (name.startswith("N_") or name in ("Failed_Queries", "Empty_Queries")):
        return int(value)
    if isinstance(value, float) and name.startswith("Latency"):
        return f"{value:.1f}"
    return value


def _labels(dist: Mapping[str, Any]) -> str:
    labels = dist["labels"]
    returned = next(v for k, v in dist.items() if k.startswith("returned_top"))
    depth = next(k for k in dist if k.startswith("returned_top")).removeprefix("returned_top")
    return "\n\n".join(
        [
            "## Label distribution",
            f"{dist['n_labels']} labels for this query set; {dist['in_scope_queries_with_labels']} of "
            f"{dist['in_scope_queries']} in-scope queries have labels.",
            table(["", *labels.keys()], [("labels in the cache", *labels.values())]),
            f"Labels of the returned top {depth} (in-scope queries; U = unjudged, counted as Irrelevant):",
            table(["", *returned.keys()], [(f"returned top {depth}", *returned.values())]),
        ]
    )


def _group_table(groups: Mapping[str, Mapping[str, Any]], label: str) -> str:
    if not groups:
        return ""
    cols = list(next(iter(groups.values())).keys())
    return table([label, *cols], [(name, *(row[c] for c in cols)) for name, row in groups.items()])


def _groups(groups: Mapping[str, Any]) -> str:
    out = ["## Grouped views", "### Overall", _group_table({"all": groups["overall"]}, "group")]
    for key in ("query_type", "source"):
        out += [f"### By {key}", _group_table(groups[key], key)]
    return "\n\n".join(out)


def _oos(oos: Mapping[str, Any], pr_curve: str | None, *, slim: bool = False) -> str:
    out = ["## Out of scope and handoff"]
    if not slim:  # a slim report has them in its scorecard only
        out.append(table(["metric", "value"], list(oos["metrics"].items())))
    sweep = oos.get("threshold_sweep")
    if sweep:
        cols = list(sweep[0].keys())
        at = _row_at(sweep, oos.get("threshold_in_effect"))
        shown = _sweep_rows(len(sweep), at) if slim else list(range(len(sweep)))
        out += [
            "### Confidence threshold sweep",
            "Answer when confidence >= threshold; 'handoff' is the positive prediction for OOS queries."
            + (
                ""
                if at is None
                else f" The row marked 'in effect' is the threshold this report scores ({fmt(sweep[at]['threshold'])})."
            ),
            table(cols, [_sweep_cells(sweep[i], cols, i == at) for i in shown]),
        ]
        if len(shown) < len(sweep):
            out.append(
                f"{len(shown)} of {len(sweep)} thresholds ({fmt(sweep[0]['threshold'], 2)} to "
                f"{fmt(sweep[-1]['threshold'], 2)}); every row is in the JSON report and the plot."
            )
        if pr_curve:
            out.append(f"![handoff precision-recall curve]({pr_curve})")
    else:
        out.append("No response carried a confidence value: no threshold sweep.")
    hist = oos.get("fallback_histogram")
    if hist:
        levels = sorted({lv for row in hist.values() for lv in row}, key=str)
        out += [
            "### Fallback level per query_type",
            table(["query_type", *levels], [(qt, *(row.get(lv, 0) for lv in levels)) for qt, row in hist.items()]),
        ]
    return "\n\n".join(out)


def _row_at(sweep: Sequence[Mapping[str, Any]], threshold: float | None) -> int | None:
    if threshold is None:
        return None
    return next((i for i, row in enumerate(sweep) if abs(row["threshold"] - threshold) <= 1e-9), None)


def _sweep_rows(n: int, at: int | None) -> list[int]:
    """The rows a slim report shows: around ``at``, else spread evenly (first and last kept)."""
    if at is not None:
        return list(range(max(0, at - SLIM_SWEEP_NEIGHBOURS), min(n, at + SLIM_SWEEP_NEIGHBOURS + 1)))
    if n <= SLIM_SWEEP_ROWS:
        return list(range(n))
    return sorted({round(i * (n - 1) / (SLIM_SWEEP_ROWS - 1)) for i in range(SLIM_SWEEP_ROWS)})


def _sweep_cells(row: Mapping[str, Any], cols: Sequence[str], in_effect: bool) -> list[Any]:
    cells = [row[c] for c in cols]
    if in_effect:
        cells[cols.index("threshold")] = f"**{fmt(row['threshold'])}** (in effect)"
    return cells


def _coverage(cov: Mapping[str, Any], unjudged: Sequence[Mapping[str, Any]] | None) -> str:
    out = [
        "## Coverage",
        f"Judged@10 = {fmt(cov['Judged@10'])}, Judged@20 = {fmt(cov['Judged@20'])}; "
        f"{cov['unjudged_hits']} unjudged hits ({cov['unjudged_in_top10']} in a top 10).",
        "\n".join(f"- {tip}" for tip in cov["tips"]),
    ]
    if unjudged:
        shown = unjudged[:MAX_UNJUDGED_LISTED]
        out.append("### Unjudged hits")
        if len(unjudged) > len(shown):
            out.append(f"The first {len(shown)} of {len(unjudged)} (all of them are in the JSON report).")
        out.append(
            table(
                ["query_id", "rank", "doc_id", "title"],
                [(u["query_id"], u["rank"], u["doc_id"], u.get("title")) for u in shown],
            )
        )
    return "\n\n".join(out)


def _failed(failed: Sequence[Mapping[str, Any]]) -> str:
    if not failed:
        return "## Failed queries\n\nNone."
    return "## Failed queries\n\n" + table(
        ["query_id", "request_id", "attempts", "reason"],
        [(f["query_id"], f["request_id"], f["attempts"], f["reason"]) for f in failed],
    )


def _queries(queries: Sequence[Mapping[str, Any]]) -> str:
    summary = table(
        [
            "query_id",
            "type",
            "source",
            "scope",
            "status",
            *_SUMMARY_METRICS,
            "handoff",
            "latency_ms",
            "request_id",
            "top-10 labels",
        ],
        [
            (
                q["query_id"],
                q["query_type"],
                q["source"],
                q["scope"],
                q["status"],
                *(q["metrics"].get(m) for m in _SUMMARY_METRICS),
                q["handoff"],
                q["latency_ms"],
                q["request_id"],
                q["labels_top10"],
            )
            for q in queries
        ],
    )
    details = [_query_detail(q) for q in queries]
    return "\n\n".join(["## Per query", summary, "### Top-20 snapshots", *details])


def _query_detail(q: Mapping[str, Any]) -> str:
    head = f"#### {q['query_id']}: {_cell(str(q['query']))}"
    facts = (
        f"scope {q['scope']}, type {q['query_type']}, source {q['source']}, status {q['status']}, "
        f"request_id `{q['request_id']}`, handoff {fmt(q['handoff'])}, confidence {fmt(q['confidence'])}"
    )
    if q.get("n_repeats"):
        facts += f", repeats removed {q['n_repeats']}"
    if q.get("failure_reason"):
        facts += f"; failed: {_cell(str(q['failure_reason']))}"
    lines = [head, facts, f"top-20 labels: {q['labels_top20'] or '(no results)'}"]
    if q["top20"]:
        lines.append(
            table(
                ["rank", "doc_id", "label", "title", "score"],
                [(h["rank"], h["doc_id"], h["label"], h["title"], h["score"]) for h in q["top20"]],
            )
        )
    return "\n\n".join(lines)


def _config(snapshot: str | None) -> str:
    body = snapshot.rstrip("\n") if snapshot else "(no config snapshot recorded)"
    fence = "````" if "```" in body else "```"
    return f"## Config snapshot\n\n{fence}\n{body}\n{fence}"
