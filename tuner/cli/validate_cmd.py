"""`tuner validate EXPERIMENT`: baseline vs best feasible trial on the holdout queries."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

ExperimentArg = Annotated[Path, typer.Argument(help="Experiment file (experiments/*.yaml).", show_default=False)]


def register(app: typer.Typer) -> None:
    app.command(name="validate")(validate_command)


def validate_command(
    experiment: ExperimentArg,
    trial: Annotated[
        int | None, typer.Option("--trial", help="Validate this trial instead of the best feasible.")
    ] = None,
    fraction: Annotated[
        float | None,
        typer.Option("--fraction", help="Holdout share (default: the experiment's holdout.fraction, else 0.3)."),
    ] = None,
    seed: Annotated[int | None, typer.Option("--seed", help="Split seed (default: the experiment's).")] = None,
    resamples: Annotated[
        int, typer.Option("--resamples", min=100, help="Bootstrap / randomisation resamples.")
    ] = 10_000,
    test: Annotated[str, typer.Option("--test", help="permutation (paired randomisation) | wilcoxon")] = "permutation",
) -> None:
    """Re-evaluate the baseline and the best feasible trial on the held-out queries: per-metric
    deltas with paired bootstrap intervals, a paired test per metric, Judged@10 of both."""
    from tuner.config.experiment import load_experiment
    from tuner.errors import InputError
    from tuner.ops.validate import holdout_config_of, validate_holdout

    if test not in ("permutation", "wilcoxon"):
        raise InputError(f"--test {test!r}: use permutation or wilcoxon")
    exp = load_experiment(experiment)
    config = holdout_config_of(exp)
    updates = {k: v for k, v in (("fraction", fraction), ("seed", seed)) if v is not None}
    if updates:
        config = config.model_copy(update=updates)
    console = Console()
    run = validate_holdout(
        exp,
        holdout=config,
        trial_number=trial,
        n_resamples=resamples,
        test=test,
        on_step=lambda s: console.print(f"[dim]{s}[/]"),
    )
    console.print(run.report.to_markdown(), markup=False, highlight=False)
    for warning in run.report.warnings:
        console.print(f"[yellow]warning:[/] {warning}")
    console.print(f"wrote {run.json_path} and {run.markdown_path}", soft_wrap=True)
