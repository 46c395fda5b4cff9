"""`tuner dashboard EXPERIMENT`: optuna-dashboard and the MLflow UI until Ctrl-C."""

from __future__ import annotations

import signal
import time
from pathlib import Path
from typing import Annotated

import typer

from tuner.dashboard import DEFAULT_MLFLOW_PORT, DEFAULT_OPTUNA_PORT


def register(app: typer.Typer) -> None:
    app.command(name="dashboard")(dashboard_command)


def _sigterm_as_interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def dashboard_command(
    experiment: Annotated[Path, typer.Argument(help="Experiment file (experiments/*.yaml).", show_default=False)],
    optuna_port: Annotated[int, typer.Option("--optuna-port", help="Port of optuna-dashboard on 127.0.0.1.")] = DEFAULT_OPTUNA_PORT,
    mlflow_port: Annotated[int, typer.Option("--mlflow-port", help="Port of the MLflow UI on 127.0.0.1.")] = DEFAULT_MLFLOW_PORT,
    deadline: Annotated[float, typer.Option("--deadline", help="Seconds to wait for both UIs to answer.")] = 90.0,
) -> None:
    """Serve optuna-dashboard (study storage + artifacts) and the MLflow UI (tracking
    store) of EXPERIMENT on 127.0.0.1 until Ctrl-C or SIGTERM, then stop both."""
    from tuner.dashboard import Dashboards, ui_specs
    from tuner.experiment import load_experiment

    # The UIs read only the stores: the data set and backend config need not be there.
    exp = load_experiment(experiment, check_paths=False)
    specs = ui_specs(exp, optuna_port=optuna_port, mlflow_port=mlflow_port)
    dashboards = Dashboards(specs, exp.state_dir / "dashboard")
    # SIGTERM (from a service manager or `kill`) ends the command like Ctrl-C does.
    previous = signal.signal(signal.SIGTERM, _sigterm_as_interrupt)
    try:
        typer.echo(f"starting {' and '.join(s.name for s in specs)} (logs in {dashboards.log_dir}) ...", err=True)
        dashboards.start()
        dashboards.wait_ready(deadline_s=deadline)
        for spec in specs:
            typer.echo(f"{spec.name}: {spec.url}")
        if not exp.tracking.enabled:
            typer.echo("mlflow: tracking is disabled in the experiment (tracking.enabled: false)", err=True)
        typer.echo("Ctrl-C stops both.", err=True)
        while True:
            reason = dashboards.failure()
            if reason is not None:
                from tuner.errors import TargetError

                raise TargetError(f"{reason} (log: {dashboards.log_dir})")
            time.sleep(0.5)
    except KeyboardInterrupt:
        typer.echo("stopping the dashboards ...", err=True)
    finally:
        dashboards.stop()
        signal.signal(signal.SIGTERM, previous)
    typer.echo("stopped.", err=True)
