"""`tuner run | best | report | apply | demo`: the study commands.

The only place the study is printed: the library returns summaries, tables and
plans; this module renders them with rich and maps outcomes to exit codes.
"""

from __future__ import annotations

import logging
import signal
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console

EXIT_INTERRUPTED = {signal.SIGINT: 130, signal.SIGTERM: 143}


def register(app: typer.Typer) -> None:
    app.command(name="run")(run_command)
    app.command(name="best")(best_command)
    app.command(name="report")(report_command)
    app.command(name="apply")(apply_command)
    app.command(name="demo")(demo_command)


ExperimentArg = Annotated[Path, typer.Argument(help="Experiment file (experiments/*.yaml).", show_default=False)]
SkipChecksOption = Annotated[bool, typer.Option(
    "--skip-checks", help="Run even when the preflight (`tuner check`) finds a set-up that gives wrong numbers; "
    "the findings and the skip are recorded in the reports.")]


def _quiet_libraries() -> None:
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
        console.print(f"[yellow]{sig.name}: finishing the current trial, then restoring the original config "
                      "(Ctrl-C again to abort the trial)[/]")

    previous = {s: signal.signal(s, handler) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield received
    finally:
        for s, h in previous.items():
            signal.signal(s, h)


# ------------------------------------------------------------------------------ run


def run_command(
    experiment: ExperimentArg,
    n_trials: Annotated[int | None, typer.Option("--n-trials", min=1, help=(
        "Trials to run now (default: what the study still lacks of the experiment's n_trials)."))] = None,
    timeout: Annotated[float | None, typer.Option("--timeout", min=1, help=(
        "Seconds for this run; no new trial starts after it (default: the experiment's timeout_s)."))] = None,
    no_cache: Annotated[bool, typer.Option("--no-cache", help="Re-run identical configs instead of reusing results.")] = False,
    skip_checks: SkipChecksOption = False,
) -> None:
    """Create or resume the experiment's study and run trials (Ctrl-C / SIGTERM stop cleanly).

    The preflight (`tuner check`) runs first and stops with exit 2 on a set-up that
    would give wrong numbers."""
    from tuner.config.experiment import load_experiment

    console = Console()
    exp = load_experiment(experiment)
    _run_and_report(exp, console, n_trials=n_trials, timeout=timeout, use_cache=not no_cache, skip_checks=skip_checks)


def _run_and_report(exp: Any, console: Console, *, n_trials: int | None, timeout: float | None,
                    use_cache: bool = True, skip_checks: bool = False) -> None:
    from tuner.cli.progress import RichProgress
    from tuner.ops.run import run_experiment
    from tuner.study.trial import StopFlag

    _quiet_libraries()
    for warning in exp.warnings:
        console.print(f"[yellow]warning:[/] {warning}", soft_wrap=True)
    stop = StopFlag()
    with graceful_signals(stop, console) as received, RichProgress(console, objective=exp.objective.metric) as progress:
        summary = run_experiment(exp, n_trials=n_trials, timeout=timeout, stop=stop, observer=progress,
                                 use_cache=use_cache, skip_checks=skip_checks)
    _print_summary(console, exp, summary)
    if summary.error:
        console.print(f"[red]error:[/] {summary.error}", soft_wrap=True)
        raise typer.Exit(2)
    ran = summary.result.ran
    if ran and "signal" not in received and all(o.state == "FAIL" for o in ran):
        console.print(f"[red]error:[/] every trial of this run failed ({len(ran)}); last: {ran[-1].fail_reason}; "
                      "fix the backend or the search space (`tuner check EXPERIMENT`), then run again",
                      soft_wrap=True)
        raise typer.Exit(1)
    if "signal" in received:
        raise typer.Exit(EXIT_INTERRUPTED.get(signal.Signals(received["signal"]), 1))


def _print_summary(console: Console, exp: Any, summary: Any) -> None:
    from tuner.cli.progress import fmt_duration, summary_tables
    from tuner.ops import analysis as A
    from tuner.ops.apply import load_study

    maximize = exp.objective.direction == "maximize"
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
        + f" in {fmt_duration(result.elapsed_s)}, stopped by {result.stopped_by}; {summary.n_trials_total} trials in total",
        soft_wrap=True,
    )
    if not result.ran and result.stopped_by == "n_trials":
        console.print(f"the study already has the experiment's n_trials ({exp.n_trials}); "
                      "pass --n-trials N to run N more", soft_wrap=True)
    if summary.restored:
        console.print(f"original config restored: {', '.join(map(str, summary.restored))}", soft_wrap=True)
    frame = A.trials_frame(load_study(exp).get_trials(deepcopy=False))
    if summary.best is None:
        console.print("[yellow]no feasible trial yet[/] (constraints: "
                      + ", ".join(c.name for c in exp.constraints) + ")")
    else:
        for table in summary_tables(frame, objective=exp.objective.metric, maximize=maximize):
            console.print(table)
    if summary.holdout is not None:
        _print_holdout(console, summary.holdout)
    console.print("\n[bold]dashboards[/]")
    for name, command in summary.dashboards.items():
        console.print(f"  {name:7s} {command}", soft_wrap=True)
    from tuner.ops.dashboard import console_script

    tuner = console_script("tuner")
    console.print("\n[bold]next[/]")
    console.print(f"  {tuner} best {exp.source}", soft_wrap=True)
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


