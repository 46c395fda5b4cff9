"""Tables and plots over a study's trials: `tuner best`, `tuner report`, the run summary.

Everything here is a pure function of a trials DataFrame (built once from Optuna's
frozen trials by `trials_frame`), so it is tested without a study or a backend.

Feasibility is not Optuna's best-trial logic: a trial is feasible when it is COMPLETE
and every constraint value is <= 0 (Optuna's convention), and the best trial is the
best *feasible* one, both by the one rule and ranking of tuner.study.feasibility (the
frame's rows rank exactly as `best_feasible_trial` ranks the trials).
optuna-dashboard's best-trial card ignores feasibility, which is why reports carry
this selection.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from tuner import numbers as nums
from tuner.files import atomic_write_text, atomic_write_with
from tuner.metrics.scorecard import PRIMARY_METRIC, PRIMARY_SCORECARD
from tuner.ops.trial_rows import PARAM_PREFIX as PARAM_PREFIX  # re-exported: the frame's column prefix
from tuner.ops.trial_rows import infeasible_keys, is_baseline, ranked_keys, trial_row
from tuner.ops.trial_rows import require_trials as require_trials
from tuner.ops.trial_rows import trial_duration as trial_duration
from tuner.ops.trial_rows import worst_violation as worst_violation
from tuner.ops.verdicts import CONSTRAINT_PREFIX, parse_constraint, verdicts
from tuner.ops.verdicts import JUDGED as JUDGED  # re-exported: the CLI's tables name the column

# The scorecard (tuner.metrics), its primary score and the OOS rate: the deltas the
# run summary and the study report show.
SCORECARD = (*PRIMARY_SCORECARD, PRIMARY_METRIC, "OOS_FP_Rate")
#: the scorecard's count of out-of-scope queries: with none, every OOS rate is "n/a"
N_OOS = "N_OOS_Queries"
#: the metrics whose denominator is the out-of-scope queries (printed "n/a" without any)
OOS_RATES = frozenset({"OOS_FP_Rate", "Handoff_Recall", "Handoff_F1"})

_BASE_COLUMNS = [
    "number",
    "state",
    "value",
    "feasible",
    "violation",
    "variant",
    "cache_hit",
    "fail_reason",
    "early_stop",
    "gates_moved",
    "duration_s",
]


def trials_frame(trials: Iterable[Any]) -> pd.DataFrame:
    """One row per trial (Optuna FrozenTrials or anything with the same attributes), by
    trial number: the rows of tuner.ops.trial_rows (its docstring lists the columns), a
    key a trial has no value for NaN."""
    rows = [trial_row(t) for t in trials]
    if not rows:
        return pd.DataFrame(columns=_BASE_COLUMNS)
    frame = pd.DataFrame(rows)
    # Conditional parameters leave gaps; as object columns ints stay ints (not 13.0).
    for col in frame.columns:
        if col.startswith(PARAM_PREFIX):
            frame[col] = pd.Series([r.get(col) for r in rows], dtype=object, index=frame.index)
    return frame.sort_values("number").reset_index(drop=True)


def feasible_ranked(frame: pd.DataFrame, *, maximize: bool = True) -> pd.DataFrame:
    """Feasible trials with a value, best first (tuner.study.feasibility.rank_key: ties
    to the lower trial number)."""
    if frame.empty:
        return frame
    entries = zip(frame.index, frame["number"], frame["value"], frame["feasible"], strict=True)
    return frame.loc[ranked_keys(entries, maximize=maximize)]


def infeasible_trials(frame: pd.DataFrame) -> pd.DataFrame:
    """COMPLETE trials that break a constraint, least violating first."""
    if frame.empty:
        return frame
    entries = zip(frame.index, frame["number"], frame["state"], frame["feasible"], frame["violation"], strict=True)
    return frame.loc[infeasible_keys(entries)]


def best_feasible(frame: pd.DataFrame, *, maximize: bool = True) -> pd.Series | None:
    """The best feasible trial's row, or None when no trial is feasible."""
    ranked = feasible_ranked(frame, maximize=maximize)
    return None if ranked.empty else ranked.iloc[0]


