"""Every trial's per-query scores, kept compact on the study, so a finished (or running)
study can be cross-validated (tuner.study.crossval) without reading a report file.

What is kept, per COMPLETE measured trial, in the trial record ``tuner.per_query``
(a system attribute: optuna-dashboard does not show it):

- ``q``: a 12-hex digest of the query list the values are laid out on;
- ``objective``: the objective's value per in-scope query (rounded to 5 decimals), in
  query-set order;
- ``oos_answered``: one character per OOS query, ``1`` answered, ``0`` handed off (the
  OOS_FP_Rate of any subset is the share of ``1``);
- ``metrics``: per constraint metric that is a mean over in-scope queries (a ranking
  metric, Judged@k), its per-query values. A constraint on anything else (a latency
  percentile) has no per-query values: the cross-validation keeps the trial's whole-set
  verdict for it.

About 8 bytes per in-scope query and 1 per OOS query (measured: 1.4 kB a trial on the
demo's 174 tuned in-scope and 32 OOS queries, 1.9 kB on Cranfield's 225 and 20). The query
list itself (id, query_type, scope: 6-7 kB on those two) is stored once on the study, in
the system attribute ``tuner.queries.<digest>``.

A replay trial adds ``settings``: the (at most 20, tuner.study.trial.replay_measure.CV_SETTINGS)
best fusion settings it scored exactly, each with its objective per in-scope query and OOS
answers at its own solved gates, its largest violation and its ``params`` (the replayed
keys, a nested value flattened to ``key.sub``), each a candidate of its own.

A candidate's params (the robust pick's neighbourhood, tuner.study.crossval) are the
trial's recorded assignment (else its Optuna params), a setting's over its trial's; a
setting recorded without params is marked apart (its own neighbourhood).

A cache hit measured nothing: it reads the record of the trial it was copied from, when
that trial is in this study with the same assignment.
A trial without a record (an OOS early stop, a study from before records) is not a
candidate.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from tuner.config.objective import Constraint, Objective
from tuner.config.validation import CrossValConfig, Selection
from tuner.optuna_adapter import storage_of, study_id_of
from tuner.study.crossval import Candidate, CrossValResult, QueryInfo, compare_selection, select
from tuner.study.feasibility import best_feasible_trial, is_feasible
from tuner.study.trial.attrs import (
    ATTR_CACHED_FROM,
    ATTR_VARIANT,
    assignment_of,
    named_constraints,
    set_record,
    trial_attr,
)

ATTR_PER_QUERY = "per_query"  # the trial record (module doc)
QUERIES_PREFIX = "tuner.queries."  # + digest: the study's query list of a record
OOS_METRIC = "OOS_FP_Rate"
_DECIMALS = 5


def queries_of(per_query: Any) -> list[QueryInfo]:
    """The query list of a batch's per-query frame (index query_id)."""
    # tolist first: iterating an Arrow-backed column boxes every value (10x slower)
    columns = (per_query.index.tolist(), per_query["query_type"].tolist(), per_query["scope"].tolist())
    return [QueryInfo(str(qid), str(qtype), str(scope)) for qid, qtype, scope in zip(*columns, strict=True)]


def digest_of(queries: Sequence[QueryInfo]) -> str:
    text = json.dumps([list(q) for q in queries], separators=(",", ":"))
    return hashlib.blake2b(text.encode(), digest_size=6).hexdigest()


def build_record(
    per_query: Any,
    metrics: Mapping[str, float],
    objective: str,
    constraints: Sequence[Constraint],
    queries: Sequence[QueryInfo] | None = None,
) -> dict[str, Any] | None:
    """A batch's record (module doc); None when the objective is not a per-query column.
    ``queries``: `queries_of(per_query)`, when the caller has it already."""
    if objective not in per_query.columns:
        return None
    in_scope = (per_query["scope"] != "oos").to_numpy()
    record: dict[str, Any] = {
        "q": digest_of(queries if queries is not None else queries_of(per_query)),
        "objective": _rounded(per_query[objective].to_numpy(dtype=float)[in_scope]),
    }
    if (~in_scope).any():
        answered = per_query["answered"].to_numpy(dtype=bool)[~in_scope]
        record["oos_answered"] = "".join("1" if a else "0" for a in answered)
    extra = {}
    for c in constraints:
        if c.metric in (OOS_METRIC, objective) or c.metric not in per_query.columns:
            continue
        values = per_query[c.metric].to_numpy(dtype=float)[in_scope]
        whole = metrics.get(c.metric)
        # only a metric that is the mean of its column over in-scope queries splits by fold
        if whole is not None and values.size and math.isclose(float(np.nanmean(values)), float(whole), abs_tol=1e-6):
            extra[c.metric] = _rounded(values)
    if extra:
        record["metrics"] = extra
    return record