# ------------------------------------------------------------------------------ best


def best_command(
    experiment: ExperimentArg,
    top: Annotated[int, typer.Option("--top", min=1, help="How many feasible trials to list.")] = 5,
) -> None:
    """The top-N feasible trials of the study (infeasible ones listed apart)."""
    from rich.table import Table

    from tuner.config.experiment import load_experiment
    from tuner.ops import analysis as A
    from tuner.ops.apply import load_study

    console = Console()
    exp = load_experiment(experiment, check_paths=False)
    frame = A.trials_frame(load_study(exp).get_trials(deepcopy=False))
    A.require_trials(frame, exp.study)
    maximize = exp.objective.direction == "maximize"

    metric_cols = [m for m in ("OOS_FP_Rate", "Judged@10") if m in frame.columns and m != exp.objective.metric]
    constraint_cols = [c for c in frame.columns if c.startswith(A.CONSTRAINT_PREFIX)]

    def trials_table(title: str, rows: Any) -> Table:
        t = Table(title=title, title_justify="left")
        t.add_column("trial", justify="right")
        t.add_column(exp.objective.metric, justify="right")
        for col in metric_cols:
            t.add_column(col, justify="right")
        for col in constraint_cols:
            t.add_column(col.removeprefix(A.CONSTRAINT_PREFIX) + " (violation)", justify="right")
        t.add_column("variant")
        for _, row in rows.iterrows():
            t.add_row(f"#{int(row['number'])}", _cell(row["value"]), *(_cell(row[c]) for c in metric_cols),
                      *(_cell(row[c]) for c in constraint_cols),
                      str(row["variant"] or "") + (" (cached)" if row["cache_hit"] else ""))
        return t

    def params_table(rows: Any) -> Table:
        t = Table(title="their parameters", title_justify="left")
        t.add_column("config key")
        for _, row in rows.iterrows():
            t.add_column(f"#{int(row['number'])}", justify="right")
        for col in [c for c in frame.columns if c.startswith(A.PARAM_PREFIX)]:
            t.add_row(col.removeprefix(A.PARAM_PREFIX), *(_cell(row[col]) for _, row in rows.iterrows()))
        return t

    ranked = A.feasible_ranked(frame, maximize=maximize)
    if ranked.empty:
        console.print("[yellow]no feasible trial yet[/]")
    else:
        top_rows = ranked.head(top)
        console.print(trials_table(f"top {len(top_rows)} feasible trial(s) of {exp.study} "
                                   f"({exp.objective.direction} {exp.objective.metric})", top_rows))
        console.print(params_table(top_rows))
    infeasible = A.infeasible_trials(frame)
    if not infeasible.empty:
        console.print(trials_table(f"{len(infeasible)} infeasible trial(s), least violating first",
                                   infeasible.head(top)))
    failed = frame[frame["state"] != "COMPLETE"]
    if not failed.empty:
        console.print(f"{len(failed)} trial(s) failed or pruned; `tuner report {experiment}` lists them")


