"""`tuner best | report`: the study's results, as tables on the console and as
CSV, Markdown and PNG files."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console

from tuner.cli.study_common import ExperimentArg, quiet_libraries


def register(app: typer.Typer) -> None:
    app.command(name="best")(best_command)
    app.command(name="report")(report_command)


def best_command(
    experiment: ExperimentArg,
    top: Annotated[int, typer.Option("--top", min=1, help="How many feasible trials to list.")] = 5,
) -> None:
    """The top-N feasible trials of the study (infeasible ones listed apart)."""
    from rich.table import Table

    from tuner.config.experiment import load_experiment
    from tuner.ops import analysis
    from tuner.study.storage import load_study

    console = Console()
    exp = load_experiment(experiment, check_paths=False)
    frame = analysis.trials_frame(load_study(exp).get_trials(deepcopy=False))
    analysis.require_trials(frame, exp.study)
    maximize = exp.objective.direction == "maximize"

    metric_cols = [m for m in ("OOS_FP_Rate", "Judged@10") if m in frame.columns and m != exp.objective.metric]
    constraint_cols = [c for c in frame.columns if c.startswith(analysis.CONSTRAINT_PREFIX)]

    def trials_table(title: str, rows: Any) -> Table:
        t = Table(title=title, title_justify="left")
        t.add_column("trial", justify="right")
        t.add_column(exp.objective.metric, justify="right")
        for col in metric_cols:
            t.add_column(col, justify="right")
        for col in constraint_cols:
            t.add_column(col.removeprefix(analysis.CONSTRAINT_PREFIX) + " (violation)", justify="right")
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
        for col in [c for c in frame.columns if c.startswith(analysis.PARAM_PREFIX)]:
            t.add_row(col.removeprefix(analysis.PARAM_PREFIX), *(_cell(row[col]) for _, row in rows.iterrows()))
        return t

    ranked = analysis.feasible_ranked(frame, maximize=maximize)
    if ranked.empty:
        console.print("[yellow]no feasible trial yet[/]")
    else:
        top_rows = ranked.head(top)
        console.print(trials_table(f"top {len(top_rows)} feasible trial(s) of {exp.study} "
                                   f"({exp.objective.direction} {exp.objective.metric})", top_rows))
        console.print(params_table(top_rows))
    infeasible = analysis.infeasible_trials(frame)
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


def report_command(
    experiment: ExperimentArg,
    out: Annotated[Path | None, typer.Option("--out", help="Output folder (default <state_dir>/reports/<study>).")] = None,
) -> None:
    """All trials to CSV and Markdown, plus PNG plots (history, importances, score vs OOS)."""
    from tuner.config.experiment import load_experiment
    from tuner.ops import analysis
    from tuner.study.storage import load_study

    console = Console()
    exp = load_experiment(experiment, check_paths=False)
    quiet_libraries()
    study = load_study(exp)
    frame = analysis.trials_frame(study.get_trials(deepcopy=False))
    analysis.require_trials(frame, exp.study)
    out_dir = out or exp.state_dir / "reports" / exp.study
    oos_limit = next((c.bound for c in exp.constraints if c.metric == "OOS_FP_Rate" and c.op == "<="), None)
    paths = analysis.write_study_report(
        frame,
        out_dir,
        study_name=exp.study,
        objective=exp.objective.metric,
        maximize=exp.objective.direction == "maximize",
        importances=analysis.param_importances(study),
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