def settings_record(settings: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """A replay trial's scored settings (tuner.study.trial.replay_measure), rounded like the
    trial's own scores, for the record's ``settings``."""
    return [
        {
            "setting": str(s["setting"]),
            "violation": float(s["violation"]),
            "objective": _rounded(np.asarray(s["objective"], dtype=float)),
            "oos_answered": str(s["oos_answered"]),
            **({"params": flat_params(s["params"])} if s.get("params") else {}),
        }
        for s in settings
    ]


def flat_params(assignment: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """``assignment`` with nested mappings flattened to ``key.sub`` and lists to ``key.0``,
    ``key.1``.. (a list of numbers, e.g. fallback windows, stays numeric); any other value
    that is neither a number, a string nor a bool is kept as its text (a categorical value)."""
    out: dict[str, Any] = {}
    for key, value in assignment.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping):
            out.update(flat_params(value, prefix=f"{name}."))
        elif isinstance(value, list | tuple):
            out.update(flat_params({str(i): v for i, v in enumerate(value)}, prefix=f"{name}."))
        elif value is None or isinstance(value, bool | int | float | str):
            out[name] = value
        else:
            out[name] = str(value)
    return out


def save_record(trial: Any, record: dict[str, Any], queries: Sequence[QueryInfo], known: set[str]) -> None:
    """Store ``record`` on a running trial and, the first time this process sees its query
    list (``known``: the digests stored so far), the list on the study."""
    digest = record["q"]
    if digest not in known:
        study = trial.study
        storage_of(study).set_study_system_attr(study_id_of(study), QUERIES_PREFIX + digest, [list(q) for q in queries])
        known.add(digest)
    set_record(trial, ATTR_PER_QUERY, record)


@dataclass
class StudyScores:
    """What the cross-validation needs from a study: the query list, the candidates, the
    baseline, and notes on the trials left out."""

    queries: list[QueryInfo]
    candidates: list[Candidate]
    baseline: Candidate | None
    notes: list[str] = field(default_factory=list)


def study_scores(study: Any, objective: str, constraints: Sequence[Constraint]) -> StudyScores | None:
    """The study's recorded per-query scores (None when no trial has a record)."""
    attrs = storage_of(study).get_study_system_attrs(study_id_of(study))
    return scores_of(study.get_trials(deepcopy=False), attrs, objective=objective, constraints=constraints)


def scores_of(
    trials: Sequence[Any], study_attrs: Mapping[str, Any], *, objective: str, constraints: Sequence[Constraint]
) -> StudyScores | None:
    """`study_scores` of frozen trials and the study's system attributes."""
    by_number = {t.number: t for t in trials}
    complete = [t for t in trials if t.state.name == "COMPLETE"]
    records = {t.number: r for t in complete if (r := _record(t, by_number)) is not None}
    if not records:
        return None
    digest = records[max(records)]["q"]  # the query list of the latest trial
    listed = study_attrs.get(QUERIES_PREFIX + digest)
    if not listed:
        return None
    queries = [QueryInfo(*q) for q in listed]
    notes = []
    other = sum(r["q"] != digest for r in records.values())
    if other:
        notes.append(f"{other} trial(s) measured on another query set are left out")
    missing = len(complete) - len(records)
    if missing:
        notes.append(
            f"{missing} complete trial(s) without per-query scores (OOS early stops, copies of another "
            "study's trials, older trials) left out"
        )
    candidates, baseline = [], None
    for number in sorted(records):
        record = records[number]
        if record["q"] != digest:
            continue
        cand = _candidate(by_number[number], record, queries, constraints, objective)
        candidates.append(cand)
        settings = record.get("settings") or ()
        replayed = {key for s in settings for key in flat_params(s.get("params") or {})}
        candidates += [
            _setting(by_number[number], setting, queries, constraints, objective, replayed) for setting in settings
        ]
        if by_number[number].user_attrs.get(ATTR_VARIANT) == "baseline":
            baseline = cand
    return StudyScores(queries, candidates, baseline, notes)


def _record(trial: Any, by_number: Mapping[int, Any]) -> dict[str, Any] | None:
    """The trial's record; a cache hit's is that of the trial it was copied from, when that
    trial is in this study: the result cache is shared by a state dir's studies, so the
    number alone may name another study's trial (the same assignment says it is this one)."""
    record = trial_attr(trial, ATTR_PER_QUERY)
    if record is None and (source := trial.user_attrs.get(ATTR_CACHED_FROM)) is not None:
        origin = by_number.get(int(source))
        if origin is not None and _same_assignment(origin, trial):
            record = trial_attr(origin, ATTR_PER_QUERY)
    return record if isinstance(record, dict) and "q" in record else None


def _same_assignment(a: Any, b: Any) -> bool:
    return json.dumps(assignment_of(a), sort_keys=True, default=str) == json.dumps(
        assignment_of(b), sort_keys=True, default=str
    )


def _candidate(
    trial: Any,
    record: Mapping[str, Any],
    queries: Sequence[QueryInfo],
    constraints: Sequence[Constraint],
    record_objective: str,
) -> Candidate:
    in_scope = np.array([q.scope != "oos" for q in queries], dtype=bool)
    objective = _spread(record["objective"], in_scope)
    metrics: dict[str, np.ndarray] = {}
    if "oos_answered" in record:
        metrics[OOS_METRIC] = _spread([float(ch == "1") for ch in record["oos_answered"]], ~in_scope)
    if any(c.metric == record_objective for c in constraints):
        metrics[record_objective] = objective
    for name, values in (record.get("metrics") or {}).items():
        metrics[name] = _spread(values, in_scope)
    violations = named_constraints(trial.constraints)
    fixed = {c.name: violations.get(c.name, 0.0) for c in constraints if c.metric not in metrics}
    params = flat_params(assignment_of(trial) or dict(trial.params))
    return Candidate(trial.number, f"#{trial.number}", objective, metrics, fixed, params)


def _setting(
    trial: Any,
    setting: Mapping[str, Any],
    queries: Sequence[QueryInfo],
    constraints: Sequence[Constraint],
    objective: str,
    replayed: Iterable[str] = (),
) -> Candidate:
    """A replayed setting of ``trial`` as a candidate: its per-query objective and OOS
    answers; a constraint without per-query values takes the setting's largest violation
    (all the replay keeps of it, the stricter reading). Its params: the trial's without
    the ``replayed`` keys (any of the trial's settings sets them: a conditional key of the
    trial's own method must not stick to a setting of another), then the setting's own."""
    record = {"objective": setting["objective"]}
    if setting.get("oos_answered"):
        record["oos_answered"] = setting["oos_answered"]
    base = _candidate(trial, record, queries, constraints, objective)
    fixed = {name: float(setting["violation"]) for name in base.fixed}
    label = f"#{trial.number} replayed {setting['setting']}"
    own = setting.get("params")
    drop = set(replayed)
    kept = {k: v for k, v in base.params.items() if k not in drop}
    params = {**kept, **(flat_params(own) if own else {"replayed setting": label})}
    return Candidate(trial.number, label, base.objective, base.metrics, fixed, params)


def _spread(values: Iterable[float], where: np.ndarray) -> np.ndarray:
    out = np.full(where.shape, np.nan)
    out[where] = np.asarray(list(values), dtype=float)
    return out


def _rounded(values: np.ndarray) -> list[float]:
    rounded: list[float] = np.round(values, _DECIMALS).tolist()
    return rounded


def robust_trial(study: Any, objective: Objective, constraints: Sequence[Constraint]) -> Any:
    """The trial ``selection: robust`` deploys (`tuner apply`, `tuner validate` without
    --trial): the robust rule's pick on all queries among the feasible trials, their
    neighbourhoods counting the replayed settings too (a replayed setting itself is not a
    trial to apply). Without recorded per-query scores: the best feasible trial."""
    trials = study.get_trials(deepcopy=False)
    scores = study_scores(study, objective.metric, constraints)
    if scores is not None:
        by_number = {t.number: t for t in trials}
        eligible = [c.label == f"#{c.number}" and is_feasible(by_number[c.number]) for c in scores.candidates]
        index = select(
            scores.candidates, constraints, maximize=objective.maximize, selection="robust", eligible=eligible
        )
        if index is not None:
            return by_number[scores.candidates[index].number]
    return best_feasible_trial(trials, maximize=objective.maximize)


def trial_chooser(
    objective: Objective, constraints: Sequence[Constraint], selection: Selection
) -> Callable[[Any], Any] | None:
    """How `tuner.study.feasibility.pick_trial` chooses without --trial: None (the best
    feasible trial) for ``selection: best``, `robust_trial` for ``robust``."""
    if selection == "best":
        return None
    return lambda study: robust_trial(study, objective, constraints)


def study_crossval(
    study: Any,
    objective: Objective,
    constraints: Sequence[Constraint],
    cv: CrossValConfig,
    selection: Selection = "best",
) -> CrossValResult | None:
    """The cross-validated estimate of ``study`` from its recorded per-query scores
    (tuner.study.crossval) with the ``selection`` rule, and every rule's score beside it
    (``rules``); None before any trial has them."""
    scores = study_scores(study, objective.metric, constraints)
    if scores is None:
        return None
    result = compare_selection(
        scores.queries,
        scores.candidates,
        scores.baseline,
        constraints,
        objective=objective.metric,
        maximize=objective.maximize,
        folds=cv.folds,
        seed=cv.seed,
        confidence=cv.confidence,
        selection=selection,
    )
    if result is not None:
        result.notes += scores.notes
    return result