def _cell(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return "-" if value != value else f"{value:.4f}"
    if isinstance(value, tuple):
        return "[" + ", ".join(str(v) for v in value) + "]"
    return str(value)


# ------------------------------------------------------------------------------ report


def report_command(
    experiment: ExperimentArg,
    out: Annotated[Path | None, typer.Option("--out", help="Output folder (default <state_dir>/reports/<study>).")] = None,
) -> None:
    """All trials to CSV and Markdown, plus PNG plots (history, importances, score vs OOS)."""
    from tuner.config.experiment import load_experiment
    from tuner.ops import analysis as A
    from tuner.ops.apply import load_study

    console = Console()
    exp = load_experiment(experiment, check_paths=False)
    _quiet_libraries()
    study = load_study(exp)
    frame = A.trials_frame(study.get_trials(deepcopy=False))
    A.require_trials(frame, exp.study)
    out_dir = out or exp.state_dir / "reports" / exp.study
    oos_limit = next((c.bound for c in exp.constraints if c.metric == "OOS_FP_Rate" and c.op == "<="), None)
    paths = A.write_study_report(
        frame,
        out_dir,
        study_name=exp.study,
        objective=exp.objective.metric,
        maximize=exp.objective.direction == "maximize",
        importances=A.param_importances(study),
        oos_limit=oos_limit,
    )
    console.print(f"wrote {len(frame)} trials of [bold]{exp.study}[/]:")
    for p in (paths.csv, paths.markdown, paths.history_png, paths.importance_png, paths.score_vs_oos_png):
        console.print(f"  {p}", soft_wrap=True)
    _print_holdout_link(console, exp, exp.state_dir / "reports" / exp.study)


def _print_holdout_link(console: Console, exp: Any, folder: Path) -> None:
    """holdout.md (written by `tuner run` with a holdout, or `tuner validate`) when present."""
    from tuner.ops.validate import REPORT_MD

    holdout_md = folder / REPORT_MD
    if holdout_md.is_file():
        console.print("\n[bold]holdout validation[/]")
        console.print(holdout_md.read_text(encoding="utf-8"), markup=False, highlight=False)
        console.print(f"  {holdout_md}", soft_wrap=True)
    else:
        console.print(f"no holdout validation yet: run `tuner validate {exp.source}` (set holdout: in the experiment "
                      "file so the study tunes without the held-out queries)", soft_wrap=True)


# ------------------------------------------------------------------------------ apply


def apply_command(
    experiment: ExperimentArg,
    trial: Annotated[int | None, typer.Option("--trial", min=0, help="Trial number (default: best feasible).")] = None,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Only show the diff.")] = False,
    tolerance: Annotated[float, typer.Option("--tolerance", min=0.0, help=(
        "Largest |re-measured - trial| objective difference accepted before rolling back."))] = 0.01,
    skip_checks: SkipChecksOption = False,
    force: Annotated[bool, typer.Option("--force", help=(
        "Write even keys edited by hand since the study measured them (drift)."))] = False,
) -> None:
    """Write the best feasible (or --trial N) config into the target; re-check it, roll back if it does not hold."""
    from tuner.config.experiment import load_experiment
    from tuner.ops.apply import apply_rights

    console = Console()
    _quiet_libraries()
    exp = load_experiment(experiment)
    if dry_run:  # reads only: never takes a lock, never replays a journal
        _apply(console, exp, trial=trial, dry_run=True, tolerance=tolerance, skip_checks=skip_checks, force=force)
        return
    with apply_rights(exp) as lease:
        for line in lease.notes:
            console.print(f"[yellow]{line}[/]", soft_wrap=True)
        _apply(console, exp, trial=trial, dry_run=False, tolerance=tolerance, skip_checks=skip_checks, force=force)


def _apply(console: Console, exp: Any, *, trial: int | None, dry_run: bool, tolerance: float,
           skip_checks: bool, force: bool) -> None:
    from tuner.ops.apply import apply_plan, plan_apply

    plan = plan_apply(exp, trial_number=trial, recover_journal=not dry_run)
    for line in plan.prepared.patcher.notes:
        console.print(f"[yellow]{line}[/]", soft_wrap=True, highlight=False)
    if dry_run:  # the static checks cost nothing: say what a real apply would refuse
        from tuner.ops.check import static_preflight

        for finding in static_preflight(plan.prepared).stops:
            console.print(f"[red]preflight stop:[/] {finding.message}", soft_wrap=True, highlight=False)
    feas = "feasible" if plan.feasible else "[red]INFEASIBLE[/]"
    console.print(f"trial #{plan.trial_number} ({feas}, {plan.objective} = {plan.expected:.4f})")
    if not plan.changes:
        console.print("the config files already hold this trial's values; nothing to apply")
        return
    console.print(_colored_diff(plan.diff), soft_wrap=True)
    if plan.drift:
        how = "--force given: written anyway" if force else "a real apply stops here"
        console.print(f"[yellow]drift ({how}):[/] {plan.drift_message()}", soft_wrap=True, highlight=False)
    if dry_run:
        console.print("[dim]--dry-run: nothing written[/]")
        return
    result = apply_plan(plan, tolerance=tolerance, on_step=lambda s: console.print(f"[dim]{s}[/]"),
                        skip_checks=skip_checks, force=force)
    if result.applied:
        console.print(f"[green]{result.message}[/]", soft_wrap=True)
        return
    console.print(f"[red]{result.message}[/]", soft_wrap=True)
    raise typer.Exit(1)


def _colored_diff(diff: str) -> Any:
    """The unified diff, whole lines (never cropped), + green and - red."""
    from rich.text import Text

    out = Text()
    for line in diff.splitlines(keepends=True):
        style = ""
        if line.startswith(("+++", "---")):
            style = "bold"
        elif line.startswith("+"):
            style = "green"
        elif line.startswith("-"):
            style = "red"
        elif line.startswith("@@"):
            style = "cyan"
        out.append(line, style=style)
    return out


# ------------------------------------------------------------------------------ demo


def demo_command(
    fresh: Annotated[bool, typer.Option("--fresh", help="Delete the demo's study, data and MLflow runs first.")] = False,
    n_trials: Annotated[int | None, typer.Option("--n-trials", min=1, help=(
        "Trials to run now (default: complete the demo's 20).")) ] = None,
) -> None:
    """The demo: generated data, the reference backend, a 20-trial study with the OOS constraint."""
    import time

    from tuner.config.experiment import load_experiment
    from tuner.ops.demo import DEMO_EXPERIMENT, find_project, prepare_demo
    from tuner.study.locks import patch_rights

    console = Console()
    _quiet_libraries()
    started = time.monotonic()
    project = find_project()
    planned = load_experiment(project / DEMO_EXPERIMENT, check_paths=False)
    # Locked before --fresh deletes anything or the data is regenerated: a second demo
    # (or a run of the demo experiment) is refused instead of losing its study.
    with patch_rights(planned.storage, planned.study, planned.target.config_files, mode="exclusive",
                      command="tuner demo") as lease:
        for line in lease.notes:
            console.print(f"[yellow]{line}[/]", soft_wrap=True)
        exp = prepare_demo(project, fresh=fresh, python=sys.executable,
                           on_step=lambda s: console.print(f"[dim]{s}[/]", soft_wrap=True))
        console.print(f"[dim]set-up done in {time.monotonic() - started:.1f} s[/]")
        try:
            _run_and_report(exp, console, n_trials=n_trials, timeout=None)
        finally:
            console.print(f"[dim]demo took {time.monotonic() - started:.0f} s[/]")