def baseline_row(frame: pd.DataFrame) -> pd.Series | None:
    """The baseline trial (the config as found), when the study ran one."""
    if frame.empty:
        return None
    rows = frame[[is_baseline(v, s) for v, s in zip(frame["variant"], frame["state"], strict=True)]]
    return None if rows.empty else rows.iloc[0]


@dataclass(frozen=True)
class Delta:
    metric: str
    baseline: float
    best: float

    @property
    def change(self) -> float:
        return self.best - self.baseline


def deltas(
    best: pd.Series, baseline: pd.Series, metrics: Sequence[str] = SCORECARD, *, objective: str | None = None
) -> list[Delta]:
    """Best minus baseline on each scorecard metric present in both rows, led by the
    ``objective``'s own metric when it is not one of them (NDCG@10, AP@100, ...): the
    number the study tuned is the first one a person looks for."""
    if objective is not None and objective not in metrics:
        metrics = (objective, *metrics)
    out = []
    for m in metrics:
        b, v = baseline.get(m), best.get(m)
        if _is_number(b) and _is_number(v):
            out.append(Delta(m, float(b), float(v)))
    return out


def without_oos(row: Mapping[str, Any]) -> bool:
    """The trial's batch had no out-of-scope queries: its OOS rates measured nothing
    (they read 0.0 by the zero-division convention, tuner.evaluation.oos)."""
    n = row.get(N_OOS)
    return _is_number(n) and n == 0


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and not math.isnan(float(value))


def summary_table(frame: pd.DataFrame, *, metrics: Sequence[str] = ("OOS_FP_Rate", JUDGED)) -> pd.DataFrame:
    """The columns a report lists per trial: number, value, a few metrics, a verdict per
    constraint (``0.0938 ✓ ≤ 0.10``), variant and the parameters (names without prefixes)."""
    if frame.empty:
        return frame
    cols = ["number", "value"] + [m for m in metrics if m in frame.columns]
    out = frame[cols].copy()
    empty = [without_oos(row) for _, row in frame.iterrows()]
    for m in (m for m in cols if m in OOS_RATES):
        out[m] = [("n/a" if e else v) for e, v in zip(empty, out[m], strict=True)]
    per_row = [verdicts(row) for _, row in frame.iterrows()]
    for i, col in enumerate(c for c in frame.columns if c.startswith(CONSTRAINT_PREFIX)):
        out[col.removeprefix(CONSTRAINT_PREFIX)] = [v[i].text() for v in per_row]
    out["variant"] = frame["variant"]
    params = [c for c in frame.columns if c.startswith(PARAM_PREFIX)]
    return pd.concat([out, frame[params].rename(columns=lambda c: c.removeprefix(PARAM_PREFIX))], axis=1)


def markdown_table(frame: pd.DataFrame, *, signed: Collection[str] = (), values: Collection[str] = ()) -> str:
    """A GitHub-flavoured Markdown table (no extra dependency); numbers as people read
    them (tuner.numbers): measured ones by `num`, the ``signed`` columns (changes) by
    `delta`, the ``values`` columns (config values, lists as ``[30, 90]``) by `value`."""
    if frame.empty:
        return "_(none)_\n"

    def fmt(column: str, v: Any) -> str:
        if v is None or (isinstance(v, float) and math.isnan(v)):
            return ""
        if column in values or isinstance(v, (tuple, list)):
            return nums.value(v)
        if isinstance(v, float):
            return nums.delta(v) if column in signed else nums.num(v)
        return str(v).replace("|", "\\|").replace("\n", " ")

    columns = [str(c) for c in frame.columns]
    header = "| " + " | ".join(columns) + " |"
    rule = "| " + " | ".join("---" for _ in frame.columns) + " |"
    body = [
        "| " + " | ".join(fmt(c, v) for c, v in zip(columns, row, strict=True)) + " |"
        for row in frame.itertuples(index=False)
    ]
    return "\n".join([header, rule, *body]) + "\n"


# ---------------------------------------------------------------- report files


@dataclass(frozen=True)
class StudyReportPaths:
    csv: Path
    markdown: Path
    history_png: Path
    importance_png: Path
    score_vs_oos_png: Path
    pareto_csv: Path | None = None  # a two-objective study's feasible front (tuner.study.pareto)


