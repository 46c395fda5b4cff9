"""`tuner apply`: show the diff of the best (or a chosen) trial's config, write it into
the target, re-check it and roll back when it does not hold."""

from __future__ import annotations

from typing import Annotated, Any

import typer
from rich.console import Console

from tuner.cli.study_common import ExperimentArg, SkipChecksOption, quiet_libraries, warn_pending_journal


def register(app: typer.Typer) -> None:
    app.command(name="apply")(apply_command)


def apply_command(
    experiment: ExperimentArg,
    trial: Annotated[int | None, typer.Option("--trial", min=0, help="Trial number (default: best feasible).")] = None,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Only show the diff.")] = False,
    tolerance: Annotated[
        float,
        typer.Option(
            "--tolerance",
            min=0.0,
            help=("Largest |re-measured - trial| objective difference accepted before rolling back."),
        ),
    ] = 0.01,
    skip_checks: SkipChecksOption = False,
    force: Annotated[
        bool, typer.Option("--force", help=("Write even keys edited by hand since the study measured them (drift)."))
    ] = False,
    recover: Annotated[
        bool,
        typer.Option(
            "--recover",
            help=(
                "Only replay a restore journal a killed command left (originals back) and restart the backend on them."
            ),
        ),
    ] = False,
) -> None:
    """Write the best feasible (or --trial N) config into the target; re-check it, roll back if it does not hold."""
    from tuner.config.experiment import load_experiment
    from tuner.ops.apply import apply_rights

    console = Console()
    quiet_libraries()
    exp = load_experiment(experiment)
    if exp.target.channel == "request" and exp.target.apply_to is None:  # no file: the values travel in the request
        _show_request_fragment(console, exp, trial=trial)
        return
    if dry_run:  # reads only: never takes a lock, never replays a journal
        warn_pending_journal(console, exp)
        _apply(console, exp, trial=trial, dry_run=True, tolerance=tolerance, skip_checks=skip_checks, force=force)
        return
    with apply_rights(exp) as lease:
        for line in lease.notes:
            console.print(f"[yellow]{line}[/]", soft_wrap=True)
        if recover:
            from tuner.ops.apply import recover_apply

            console.print(
                recover_apply(
                    exp, on_step=lambda s: console.print(s, style="dim", soft_wrap=True, highlight=False, markup=False)
                ),
                style="bold",
                soft_wrap=True,
                highlight=False,
                markup=False,
            )
            return
        _apply(console, exp, trial=trial, dry_run=False, tolerance=tolerance, skip_checks=skip_checks, force=force)


def _show_request_fragment(console: Console, exp: Any, *, trial: int | None) -> None:
    import json

    from tuner.ops.apply import request_fragment

    found = request_fragment(exp, trial_number=trial)
    verdict = "feasible" if found.feasible else "INFEASIBLE"
    console.print(
        f"trial #{found.trial_number} ({exp.objective.metric} {found.expected:.4f}, {verdict}): target.channel is "
        "request, so there is no file to write; set these values in the request your application sends "
        "(the places target.request.bind names):",
        soft_wrap=True,
        highlight=False,
        markup=False,
    )
    console.print(
        json.dumps(found.fragment, indent=2, ensure_ascii=False), soft_wrap=True, highlight=False, markup=False
    )


def _apply(
    console: Console, exp: Any, *, trial: int | None, dry_run: bool, tolerance: float, skip_checks: bool, force: bool
) -> None:
    from tuner.ops.apply import apply_plan, plan_apply

    def replayed(line: str) -> None:  # a killed command's journal: say what came back, and serve it
        from tuner.ops.apply import restart_on_files

        console.print(line, style="bold yellow", soft_wrap=True, highlight=False, markup=False)
        restart_on_files(exp, on_step=lambda s: console.print(f"[dim]{s}[/]"))

    plan = plan_apply(exp, trial_number=trial, recover_journal=not dry_run, on_replay=replayed)
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
    if plan.gates_moved:  # the other solved gates are written as found (tuner.study.gates.gate_choice)
        console.print(f"gates moved by a constraint: {plan.gates_moved}", soft_wrap=True, highlight=False, markup=False)
    if plan.drift:
        how = "--force given: written anyway" if force else "a real apply stops here"
        console.print(f"[yellow]drift ({how}):[/] {plan.drift_message()}", soft_wrap=True, highlight=False)
    if dry_run:
        console.print("[dim]--dry-run: nothing written[/]")
        return
    result = apply_plan(
        plan, tolerance=tolerance, on_step=lambda s: console.print(f"[dim]{s}[/]"), skip_checks=skip_checks, force=force
    )
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
