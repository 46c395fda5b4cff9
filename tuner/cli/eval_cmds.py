"""`tuner eval` (one batch evaluation of a live search API, with CI gates) and
`tuner labels import | stats | export-unjudged`."""

from __future__ import annotations

from contextlib import nullcontext
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated, Any, cast

import typer
from rich.console import Console
from rich.table import Table

from tuner.errors import ConfigError, InputError, LabelError

DEFAULT_DB = Path(".tuner/labels.db")


def _console(*, stderr: bool = False) -> Console:
    # soft_wrap: one message stays one line in CI logs, whatever the terminal width
    return Console(stderr=stderr, soft_wrap=True)


labels_app = typer.Typer(
    name="labels", help="The label cache: import, inspect, export unjudged hits.", no_args_is_help=True
)


def register(app: typer.Typer) -> None:
    app.command(name="eval")(eval_command)
    app.add_typer(labels_app, name="labels")


# --------------------------------------------------------------------------- tuner eval


def eval_command(
    queries: Annotated[Path | None, typer.Option("--queries", help="Query set (JSONL).")] = None,
    experiment: Annotated[
        Path | None,
        typer.Option(
            "--experiment",
            help="Take the query set, labels, request/response mapping and backend from an experiment "
            "file (flags still override): its backend is started on the config as found and stopped after, as "
            "`tuner check` does.",
        ),
    ] = None,
    port: Annotated[
        int | None,
        typer.Option(
            "--port",
            help="With --experiment: measure a backend already running on this port (filling {port} in "
            "its URLs) instead of starting one.",
        ),
    ] = None,
    url: Annotated[
        str | None, typer.Option("--url", help="Search endpoint, e.g. http://127.0.0.1:8080/search.")
    ] = None,
    spec_file: Annotated[
        Path | None,
        typer.Option(
            "--spec",
            help="YAML EvalSpec: request (url, method, headers, body template, pass_extra), response "
            "(results_path, doc_id, score, title, confidence, handoff, fallback_level), top_k, concurrency, ...",
        ),
    ] = None,
    labels_db: Annotated[
        Path | None,
        typer.Option("--labels-db", help=f"Label cache (SQLite); default {DEFAULT_DB}, or the experiment's."),
    ] = None,
    dataset_id: Annotated[
        str | None, typer.Option("--dataset-id", help="Dataset id of the labels (default: the query file's stem).")
    ] = None,
    out: Annotated[
        Path | None, typer.Option("--out", help="Report directory (default .tuner/reports/<dataset>-<time>).")
    ] = None,
    top_k: Annotated[int | None, typer.Option("--top-k", min=1, help="Results to ask for per query.")] = None,
    concurrency: Annotated[int | None, typer.Option("--concurrency", min=1, help="Requests in flight at once.")] = None,
    timeout_s: Annotated[
        float | None, typer.Option("--timeout", min=0.001, help="Seconds per request attempt.")
    ] = None,
    retries: Annotated[
        int | None, typer.Option("--retries", min=0, max=10, help="Retries on transport errors / 5xx.")
    ] = None,
    max_failed: Annotated[
        float | None,
        typer.Option("--max-failed", min=0, help="Failure budget: a fraction (<1) or a count (>=1) of queries."),
    ] = None,
    gains: Annotated[str | None, typer.Option("--gains", help="linear (grade) or exp (2^grade - 1).")] = None,
    confidence: Annotated[
        str | None, typer.Option("--confidence-field", help="Response path of the confidence value.")
    ] = None,
    handoff: Annotated[str | None, typer.Option("--handoff-field", help="Response path of the handoff flag.")] = None,
    fallback: Annotated[
        str | None, typer.Option("--fallback-field", help="Response path of the fallback level.")
    ] = None,
    order_seed: Annotated[
        int | None, typer.Option("--order-seed", help="Shuffle the query order with this seed.")
    ] = None,
    config_snapshot: Annotated[
        Path | None,
        typer.Option("--config-snapshot", help="A text file (e.g. the backend's config.yaml) to record in the report."),
    ] = None,
    title: Annotated[str, typer.Option("--title", help="Report title.")] = "Batch evaluation",
    fail_under: Annotated[
        list[str] | None,
        typer.Option(
            "--fail-under", help="Gate: exit 1 when METRIC < VALUE, e.g. Primary_Metric_Score=0.6 (repeatable)."
        ),
    ] = None,
    fail_over: Annotated[
        list[str] | None,
        typer.Option("--fail-over", help="Gate: exit 1 when METRIC > VALUE, e.g. OOS_FP_Rate=0.1 (repeatable)."),
    ] = None,
    unjudged: Annotated[
        str,
        typer.Option(
            "--unjudged-queries",
            help="In-scope queries without any judgment: drop (counted), keep (each scores 0) "
            "or error. With --experiment: its dataset.unjudged_queries.",
        ),
    ] = "drop",
    skip_checks: Annotated[
        bool,
        typer.Option(
            "--skip-checks",
            help="Report even when the preflight finds a set-up that gives wrong numbers "
            "(the report records it); otherwise exit 2.",
        ),
    ] = False,
) -> None:
    """Run one batch evaluation against a live search API and write its reports.

    The preflight checks (`tuner check`) run on this batch: most queries empty, doc ids
    that match no label, most queries handed off, a gate on OOS metrics without OOS
    queries stop with exit 2 (the reports are written all the same)."""
    from tuner.data.dataset import judged_subset, load_queryset
    from tuner.data.labels import LabelStore, stale_labels_message
    from tuner.evaluation import check_gates, parse_gate, run_batch, scorecard_keys
    from tuner.evaluation.probe import fetch_raw
    from tuner.report import ReportContext, write_reports
    from tuner.study.preflight import PreflightReport, check_batch, gate_constraint, static_checks

    console = _console()
    gates = [parse_gate(g, "under") for g in fail_under or []] + [parse_gate(g, "over") for g in fail_over or []]
    known = set(scorecard_keys())  # a typo in a gate fails before any traffic
    for gate in gates:
        if gate.metric not in known:
            raise InputError(
                f"gate {gate.describe()}: unknown metric {gate.metric!r}; known: {', '.join(sorted(known))}"
            )
    flags = dict(
        url=url,
        top_k=top_k,
        concurrency=concurrency,
        timeout_s=timeout_s,
        retries=retries,
        max_failed=max_failed,
        gains=gains,
        confidence=confidence,
        handoff=handoff,
        fallback=fallback,
    )
    snapshot = _read_snapshot(config_snapshot)
    backend: Any = nullcontext()  # the backend is running already, or started below (started: its experiment)
    started: Any = None
    if experiment is not None:
        spec, query_set, qrels, fingerprint, labels_db, queries, note, policy, started = _from_experiment(
            experiment, port, spec_file, flags, queries=queries, dataset_id=dataset_id, labels_db=labels_db
        )
        if started is not None:  # its backend, started here on the config as found (tuner.ops.backend)
            from tuner.cli.study_common import warn_pending_journal
            from tuner.ops.backend import served_as_found

            warn_pending_journal(console, started)
            backend = served_as_found(started, command="tuner eval")
    else:
        if queries is None:
            raise InputError("tuner eval needs --queries FILE (or --experiment FILE)")
        spec = _spec(spec_file, **flags)
        query_set = load_queryset(queries, dataset_id)
        labels_db = labels_db or DEFAULT_DB
        store = LabelStore(_existing_db(labels_db))
        qrels = store.qrels(query_set.dataset_id)
        changes = store.source_changes(query_set.dataset_id)  # the files imported into it, read again
        if changes:
            raise LabelError(stale_labels_message(changes, query_set.dataset_id, labels_db))
        fingerprint = store.fingerprint(query_set.dataset_id)
        judged = judged_subset(query_set, qrels, unjudged)
        query_set, note, policy = judged.queries, judged.note, unjudged

    preflight = PreflightReport(n_total=len(query_set), skipped=skip_checks)
    preflight.extend(
        static_checks(spec, query_set, [gate_constraint(g) for g in gates], unjudged_note=note, unjudged_policy=policy)
    )
    preflight.raise_for_stops("tuner eval")
    if started is not None:
        console.print(
            f"starting the backend on the config as found (target.apply {started.target.apply}); it is "
            "stopped after the batch",
            highlight=False,
        )
    with backend:
        console.print(
            f"evaluating {len(query_set)} queries of [bold]{query_set.dataset_id}[/] against "
            f"{spec.request.url} (concurrency {spec.concurrency}, top_k {spec.top_k})"
        )
        result = run_batch(spec, query_set, qrels, order_seed=order_seed)
        preflight.n_checked = len(query_set)
        preflight.extend(check_batch(result, spec, raw_response=lambda qid: fetch_raw(spec, query_set[qid])))
    out_dir = out or Path(".tuner/reports") / f"{query_set.dataset_id}-{datetime.now(UTC):%Y%m%dT%H%M%SZ}"
    misses = check_gates(result.metrics, gates)
    context = ReportContext(
        title=title,
        labels_fingerprint=fingerprint,
        labels_db=str(labels_db),
        url=spec.request.url,
        queries_file=str(queries),
        spec=spec.model_dump(mode="json"),
        extra={
            "gates": [{"gate": g.describe(), "passed": all(m.gate != g for m in misses)} for g in gates],
            "preflight": preflight.for_reports(),
        },
    )
    paths = write_reports(result, out_dir, context=context, config_snapshot=snapshot)
    for finding in preflight.findings:
        console.print(finding.note, highlight=False, markup=False)
    if preflight.stops and not skip_checks:
        console.print(f"report (for diagnosis): {paths.json}")
    preflight.raise_for_stops("tuner eval")

    console.print(_scorecard_table(result.metrics))
    if result.failed:
        console.print(f"[yellow]{len(result.failed)} queries failed (within the budget); see the report[/]")
    for name, path in (
        ("JSON", paths.json),
        ("Markdown", paths.markdown),
        ("per-query CSV", paths.per_query_csv),
        ("PR curve", paths.pr_curve_png),
    ):
        if path is not None:
            console.print(f"{name:>14}: {path}")
    if misses:
        err = _console(stderr=True)
        for miss in misses:
            err.print(f"[red]{miss.message()}[/]", highlight=False)
        raise typer.Exit(1)
    if gates:
        console.print(f"[green]all {len(gates)} gate(s) passed[/]")


