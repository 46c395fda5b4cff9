"""`tuner dashboard EXPERIMENT`: optuna-dashboard and the MLflow UI until Ctrl-C; `tuner
optuna-dashboard STORAGE`: optuna-dashboard alone, params under their config keys
(tuner.ops.dashboard_server), which `tuner dashboard` starts."""

from __future__ import annotations

import signal
import time
from pathlib import Path
from typing import Annotated, Any

import typer

from tuner.ops.dashboard_specs import DEFAULT_MLFLOW_PORT, DEFAULT_OPTUNA_PORT

_STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)
_POLL_S = 0.25  # how soon a stop request or a dead UI is noticed


def register(app: typer.Typer) -> None:
    app.command(name="dashboard")(dashboard_command)
    app.command(name="optuna-dashboard")(optuna_dashboard_command)


class _StopRequest:
    """Handler of SIGINT and SIGTERM: notes the first one and returns. Later ones change
    nothing, so a second Ctrl-C cannot cut the stop of the UIs short.

    It never raises: a KeyboardInterrupt thrown into whatever runs when the signal lands
    (an import, the headline's database read) leaves that code half done. With it, a run
    stopped right after its URLs appeared ended killed by SIGINT after printing "stopped."
    (exit -2, no traceback) in 2 of ~70 runs under load (tests/browser/test_dashboard_cmd);
    with the request polled between the command's own short waits, in 0 of 111.
    """

    def __init__(self) -> None:
        self.signum: int | None = None

    def __call__(self, signum: int, frame: object) -> None:
        if self.signum is None:
            self.signum = signum

    def requested(self) -> bool:
        return self.signum is not None


def _stop_on_signals() -> _StopRequest:
    """SIGINT and SIGTERM both stop the command. Installed explicitly: a process started
    with SIGINT ignored (a background job of a script, some CI runners) would otherwise
    ignore Ctrl-C and `kill -INT` for good. Left installed until the process exits: a
    repeated signal after the stop (a user pressing Ctrl-C twice, a supervisor sending
    SIGTERM again) must not turn a clean exit into a death by that signal."""
    request = _StopRequest()
    for sig in _STOP_SIGNALS:
        signal.signal(sig, request)
    return request


def dashboard_command(
    experiment: Annotated[Path, typer.Argument(help="Experiment file (experiments/*.yaml).", show_default=False)],
    optuna_port: Annotated[
        int, typer.Option("--optuna-port", help="Port of optuna-dashboard on 127.0.0.1.")
    ] = DEFAULT_OPTUNA_PORT,
    mlflow_port: Annotated[
        int, typer.Option("--mlflow-port", help="Port of the MLflow UI on 127.0.0.1.")
    ] = DEFAULT_MLFLOW_PORT,
    deadline: Annotated[float, typer.Option("--deadline", help="Seconds to wait for both UIs to answer.")] = 90.0,
) -> None:
    """Serve optuna-dashboard (study storage + artifacts) and the MLflow UI (tracking
    store) of EXPERIMENT on 127.0.0.1 until Ctrl-C or SIGTERM, then stop both."""
    from tuner.config.experiment import load_experiment
    from tuner.ops.dashboard_procs import Dashboards
    from tuner.ops.dashboard_specs import ui_specs

    # The UIs read only the stores: the data set and backend config need not be there.
    exp = load_experiment(experiment, check_paths=False)
    specs = ui_specs(exp, optuna_port=optuna_port, mlflow_port=mlflow_port)
    dashboards = Dashboards(specs, exp.state_dir / "dashboard")
    stop = _stop_on_signals()
    try:
        typer.echo(f"starting {' and '.join(s.name for s in specs)} (logs in {dashboards.log_dir}) ...", err=True)
        dashboards.start()
        if dashboards.wait_ready(deadline_s=deadline, stop_requested=stop.requested):
            for spec in specs:
                typer.echo(f"{spec.name}: {spec.url}")
            headline = None if stop.requested() else _study_headline(exp)
            if headline:
                typer.echo(headline)
            if not exp.tracking.enabled:
                typer.echo("mlflow: tracking is disabled in the experiment (tracking.enabled: false)", err=True)
            typer.echo("Ctrl-C stops both.", err=True)
        while not stop.requested():
            reason = dashboards.failure()
            if reason is not None:
                from tuner.errors import TargetError

                raise TargetError(f"{reason} (log: {dashboards.log_dir})")
            time.sleep(_POLL_S)
        typer.echo("stopping the dashboards ...", err=True)
    finally:
        dashboards.stop()
    typer.echo("stopped.", err=True)


def _study_headline(exp: Any) -> str | None:
    """The trial optuna-dashboard's Best Trial card names, or why it is empty
    (tuner.study.notes.dashboard_headline); None before the study's first run."""
    from tuner.errors import StudyError
    from tuner.study.notes import dashboard_headline
    from tuner.study.storage.study_storage import load_study

    try:
        study = load_study(exp)
        trials = study.get_trials(deepcopy=False)
    except StudyError:
        return None
    except Exception as exc:  # noqa: BLE001 - the UIs run; only this line is lost
        return f"study {exp.study}: not read ({type(exc).__name__}), so the best feasible trial is not named here"
    if exp.secondary_objective is not None:  # optuna-dashboard shows the front, not one best trial
        return (
            f"study {exp.study}: two objectives: the study page's Pareto Front plot marks the feasible front "
            f"(`tuner best {exp.source} --pareto` lists it)"
        )
    return dashboard_headline(
        trials,
        study_name=study.study_name,
        objective=exp.objective.metric,
        maximize=exp.objective.maximize,
    )


def optuna_dashboard_command(
    storage: Annotated[str, typer.Argument(help="Study storage URL (sqlite:///..., postgresql://...).")],
    artifact_dir: Annotated[
        Path | None, typer.Option("--artifact-dir", help="The study's Optuna artifact store (reports, configs).")
    ] = None,
    host: Annotated[str, typer.Option("--host", help="Address to listen on.")] = "127.0.0.1",
    port: Annotated[int, typer.Option("--port", help="Port to listen on.")] = DEFAULT_OPTUNA_PORT,
) -> None:
    """Serve optuna-dashboard on STORAGE with every param under its config key (the
    samplers' internal coordinates, such as fusion.weights:bm25, are not listed) until
    Ctrl-C."""
    from tuner.ops.dashboard_server import dashboard_app, listen

    app = dashboard_app(storage, artifact_dir)
    # Ctrl-C stops it also when it was started with SIGINT ignored (a background job of a
    # script, some CI runners: Python keeps an inherited SIG_IGN). Without this, `kill -INT`
    # did nothing there: the suite's optuna-dashboards each sat out a 60 s stop deadline in
    # CI. Set before it listens, so a client that sees the port can stop it; once serving,
    # only serve_forever's select loop runs in this thread (requests have their own).
    signal.signal(signal.SIGINT, signal.default_int_handler)
    with listen(app, host=host, port=port) as server:
        typer.echo(f"optuna-dashboard (params under their config keys): http://{host}:{port}/dashboard/", err=True)
        try:
            server.serve_forever()
        except KeyboardInterrupt:
            typer.echo("stopped.", err=True)
