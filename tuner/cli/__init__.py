"""The `tuner` command line. The only place that prints and exits.

Each command group lives in its own module exposing ``register(app)``; this module
only assembles them and turns TunerError into a one-line message and exit code.
"""

from __future__ import annotations

import os
import sys
import traceback

import typer

from tuner.errors import TunerError

app = typer.Typer(
    name="tuner",
    help="Tune a hybrid search backend overnight with Optuna.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)

_COMMAND_MODULES = (
    "tuner.cli.score_cmd",
    "tuner.cli.eval_cmds",
    "tuner.cli.run_cmd",
    "tuner.cli.result_cmds",
    "tuner.cli.apply_cmd",
    "tuner.cli.demo_cmd",
    "tuner.cli.check_cmd",
    "tuner.cli.dashboard_cmd",
    # Listed after eval_cmds: labelqueue_cmd extends eval_cmds' `labels` group, and
    # --help lists commands in registration order.
    "tuner.cli.worker_cmds",
    "tuner.cli.labelqueue_cmd",
    "tuner.cli.validate_cmd",
)


def _register_all() -> None:
    import importlib

    for name in _COMMAND_MODULES:
        importlib.import_module(name).register(app)


@app.command()
def version() -> None:
    """Print the fusion-tuner version."""
    from tuner import __version__

    typer.echo(__version__)


@app.callback()
def _root() -> None:
    """Tune a hybrid search backend overnight with Optuna."""
    # Here, not in main(): the limit imports numpy, which `tuner --help` does without.
    from tuner.threads import limit_blas_threads

    limit_blas_threads()


_register_all()


def main(argv: list[str] | None = None) -> None:
    """Console-script entry point: run the app, map TunerError (and any error a full disk
    caused, tuner.diskspace) to a one-line error. Every command first limits the process to
    one BLAS thread (tuner.threads)."""
    try:
        app(args=argv)
    except TunerError as exc:
        _fail(exc)
    except Exception as exc:
        from tuner.diskspace import disk_full

        full = disk_full(exc)  # a command that does not name what it writes: one line all the same
        if full is None:
            raise
        _fail(full)


def _fail(exc: TunerError) -> None:
    from tuner.secrets import redact_text

    if os.environ.get("TUNER_TRACEBACK"):  # for a bug report: where the error came from
        traceback.print_exception(exc, file=sys.stderr)

    typer.secho(f"error: {redact_text(str(exc))}", err=True, fg=typer.colors.RED)  # last line of defence
    sys.exit(exc.exit_code)
