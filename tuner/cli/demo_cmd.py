"""`tuner demo`: generated data, the reference backend and a 20-trial study, run and
printed like `tuner run`."""

from __future__ import annotations

import sys
from typing import Annotated

import typer
from rich.console import Console

from tuner.cli.run_cmd import run_and_report
from tuner.cli.study_common import quiet_libraries


def register(app: typer.Typer) -> None:
    app.command(name="demo")(demo_command)


def demo_command(
    fresh: Annotated[
        bool, typer.Option("--fresh", help="Delete the demo's study, data and MLflow runs first.")
    ] = False,
    n_trials: Annotated[
        int | None, typer.Option("--n-trials", min=1, help=("Trials to run now (default: complete the demo's 20)."))
    ] = None,
) -> None:
    """The demo: generated data, the reference backend, a 20-trial study with the OOS constraint."""
    import time

    from tuner.config.experiment import load_experiment
    from tuner.ops.demo import DEMO_EXPERIMENT, find_project, prepare_demo
    from tuner.study.storage.locks import patch_rights

    console = Console()
    quiet_libraries()
    started = time.monotonic()
    project = find_project()
    planned = load_experiment(project / DEMO_EXPERIMENT, check_paths=False)
    # Locked before --fresh deletes anything or the data is regenerated: a second demo
    # (or a run of the demo experiment) is refused instead of losing its study.
    with patch_rights(
        planned.storage, planned.study, planned.target.config_files, mode="exclusive", command="tuner demo"
    ) as lease:
        for line in lease.notes:
            console.print(f"[yellow]{line}[/]", soft_wrap=True)
        exp = prepare_demo(
            project, fresh=fresh, python=sys.executable, on_step=lambda s: console.print(f"[dim]{s}[/]", soft_wrap=True)
        )
        console.print(f"[dim]set-up done in {time.monotonic() - started:.1f} s[/]")
        try:
            run_and_report(exp, console, n_trials=n_trials, timeout=None)
        finally:
            console.print(f"[dim]demo took {time.monotonic() - started:.0f} s[/]")
