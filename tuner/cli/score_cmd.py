"""`tuner score`: score a run file (TREC, JSONL or JSON array) offline against qrels.

This is how a user checks a backend's exported run without serving it, and how the
scorecard is compared with trec_eval on the same files (same order, same -l).
The scorecard (numpy, pandas) is imported by the functions that score: every other
command loads this module too.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.console import Console
from rich.table import Table

from tuner.data.qrels import IDENTITY, GradeMap, read_qrels
from tuner.data.runs import ORDERS, Run, read_run
from tuner.errors import InputError
from tuner.files import atomic_write_text

if TYPE_CHECKING:
    import pandas as pd

COVERAGE_DEPTHS = (10, 20)
QUERY_SETS = ("qrels", "common")


def register(app: typer.Typer) -> None:
    app.command(name="score")(score)


def score(
    qrels: Annotated[
        Path | None, typer.Option("--qrels", help="TREC qrels: 'qid iter docno grade' (or 'qid docno grade').")
    ] = None,
    run: Annotated[
        Path | None,
        typer.Option(
            "--run",
            help="TREC run ('qid Q0 docno rank score tag'), JSONL "
            "({query_id, results: [{doc_id, score}]} per line, or one {qid, docid, rank, score} hit per line) or a "
            "JSON array of {hits: [{qid, docid, rank, score}]} per query; told apart by content.",
        ),
    ] = None,
    metric_names: Annotated[
        str | None,
        typer.Option(
            "--metrics",
            help="Comma-separated metrics, e.g. NDCG@10,P@5,ERR@20 (default: primary + secondary scorecard).",
        ),
    ] = None,
    gains: Annotated[str, typer.Option("--gains", help="Gain scheme: linear (grade) or exp (2^grade - 1).")] = "linear",
    relevance_level: Annotated[
        int,
        typer.Option(
            "--relevance-level",
            "-l",
            help="trec_eval -l: binary metrics (P, Recall, Success, MRR, AP) count "
            "grade >= N as relevant. Graded ones (NDCG, ERR, graded MAP...) and those named by their level "
            "(Useful_/Strong_/Exact_) ignore it, as trec_eval's ndcg does.",
        ),
    ] = 1,
    order: Annotated[
        str,
        typer.Option(
            "--order",
            help="trec: rank each query by score descending, ties by docno descending, as trec_eval does "
            "(rank fields and file order ignored; a query with no scores keeps file order). given: file order, e.g. "
            "captured API responses scored as the live scorecard does.",
        ),
    ] = "trec",
    grade_map: Annotated[
        str | None,
        typer.Option(
            "--grade-map",
            help="Map the qrels' grades onto 0..3, e.g. '1:3,2:2,3:1,4:1,-1:0' ('-1:unjudged' drops). "
            "Default: identity on 0..3.",
        ),
    ] = None,
    queries: Annotated[
        str,
        typer.Option(
            "--queries",
            help="qrels: every labelled query (a query missing from the run scores 0, like trec_eval -c); "
            "common: only queries in both files (trec_eval's default).",
        ),
    ] = "qrels",
    per_query: Annotated[bool, typer.Option("--per-query", help="Also print one row per query.")] = False,
    json_out: Annotated[
        Path | None, typer.Option("--json", help="Write the scores (aggregate + per query) to this JSON file.")
    ] = None,
    list_metrics: Annotated[bool, typer.Option("--list-metrics", help="List the metric families and exit.")] = False,
) -> None:
    """Score a run file offline against graded qrels and print the scorecard.

    Ranking (--order trec, the default): score descending, ties by docno descending, as trec_eval does.

    So a JSON or JSONL run scores exactly like the same run as TREC lines; --order given keeps file order.

    Scores are read at full precision, never rounded. -l N: binary metrics count grade >= N as relevant.
    """
    import pandas as pd

    from tuner import metrics

    console = Console()
    if list_metrics:
        console.print(_metrics_table())
        return
    if qrels is None or run is None:
        raise InputError("tuner score needs --qrels FILE and --run FILE (or --list-metrics)")
    metrics.check_relevance_level(relevance_level)
    if order not in ORDERS:
        raise InputError(f"--order {order!r} is not one of: {', '.join(ORDERS)}; trec is trec_eval's order")
    mapping = IDENTITY if grade_map is None else GradeMap.parse(grade_map)
    labels = read_qrels(qrels, mapping)
    ranked = read_run(run, order=order)
    query_ids = _query_ids(labels, ranked, queries)
    wanted = None if metric_names is None else [m.strip() for m in metric_names.split(",") if m.strip()]
    per_query_scores = metrics.score_rankings(
        ranked.rankings, labels, query_ids, gains=gains, metrics=wanted, relevance_level=relevance_level
    )
    coverage = pd.concat([metrics.judged_at_k(ranked.rankings, labels, query_ids, k) for k in COVERAGE_DEPTHS], axis=1)
    unlabelled = [q for q in ranked.rankings if q not in labels]
    report = _report(per_query_scores, coverage, qrels, run, ranked, order, gains, mapping, unlabelled)
    if json_out is not None:
        _write_json(json_out, report)
    _print(console, report, per_query_scores if per_query else None)
    if json_out is not None:
        console.print(f"wrote {json_out}")


def _query_ids(labels: dict[str, dict[str, int]], ranked: Run, queries: str) -> list[str]:
    if queries == "qrels":
        return list(labels)
    if queries == "common":
        return [q for q in labels if q in ranked.rankings]
    raise InputError(f"--queries {queries!r} is not one of: {', '.join(QUERY_SETS)}")


def _report(
    scores: pd.DataFrame,
    coverage: pd.DataFrame,
    qrels: Path,
    run: Path,
    ranked: Run,
    order: str,
    gains: str,
    mapping: GradeMap,
    unlabelled: list[str],
) -> dict[str, Any]:
    import pandas as pd

    from tuner import metrics

    return {
        "scorecard_version": metrics.SCORECARD_VERSION,
        "formula": metrics.SCORECARD_FORMULA,
        "gains": gains,
        "relevance_level": scores.attrs["relevance_level"],
        "grade_map": mapping.describe(),
        "qrels": str(qrels),
        "run": str(run),
        "run_format": ranked.format,
        "order": order,
        "n_queries": len(scores),
        "run_queries_without_labels": unlabelled,
        "aggregate": metrics.aggregate(scores),
        "coverage": metrics.aggregate(coverage),
        "per_query": {
            str(qid): {k: _finite(v) for k, v in row.items()}
            for qid, row in pd.concat([scores, coverage], axis=1).iterrows()
        },
    }


def _finite(value: float) -> float | None:
    return None if math.isnan(value) else float(value)


def _write_json(path: Path, report: dict[str, Any]) -> None:
    atomic_write_text(path, json.dumps(report, indent=2, allow_nan=False) + "\n")


def _print(console: Console, report: dict[str, Any], per_query: pd.DataFrame | None) -> None:
    from tuner.metrics import PRIMARY_METRIC

    caption = (
        f"{report['run']} ({report['run_format']}, {report['order']} order) · {report['n_queries']} queries · "
        f"gains {report['gains']} · relevant: grade >= {report['relevance_level']} · "
        f"grade map {report['grade_map']} · {report['scorecard_version']}"
    )
    table = Table(title="Scorecard")
    table.add_column("metric")
    table.add_column("mean", justify="right")
    for name, value in report["aggregate"].items():
        style = "bold" if name == PRIMARY_METRIC else None
        table.add_row(name, f"{value:.4f}", style=style)
    for name, value in report["coverage"].items():
        table.add_row(name, "n/a" if math.isnan(value) else f"{value:.4f}", style="dim")
    console.print(table)
    # one line, never folded: it says how to read every number above (and grep finds it)
    console.print(caption, soft_wrap=True, highlight=False)
    if report["run_queries_without_labels"]:
        console.print(
            f"note: {len(report['run_queries_without_labels'])} run queries have no labels and were "
            "not scored; label them or check the query ids"
        )
    if per_query is not None:
        console.print(_per_query_table(per_query))


def _per_query_table(scores: pd.DataFrame) -> Table:
    table = Table(title="Per query")
    table.add_column("query_id")
    for column in scores.columns:
        table.add_column(column, justify="right")
    for qid, row in scores.iterrows():
        table.add_row(str(qid), *(f"{value:.4f}" for value in row))
    return table


def _metrics_table() -> Table:
    from tuner import metrics

    table = Table(
        title=f"Metrics ({metrics.SCORECARD_VERSION}); write FAMILY@k, e.g. NDCG@23. "
        "L = --relevance-level (trec_eval -l), default 1"
    )
    for column in ("family", "cutoff", "gains", "-l", "trec_eval", "definition"):
        table.add_column(column)
    for family in metrics.list_metrics():
        table.add_row(
            family.name,
            "@k" if family.needs_cutoff else "@k or bare",
            "yes" if family.uses_gains else "",
            "yes" if family.binary else "",
            family.trec_eval,
            family.description,
        )
    return table