def write_study_report(
    frame: pd.DataFrame,
    out_dir: Path,
    *,
    study_name: str,
    objective: str,
    maximize: bool,
    importances: Mapping[str, float],
    oos_metric: str = "OOS_FP_Rate",
    oos_limit: float | None = None,
    pareto: tuple[str, pd.DataFrame] | None = None,
) -> StudyReportPaths:
    """All trials to CSV and Markdown plus three PNG plots, written atomically; ``pareto``
    (a two-objective study): the report's Pareto section and the front's rows (pareto.csv)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = StudyReportPaths(
        csv=out_dir / "trials.csv",
        markdown=out_dir / "report.md",
        history_png=out_dir / "optimization_history.png",
        importance_png=out_dir / "param_importances.png",
        score_vs_oos_png=out_dir / "score_vs_oos_fp_rate.png",
        pareto_csv=None if pareto is None else out_dir / "pareto.csv",
    )
    atomic_write_text(paths.csv, user_columns(frame).to_csv(index=False))
    if pareto is not None and paths.pareto_csv is not None:
        atomic_write_text(paths.pareto_csv, pareto[1].to_csv(index=False))
    plot_history(frame, paths.history_png, objective=objective, maximize=maximize)
    plot_importances(importances, paths.importance_png)
    plot_score_vs_oos(frame, paths.score_vs_oos_png, objective=objective, oos_metric=oos_metric, oos_limit=oos_limit)
    atomic_write_text(
        paths.markdown,
        study_markdown(
            frame,
            study_name=study_name,
            objective=objective,
            maximize=maximize,
            importances=importances,
            images=paths,
            pareto=None if pareto is None else pareto[0],
        ),
    )
    return paths


def write_experiment_report(study: Any, experiment: Any, out_dir: Path | None = None) -> StudyReportPaths:
    """`write_study_report` of ``experiment``'s ``study`` (its objective, importances and
    OOS bound) into ``out_dir``, by default ``<state_dir>/reports/<study>`` (what `tuner
    report` writes, and `tuner run` at its end for the MLflow parent run); StudyError
    while it has no trials."""
    frame = trials_frame(study.get_trials(deepcopy=False))
    require_trials(frame, experiment.study)
    oos_limit = next((c.bound for c in experiment.constraints if c.metric == "OOS_FP_Rate" and c.op == "<="), None)
    return write_study_report(
        frame,
        out_dir or experiment.state_dir / "reports" / experiment.study,
        study_name=experiment.study,
        objective=experiment.objective.metric,
        maximize=experiment.objective.maximize,
        importances=param_importances(study),
        oos_limit=oos_limit,
        pareto=_pareto(study) if experiment.secondary_objective is not None else None,
    )


def _pareto(study: Any) -> tuple[str, pd.DataFrame]:
    """The report's Pareto section and pareto.csv's rows (tuner.study.pareto)."""
    from tuner.study import pareto as par

    maximize = par.study_maximize(study)
    metrics = (study.metric_names or ["objective", "secondary"])[:2]
    front = par.feasible_front(study.get_trials(deepcopy=False), maximize=maximize)
    names = par.differing_params(front)
    rows = par.front_rows(front, names)
    table = pd.DataFrame(rows, columns=["trial", "quality", "secondary", "quality_best", "baseline", *names])
    table = table.rename(columns={"quality": metrics[0], "secondary": metrics[1]})
    return par.front_markdown(rows, names, (metrics[0], metrics[1])), table


def user_columns(frame: pd.DataFrame) -> pd.DataFrame:
    """``frame`` with each ``param:KEY`` column named ``KEY``, the config key people read
    everywhere else (a key that is also another column's name keeps its prefix)."""
    taken = set(frame.columns)
    return frame.rename(
        columns=lambda c: (
            c.removeprefix(PARAM_PREFIX)
            if c.startswith(PARAM_PREFIX) and c.removeprefix(PARAM_PREFIX) not in taken
            else c
        )
    )


def _constraint_names(frame: pd.DataFrame) -> list[str]:
    return [c.removeprefix(CONSTRAINT_PREFIX) for c in frame.columns if c.startswith(CONSTRAINT_PREFIX)]


def study_markdown(
    frame: pd.DataFrame,
    *,
    study_name: str,
    objective: str,
    maximize: bool,
    importances: Mapping[str, float],
    images: StudyReportPaths | None = None,
    pareto: str | None = None,
) -> str:
    lines = [f"# Study `{study_name}`", ""]
    settings = {c.removeprefix(PARAM_PREFIX) for c in frame.columns if c.startswith(PARAM_PREFIX)}
    counts = frame["state"].value_counts().to_dict() if not frame.empty else {}
    lines.append(
        f"{len(frame)} trials: " + ", ".join(f"{n} {s}" for s, n in sorted(counts.items())) + "; objective "
        f"{objective} "
        f"({'maximise' if maximize else 'minimise'})."
    )
    lines.append("")
    best = best_feasible(frame, maximize=maximize)
    base = baseline_row(frame)
    if best is None:
        lines += ["**No feasible trial.**", ""]
    else:
        lines += [f"**Best feasible trial: #{int(best['number'])}** ({objective} = {nums.num(best['value'])}).", ""]
        if base is not None:
            na = without_oos(best) or without_oos(base)
            # a constrained metric says which way is worse: OOS_FP_Rate's -0.1500 is a gain
            ops = {c.metric: c.op for c in map(parse_constraint, _constraint_names(frame)) if c is not None}
            rows = pd.DataFrame(
                [
                    {
                        "metric": f"{d.metric} ({nums.worse(ops[d.metric])})" if d.metric in ops else d.metric,
                        **(
                            {"baseline": "n/a", "best": "n/a", "delta": "n/a"}
                            if na and d.metric in OOS_RATES
                            else {"baseline": d.baseline, "best": d.best, "delta": d.change}
                        ),
                    }
                    for d in deltas(best, base, objective=objective)
                ]
            )
            lines += [
                f"Against the baseline (trial #{int(base['number'])}):",
                "",
                markdown_table(rows, signed={"delta"}),
            ]
    lines += [
        "## Feasible trials (best first)",
        "",
        markdown_table(summary_table(feasible_ranked(frame, maximize=maximize)), values=settings),
    ]
    lines += ["## Infeasible trials", "", markdown_table(summary_table(infeasible_trials(frame)), values=settings)]
    failed = frame[frame["state"] != "COMPLETE"] if not frame.empty else frame
    lines += [
        "## Failed / pruned trials",
        "",
        markdown_table(failed[["number", "state", "fail_reason"]] if not failed.empty else failed),
    ]
    if pareto is not None:
        lines += [pareto]
    if importances:
        imp = pd.DataFrame([{"parameter": k, "importance": v} for k, v in importances.items()])
        lines += ["## Parameter importances", "", markdown_table(imp)]
    else:
        complete = int(counts.get("COMPLETE", 0))
        lines += [
            "## Parameter importances",
            "",
            f"Not computed: fANOVA needs at least {MIN_IMPORTANCE_TRIALS} complete trials in which the parameters "
            f"vary (this study has {complete} complete); on fewer it ranks noise.",
            "",
        ]
    if images is not None:
        lines += ["## Plots", ""]
        for p in (images.history_png, images.importance_png, images.score_vs_oos_png):
            lines.append(f"![{p.stem}]({p.name})")
        lines.append("")
    return "\n".join(lines)


# ---------------------------------------------------------------- plots (matplotlib Agg)


def _figure(width: float = 7.0, height: float = 4.5) -> Any:
    import matplotlib

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    return plt.subplots(figsize=(width, height), dpi=110)


def _save(fig: Any, path: Path, *, laid_out: bool = False) -> None:
    """Write ``fig`` as a PNG (laid out tightly unless ``laid_out`` already: a layout
    after its labels were placed would move the points under them)."""
    import matplotlib.pyplot as plt

    if not laid_out:
        fig.tight_layout()
    try:
        atomic_write_with(path, lambda fh: fig.savefig(fh, format="png"))
    finally:
        plt.close(fig)


def _split(frame: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame]:
    done = frame[frame["state"] == "COMPLETE"] if not frame.empty else frame
    if done.empty:
        return done, done
    mask = done["feasible"].astype(bool)
    return done[mask], done[~mask]


def plot_history(frame: pd.DataFrame, path: Path, *, objective: str, maximize: bool) -> None:
    """Objective per trial, feasible (dots) vs infeasible (crosses), best feasible so far (line)."""
    _save(history_figure(frame, objective=objective, maximize=maximize), path)


def history_figure(frame: pd.DataFrame, *, objective: str, maximize: bool) -> Any:
    """`plot_history`'s figure: trials on whole-number ticks."""
    from matplotlib.ticker import MaxNLocator

    fig, ax = _figure()
    feasible, infeasible = _split(frame)
    ax.scatter(feasible["number"], feasible["value"], marker="o", color="tab:blue", label="feasible", zorder=3)
    ax.scatter(infeasible["number"], infeasible["value"], marker="x", color="tab:red", label="infeasible", zorder=3)
    if not feasible.empty:
        running = feasible["value"].cummax() if maximize else feasible["value"].cummin()
        ax.step(feasible["number"], running, where="post", color="tab:green", label="best feasible so far")
    base = baseline_row(frame)
    if base is not None and _is_number(base["value"]):
        ax.axhline(float(base["value"]), color="grey", linestyle=":", label="baseline")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))  # trial numbers: no 2.5
    ax.set_xlabel("trial")
    ax.set_ylabel(objective)
    ax.set_title("Optimisation history")
    ax.legend(loc="best", fontsize="small")
    return fig


