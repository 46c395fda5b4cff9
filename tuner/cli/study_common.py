"""What the study commands (run, best, report, apply, demo) share: the experiment
argument, the --skip-checks option and quieting the libraries' INFO logging."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Annotated

import typer

ExperimentArg = Annotated[Path, typer.Argument(help="Experiment file (experiments/*.yaml).", show_default=False)]
SkipChecksOption = Annotated[bool, typer.Option(
    "--skip-checks", help="Run even when the preflight (`tuner check`) finds a set-up that gives wrong numbers; "
    "the findings and the skip are recorded in the reports.")]


def quiet_libraries() -> None:
    # MLflow and alembic log INFO lines on every store open; the display says enough.
    # mlflow sets its logger's level when imported, so import it before lowering it.
    import warnings

    import mlflow  # noqa: F401
    import optuna

    for name in ("mlflow", "alembic", "optuna"):
        logging.getLogger(name).setLevel(logging.WARNING)
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)
    warnings.filterwarnings("ignore", module="mlflow")

