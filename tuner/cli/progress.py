"""The live progress display of `tuner run` / `tuner demo` (rich).

`RichProgress` is a `StudyObserver`: the study loop tells it what happens, it renders.
Only the CLI creates one (library code never prints). Finished trials are printed as
permanent lines above the live panel, so a log of a non-interactive run (CI, nohup)
still shows every trial; the panel shows trials done, the best feasible trial so far,
the current trial's phase and an ETA.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING

import optuna
from optuna.trial import FrozenTrial
from rich.console import Console, Group
from rich.live import Live
from rich.table import Table
from rich.text import Text

from tuner.ops import analysis
from tuner.study.loop import StudyObserver
from tuner.study.trial.outcome import TrialOutcome

if TYPE_CHECKING:
    import pandas as pd

_PHASE_LABEL = {
    "suggest": "sampling parameters",
    "render": "rendering config",
    "cache": "checking result cache",
    "patch": "patching config",
    "restart": "restarting backend",
    "health": "waiting for health",
    "reload": "reloading backend config",
    "confirm": "confirming the reload",
    "evaluate": "evaluating queries",
    "solve": "solving gates",
    "report": "writing reports",
    "track": "recording (Optuna + MLflow)",
}


def eta_seconds(done: int, planned: int | None, elapsed: float, timeout: float | None) -> float | None:
    """Remaining time: mean trial time x trials left, capped by the timeout."""
    candidates = []
    if planned is not None and done > 0:
        candidates.append(elapsed / done * max(planned - done, 0))
    if timeout is not None:
        candidates.append(max(timeout - elapsed, 0.0))
    return min(candidates) if candidates else None


def fmt_duration(seconds: float | None) -> str:
    if seconds is None:
        return "?"
    seconds = int(round(seconds))  # noqa: RUF046 - numpy 1.x round() gives a float
    h, rest = divmod(seconds, 3600)
    m, s = divmod(rest, 60)
    return f"{h}h{m:02d}m" if h else f"{m}m{s:02d}s" if m else f"{s}s"


class RichProgress(StudyObserver):
    def __init__(
        self,
        console: Console,
        *,
        objective: str = "Primary_Metric_Score",
        constrained: bool = True,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.console = console
        self.objective = objective
        self.constrained = constrained  # the study has constraints: a trial is feasible or not
        self.clock = clock
        self.study_name = ""
        self.planned: int | None = None
        self.timeout: float | None = None
        self.started = clock()
        self.done = 0
        self.current: int | None = None
        self.variant: str | None = None
        self.phase_name = ""
        self.best: FrozenTrial | None = None
        self.live: Live | None = None

    # -------------------------------------------------------------- lifecycle

    def __enter__(self) -> RichProgress:
        self.live = Live(
            self._panel(), console=self.console, refresh_per_second=4, transient=True, get_renderable=self._panel
        )
        self.live.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        if self.live is not None:
            self.live.__exit__(None, None, None)
            self.live = None

    # -------------------------------------------------------------- observer

    def study_started(self, study: optuna.Study, *, planned: int | None, timeout: float | None) -> None:
        self.study_name = study.study_name
        self.planned, self.timeout = planned, timeout
        self.started = self.clock()
        from optuna.trial import TrialState

        trials = study.get_trials(deepcopy=False)
        finished = sum(t.state.is_finished() for t in trials)
        queued = sum(t.state == TrialState.WAITING for t in trials)
        plan = f"{planned} trial(s)" if planned is not None else "until stopped"
        limit = f", timeout {fmt_duration(timeout)}" if timeout is not None else ""
        waiting = f", {queued} queued (baseline / shortlist)" if queued else ""
        self.console.print(
            f"[bold]study {study.study_name}[/]: {finished} finished{waiting}; this run: {plan}{limit}", soft_wrap=True
        )

    def trial_started(self, number: int, variant: str | None) -> None:
        self.current, self.variant, self.phase_name = number, variant, "starting"

    def phase(self, number: int, phase: str) -> None:
        self.phase_name = _PHASE_LABEL.get(phase, phase)

    def trial_finished(self, outcome: TrialOutcome, best: FrozenTrial | None) -> None:
        self.done += 1
        self.best = best
        if self.current == outcome.number:  # a pipelined run may be measuring the next one already
            self.current = None
        self.console.print(trial_line(outcome, self.objective, constrained=self.constrained), soft_wrap=True)

    def note(self, text: str) -> None:
        self.console.print(f"[dim]{text}[/]", soft_wrap=True)

    # -------------------------------------------------------------- rendering

    def _panel(self) -> Group:
        elapsed = self.clock() - self.started
        planned = f"/{self.planned}" if self.planned is not None else ""
        head = Text.assemble(
            ("trials ", "bold"),
            f"{self.done}{planned}",
            ("  elapsed ", "bold"),
            fmt_duration(elapsed),
            ("  ETA ", "bold"),
            fmt_duration(eta_seconds(self.done, self.planned, elapsed, self.timeout)),
        )
        if self.best is not None:
            best = Text.assemble(
                ("best feasible ", "bold"), f"#{self.best.number} {self.objective} = {self.best.values[0]:.4f}"
            )
        else:
            best = Text("best feasible: none yet", style="yellow")
        if self.current is not None:
            label = f" ({self.variant})" if self.variant else ""
            cur = Text.assemble(("trial ", "bold"), f"#{self.current}{label}: ", (self.phase_name, "cyan"))
        else:
            cur = Text("")
        return Group(head, best, cur)


def trial_line(outcome: TrialOutcome, objective: str, *, constrained: bool = True) -> Text:
    """One permanent line per finished trial. The OOS rate of a batch without OOS
    queries, and the verdict of a study without constraints, print ``n/a``: a "0.000
    feasible" there would be a number nothing measured."""
    took = outcome.duration_s  # the one definition (tuner.study.trial.outcome.trial_seconds), as stored
    parts: list[tuple[str, str] | str] = [(f"#{outcome.number:<3}", "bold")]
    if outcome.state == "COMPLETE":
        feasible = outcome.feasible
        short = "score" if objective == "Primary_Metric_Score" else objective
        parts.append(f" {short} {outcome.value:.4f}")
        oos = outcome.metrics.get("OOS_FP_Rate")
        if oos is not None:
            parts.append(f"  OOS FP {'n/a' if analysis.without_oos(outcome.metrics) else format(oos, '.3f'):5}")
        if not constrained:
            parts.append(("  n/a       ", "dim"))
        else:
            parts.append(("  feasible  " if feasible else "  infeasible", "green" if feasible else "red"))
        if outcome.cache_hit:
            parts.append(("  cached", "dim"))
    else:
        reason = (outcome.fail_reason or "").split(";")[0]  # the what; the full reason is on the trial
        parts += [(f" {outcome.state} ", "yellow" if outcome.state == "PRUNED" else "red"), reason]
    parts.append((f"  {took:.1f}s", "dim"))
    if outcome.applied and outcome.applied != "restart":
        # "reload", or "restart: <why not a reload>" when the experiment declares a reload
        parts.append((f"  {outcome.applied}", "dim" if outcome.applied == "reload" else "yellow"))
    return Text.assemble(*parts)