def plot_importances(importances: Mapping[str, float], path: Path) -> None:
    """Horizontal bars, most important on top; a note when they cannot be computed yet."""
    fig, ax = _figure(7.0, max(2.5, 0.45 * len(importances) + 1.2))
    if importances:
        names = list(importances)[::-1]
        ax.barh(names, [importances[n] for n in names], color="tab:blue")
        ax.set_xlabel("importance (fANOVA, share of objective variance)")
    else:
        ax.text(
            0.5,
            0.5,
            f"not computed: needs {MIN_IMPORTANCE_TRIALS} complete trials\nin which the parameters vary",
            ha="center",
            va="center",
        )
        ax.set_axis_off()
    ax.set_title("Parameter importances")
    _save(fig, path)


def plot_score_vs_oos(
    frame: pd.DataFrame, path: Path, *, objective: str, oos_metric: str, oos_limit: float | None
) -> None:
    """The trade-off the constraint cuts: objective against the OOS false-positive rate."""
    fig = score_vs_oos_figure(frame, objective=objective, oos_metric=oos_metric, oos_limit=oos_limit)
    _save(fig, path, laid_out=True)


def score_vs_oos_figure(frame: pd.DataFrame, *, objective: str, oos_metric: str, oos_limit: float | None) -> Any:
    """`plot_score_vs_oos`'s figure: each feasible point labelled with its trial number,
    trials on one spot sharing a label, no label over another (`label_points`)."""
    fig, ax = _figure()
    feasible, infeasible = _split(frame)
    points: list[tuple[float, float, int]] = []
    if oos_metric in frame.columns:
        ax.scatter(feasible[oos_metric], feasible["value"], marker="o", color="tab:blue", label="feasible", zorder=3)
        ax.scatter(
            infeasible[oos_metric], infeasible["value"], marker="x", color="tab:red", label="infeasible", zorder=3
        )
        points = [(float(r[oos_metric]), float(r["value"]), int(r["number"])) for _, r in feasible.iterrows()]
    if oos_limit is not None:
        ax.axvline(oos_limit, color="grey", linestyle="--", label=f"{oos_metric} limit {nums.value(oos_limit)}")
    ax.set_xlabel(oos_metric)
    ax.set_ylabel(objective)
    ax.set_title(f"{objective} vs {oos_metric}")
    ax.legend(loc="best", fontsize="small")
    fig.tight_layout()  # before the labels are placed: where the points will be drawn
    label_points(ax, [p for p in points if _is_number(p[0]) and _is_number(p[1])])
    return fig


