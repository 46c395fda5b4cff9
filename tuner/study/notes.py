"""What the dashboards say about a study in words: the study note (best feasible vs
baseline, the holdout verdict, links), a trial's note, and the links between the two UIs.

optuna-dashboard 0.21's own Best Trial card and chip ignore constraints; `tuner dashboard`
serves it a view whose best trial is the best feasible one (tuner.ops.dashboard_server),
with the card left empty when no trial is feasible. The study note, shown at the top of
the study page, names the best *feasible* trial and says so loudly when the highest
score is infeasible (what optuna-dashboard started on the storage by itself would show).
The same Markdown is the MLflow parent run's description; `dashboard_headline` is the
line `tuner dashboard` prints. Builders are pure (Markdown from trials); `write_note` is
the one write.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from optuna.trial import FrozenTrial, TrialState

from tuner import numbers as nums
from tuner.optuna_adapter import save_dashboard_note
from tuner.study.feasibility import best_feasible_trial, constraints_hold, feasible_ranked, is_feasible, summary_of
from tuner.study.trial.attrs import ATTR_EARLY_STOP, ATTR_MLFLOW_RUN, ATTR_VARIANT, metrics_of, named_constraints

if TYPE_CHECKING:
    from tuner.report.tracker import Tracker

_TOP = 5  # feasible trials listed in the study note


@dataclass(frozen=True)
class Links:
    """Where the dashboards serve this study (tracking.optuna_dashboard_url and
    tracking.mlflow_ui_url; `tuner dashboard` serves them there by default). MLflow's
    pages are the tracker's to name (``Tracker.run_url`` / ``experiment_url``: None
    without MLflow)."""

    optuna_url: str
    mlflow_url: str
    study_id: int
    tracker: Tracker | None = None

    def trial(self, number: int) -> str:
        return f"{self.optuna_url.rstrip('/')}/studies/{self.study_id}/trials?numbers={number}"

    def study(self) -> str:
        return f"{self.optuna_url.rstrip('/')}/studies/{self.study_id}"

    def run(self, run_id: str | None) -> str | None:
        if not run_id or self.tracker is None:
            return None
        return self.tracker.run_url(run_id, self.mlflow_url)

    def experiment(self) -> str | None:
        return None if self.tracker is None else self.tracker.experiment_url(self.mlflow_url)


def trial_note(
    *,
    number: int,
    state: str,
    value: float | None,
    objective: str,
    feasible: bool,
    constraints: Mapping[str, float],
    metrics: Mapping[str, float],
    solved: Mapping[str, Any],
    early_stop: str | None = None,
    fail_reason: str | None = None,
    links: Mapping[str, str] = {},
    gates_moved: str | None = None,
) -> str:
    """A trial's note: verdict, constraints, solved gates (and which constraint moved one
    off its value as found), links."""
    if state != "COMPLETE":
        head = f"**{state}**" + (f": {fail_reason}" if fail_reason else "")
    else:
        mark = "feasible" if feasible else "**infeasible**"
        head = f"**{objective} {nums.num(value)}** · {mark}" if value is not None else mark
    lines = [f"### Trial {number}", "", head, ""]
    if early_stop:
        lines += [f"Stopped early: {early_stop}.", ""]
    for name, violation in constraints.items():
        metric = name.split()[0]
        shown = metrics.get(metric)
        verdict = "holds" if constraints_hold([violation]) else f"**violated** by {nums.delta(violation)}"
        lines.append(f"- `{name}`: {metric} = {nums.num(shown)}, {verdict}{_bound(name)}")
    for name, v in solved.items():
        lines.append(f"- `{name}` = {nums.value(v)} (solved from this trial's retrieval)")
    if gates_moved:
        lines.append(f"- gates moved by a constraint: {gates_moved}")
    if links:
        lines += ["", " · ".join(f"[{label}]({url})" for label, url in links.items())]
    return "\n".join(lines).rstrip() + "\n"


def study_note(
    trials: Sequence[FrozenTrial],
    *,
    study_name: str,
    objective: str,
    maximize: bool,
    links: Links | None = None,
    holdout: str | None = None,
    apply_hint: str | None = None,
    crossval: str | None = None,
    selection: str | None = None,
) -> str:
    """The study note: best feasible trial vs baseline, the top feasible trials, the
    trial the Best Trial card shows when it is infeasible, the holdout verdict, the
    cross-validated estimate (tuner.study.crossval, its summary line) and the pick rules
    compared (its selection line)."""
    done = [t for t in trials if t.state == TrialState.COMPLETE and t.values]
    best = best_feasible_trial(trials, maximize=maximize)
    baseline = next((t for t in done if t.user_attrs.get(ATTR_VARIANT) == "baseline"), None)
    link: Callable[[FrozenTrial], str] = (
        (lambda t: f"[#{t.number}]({links.trial(t.number)})") if links else (lambda t: f"#{t.number}")
    )
    n_feasible = sum(is_feasible(t) for t in trials)
    counts = (
        f"{len(trials)} trials: {n_feasible} feasible, {len(done) - n_feasible} infeasible, "
        f"{sum(t.state == TrialState.FAIL for t in trials)} failed, "
        f"{sum(t.state == TrialState.PRUNED for t in trials)} pruned"
    )
    lines = [f"## {study_name}: the trial to apply", ""]
    if best is None:
        lines += [
            "**No feasible trial yet**: every completed trial breaks a constraint. Nothing to apply; "
            "the Best Trial card stays empty.",
            "",
        ]
    else:
        line = f"**Best feasible: trial {link(best)}, {objective} {nums.num(best.values[0])}**"
        if baseline is not None and baseline.number != best.number:
            change = nums.delta(best.values[0] - baseline.values[0])
            line += f" ({change} vs the baseline {link(baseline)}, {nums.num(baseline.values[0])})"
        lines += [line + ".", ""]
    card = _top_scorer(done, maximize)
    if card is not None and not is_feasible(card):
        lines += [
            f"⚠ The highest {objective}, {link(card)} ({nums.num(card.values[0])}), is **infeasible** "
            f"({_broken(card)}): do not apply it. The Best Trial card of `tuner dashboard` names the best "
            "feasible trial; optuna-dashboard started on the storage by itself shows this one.",
            "",
        ]
    if holdout:
        lines += [f"Holdout: {holdout}", ""]
    if crossval:
        lines += [f"Cross-validated: {crossval}", ""]
    if selection:
        lines += [f"{selection[0].upper()}{selection[1:]}.", ""]
    feasible = feasible_ranked(trials, maximize=maximize)
    if feasible:
        lines += [f"| trial | {objective} | vs baseline | constraints | variant |", "|---|---:|---:|---|---|"]
        for t in feasible[:_TOP]:
            change = nums.delta(t.values[0] - baseline.values[0]) if baseline is not None else ""
            variant = t.user_attrs.get(ATTR_VARIANT, "")
            lines.append(f"| {link(t)} | {nums.num(t.values[0])} | {change} | {_held(t)} | {variant} |")
        lines.append("")
        bounds = sorted(
            {b.strip(" ()") for t in feasible[:_TOP] for n in named_constraints(t.constraints) if (b := _bound(n))}
        )
        if bounds:  # the table's constraint column is the metric's value: say which way is worse
            lines += [f"Constraints: {', '.join(bounds)}.", ""]
    extra = []
    if best is not None and links is not None and (run := links.run(best.user_attrs.get(ATTR_MLFLOW_RUN))):
        extra.append(f"[best trial's MLflow run]({run})")
    if links is not None and (exp := links.experiment()):
        extra.append(f"[all runs in MLflow]({exp})")
    if extra:
        lines += [" · ".join(extra), ""]
    if apply_hint and best is not None:
        lines += [f"Apply it: `{apply_hint}`", ""]
    lines.append(counts + ".")
    return "\n".join(lines) + "\n"


def dashboard_headline(trials: Sequence[FrozenTrial], *, study_name: str, objective: str, maximize: bool) -> str:
    """One line for `tuner dashboard`: the trial the Best Trial card names, or why it is empty."""
    best = best_feasible_trial(trials, maximize=maximize)
    if best is not None:
        value = nums.num(best.values[0])
        return f"study {study_name}: best feasible trial #{best.number}, {objective} {value} (the Best Trial card)"
    done = sum(t.state == TrialState.COMPLETE for t in trials)
    if done == 0:
        return f"study {study_name}: no completed trial yet; the Best Trial card stays empty"
    return (
        f"study {study_name}: no feasible trial yet ({done} completed, every one breaks a constraint): "
        "the Best Trial card stays empty and there is nothing to apply"
    )


def study_summary_metrics(trials: Sequence[FrozenTrial], *, maximize: bool) -> dict[str, float]:
    """Numbers for the MLflow parent run next to the study note: the run's end-of-study
    summary (tuner.study.feasibility.summary_of) so far, plus the baseline's value."""
    out = summary_of(trials, maximize=maximize)
    baseline = next(
        (
            t
            for t in trials
            if t.state == TrialState.COMPLETE and t.values and t.user_attrs.get(ATTR_VARIANT) == "baseline"
        ),
        None,
    )
    if baseline is not None:
        out["baseline_value"] = float(baseline.values[0])
    return out