def _from_experiment(
    path: Path,
    port: int | None,
    spec_file: Path | None,
    flags: dict[str, Any],
    *,
    queries: Path | None,
    dataset_id: str | None,
    labels_db: Path | None,
) -> tuple[Any, ...]:
    """Spec, queries, labels (imported from the experiment's label files when missing),
    and the experiment when its backend is to be started here (None: a backend already
    running, given by --port or --url, or ``target.apply: none``)."""
    from tuner.config.experiment import load_experiment
    from tuner.ops.backend import can_start
    from tuner.study.wiring import load_dataset

    exp = _with_dataset_flags(load_experiment(path), queries, dataset_id, labels_db)
    start = port is None and flags["url"] is None and can_start(exp)
    if start or port is not None or isinstance(exp.target.port, int):
        exp = exp.bind_port(port)  # starting: target.port, "auto" picking a free port now
    if "{port}" in exp.evaluation.request.url and flags["url"] is None:
        if start:
            raise InputError(
                f"{path}: the search URL has a {{port}} placeholder but target.port is not set; set "
                "target.port (a number or auto), or pass --port N of a running backend"
            )
        raise InputError(
            f"{path}: the search URL has a {{port}} placeholder; pass --port N (the running backend's port)"
        )
    spec = _spec(spec_file, base=exp.evaluation, **flags)
    query_set, qrels, fingerprint, note = load_dataset(exp)
    return (
        spec,
        query_set,
        qrels,
        fingerprint,
        exp.dataset.labels_db,
        exp.dataset.queries,
        note,
        exp.dataset.unjudged_queries,
        exp if start else None,
    )


