"""`tuner worker EXPERIMENT --replica N`: one of several workers on a shared study."""

from __future__ import annotations

import signal
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console

ExperimentArg = Annotated[Path, typer.Argument(help="Experiment file (experiments/*.yaml).", show_default=False)]


def register(app: typer.Typer) -> None:
    app.command(name="worker")(worker_command)
    app.command(name="workers")(workers_command)


def workers_command(
    experiment: ExperimentArg,
    count: Annotated[
        int | None,
        typer.Option(
            "--count", min=1, help=("Replicas to start on this machine (default: workers.count of the experiment).")
        ),
    ] = None,
    first: Annotated[
        int,
        typer.Option(
            "--first", min=0, help=("Number of the first replica (another machine starts at the next free number).")
        ),
    ] = 0,
    n_trials: Annotated[int | None, typer.Option("--n-trials", min=1, help="Study-wide total.")] = None,
    timeout: Annotated[float | None, typer.Option("--timeout", help="Seconds each worker runs at most.")] = None,
) -> None:
    """Start workers.count `tuner worker` processes (replicas --first, --first+1, ...) on this
    machine and wait for all of them; Ctrl-C / SIGTERM is passed on to each."""
    import subprocess
    import sys
    import time

    from tuner.config.experiment import load_experiment
    from tuner.study.storage.study_storage import check_storage

    console = Console(stderr=True)
    exp = load_experiment(experiment)
    n = count or exp.workers.count
    check_storage(exp.storage, n_workers=max(n, 2))  # refuse SQLite before starting anything
    extra = [*(["--n-trials", str(n_trials)] if n_trials else []), *(["--timeout", str(timeout)] if timeout else [])]
    procs = [
        subprocess.Popen([sys.executable, "-m", "tuner", "worker", str(experiment), "--replica", str(r), *extra])
        for r in range(first, first + n)
    ]
    console.print(f"started replicas {first}..{first + n - 1} (pids {', '.join(str(p.pid) for p in procs)})")

    def forward(signum: int, frame: object) -> None:
        for p in procs:
            if p.poll() is None:
                p.send_signal(signum)

    previous = {sig: signal.signal(sig, forward) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        while any(p.poll() is None for p in procs):
            time.sleep(0.2)
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)
    codes = [p.returncode for p in procs]
    console.print(f"workers finished with exit codes {codes}")
    failed = [c for c in codes if c]
    if failed:  # the first failure's code; a worker killed by a signal (negative) is 1
        raise typer.Exit(failed[0] if failed[0] > 0 else 1)


def worker_command(
    experiment: ExperimentArg,
    replica: Annotated[
        int,
        typer.Option(
            "--replica",
            min=0,
            help="This worker's replica number (0, 1, ...): its own backend copy, port and state dir.",
        ),
    ] = 0,
    n_trials: Annotated[
        int | None, typer.Option("--n-trials", min=1, help="Study-wide total (default: the experiment's n_trials).")
    ] = None,
    timeout: Annotated[float | None, typer.Option("--timeout", help="Seconds this worker runs at most.")] = None,
    heartbeat: Annotated[
        int | None,
        typer.Option(
            "--heartbeat",
            min=1,
            help=("Heartbeat interval (s); default: workers.heartbeat_interval_s of the experiment (30)."),
        ),
    ] = None,
    grace: Annotated[
        int | None,
        typer.Option(
            "--grace",
            min=2,
            help="A trial silent this long (s) is failed and retried by another worker (default 4 x heartbeat).",
        ),
    ] = None,
    max_retry: Annotated[
        int | None,
        typer.Option("--max-retry", min=0, help=("Retries of one crashed trial (default: workers.max_retry, 2).")),
    ] = None,
    port: Annotated[
        int | None,
        typer.Option("--port", min=1, help=("This replica's port (default: from workers.ports, else a free one).")),
    ] = None,
    skip_checks: Annotated[
        bool,
        typer.Option(
            "--skip-checks",
            help=(
                "Run even when this replica's preflight finds a set-up that gives wrong numbers "
                "(recorded in the reports)."
            ),
        ),
    ] = False,
) -> None:
    """Run trials of the experiment's study (PostgreSQL storage) on backend replica N until
    the study has n_trials finished trials. Start one per replica, on one or more machines."""
    from tuner.cli.study_common import quiet_libraries
    from tuner.config.experiment import load_experiment
    from tuner.config.workers import WorkerSettings
    from tuner.ops.workers import run_replica
    from tuner.study.stop import StopFlag

    quiet_libraries()  # as `tuner run`: MLflow's, alembic's and Optuna's chatter off
    console = Console(stderr=True)
    exp = load_experiment(experiment)
    given = {
        "heartbeat_interval_s": heartbeat,
        "grace_period_s": grace,
        "max_retry": max_retry,
        # a base port that puts this replica on --port (replica N gets base + N)
        "ports": port - replica if port is not None and port > replica else None,
    }
    # the CLI overrides the experiment's workers: section, field by field (validated again)
    settings = WorkerSettings(**{**exp.workers.model_dump(), **{k: v for k, v in given.items() if v is not None}})
    exp = exp.model_copy(update={"workers": settings})
    stop = StopFlag()
    previous = {}

    received: list[int] = []

    def handler(signum: int, frame: object) -> None:
        received.append(signum)
        if stop.is_set():  # a second signal: leave now (the reaper restores the replica)
            raise KeyboardInterrupt
        stop.set(f"signal {signal.Signals(signum).name}")
        console.print(f"[yellow]replica {replica}: stopping after the current trial (again to abort)[/]")

    for sig in (signal.SIGINT, signal.SIGTERM):
        previous[sig] = signal.signal(sig, handler)
    try:
        summary = run_replica(
            exp,
            replica,
            settings=settings,
            n_trials=n_trials,
            timeout_s=timeout,
            stop=stop,
            note=console.print,
            skip_checks=skip_checks,
        )
    except Exception as exc:
        away = _database_away(exc, exp, replica)
        if away is None:
            raise
        raise away from exc
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)
    ran = [o.number for o in summary.result.ran]
    console.print(
        f"replica {replica}: {len(ran)} trial(s) {ran}, stopped by "
        f"{summary.result.stopped_by}; config restored: "
        f"{', '.join(map(str, summary.restored)) or 'unchanged'}"
    )
    from tuner.study.storage.retry import infra_summary

    infra = infra_summary(summary.result.infra_failed)
    if infra:
        console.print(f"replica {replica}: {infra}", soft_wrap=True, markup=False)
    if summary.error:
        console.print(f"[red]error: {summary.error}[/]", soft_wrap=True)
        raise typer.Exit(1)
    if summary.result.stopped_by == "signal":
        raise typer.Exit(128 + (received[0] if received else signal.SIGINT))  # as `tuner run`: 130, 143


def _database_away(exc: BaseException, exp: Any, replica: int) -> Exception | None:
    """The one-line error of a worker the study's database ended by staying away (past
    the ~9 s its calls wait out), else None: what is kept and how to go on."""
    from tuner.files import display_path
    from tuner.study.storage.study_storage import database_unreachable

    return database_unreachable(
        exc,
        study=exp.study,
        url=exp.storage,
        kept="every trial told before it went away is in the study, and the replica's config copy is restored "
        "as the worker ends (else by the replica's next start)",
        resume=f"`tuner worker {display_path(exp.source)} --replica {replica}` goes on with the study (a trial "
        "left running is failed once it is stale, and retried)",
    )
