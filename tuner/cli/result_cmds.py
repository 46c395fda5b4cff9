"""`tuner best | report`: the study's results, as tables on the console and as
CSV, Markdown and PNG files."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console

from tuner.cli.study_common import ExperimentArg, quiet_libraries, warn_pending_journal


def register(app: typer.Typer) -> None:
    app.command(name="best")(best_command)
    app.command(name="report")(report_command)


def best_command(
    experiment: ExperimentArg,
    top: Annotated[int, typer.Option("--top", min=1, help="How many feasible trials to list.")] = 5,
    pareto: Annotated[
        bool,
        typer.Option(
            "--pareto",
            help="The feasible Pareto front of a two-objective study (secondary_objective), one line a point.",
        ),
    ] = False,
) -> None:
    """The baseline and the top-N feasible trials: scores, deltas, constraint verdicts and
    every config value (infeasible trials listed apart). --pareto: the feasible Pareto front."""
    from tuner.cli import best_tables as bt
    from tuner.config.experiment import load_experiment
    from tuner.ops import trial_rows as tr
    from tuner.ops.verdicts import JUDGED
    from tuner.study.storage.study_storage import load_study

    console = Console()
    exp = load_experiment(experiment, check_paths=False)
    warn_pending_journal(console, exp)
    study = load_study(exp)
    # plain rows, not the report's DataFrame: pandas alone took a third of this command's time
    table = tr.trial_rows(study.get_trials(deepcopy=False))
    rows = table.rows
    tr.require_trials(rows, exp.study)
    if pareto:
        _print_pareto(console, study, experiment)
        return
    maximize = exp.objective.maximize
    base = tr.baseline(rows)
    names = bt.constraint_names_of(table.columns)
    judged = JUDGED in table.columns and exp.objective.metric != JUDGED
    goal = f"{exp.objective.direction} {exp.objective.metric}"

    ranked = tr.feasible_ranked(rows, maximize=maximize)
    if base is not None:
        ranked = [r for r in ranked if r["number"] != base["number"]]
    top_rows = ranked[:top]
    complete = sum(r["state"] == "COMPLETE" for r in rows)
    if not top_rows:
        others = "other " if base is not None and bool(base["feasible"]) else ""
        console.print(
            f"[yellow]no {others}feasible trial yet: {complete} complete trial(s), none meets every "
            "constraint[/]" + (" (the baseline is shown below)" if base is not None else "")
        )
    if base is None:
        console.print("no baseline trial in this study (set `baseline: true` in the experiment file); no deltas")
    if top_rows or base is not None:
        what = ("the baseline and " if base is not None else "") + (
            f"the top {len(top_rows)} feasible trial(s)" if top_rows else "no feasible trial"
        )
        console.print(
            bt.trials_table(
                console, f"{exp.study}: {what} ({goal})", top_rows, base=base, constraint_names=names, judged=judged
            )
        )
        console.print(bt.legend(console, objective=exp.objective.metric, base=base, constraints=bool(names)))
        for params, width in bt.params_tables(console, table.columns, top_rows, base):
            console.print(params, width=width)
        if base is not None and top_rows:
            console.print(f"{bt.CHANGED} differs from the baseline (#{int(base['number'])})")
        for line in bt.gate_moves(top_rows):
            console.print(line, markup=False, highlight=False, soft_wrap=True)

    all_infeasible = tr.infeasible(rows)
    infeasible = all_infeasible[:top]
    if infeasible:
        n_infeasible = len(all_infeasible)
        shown = "" if n_infeasible == len(infeasible) else f", the {len(infeasible)} least violating"
        console.print(
            bt.trials_table(
                console,
                f"{n_infeasible} infeasible trial(s){shown}: the constraints they break",
                infeasible,
                base=None,
                constraint_names=names,
                judged=judged,
                excess=True,
            )
        )
        for line in bt.early_stops(infeasible):
            console.print(line, markup=False, highlight=False)
    failed = [r for r in rows if r["state"] != "COMPLETE"]
    if failed:
        console.print(f"{len(failed)} trial(s) failed or pruned; `tuner report {experiment}` lists them")
    if exp.cross_validates:
        _print_crossval(console, study, exp)
    if exp.selection == "robust":
        _print_robust(console, study, exp, experiment)


def _print_pareto(console: Console, study: Any, experiment: Any) -> None:
    """The feasible Pareto front (tuner.study.pareto), best quality first, and how to deploy a point."""
    from tuner.study import pareto as par

    maximize = par.study_maximize(study)  # a one-objective study: a one-line error naming the fix
    metrics = (study.metric_names or ["objective", "secondary"])[:2]
    front = par.feasible_front(study.get_trials(deepcopy=False), maximize=maximize)

    def say(line: str) -> None:
        console.print(line, soft_wrap=True, markup=False, highlight=False)

    if not front:
        say(f"no feasible trial yet: the Pareto front of {metrics[0]} and {metrics[1]} is empty")
        return
    names = par.differing_params(front)
    goals = ", ".join(f"{'max' if up else 'min'} {m}" for m, up in zip(metrics, maximize, strict=True))
    say(f"{study.study_name}: feasible Pareto front, {len(front)} point(s) ({goals})")
    for line in par.front_lines(par.front_rows(front, names), names, (metrics[0], metrics[1])):
        say(line)
    say(f"deploy a point: `tuner apply {experiment} --trial N` (without --trial: the quality-best, #{front[0].number})")


def _print_robust(console: Console, study: Any, exp: Any, experiment: Any) -> None:
    """With ``selection: robust`` the trial to apply is the robust pick, not the top row."""
    from tuner.study.query_scores import robust_trial

    trial = robust_trial(study, exp.objective, exp.constraints)
    if trial is not None:
        console.print(
            f"selection: robust: `tuner apply {experiment}` applies trial #{trial.number} "
            f"({exp.objective.metric} {trial.values[0]:.4f}), the best neighbourhood of like settings",
            soft_wrap=True,
            markup=False,
            highlight=False,
        )


def _print_crossval(console: Console, study: Any, exp: Any) -> None:
    """How much of the gain is real: the cross-validated estimate (tuner.study.crossval)."""
    from tuner.study.query_scores import study_crossval

    cv = study_crossval(study, exp.objective, exp.constraints, exp.cv, exp.selection)
    if cv is None:
        console.print("no cross-validated estimate: no trial recorded per-query scores", soft_wrap=True)
        return
    console.print("\n[bold]cross-validated[/] (tune then deploy, on queries each pick was not chosen on)")
    console.print(cv.summary_line(), soft_wrap=True, markup=False, highlight=False)
    picks = ", ".join(f"fold {p.fold + 1}: {p.label or 'baseline'}" for p in cv.picks)
    held = "".join(f"; {k} {v:.4g} on the held-out folds" for k, v in cv.heldout_constraints.items())
    console.print(f"  picks per fold: {picks}{held}", soft_wrap=True, markup=False, highlight=False)
    if (rules := cv.selection_line()) is not None:
        console.print(f"  {rules}", soft_wrap=True, markup=False, highlight=False)
    for note in cv.notes:
        console.print(f"  note: {note}", soft_wrap=True, markup=False, highlight=False)


def report_command(
    experiment: ExperimentArg,
    out: Annotated[
        Path | None, typer.Option("--out", help="Output folder (default <state_dir>/reports/<study>).")
    ] = None,
) -> None:
    """All trials to CSV and Markdown, plus PNG plots (history, importances, score vs OOS)."""
    from tuner.config.experiment import load_experiment
    from tuner.ops import analysis
    from tuner.study.storage.study_storage import load_study

    console = Console()
    exp = load_experiment(experiment, check_paths=False)
    warn_pending_journal(console, exp)
    quiet_libraries()
    study = load_study(exp)
    paths = analysis.write_experiment_report(study, exp, out)
    console.print(f"wrote {len(study.get_trials(deepcopy=False))} trials of [bold]{exp.study}[/]:")
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
        console.print(
            f"no holdout validation yet: run `tuner validate {exp.source}` (set holdout: in the experiment "
            "file so the study tunes without the held-out queries)",
            soft_wrap=True,
        )