def _with_dataset_flags(exp: Any, queries: Path | None, dataset_id: str | None, labels_db: Path | None) -> Any:
    """The experiment with --queries, --dataset-id and --labels-db over its dataset section.
    Another query set or dataset id leaves the experiment's label files out: they are the
    labels of its own dataset, and imported under another id they would grade the wrong
    queries (that set's labels are imported with `tuner labels import`)."""
    from tuner.data.dataset import default_dataset_id

    ds = exp.dataset
    update: dict[str, Any] = {}
    if labels_db is not None:
        update["labels_db"] = labels_db
    if queries is not None or dataset_id is not None:
        new_queries = queries if queries is not None else ds.queries
        new_id = dataset_id or default_dataset_id(new_queries)
        update.update(queries=new_queries, dataset_id=new_id)
        if new_id != (ds.dataset_id or default_dataset_id(ds.queries)):
            update["labels"] = []
    if not update:
        return exp
    return exp.model_copy(update={"dataset": ds.model_copy(update=update)})


def _spec(spec_file: Path | None, base: Any = None, **flags: Any) -> Any:
    from pydantic import ValidationError

    from tuner.config.yamlfile import load_model
    from tuner.evaluation import EvalSpec, RequestMapping

    if spec_file is not None:
        base = load_model(spec_file, EvalSpec)
    elif base is not None:
        pass
    elif flags["url"] is not None:
        base = EvalSpec(request=RequestMapping(url=flags["url"]))
    else:
        raise InputError("tuner eval needs --url URL or --spec FILE (a YAML EvalSpec)")
    data = base.model_dump()
    if flags["url"] is not None:
        data["request"]["url"] = flags["url"]
    for key, field in (("confidence", "confidence"), ("handoff", "handoff"), ("fallback", "fallback_level")):
        if flags[key] is not None:
            data["response"][field] = flags[key]
    for key, field in (
        ("top_k", "top_k"),
        ("concurrency", "concurrency"),
        ("timeout_s", "timeout_s"),
        ("retries", "retries"),
        ("max_failed", "max_failed_queries"),
        ("gains", "gains"),
    ):
        if flags[key] is not None:
            data[field] = flags[key]
    try:
        return EvalSpec.model_validate(data)
    except ValidationError as exc:
        first = exc.errors()[0]
        key = ".".join(str(p) for p in first["loc"])
        raise ConfigError(f"evaluation setting {key}: {first['msg']}; fix the flag or the --spec file") from exc


