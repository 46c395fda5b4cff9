"""The feasible Pareto front of a two-objective study (``secondary_objective``).

A trial is on the front when it is feasible (the one rule, tuner.study.feasibility) and no
other feasible trial is at least as good on both objectives and better on one. Trials with
equal values on both are all kept (the earlier first). Pure functions on FrozenTrials:
`tuner best --pareto`, the report's Pareto section and the MLflow parent run's
``pareto.csv`` all read `feasible_front` and `front_rows`.

    feasible_front(trials, maximize=(True, False)) -> [FrozenTrial, ...]  # best quality first
    differing_params(front) -> [key, ...]     # the config keys whose values differ on the front
    front_rows(front, names) -> [{"trial", "quality", "secondary", "quality_best", "baseline", key: value}, ...]

A point's settings are its config values as written to the backend (the trial's
assignment: solved gates included, a simplex as its components), not Optuna's encoding.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any

from tuner.errors import StudyError
from tuner.study.feasibility import is_feasible
from tuner.study.trial.attrs import ATTR_VARIANT, assignment_of

if TYPE_CHECKING:
    import optuna
    from optuna.trial import FrozenTrial


def is_multi_objective(study: optuna.Study) -> bool:
    return len(study.directions) > 1


def study_maximize(study: optuna.Study) -> tuple[bool, bool]:
    """Per objective, whether it is maximised (a two-objective study; else a one-line error)."""
    directions = [d.name.lower() == "maximize" for d in study.directions]
    if len(directions) != 2:
        raise StudyError(
            f"study {study.study_name!r} has {len(directions)} objective(s); a Pareto front needs two: "
            "add secondary_objective: {metric: Latency_P95_ms, direction: minimize} to the experiment "
            "and run a new study"
        )
    return directions[0], directions[1]


def dominates(a: Sequence[float], b: Sequence[float], maximize: Sequence[bool]) -> bool:
    """``a`` is at least as good as ``b`` on every objective and better on one."""
    better = False
    for x, y, up in zip(a, b, maximize, strict=True):
        gx, gy = (x, y) if up else (-x, -y)
        if gx < gy:
            return False
        better = better or gx > gy
    return better


def feasible_front(trials: Iterable[FrozenTrial], *, maximize: Sequence[bool]) -> list[FrozenTrial]:
    """The feasible non-dominated trials with finite values, best first objective first
    (ties: the better second, then the earlier trial)."""
    n = len(maximize)
    points = [
        t
        for t in trials
        if is_feasible(t) and t.values is not None and len(t.values) == n and all(math.isfinite(v) for v in t.values)
    ]
    front = [t for t in points if not any(dominates(o.values, t.values, maximize) for o in points)]

    def key(t: FrozenTrial) -> tuple[float, ...]:
        return (*(-v if up else v for v, up in zip(t.values, maximize, strict=True)), float(t.number))

    return sorted(front, key=key)


def differing_params(front: Sequence[FrozenTrial]) -> list[str]:
    """The config keys whose values are not the same on every point of the front (a key a
    point lacks counts as differing), in name order."""
    settings = [assignment_of(t) for t in front]
    names = sorted({name for a in settings for name in a})
    return [n for n in names if len({repr(a.get(n)) for a in settings}) > 1]


def front_rows(front: Sequence[FrozenTrial], names: Sequence[str]) -> list[dict[str, Any]]:
    """One row per point: trial number, both objective values, whether it is the
    quality-best (the first objective's best, the front's first) or the baseline, and the
    named config values."""
    rows = []
    for i, t in enumerate(front):
        settings = assignment_of(t)
        rows.append(
            {
                "trial": t.number,
                "quality": float(t.values[0]),
                "secondary": float(t.values[1]),
                "quality_best": i == 0,
                "baseline": t.user_attrs.get(ATTR_VARIANT) == "baseline",
                **{n: settings.get(n) for n in names},
            }
        )
    return rows


def front_lines(rows: Sequence[dict[str, Any]], names: Sequence[str], metrics: tuple[str, str]) -> list[str]:
    """`tuner best --pareto`'s lines, one a point: ``#12  NDCG@10 0.3859  Latency_P95_ms 21.30
    fusion.method=rrf ...  <- quality-best``. The params shown are those that differ on the front."""
    from tuner import numbers as nums

    out = []
    for row in rows:
        params = "  ".join(f"{n}={nums.value(row[n])}" for n in names)
        line = f"#{row['trial']:<4} {metrics[0]} {nums.num(row['quality'])}  {metrics[1]} {nums.num(row['secondary'])}"
        line += f"  {params}" if params else ""
        marks = [m for m, on in (("quality-best", row["quality_best"]), ("baseline", row.get("baseline"))) if on]
        line += f"  <- {', '.join(marks)}" if marks else ""
        out.append(line)
    return out


def front_markdown(rows: Sequence[dict[str, Any]], names: Sequence[str], metrics: tuple[str, str]) -> str:
    """The report's Pareto section: what the front is, one table row a point, and how to
    deploy one."""
    from tuner import numbers as nums

    head = ["trial", metrics[0], metrics[1], *names, ""]
    lines = [
        "## Pareto front (quality against " + metrics[1] + ")",
        "",
        f"The feasible trials no other feasible trial beats on both {metrics[0]} and {metrics[1]}, best "
        f"{metrics[0]} first. Deploy a point with `tuner apply EXPERIMENT --trial N`.",
        "",
        "| " + " | ".join(head) + " |",
        "|" + "---|" * len(head),
    ]
    for row in rows:
        marks = [m for m, on in (("quality-best", row["quality_best"]), ("baseline", row.get("baseline"))) if on]
        cells = [f"#{row['trial']}", nums.num(row["quality"]), nums.num(row["secondary"])]
        cells += [nums.value(row[n]) for n in names] + [", ".join(marks)]
        lines.append("| " + " | ".join(cells) + " |")
    if not rows:
        lines.append("| no feasible trial yet |" + " |" * (len(head) - 1))
    return "\n".join(lines) + "\n"
