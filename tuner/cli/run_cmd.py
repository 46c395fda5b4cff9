"""`tuner run`: create or resume the study, run trials, print the summary and map the
outcome (error, every trial failed, interrupted) to an exit code.

The only place a run is printed: the library returns the summary; this module renders
it with rich.
"""

from __future__ import annotations

import signal
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Annotated, Any

import typer
from rich.console import Console

from tuner.cli.study_common import ExperimentArg, SkipChecksOption, quiet_libraries

EXIT_INTERRUPTED = {signal.SIGINT: 130, signal.SIGTERM: 143}


def register(app: typer.Typer) -> None:
    app.command(name="run")(run_command)


@contextmanager
def graceful_signals(stop: Any, console: Console) -> Iterator[dict[str, int]]:
    """First SIGINT / SIGTERM: finish (or cleanly fail) the current trial, then stop and
    restore. A second SIGINT aborts the trial at once (the restore still runs)."""
    received: dict[str, int] = {}

    def handler(signum: int, frame: object) -> None:
        sig = signal.Signals(signum)
        if stop.is_set():
            if sig == signal.SIGINT:
                raise KeyboardInterrupt
            return
        received["signal"] = signum
        stop.set(f"interrupted by {sig.name}")
        console.print(
            f"[yellow]{sig.name}: finishing the current trial, then restoring the original config "
            "(Ctrl-C again to abort the trial)[/]"
        )

    previous = {s: signal.signal(s, handler) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield received
    finally:
        for s, h in previous.items():
            signal.signal(s, h)


def run_command(
    experiment: ExperimentArg,
    n_trials: Annotated[
        int | None,
        typer.Option(
            "--n-trials",
            min=1,
            help=("Trials to run now (default: what the study still lacks of the experiment's n_trials)."),
        ),
    ] = None,
    timeout: Annotated[
        float | None,
        typer.Option(
            "--timeout",
            min=1,
            help=("Seconds for this run; no new trial starts after it (default: the experiment's timeout_s)."),
        ),
    ] = None,
    no_cache: Annotated[
        bool, typer.Option("--no-cache", help="Re-run identical configs instead of reusing results.")
    ] = False,
    skip_checks: SkipChecksOption = False,
    parallel: Annotated[
        int,
        typer.Option(
            "--parallel",
            min=1,
            help=(
                "Trials measured at once on the one backend, sharing evaluation.concurrency "
                "(target.channel: request only; default 1)."
            ),
        ),
    ] = 1,
) -> None:
    """Create or resume the experiment's study and run trials (Ctrl-C / SIGTERM stop cleanly).

    The preflight (`tuner check`) runs first and stops with exit 2 on a set-up that
    would give wrong numbers."""
    from tuner.config.experiment import load_experiment

    console = Console()
    exp = load_experiment(experiment)
    run_and_report(
        exp,
        console,
        n_trials=n_trials,
        timeout=timeout,
        use_cache=not no_cache,
        skip_checks=skip_checks,
        parallel=parallel,
    )


def run_and_report(
    exp: Any,
    console: Console,
    *,
    n_trials: int | None,
    timeout: float | None,
    use_cache: bool = True,
    skip_checks: bool = False,
    parallel: int = 1,
) -> None:
    from tuner.cli.progress import RichProgress
    from tuner.ops.run import run_experiment
    from tuner.study.stop import StopFlag

    quiet_libraries()
    for warning in exp.warnings:
        console.print(f"[yellow]warning:[/] {warning}", soft_wrap=True)
    stop = StopFlag()
    with (
        graceful_signals(stop, console) as received,
        RichProgress(console, objective=exp.objective.metric, constrained=bool(exp.constraints)) as progress,
    ):
        summary = run_experiment(
            exp,
            n_trials=n_trials,
            timeout=timeout,
            stop=stop,
            observer=progress,
            use_cache=use_cache,
            skip_checks=skip_checks,
            parallel=parallel,
        )
    _print_summary(console, exp, summary)
    if summary.error:
        console.print(f"[red]error:[/] {summary.error}", soft_wrap=True)
        raise typer.Exit(2)
    ran = summary.result.ran
    if ran and "signal" not in received and all(o.state == "FAIL" for o in ran):
        console.print(
            f"[red]error:[/] every trial of this run failed ({len(ran)}); last: {ran[-1].fail_reason}; "
            "fix the backend or the search space (`tuner check EXPERIMENT`), then run again",
            soft_wrap=True,
        )
        raise typer.Exit(1)
    if "signal" in received:
        raise typer.Exit(EXIT_INTERRUPTED.get(signal.Signals(received["signal"]), 1))


def _print_summary(console: Console, exp: Any, summary: Any) -> None:
    from tuner.cli.progress import fmt_duration, summary_tables
    from tuner.ops import analysis
    from tuner.study.storage.study_storage import load_study

    maximize = exp.objective.maximize
    for warning in summary.warnings:
        if warning not in exp.warnings:  # those were printed at the start
            console.print(f"[yellow]warning:[/] {warning}", soft_wrap=True)
    result = summary.result
    states: dict[str, int] = {}
    for o in result.ran:
        states[o.state] = states.get(o.state, 0) + 1
    ran = ", ".join(f"{n} {s}" for s, n in sorted(states.items())) or "no trials"
    cached = sum(o.cache_hit for o in result.ran)
    console.print()
    console.print(
        f"[bold]study {summary.study_name}[/]: this run {ran}"
        + (f" ({cached} from the result cache)" if cached else "")
        + f" in {fmt_duration(result.elapsed_s)}, stopped by {result.stopped_by}; "
        f"{summary.n_trials_total} trials in total",
        soft_wrap=True,
    )
    from tuner.study.storage.retry import infra_summary

    infra = infra_summary(result.infra_failed)
    if infra:
        console.print(infra, style="yellow", soft_wrap=True, markup=False)
    if not result.ran and result.stopped_by == "n_trials":
        console.print(
            f"the study already has the experiment's n_trials ({exp.n_trials}); pass --n-trials N to run N more",
            soft_wrap=True,
        )
    if summary.restored and exp.target.channel == "http" and exp.target.http is not None:
        from tuner.secrets import redact_url

        shown = redact_url(exp.bind_port().target.http.url if isinstance(exp.target.port, int) else exp.target.http.url)
        console.print(f"original config document restored: {shown} (read back)", soft_wrap=True, markup=False)
    elif summary.restored:
        console.print(f"original config restored: {', '.join(map(str, summary.restored))}", soft_wrap=True)
    frame = analysis.trials_frame(load_study(exp).get_trials(deepcopy=False))
    if summary.best is None:
        console.print(
            "[yellow]no feasible trial yet[/] (constraints: " + ", ".join(c.name for c in exp.constraints) + ")"
        )
    else:
        for table in summary_tables(frame, objective=exp.objective.metric, maximize=maximize):
            console.print(table)
    if summary.holdout is not None:
        _print_holdout(console, summary.holdout)
    if summary.crossval is not None:
        console.print("\n[bold]cross-validated[/] (tune then deploy, on queries each pick was not chosen on)")
        console.print(summary.crossval.summary_line(), soft_wrap=True, markup=False, highlight=False)
        if (rules := summary.crossval.selection_line()) is not None:
            console.print(rules, soft_wrap=True, markup=False, highlight=False)
    console.print("\n[bold]dashboards[/]")
    for name, command in summary.dashboards.items():
        console.print(f"  {name:7s} {command}", soft_wrap=True)
    from tuner.ops.dashboard_specs import console_script

    tuner = console_script("tuner")
    console.print("\n[bold]next[/]")
    console.print(f"  {tuner} best {exp.source}", soft_wrap=True)
    if exp.secondary_objective is not None:  # a two-objective study: its trade-off, one line a point
        console.print(f"  {tuner} best {exp.source} --pareto", soft_wrap=True)
    console.print(f"  {tuner} apply {exp.source} --dry-run", soft_wrap=True)


def _print_holdout(console: Console, run: Any) -> None:
    """The end-of-study holdout check: verdict, primary delta with its interval, warnings."""
    report = run.report
    row = report.comparison.loc[report.primary]
    console.print(
        f"\n[bold]holdout[/] ({report.n_in_scope} in-scope of {report.n_queries} held-out queries, never tuned on): "
        f"best trial #{run.best_trial} vs baseline #{run.baseline_trial} on {report.primary}: "
        f"{row['baseline']:.4f} -> {row['candidate']:.4f} ({row['delta']:+.4f}, "
        f"CI [{row['ci_low']:+.4f}, {row['ci_high']:+.4f}], p {row['p_value']:.3f}): {report.verdict}",
        soft_wrap=True,
    )
    for warning in report.warnings:
        console.print(f"[yellow]warning:[/] {warning}", soft_wrap=True)
    console.print(f"  {run.markdown_path}", soft_wrap=True)