def _existing_db(db: Path) -> Path:
    # opening a missing path would create an empty database and hide a typo
    if not db.is_file():
        raise InputError(
            f"{db}: no label database here; create it with `tuner labels import FILE --db {db} --dataset-id ID`"
        )
    return db


def _read_snapshot(path: Path | None) -> str | None:
    if path is None:
        return None
    try:
        return path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise InputError(f"{path}: cannot read the config snapshot ({exc}); pass a text file") from exc


def _scorecard_table(metrics: dict[str, float]) -> Table:
    from tuner.metrics import PRIMARY_SCORECARD

    table = Table(title="Scorecard (in-scope means)", show_header=True)
    table.add_column("metric")
    table.add_column("value", justify="right")
    shown = [
        "Primary_Metric_Score",
        *PRIMARY_SCORECARD,
        "OOS_FP_Rate",
        "InScope_Handoff_Rate",
        "Handoff_F1",
        "Judged@10",
        "Judged@20",
        "Empty_Queries",
        "Latency_Avg_ms",
        "Latency_P50_ms",
        "Latency_P95_ms",
        "Failed_Queries",
        "N_Queries",
        "N_Truncated_Hits",
        "N_Repeated_Hits",
    ]
    for name in shown:
        if name in metrics:
            value = metrics[name]
            text = (
                "n/a"
                if value != value
                else f"{value:.0f}"
                if name.startswith(("N_", "Failed", "Empty"))
                else (f"{value:.1f}" if name.startswith("Latency") else f"{value:.4f}")
            )
            table.add_row(name, text)
    return table


