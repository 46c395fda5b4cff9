"""`tuner labels queue | queue-import`: the labelling queue of a study.

Adds two subcommands to the `labels` group (defined in tuner.cli.eval_cmds, which is
registered first).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.console import Console

if TYPE_CHECKING:
    from tuner.config.experiment import Experiment
    from tuner.data.dataset import QuerySet
    from tuner.data.labels import LabelStore

ExperimentArg = Annotated[Path, typer.Argument(help="Experiment file (experiments/*.yaml).", show_default=False)]


def register(app: typer.Typer) -> None:
    from tuner.cli.eval_cmds import labels_app

    labels_app.command("queue")(queue_command)
    labels_app.command("queue-import")(queue_import_command)


def _dataset(exp: Experiment) -> tuple[QuerySet, LabelStore]:
    from tuner.data.dataset import load_queryset
    from tuner.data.labels import LabelStore

    queries = load_queryset(exp.dataset.queries, exp.dataset.dataset_id)
    return queries, LabelStore(exp.dataset.labels_path)


def queue_command(
    experiment: ExperimentArg,
    out: Annotated[Path, typer.Option("--out", help="File for the graders: .csv or .jsonl.")],
    top: Annotated[int, typer.Option("--top", min=1, help="Pool the best N feasible trials.")] = 5,
    k: Annotated[int, typer.Option("--k", min=1, help="Pool depth: unjudged hits ranked 1..k.")] = 10,
    baseline: Annotated[bool, typer.Option("--baseline/--no-baseline", help="Also pool the baseline trial.")] = True,
    fmt: Annotated[str | None, typer.Option("--format", help="csv | jsonl (default: from the extension).")] = None,
) -> None:
    """Export the unjudged top-k hits of the study's best trials for graders (deduplicated,
    most-shown first, with query and title)."""
    from tuner.config.experiment import load_experiment
    from tuner.data.unjudged import export_format
    from tuner.ops.labelqueue import build_queue, load_trial_report, pick_trials, report_of, write_queue
    from tuner.study.storage.study_storage import load_study

    kind = export_format(fmt)
    exp = load_experiment(experiment, check_paths=False)
    queries, store = _dataset(exp)
    trials = pick_trials(
        load_study(exp).get_trials(deepcopy=False),
        top_n=top,
        maximize=exp.objective.maximize,
        include_baseline=baseline,
    )
    with_reports = [(t.number, report_of(t)) for t in trials]
    reports = [load_trial_report(n, p) for n, p in with_reports if p is not None]
    known = store.qrels(queries.dataset_id) if queries.dataset_id in store.datasets() else {}
    items = build_queue(reports, k=k, qrels=known)
    n = write_queue(items, out, kind)
    console = Console()
    skipped = [num for num, p in with_reports if p is None]
    console.print(
        f"wrote {n} unjudged (query, doc) pairs from trials {[t.number for t in trials]} to {out}", soft_wrap=True
    )
    if skipped:
        console.print(f"[yellow]trials {skipped} have no JSON report (cache hits of old runs?) and were skipped[/]")
    console.print(
        f"fill in 'relevance' (0..3; leave blank to skip), then `tuner labels queue-import {experiment} {out}`",
        soft_wrap=True,
    )


def queue_import_command(
    experiment: ExperimentArg,
    graded: Annotated[Path, typer.Argument(help="The queue file with relevance filled in (some rows may stay blank).")],
) -> None:
    """Import the graded rows of a queue file into the experiment's label cache."""
    from tuner.config.experiment import load_experiment
    from tuner.ops.labelqueue import import_graded

    exp = load_experiment(experiment, check_paths=False)
    queries, store = _dataset(exp)
    summary, left = import_graded(store, graded, queries.dataset_id)
    console = Console()
    if summary is None:
        console.print(f"{graded}: no graded rows yet ({left} blank); nothing imported")
        return
    console.print(
        f"imported {summary.n_labels} labels ({summary.n_replaced} replaced) for {summary.n_queries} "
        f"queries of {queries.dataset_id}; {left} rows still ungraded",
        soft_wrap=True,
    )
    console.print(
        f"the study's trials so far are scored on the labels before this import: `tuner run` stops on study "
        f"{exp.study!r} now; give `study:` a new name to tune on the new labels (the result cache never "
        "answers from the old ones)",
        soft_wrap=True,
    )
    if summary.n_conflicts:
        from tuner.cli.eval_cmds import conflicts_line

        console.print(
            conflicts_line(summary.n_conflicts, queries.dataset_id, exp.dataset.labels_path),
            highlight=False,
            soft_wrap=True,
        )