def publish_study(
    study: Any,
    *,
    objective: Any,
    links: Links | None,
    tracker: Any = None,
    holdout: str | None = None,
    apply_hint: str | None = None,
    crossval: Any = None,
) -> None:
    """Write the study note and, with a tracker, the MLflow parent run's summary
    (``objective``: a tuner.config.objective.Objective; ``crossval``: a
    tuner.study.crossval.CrossValResult, its line in the note, its ``cv_`` metrics)."""
    trials = study.get_trials(deepcopy=False)
    note = study_note(
        trials,
        study_name=study.study_name,
        objective=objective.metric,
        maximize=objective.maximize,
        links=links,
        holdout=holdout,
        apply_hint=apply_hint,
        crossval=None if crossval is None else crossval.summary_line(),
        selection=None if crossval is None else crossval.selection_line(),
    )
    write_note(study, note)
    summarize = getattr(tracker, "summarize_study", None)
    if summarize is not None:
        metrics = study_summary_metrics(trials, maximize=objective.maximize)
        tags = {"tuner.optuna_study_page": links.study()} if links is not None else {}
        if crossval is not None:
            metrics.update(crossval.metrics())
            tags["tuner.cv_verdict"] = crossval.verdict
        summarize(note=note, metrics=metrics, tags=tags)