def _label_spots() -> list[tuple[int, int, str]]:
    """Where a label may sit around its point, in points (x, y, horizontal alignment),
    nearest first: beside it, then further out (with a leader line)."""
    spots = [
        (dx * side, dy, "left" if side > 0 else "right")
        for dx in (4, 16, 30)
        for dy in (3, -9, 11, -17, 19, -25, 27, -33)
        for side in (1, -1)
    ]
    return sorted(spots, key=lambda s: s[0] ** 2 + (s[1] + 3) ** 2)


def label_points(ax: Any, points: Sequence[tuple[float, float, int]]) -> list[Any]:
    """Label each point (x, y, trial number) with its number: the trials at one spot (the
    same values to 4 digits) share one label ("3, 9, 16"), and each label takes the
    nearest place around its point that touches no label placed before it (further out
    with a leader line to its point); with no such place, its numbers join the label of
    the nearest spot already labelled. Returns the labels (matplotlib annotations)."""
    spots: dict[tuple[str, str], list[tuple[float, float, int]]] = {}
    for x, y, n in points:
        spots.setdefault((nums.num(x), nums.num(y)), []).append((x, y, n))
    ax.figure.canvas.draw()  # the axes' final limits, so boxes are measured where they will be drawn
    renderer = ax.figure.canvas.get_renderer()
    placed: list[tuple[Any, Any, tuple[float, float]]] = []  # (label, its padded box, its point in pixels)
    for group in spots.values():
        x, y = group[0][0], group[0][1]
        at = ax.transData.transform((x, y))
        text = ", ".join(str(n) for _, _, n in sorted(group, key=lambda p: p[2]))
        for dx, dy, ha in _label_spots():
            near = abs(dx) <= 4 and dy in (3, -9)
            line = None if near else {"arrowstyle": "-", "lw": 0.4, "alpha": 0.5}
            label = ax.annotate(
                text,
                (x, y),
                xytext=(dx, dy),
                textcoords="offset points",
                ha=ha,
                va="bottom",
                fontsize=6,
                alpha=0.8,
                arrowprops=line,
            )
            box = label.get_window_extent(renderer).padded(2)  # a gap, so "13" and "19" never read "1319"
            if not any(box.overlaps(b) for _, b, _ in placed):
                placed.append((label, box, (at[0], at[1])))
                break
            label.remove()
        else:  # crowded out: join the nearest label
            nearest = min(placed, key=lambda p: (p[2][0] - at[0]) ** 2 + (p[2][1] - at[1]) ** 2)[0]
            nearest.set_text(f"{nearest.get_text()}, {text}")
    return [label for label, _, _ in placed]


