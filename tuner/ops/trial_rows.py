"""A study's trials as plain rows, one dict per trial: what `tuner best` lists, and what
the trials frame of `tuner report` and the run summary is made of (tuner.ops.analysis
builds its DataFrame from these rows). No pandas here: `tuner best` answers from the
rows without loading it (0.4-0.7 s of start-up; tests/cli/test_command_imports.py).

A row holds: number, state, value, feasible, violation (largest constraint value, <= 0
when feasible), variant (baseline / shortlist name), cache_hit, fail_reason,
early_stop, gates_moved (which constraint moved a solved gate off its value as found),
duration_s, then ``constraint:<name>``, ``param:<config key>`` (the config assignment
under tuner.config.flatten's keys, not Optuna's internal parameters) and one key per
report metric. A key a trial has no value for is absent from its row (a frame's NaN).

The selections (the feasible trials best first, the infeasible least violating first,
the baseline) are the ones the frame's functions make: both go through the same
orderings here, and the one feasibility rule and ranking of tuner.study.feasibility.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence, Sized
from dataclasses import dataclass
from typing import Any, TypeVar

from tuner.config.flatten import flatten
from tuner.config.space.kind import is_coordinate
from tuner.errors import StudyError
from tuner.ops.verdicts import CONSTRAINT_PREFIX, JUDGED, parse_constraint
from tuner.study import feasibility
from tuner.study.trial.attrs import (
    ATTR_CACHE_HIT,
    ATTR_DURATION,
    ATTR_EARLY_STOP,
    ATTR_FAIL_REASON,
    ATTR_GATES_MOVED,
    ATTR_JUDGED,
    ATTR_PHASES,
    ATTR_VARIANT,
    assignment_of,
    metrics_of,
    named_constraints,
    trial_attr,
)
from tuner.study.trial.outcome import trial_seconds

PARAM_PREFIX = "param:"
BASELINE = "baseline"  # the variant of the trial that measured the config as found

K = TypeVar("K")
Row = dict[str, Any]


def trial_row(t: Any) -> Row:
    """The row of one trial (an Optuna FrozenTrial or anything with the same attributes).
    A constraint's metric and Judged@10 missing from the metrics record are taken from
    the user attributes of the same name (the scalars the trial also keeps)."""
    attrs = dict(t.user_attrs)
    constraints = named_constraints(t.constraints)
    state = t.state.name if hasattr(t.state, "name") else str(t.state)
    value = t.values[0] if getattr(t, "values", None) else None
    row: Row = {
        "number": t.number,
        "state": state,
        "value": value,
        "feasible": feasibility.feasible(state, constraints.values()),
        "violation": worst_violation(constraints.values()),
        "variant": attrs.get(ATTR_VARIANT, ""),
        "cache_hit": bool(attrs.get(ATTR_CACHE_HIT, False)),
        "fail_reason": attrs.get(ATTR_FAIL_REASON, ""),
        "early_stop": attrs.get(ATTR_EARLY_STOP, ""),
        "gates_moved": trial_attr(t, ATTR_GATES_MOVED) or "",
        "duration_s": trial_duration(t),
    }
    row.update({CONSTRAINT_PREFIX + k: v for k, v in constraints.items()})
    # without its assignment record (an older trial): its params, the samplers' coordinates left out
    assignment = assignment_of(t) or {k: v for k, v in t.params.items() if not is_coordinate(k)}
    row.update({PARAM_PREFIX + k: v for k, v in flatten(assignment).items()})
    row.update(metrics_of(t))
    fallbacks = {c.metric: c.metric for c in map(parse_constraint, constraints) if c} | {JUDGED: ATTR_JUDGED}
    row.update({col: attrs[attr] for col, attr in fallbacks.items() if col not in row and attr in attrs})
    return row


@dataclass(frozen=True)
class TrialRows:
    """The trials' rows by trial number, and every key any row has, in the order they
    were first met (a trials frame's column order)."""

    rows: list[Row]
    columns: list[str]


def trial_rows(trials: Iterable[Any]) -> TrialRows:
    """`trial_row` of each trial, sorted by number."""
    rows = [trial_row(t) for t in trials]
    return TrialRows(sorted(rows, key=lambda r: r["number"]), columns_of(rows))


def columns_of(rows: Iterable[Mapping[str, Any]]) -> list[str]:
    """Every key of ``rows``, in the order first met."""
    return list(dict.fromkeys(k for row in rows for k in row))


def trial_duration(t: Any) -> float:
    """The trial's duration as the run printed it (tuner.study.trial.outcome.trial_seconds): its
    ``duration_s`` attribute, else (a study recorded before it) the sum of its phase
    record; never Optuna's start-to-complete span, which in the pipelined loop covers
    the neighbouring trials too. NaN for a trial with neither (running, or waiting)."""
    attrs = getattr(t, "user_attrs", None) or {}
    if isinstance(attrs.get(ATTR_DURATION), (int, float)):
        return float(attrs[ATTR_DURATION])
    phases = trial_attr(t, ATTR_PHASES)
    return trial_seconds(phases) if isinstance(phases, Mapping) and phases else math.nan


def worst_violation(constraints: Iterable[float]) -> float:
    """The largest constraint value (<= 0 when feasible); a NaN one counts as +inf, as
    it breaks the trial (tuner.study.feasibility); NaN without constraints."""
    values = [math.inf if math.isnan(v) else float(v) for v in constraints]
    return max(values) if values else math.nan


def require_trials(trials: Sized, study_name: str) -> None:
    """StudyError while the study has no trials (``trials``: rows or a frame)."""
    if len(trials) == 0:
        raise StudyError(f"study {study_name!r} has no trials yet; run `tuner run EXPERIMENT` first")


# ---------------------------------------------------------------- selections


def ranked_keys(entries: Iterable[tuple[K, int, Any, Any]], *, maximize: bool) -> list[K]:
    """The keys of the feasible entries with a value, best first; an entry is (key,
    number, value, feasible) (tuner.study.feasibility.rank_key: ties to the lower number)."""
    found = [
        ((feasibility.rank_key(value, number, maximize=maximize), i), key)
        for i, (key, number, value, ok) in enumerate(entries)
        if ok and feasibility.rankable(value)
    ]
    return [key for _, key in sorted(found, key=lambda f: f[0])]


def infeasible_keys(entries: Iterable[tuple[K, int, str, Any, float]]) -> list[K]:
    """The keys of the COMPLETE entries that break a constraint, least violating first
    (then by number); an entry is (key, number, state, feasible, violation)."""
    found = [
        ((math.isnan(violation), 0.0 if math.isnan(violation) else violation, number, i), key)
        for i, (key, number, state, ok, violation) in enumerate(entries)
        if state == "COMPLETE" and not bool(ok)
    ]  # a NaN violation (none: a broken constraint counts as +inf) would sort last, as in pandas
    return [key for _, key in sorted(found, key=lambda f: f[0])]


def is_baseline(variant: Any, state: Any) -> bool:
    """The baseline trial (the config as found) that completed."""
    return variant == BASELINE and state == "COMPLETE"


def feasible_ranked(rows: Sequence[Mapping[str, Any]], *, maximize: bool = True) -> list[Mapping[str, Any]]:
    """The feasible rows with a value, best first (`ranked_keys`)."""
    entries = ((i, r["number"], r.get("value"), r["feasible"]) for i, r in enumerate(rows))
    return [rows[i] for i in ranked_keys(entries, maximize=maximize)]


def infeasible(rows: Sequence[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    """COMPLETE rows that break a constraint, least violating first (`infeasible_keys`)."""
    entries = ((i, r["number"], r["state"], r["feasible"], r["violation"]) for i, r in enumerate(rows))
    return [rows[i] for i in infeasible_keys(entries)]


def baseline(rows: Sequence[Mapping[str, Any]]) -> Mapping[str, Any] | None:
    """The first completed baseline row, when the study ran one."""
    return next((r for r in rows if is_baseline(r.get("variant"), r["state"])), None)