# --------------------------------------------------------------------------- tuner labels


@labels_app.command("import")
def labels_import(
    file: Annotated[Path, typer.Argument(help="Label file: TREC qrels, JSONL judgments or CSV.")],
    dataset_id: Annotated[str, typer.Option("--dataset-id", help="Dataset the labels belong to (the query set's id).")],
    db: Annotated[Path, typer.Option("--db", help="Label cache (SQLite).")] = DEFAULT_DB,
    fmt: Annotated[
        str | None, typer.Option("--format", help="qrels | jsonl | csv (default: from the extension).")
    ] = None,
    grade_map: Annotated[
        str | None,
        typer.Option(
            "--grade-map", help="Map source grades onto 0..3, e.g. '1:3,2:2,3:1,4:1,-1:0' ('-1:unjudged' drops)."
        ),
    ] = None,
    replace: Annotated[
        bool,
        typer.Option(
            "--replace",
            help="Re-import a file imported before whose judgments changed: its old judgments are replaced "
            "(other files' and graders' grades are kept).",
        ),
    ] = False,
) -> None:
    """Import labels into the cache (all or nothing)."""
    from tuner.data.labelfiles import FORMATS, LabelFormat
    from tuner.data.labels import LabelStore
    from tuner.data.qrels import GradeMap

    if fmt is not None and fmt not in FORMATS:
        raise InputError(f"--format {fmt!r}: use one of {', '.join(FORMATS)}")
    mapping = None if grade_map is None else GradeMap.parse(grade_map)
    summary = LabelStore(db).import_file(
        file,
        dataset_id,
        fmt=cast("LabelFormat | None", fmt),  # checked against FORMATS above
        grade_map=mapping,
        replace=replace,
    )
    grades = ", ".join(f"L{g}={n}" for g, n in summary.grade_counts.items())
    console = _console()
    console.print(
        f"imported {summary.n_labels} labels for {summary.n_queries} queries into {db} "
        f"(dataset {dataset_id}, {summary.importer}; {summary.n_replaced} replaced) [{grades}]"
    )
    if summary.changed or summary.removed or (replace and summary.added < summary.n_labels):
        console.print(
            f"replaced this file's judgments: {summary.added} added, {summary.changed} changed, "
            f"{summary.removed} removed since its last import; a study with trials measured on the old "
            "labels stops at `tuner run`: start a new study (a new `study:` name in the experiment)"
        )
    if summary.n_conflicts:
        console.print(conflicts_line(summary.n_conflicts, dataset_id, db), highlight=False)


def conflicts_line(n: int, dataset_id: str, db: Path) -> str:
    return (
        f"note: {n} (query, doc) pair(s) of {dataset_id} are graded differently by a label file and by graders "
        f"(tuner labels queue-import); the graders' grades are kept: see them with "
        f"`tuner labels stats --dataset-id {dataset_id} --db {db} --conflicts`"
    )


