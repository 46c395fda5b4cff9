"""What the study commands (run, best, report, apply, demo) share: the experiment
argument, the --skip-checks option, quieting the libraries' INFO logging and the line
every reader of the config prints while a restore journal is pending."""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Annotated, Any

import typer

ExperimentArg = Annotated[Path, typer.Argument(help="Experiment file (experiments/*.yaml).", show_default=False)]
SkipChecksOption = Annotated[
    bool,
    typer.Option(
        "--skip-checks",
        help="Run even when the preflight (`tuner check`) finds a set-up that gives wrong numbers; "
        "the findings and the skip are recorded in the reports.",
    ),
]


def quiet_libraries() -> None:
    # MLflow and alembic log INFO lines on every store open; the display says enough.
    # mlflow sets its logger's level from MLFLOW_LOGGING_LEVEL when imported, which the
    # commands that track do later (a user's own level wins).
    import warnings

    import optuna

    os.environ.setdefault("MLFLOW_LOGGING_LEVEL", "WARNING")
    # MLflow's client writes "View run ... at: URL" and "View experiment at: URL" to stdout
    # whenever a run on a tracking server ends (one more request each): the tuner's output is
    # the tuner's, and its notes and summary link the runs already.
    os.environ.setdefault("MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT", "true")
    for name in ("mlflow", "alembic", "optuna"):
        logging.getLogger(name).setLevel(logging.WARNING)
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)
    warnings.filterwarnings("ignore", module="mlflow")


def pending_journal_line(experiment: Any) -> str | None:
    """The one line saying a restore journal is pending (tuner.config.journal.Pending.line),
    or None when there is none."""
    from tuner.config.journal import pending, recover_hint
    from tuner.errors import TargetError

    try:
        found = pending(experiment.journal_path)
        http = http_journal_line(experiment)
    except TargetError as exc:  # a reader still shows what it reads; the journal's problem is the line
        return f"restore journal pending but unreadable: {exc}"
    if http is not None:
        return http
    return None if found is None else found.line(recover_hint(experiment.source))


def http_journal_line(experiment: Any) -> str | None:
    """channel: http: the line saying the original config document is journaled (a run
    writing trials now, or one that was killed), or None."""
    if experiment.target.channel != "http" or not experiment.http_journal_path.exists():
        return None  # (and no HTTP client imported by a command that only reads)
    from tuner.targets.http_config import HttpJournal

    journal = HttpJournal(experiment.http_journal_path)
    return (
        f"restore journal pending: {journal.path}, left by {journal.whose()}: the document at "
        f"{journal.shown_url()} may hold its trial's values; the next `tuner run` or "
        f"`tuner apply {experiment.source} --recover` puts the original back"
    )


def warn_pending_journal(console: Any, experiment: Any) -> None:
    """Print the pending-journal line (loud, whole, never folded) when there is one."""
    line = pending_journal_line(experiment)
    if line is not None:
        console.print(f"warning: {line}", style="bold red", soft_wrap=True, highlight=False, markup=False)
