"""`tuner check EXPERIMENT`: the preflight on its own (tuner.study.preflight).

`tuner run`, `worker`, `eval` and `apply` run the same checks first; this command
shows every finding, not only the first stop, and exits 2 when one would stop a run.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console

_STYLE = {"stop": "red", "warn": "yellow", "info": "dim"}


def register(app: typer.Typer) -> None:
    app.command(name="check")(check_command)


def check_command(
    experiment: Annotated[Path, typer.Argument(help="Experiment file (experiments/*.yaml).", show_default=False)],
    full: Annotated[bool, typer.Option("--full", help="Check every query, not a seeded sample of a big set.")] = False,
    seed: Annotated[int, typer.Option("--seed", help="Seed of the sample (and of the query order).")] = 0,
) -> None:
    """Check the set-up before a night of trials: start the backend on the config as found,
    evaluate the queries, and stop (exit 2) on what would give wrong numbers."""
    from tuner.config.experiment import load_experiment
    from tuner.ops.check import check_experiment
    from tuner.study.preflight import PreflightError

    console = Console(soft_wrap=True)
    exp = load_experiment(experiment)
    report, warnings = check_experiment(exp, full=full, seed=seed)
    for warning in warnings:
        console.print(f"[yellow]warning:[/] {warning}", highlight=False)
    for line in finding_lines(report):
        console.print(line, highlight=False)
    stops = report.stops
    if stops:
        console.print(f"[red]preflight failed: {len(stops)} problem(s) would make the study's numbers wrong[/]")
        raise PreflightError(stops[0].message)
    checked = f"{report.n_checked} of {report.n_total} queries" if report.sampled else f"{report.n_checked} queries"
    console.print(
        f"[green]preflight passed[/] on {checked} ({len(report.warnings)} warning(s)); "
        f"`tuner run {experiment}` is good to go"
    )


def finding_lines(report: Any) -> list[str]:
    """One line per finding (never folded: CI logs and grep see whole messages)."""
    return [f"[{_STYLE[f.level]}]{f.level:<4}[/] {f.code}: {f.message}" for f in report.findings]