def write_note(target: Any, markdown: str) -> None:
    """Save ``markdown`` as the optuna-dashboard note of an ``optuna.Study`` or a running
    (or just told) ``optuna.Trial``, by optuna-dashboard's own ``save_note``."""
    save_dashboard_note(target, markdown)


def _top_scorer(done: Sequence[FrozenTrial], maximize: bool) -> FrozenTrial | None:
    """The best value, feasible or not (what optuna-dashboard's own Best Trial card shows)."""
    if not done:
        return None
    return (max if maximize else min)(done, key=lambda t: (t.values[0], -t.number))


def _broken(t: FrozenTrial) -> str:
    broken = [name for name, v in named_constraints(t.constraints).items() if v > 0]
    reason = ", ".join(f"`{n}` violated" for n in broken) or "a constraint violated"
    if t.user_attrs.get(ATTR_EARLY_STOP):
        reason += ", stopped early"
    return reason


def _held(t: FrozenTrial) -> str:
    metrics = metrics_of(t)
    parts = []
    for name in named_constraints(t.constraints):
        metric = name.split()[0]
        parts.append(f"{metric} {nums.num(metrics.get(metric, t.user_attrs.get(metric)))}")
    return ", ".join(parts)


def _bound(name: str) -> str:
    """`` (at most 0.1; higher is worse)`` for constraint ``name``; "" when it is not
    ``METRIC OP NUMBER`` (a legacy positional name)."""
    from tuner.config.objective import Constraint

    try:
        c = Constraint.parse(name)
    except ValueError:
        return ""
    limit = "at most" if c.op == "<=" else "at least"
    return f" ({c.metric} {limit} {nums.value(c.bound)}; {nums.worse(c.op)})"