@labels_app.command("stats")
def labels_stats(
    dataset_id: Annotated[
        str | None, typer.Option("--dataset-id", help="Dataset to describe (default: list datasets).")
    ] = None,
    db: Annotated[Path, typer.Option("--db", help="Label cache (SQLite).")] = DEFAULT_DB,
    per_query: Annotated[bool, typer.Option("--per-query", help="Also print the label counts of every query.")] = False,
    conflicts: Annotated[
        bool,
        typer.Option("--conflicts", help="List the (query, doc) pairs a label file and graders grade differently."),
    ] = False,
) -> None:
    """Grade distribution and coverage of the label cache, its sources and conflicts."""
    from tuner.data.labelfiles import GRADE_NAMES
    from tuner.data.labels import LabelStore

    store = LabelStore(_existing_db(db))
    console = _console()
    ids = [dataset_id] if dataset_id else store.datasets()
    if not ids:
        console.print(f"{db} holds no labels yet")
        return
    for ds in ids:
        stats = store.stats(ds)
        table = Table(title=f"{ds}: {stats.n_labels} labels, {stats.n_queries} queries judged")
        table.add_column("grade")
        table.add_column("labels", justify="right")
        table.add_column("share", justify="right")
        for grade, n in stats.grade_counts.items():
            share = n / stats.n_labels if stats.n_labels else 0.0
            table.add_row(f"L{grade} {GRADE_NAMES[grade]}", str(n), f"{share:.1%}")
        console.print(table)
        console.print(f"fingerprint {stats.fingerprint}")
        for source, importer, when, n in stats.imports:
            console.print(f"  imported {n} from {source} ({importer}, {when})", highlight=False)
        for src in stats.sources:
            sha = f"sha256 {src.file_sha256[:12]}..." if src.file_sha256 else "no file hash"
            adopted = "; adopted from a label DB written before sources were recorded" if src.adopted else ""
            console.print(
                f"  source {src.source_file}: {src.kind}, {src.n_labels} judgments, {sha}{adopted}", highlight=False
            )
        if stats.n_conflicts and not conflicts:
            console.print(conflicts_line(stats.n_conflicts, ds, db), highlight=False)
        if conflicts:
            rows = store.conflicts(ds)
            ct = Table(title=f"{ds}: {len(rows)} pair(s) graded differently by a file and by graders (graders' kept)")
            for col in ("query_id", "doc_id", "file grade", "file", "grader grade", "grader file"):
                ct.add_column(col)
            for c in rows:
                ct.add_row(c.query_id, c.doc_id, str(c.file_grade), c.file_source, str(c.grader_grade), c.grader_source)
            console.print(ct)
        if per_query:
            pq = Table(title=f"{ds}: labels per query")
            for col in ("query_id", "L0", "L1", "L2", "L3", "total"):
                pq.add_column(col, justify="right")
            for qid, counts in stats.per_query.items():
                pq.add_row(qid, *(str(counts[g]) for g in sorted(counts)), str(sum(counts.values())))
            console.print(pq)


@labels_app.command("export-unjudged")
def labels_export_unjudged(
    report: Annotated[Path, typer.Option("--report", help="report.json written by `tuner eval`.")],
    out: Annotated[Path, typer.Option("--out", help="File for the graders: .csv or .jsonl.")],
    db: Annotated[
        Path | None, typer.Option("--db", help="Label cache: leave out pairs labelled since the report was written.")
    ] = None,
    fmt: Annotated[str | None, typer.Option("--format", help="csv | jsonl (default: from the extension).")] = None,
) -> None:
    """Write the report's unjudged (query, doc) pairs for graders, deduplicated."""
    from tuner.data.labels import LabelStore
    from tuner.data.unjudged import export_format, export_unjudged
    from tuner.report import load_report

    kind = export_format(fmt)
    data = load_report(report)
    dataset_id = data["context"]["dataset_id"]
    texts = {q["query_id"]: q["query"] for q in data.get("queries") or []} or dict(data.get("query_texts") or {})
    if db is not None:
        n = LabelStore(_existing_db(db)).export_unjudged(dataset_id, data["unjudged"], out, fmt=kind, queries=texts)
    else:
        n = export_unjudged(data["unjudged"], out, fmt=kind, queries=texts)
    if data.get("unjudged_depth"):
        _console().print(
            f"note: {report} is a slim trial report: it lists the unjudged hits down to rank "
            f"{data['unjudged_depth']} only (the baseline's and the best trials' reports list all)"
        )
    _console().print(
        f"wrote {n} unjudged (query, doc) pairs of dataset {dataset_id} to {out}; fill in 'relevance' "
        f"(0..3) and run `tuner labels import {out} --dataset-id {dataset_id}`"
    )