#: fANOVA fits a random forest to the complete trials; on few points it ranks noise with
#: the look of a finding. Random sampling, Optuna's evaluator: for 10a + 3b with three
#: unused keys, an unused key ranked first in 11/12 studies at 3 trials, 5/12 at 5, 1/12 at
#: 8, 0/12 at 10; for 10a + 0.01b the near-inert b ranked first in 8/20 at 10 trials, 2/20
#: at 15, 1/20 at 20. Below this floor the table is mostly noise (above it, no guarantee).
#: Short runs also paid ~1 s of CPU at their end for it (sklearn's import and the fit).
MIN_IMPORTANCE_TRIALS = 10


def param_importances(study: Any) -> dict[str, float]:
    """fANOVA importances of the config keys over COMPLETE trials (most important first),
    read through `tuner.study.storage.user_view` as optuna-dashboard is: the values written
    to the config, never the samplers' coordinates. Empty below MIN_IMPORTANCE_TRIALS
    complete trials or while no parameter varies."""
    import warnings

    import optuna

    from tuner.study.storage.user_view import user_study

    study = user_study(study)
    complete = study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,))
    if len(complete) < MIN_IMPORTANCE_TRIALS:
        return {}
    # a two-objective study (secondary_objective): the importances for the first objective
    target = (lambda t: t.values[0]) if len(study.directions) > 1 else None
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return {k: float(v) for k, v in optuna.importance.get_param_importances(study, target=target).items()}
    except (ValueError, RuntimeError, ZeroDivisionError):
        return {}