def summary_tables(frame: pd.DataFrame, *, objective: str, maximize: bool) -> list[Table]:
    """The end-of-run tables: best feasible vs baseline on each scorecard metric."""
    best = analysis.best_feasible(frame, maximize=maximize)
    base = analysis.baseline_row(frame)
    tables: list[Table] = []
    if best is None:
        return tables
    title = f"best feasible trial #{int(best['number'])}"
    if base is not None:
        title += f" vs baseline #{int(base['number'])}"
        t = Table(title=title)
        for col in ("metric", "baseline", "best", "delta"):
            t.add_column(col, justify="left" if col == "metric" else "right")
        for d in analysis.deltas(best, base, objective=objective):
            style = "green" if d.change > 0 else "red" if d.change < 0 else ""
            if d.metric == "OOS_FP_Rate" or (d.metric == objective and not maximize):
                style = "green" if d.change < 0 else "red" if d.change > 0 else ""
            if d.metric == "OOS_FP_Rate" and (analysis.without_oos(base) or analysis.without_oos(best)):
                t.add_row(d.metric, "n/a", "n/a", "n/a")  # nothing measured
                continue
            t.add_row(d.metric, f"{d.baseline:.4f}", f"{d.best:.4f}", Text(f"{d.change:+.4f}", style=style))
        tables.append(t)
    params = Table(title=f"trial #{int(best['number'])} parameters")
    params.add_column("config key")
    params.add_column("value", justify="right")
    for col in frame.columns:
        if col.startswith(analysis.PARAM_PREFIX):
            value = best[col]
            if value is not None and not (isinstance(value, float) and value != value):
                params.add_row(col[len(analysis.PARAM_PREFIX) :], _fmt(value))
    tables.append(params)
    return tables


def _fmt(value: object) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    if isinstance(value, tuple):
        return "[" + ", ".join(_fmt(v) for v in value) + "]"
    return str(value)
