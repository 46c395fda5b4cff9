"""Post-retrieval gates solved from one retrieval instead of sampled by the study.

A gate has a *role*, whatever its config key (``gate:`` in the search space,
tuner.config.space): a ``confidence`` gate hands off when the response's confidence < t (the
reference backend's ``confidence.threshold``, another backend's ``rag.min_confidence``),
a ``min_score`` gate drops results scoring below m (``citation.min_score``). Neither
changes what the backend retrieves, only what it shows. The backend returns its
results and confidence even when it hands off, so one batch evaluation per trial is
enough to know what *every* (t, m) would have scored: this module evaluates the whole
grid client-side, picks the best pair that meets the constraints, and returns the
sweep table. The sampler then searches only the retrieval parameters, which is why a
study reaches the same best in fewer trials (bench/threshold_bench.py).

Gate model (the reference backend's, and the usual one):

- a query is *answered* when its confidence >= t and at least one result scores
  >= m (an emptied result list is handed off); a failed query counts against the
  backend (in scope: 0; OOS: answered), as in ``tuner.evaluation.result``;
- the shown ranking is the retrieved hits with score >= m, in the returned order;
- an answered in-scope query scores its metrics on that ranking, a handed-off one 0.

Exactness: the retrieval must be made with ``min_score`` at or below the lowest
candidate (results already dropped cannot be brought back; ``solve`` checks this).
Two backend behaviours the client cannot see are approximated, and the sweep table
counts the queries concerned (``n_emptied``, ``n_below_top_m``): a backend that falls
back to a wider date window when the filter empties a list, and a confidence that is
computed over the filtered hits when fewer than ``top_m`` survive the filter.

The sweep table names its gate columns by the gates' config keys, so a trial's
threshold_sweep.csv says what was solved; ``ThresholdSolution.by_role`` gives the chosen
values by role to the code that applies them (tuner.evaluation.regate).

The grid is evaluated on the retrieval as arrays (tuner.study.gates.gate_arrays: every hit graded
once, every (threshold, min_score) pair counted and scored by array operations), with
the same arithmetic as scoring each gated batch on its own, so every value is exact.

Candidate values: the grid ``low, low+step, ..., high`` of each gate (the search
space's step, else ``resolution``), plus the gate's value as found in the config
(``GateRange.found``) when it lies in the range. Outcomes are step functions of t and
m, so a fine grid covers the whole range. Which row of the grid is taken is
tuner.study.gates.gate_choice's rule: a gate that does not change the objective and that no
constraint needs keeps its value as found (else, among exact ties, the value that cuts
least); where a constraint needs it, the middle of the feasible tied plateau, and
``ThresholdSolution.moved`` says which constraint moved which gate, from what to what.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from tuner import metrics as scorecard
from tuner.config.objective import Constraint
from tuner.config.space.gates import GATE_ROLES, REFERENCE_GATES
from tuner.errors import ConfigError
from tuner.study.gates.gate_arrays import (
    HitArrays,
    bound_columns,
    bound_columns_stacked,
    hits_shown,
    scorecard_values,
    sweep_columns,
)
from tuner.study.gates.gate_choice import choose_gates

if TYPE_CHECKING:
    from tuner.evaluation.result import BatchResult

CONFIDENCE, MIN_SCORE = GATE_ROLES  # the roles (tuner.config.space.gates.GATE_ROLES)
# The reference backend's keys of those roles (a GateRange on them needs no role).
CONFIDENCE_PARAM = "confidence.threshold"
MIN_SCORE_PARAM = "citation.min_score"
#: the response field each role reads (tuner.evaluation.spec.ResponseMapping)
RESPONSE_FIELD = {CONFIDENCE: "confidence", MIN_SCORE: "score"}
_EPS = 1e-9  # the reference backend keeps scores equal to min_score up to rounding


@dataclass(frozen=True)
class GateRange:
    """One post-retrieval parameter (``param``: its config key), its role and the values
    to try. ``role`` "" takes the reference key's role; any other key must name one.
    ``found``: its value as found in the config (the study's baseline), which it keeps
    unless the objective or a constraint asks for another (tuner.study.gates.gate_choice)."""

    param: str
    low: float
    high: float
    step: float | None = None
    role: str = ""
    found: float | None = None

    def __post_init__(self) -> None:
        role = self.role or REFERENCE_GATES.get(self.param, "")
        if role not in GATE_ROLES:
            raise ConfigError(
                f"{self.param}: post-retrieval gate with role {self.role!r} cannot be solved client-side; "
                f"give it one of the roles {list(GATE_ROLES)} (gate: confidence or gate: min_score in the space)"
            )
        object.__setattr__(self, "role", role)

    def values(self, resolution: float) -> np.ndarray:
        if not (math.isfinite(self.low) and math.isfinite(self.high)) or self.high < self.low:
            raise ConfigError(f"{self.param}: post-retrieval range [{self.low}, {self.high}] is empty; set low <= high")
        step = self.step or resolution
        n = math.floor((self.high - self.low) / step + 1e-9) + 1
        grid = self.low + step * np.arange(n)
        decimals = max(0, -math.floor(math.log10(step))) + 3
        ends = [self.high]
        if self.found is not None and self.low <= self.found <= self.high:
            ends.append(self.found)  # off the step grid too: the value kept must be a candidate
        return np.unique(np.round(np.append(grid, ends), decimals))


@dataclass(frozen=True)
class QueryRetrieval:
    """What one query's retrieval returned (hits as (doc_id, score), best first)."""

    query_id: str
    scope: str
    confidence: float | None
    hits: tuple[tuple[str, float], ...]
    failed: bool = False
    #: the backend handed it off at retrieval (stands when the confidence gate is not solved)
    handoff: bool = False


@dataclass(frozen=True)
class Retrieval:
    """One batch's retrievals plus the labels of its queries and the gate settings it ran with."""

    queries: tuple[QueryRetrieval, ...]
    qrels: Mapping[str, Mapping[str, int]]
    retrieved_min_score: float = 0.0
    top_m: int | None = None
    gains: str = "linear"

    @classmethod
    def from_batch(cls, batch: BatchResult, *, retrieved_min_score: float = 0.0, top_m: int | None = None) -> Retrieval:
        pq = batch.per_query
        at = {qid: i for i, qid in enumerate(pq.index)}
        confs, status, answered = pq["confidence"].tolist(), pq["status"].tolist(), pq["answered"].tolist()
        rows = []
        for q in batch.queries:
            i = at[q.query_id]
            conf = confs[i]
            hits = tuple((h.doc_id, math.nan if h.score is None else float(h.score)) for h in batch.hits[q.query_id])
            failed = status[i] == "failed"
            rows.append(
                QueryRetrieval(
                    q.query_id,
                    q.scope,
                    None if pd.isna(conf) else float(conf),
                    hits,
                    failed=failed,
                    handoff=not failed and not bool(answered[i]),
                )
            )
        return cls(tuple(rows), batch.qrels, retrieved_min_score, top_m, batch.gains)


@dataclass
class ThresholdSolution:
    """The chosen gate values, what they score, and the whole sweep."""

    values: dict[str, float]  # by the gates' config keys
    objective: float
    metrics: dict[str, float]
    violation: float
    feasible: bool
    table: pd.DataFrame = field(repr=False)
    by_role: dict[str, float] = field(default_factory=dict)  # the same values by role
    #: which constraint moved which gate away from the value it would keep, from what to
    #: what (one line); "" when no constraint needed a gate
    moved: str = ""


def solve(
    retrieval: Retrieval,
    gates: Sequence[GateRange],
    *,
    objective: str = scorecard.PRIMARY_METRIC,
    constraints: Sequence[Constraint] = (),
    resolution: float = 0.01,
) -> ThresholdSolution:
    """Evaluate every grid point of ``gates`` on ``retrieval`` and pick the best feasible one.

    ``gates`` holds at most one gate per role (a role not given keeps the value the
    retrieval ran with: no confidence gate, no extra score filter). When no grid point
    is feasible, the one with the smallest violation wins and ``feasible`` is False, so
    the trial still reports an honest constraint value.
    """
    return _solve(
        HitArrays.from_retrieval(retrieval),
        gates,
        objective,
        constraints,
        resolution,
        retrieval.retrieved_min_score,
        retrieval.top_m,
    )


def _solve(
    arrays: HitArrays,
    gates: Sequence[GateRange],
    objective: str,
    constraints: Sequence[Constraint],
    resolution: float,
    retrieved_min_score: float,
    top_m: int | None,
    full: bool = True,
) -> ThresholdSolution:
    by_role = _by_role(gates)
    conf, cut = by_role.get(CONFIDENCE), by_role.get(MIN_SCORE)
    ts = conf.values(resolution) if conf else np.array([-math.inf])
    # Without a min_score gate nothing is filtered (-inf keeps every hit, scored or not).
    ms = cut.values(resolution) if cut else np.array([-math.inf])
    if cut is not None:
        _check_cut(arrays, retrieved_min_score, cut, float(ms.min()))
    # An unsolved confidence gate ran in the backend at its own value: its handoffs stand.
    backend_handoff = conf is None
    names = (conf.param if conf else None, cut.param if cut else None)
    columns = sweep_columns(arrays, ts, ms, objective, backend_handoff, names, top_m)
    columns["violation"] = _violations(columns, constraints)
    solved = [g for g in (conf, cut) if g is not None]
    choice = choose_gates(
        np.asarray(columns[objective], dtype=float),
        columns["violation"],
        {g.param: columns[g.param] for g in solved},
        {g.param: g.found for g in solved},
        shown=lambda rows: hits_shown(arrays, ts, ms, backend_handoff, rows),
    )
    best = choice.row
    value = {c: float(v[best]) for c, v in columns.items()}  # what table.loc[best] holds
    t = value[conf.param] if conf else -math.inf
    m = value[cut.param] if cut else -math.inf
    chosen = {g.role: (t if g.role == CONFIDENCE else m) for g in gates}
    metric_cols = [c for c in columns if c not in names and c != "violation"]
    # The whole scorecard at the chosen pair, so a trial's NDCG@20 etc. match its objective
    # (the batch's own are those of the ungated retrieval); not ``full``: the sweep's columns only.
    card = scorecard_values(arrays, t, m, backend_handoff=backend_handoff) if full else {}
    return ThresholdSolution(
        values={g.param: chosen[g.role] for g in gates},
        objective=value[objective],
        metrics=card | {c: value[c] for c in metric_cols},
        violation=value["violation"],
        feasible=bool(value["violation"] <= 0),
        table=pd.DataFrame(columns) if full else pd.DataFrame(),
        by_role=chosen,
        moved=moved_note(columns, solved, constraints, choice.kept_row, best) if choice.needed else "",
    )


def moved_note(
    columns: Mapping[str, np.ndarray],
    gates: Sequence[GateRange],
    constraints: Sequence[Constraint],
    kept: int,
    chosen: int,
) -> str:
    """One line: the constraints broken at the ``kept`` row of the sweep and the gates they
    moved to the ``chosen`` one, e.g. ``OOS_FP_Rate <= 0.1 moved confidence.threshold 0 ->
    0.25 (+0.25): at the value as found, OOS_FP_Rate = 0.4``."""
    at_kept = {c: v[kept : kept + 1] for c, v in columns.items()}
    broken, shown = [], []
    for c in constraints:
        if _violations(at_kept, [c])[0] > 0:
            broken.append(str(getattr(c, "name", None) or type(c).__name__))
            bound = _metric_bound(c)
            metric = bound.metric if bound is not None else getattr(c, "metric", None)
            if metric is not None and metric in columns:
                shown.append(f"{metric} = {float(columns[metric][kept]):.4g}")
    moves, as_found = [], True
    for g in gates:
        a, b = float(columns[g.param][kept]), float(columns[g.param][chosen])
        if not math.isclose(a, b, rel_tol=0, abs_tol=1e-9):
            moves.append(f"{g.param} {a:g} -> {b:g} ({b - a:+g})")
            as_found &= g.found is not None and math.isclose(a, g.found, rel_tol=0, abs_tol=1e-9)
    if not moves:
        return ""
    where = "the value as found" if as_found else "the least-cutting tied value"
    return f"{' and '.join(broken) or 'the constraints'} moved {' and '.join(moves)}" + (
        f": at {where}, {', '.join(shown)}" if shown else f" (broken at {where})"
    )


def _by_role(gates: Sequence[GateRange]) -> dict[str, GateRange]:
    """The gates by role; one per role and one per key (both name a sweep column)."""
    out: dict[str, GateRange] = {}
    for g in gates:
        if g.role in out:
            raise ConfigError(f"{g.param}: a second {g.role} gate (after {out[g.role].param}); solve one gate per role")
        out[g.role] = g
    if len({g.param for g in gates}) < len(gates):
        raise ConfigError(f"gates {[g.param for g in gates]} repeat a key; give each gate its own key")
    return out


def _check_cut(arrays: HitArrays, retrieved_min_score: float, cut: GateRange, lowest: float) -> None:
    """A score cut-off is exact only over scored hits retrieved at or below its lowest value."""
    hits = arrays.hits
    if (unscored := np.flatnonzero(np.isnan(hits.scores))).size:
        query = np.searchsorted(hits.starts + hits.counts, unscored[0], side="right")
        raise ConfigError(
            f"{cut.param}: query {arrays.query_ids[query]} has hits without a score, so a score filter cannot be "
            "evaluated; map response.score to the field the backend filters on"
        )
    if lowest < retrieved_min_score - _EPS:
        raise ConfigError(
            f"{cut.param}: the retrieval ran with min_score={retrieved_min_score:g}, so values "
            f"down to {lowest:g} cannot be evaluated; retrieve with min_score at the range's low end"
        )


def sweep(
    retrieval: Retrieval,
    thresholds: np.ndarray,
    min_scores: np.ndarray,
    *,
    objective: str,
    backend_handoff: bool = False,
    names: tuple[str | None, str | None] = (CONFIDENCE, MIN_SCORE),
) -> pd.DataFrame:
    """One row per (threshold, min_score): the objective (in-scope mean), the OOS metrics,
    and the counts that flag approximations. ``backend_handoff``: a query the backend
    handed off stays handed off (the confidence gate is not being solved). ``names``:
    the columns of the threshold and the min_score (the gates' keys); None leaves a gate
    that is not being solved out of the table."""
    return pd.DataFrame(
        sweep_columns(
            HitArrays.from_retrieval(retrieval),
            thresholds,
            min_scores,
            objective,
            backend_handoff,
            names,
            retrieval.top_m,
        )
    )


def scorecard_at(
    retrieval: Retrieval,
    threshold: float,
    min_score: float,
    *,
    backend_handoff: bool = False,
) -> dict[str, float]:
    """Mean of every scorecard metric over the in-scope queries with the gates at
    (threshold, min_score): a handed-off, emptied or failed query scores 0
    (``backend_handoff`` as in ``sweep``)."""
    return scorecard_values(HitArrays.from_retrieval(retrieval), threshold, min_score, backend_handoff=backend_handoff)


def _violations(columns: Mapping[str, np.ndarray], constraints: Sequence[Constraint]) -> np.ndarray:
    """Per row of the sweep (``columns``), the largest violation of ``constraints`` (<= 0
    feasible). A constraint (tuner.config.objective.Constraint) is taken on whole columns
    with its own arithmetic; one whose ``violation`` is another (a subclass, a test's
    stand-in) is called per row, on the row as a dict."""
    n = len(next(iter(columns.values())))
    if not constraints:
        return np.zeros(n)
    bounds = [b for c in constraints if (b := _metric_bound(c)) is not None]
    if len(bounds) < len(constraints):
        rows = zip(*(v.tolist() for v in columns.values()), strict=True)
        records = [dict(zip(columns, row, strict=True)) for row in rows]
        return np.array([max(c.violation(r) for c in constraints) for r in records])
    out: np.ndarray | None = None
    for b in bounds:
        if b.metric not in columns:
            b.violation(dict.fromkeys(columns, 0.0))  # raises its ConfigError naming the columns
        values = np.asarray(columns[b.metric], dtype=np.float64)
        v = np.where(np.isnan(values), math.inf, values - b.bound if b.op == "<=" else b.bound - values)
        out = v if out is None else np.where(v > out, v, out)  # max(): the first of equals
    return out if out is not None else np.zeros(n)


def _metric_bound(constraint: Any) -> Constraint | None:
    """The constraint when its ``violation`` is Constraint's own ``metric op bound``
    arithmetic (so it can be taken on whole columns), else None."""
    return constraint if type(constraint) is Constraint else None


def _pick(
    table: pd.DataFrame, objective: str, found: Mapping[str, float | None] | None = None, gates: Sequence[str] = ()
) -> int:
    """The row of a sweep table the solver takes (tuner.study.gates.gate_choice.choose_gates on its
    columns): ``gates`` the gate columns (default: those ``found`` names, else the columns
    before the objective), ``found`` their values as found. Without the retrieval, a tie
    that the gates' values cannot break goes to the first row."""
    names = (
        list(gates)
        or [n for n in (found or {}) if n in table.columns]
        or list(table.columns[: list(table.columns).index(objective)])
    )
    return choose_gates(
        table[objective].to_numpy(dtype=float),
        table["violation"].to_numpy(dtype=float),
        {n: table[n].to_numpy(dtype=float) for n in names},
        dict(found or {}),
    ).row


# --------------------------------------------------------------------------- study wiring


def solvable_gates(space: Any) -> list[GateRange]:
    """The post-retrieval params of a search space (tuner.config.space.searchspace.SearchSpace) as gate
    ranges, in sorted name order. The space has checked that each is a float with a
    role, one per role (tuner.config.space: gate:)."""
    gates = []
    for name in sorted(space.post_retrieval):
        p = space[name]
        gates.append(GateRange(p.path, p.spec.low, p.spec.high, p.spec.step, role=p.gate))
    return gates


def with_found(gates: Mapping[str, GateRange], config: Mapping[str, Any]) -> dict[str, GateRange]:
    """``gates`` (param name -> range) with each one's value as found: the number ``config``
    (param name -> value: the study's baseline, tuner.study.storage.study_storage.ATTR_CONFIG_SEEN, or the
    config now) holds for it; a gate it does not hold keeps none."""
    out = {}
    for name, g in gates.items():
        value = config.get(name)
        ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
        out[name] = replace(g, found=float(value) if ok and value is not None else None)
    return out


def check_gate_mapping(gates: Iterable[GateRange], response: Any, *, where: str = "") -> None:
    """ConfigError when a gate's role reads a response field that ``response`` (the
    experiment's evaluation.response, tuner.evaluation.spec.ResponseMapping) leaves
    unmapped: without confidences every query would be handed off, without scores
    nothing can be cut. ``where`` prefixes the message (the experiment file)."""
    for g in gates:
        name = RESPONSE_FIELD[g.role]
        if getattr(response, name, None) is None:
            raise ConfigError(
                f"{where}{g.param}: gate: {g.role} reads the response's {name}, but evaluation.response.{name} "
                f"is not mapped; set it to the response field holding the {name} (or drop the gate)"
            )


def retrieval_values(gates: Sequence[GateRange]) -> dict[str, float]:
    """The values to write for the retrieval itself: every gate at the low end of its
    range (the backend still returns results and confidence when it hands off, and a
    score filter at its lowest drops nothing that another candidate would keep)."""
    return {g.param: g.low for g in gates}


def solve_arrays(
    arrays: HitArrays,
    gates: Sequence[GateRange],
    *,
    objective: str = scorecard.PRIMARY_METRIC,
    constraints: Sequence[Constraint] = (),
    retrieved_min_score: float = 0.0,
    top_m: int | None = None,
    full: bool = True,
) -> ThresholdSolution:
    """``solve`` on a retrieval already in arrays (tuner.study.gates.gate_arrays.HitArrays). With
    no gates, the one row is the retrieval as the backend gated it. Not ``full``: the
    metrics are the sweep's columns only (objective, OOS rates, counts) and the table is
    empty (a search over thousands of retrievals needs no more)."""
    return _solve(arrays, gates, objective, constraints, 0.01, retrieved_min_score, top_m, full)


@dataclass(frozen=True)
class GateBound:
    """What ``solve_arrays`` would find, bounded at a fraction of its cost: whether some
    grid point meets the constraints (exact), and an upper bound on the best objective
    among those points (``-inf`` when none does)."""

    feasible: bool
    upper: float


@dataclass(frozen=True)
class _BoundGrid:
    """What ``bound_arrays`` and ``bound_stacked`` share: the gates' grids and config keys,
    and the metrics the constraints read."""

    conf: GateRange | None
    cut: GateRange | None
    ts: np.ndarray
    ms: np.ndarray
    names: tuple[str | None, str | None]
    wanted: frozenset[str]


def _bound_grid(gates: Sequence[GateRange], constraints: Sequence[Constraint], objective: str) -> _BoundGrid | None:
    """None when no bound holds: a constraint reads the objective or is not a plain
    ``metric op bound``."""
    bounds = [_metric_bound(c) for c in constraints]
    if any(b is None or b.metric == objective for b in bounds):
        return None
    by_role = _by_role(gates)
    conf, cut = by_role.get(CONFIDENCE), by_role.get(MIN_SCORE)
    ts = conf.values(0.01) if conf else np.array([-math.inf])
    ms = cut.values(0.01) if cut else np.array([-math.inf])
    names = (conf.param if conf else None, cut.param if cut else None)
    return _BoundGrid(conf, cut, ts, ms, names, frozenset(b.metric for b in bounds if b is not None))


def _gate_bound(feasible: np.ndarray, objective_values: np.ndarray) -> GateBound | None:
    """The bound of one setting from its grid's feasibility and objective upper bounds
    (None: an upper bound is unknown)."""
    upper = objective_values[feasible]
    if np.isnan(upper).any():
        return None
    return GateBound(bool(feasible.any()), float(np.max(upper)) if upper.size else -math.inf)


def bound_arrays(
    arrays: HitArrays,
    gates: Sequence[GateRange],
    *,
    objective: str = scorecard.PRIMARY_METRIC,
    constraints: Sequence[Constraint] = (),
    retrieved_min_score: float = 0.0,
    top_m: int | None = None,
) -> GateBound | None:
    """A ``GateBound`` of ``solve_arrays`` with the same arguments, from
    ``tuner.study.gates.gate_arrays.bound_columns`` (every column but the objective exact, so the
    feasibility is); None when no bound holds: the objective gains from a shorter ranking,
    a list's scores rise somewhere, or a constraint reads the objective or is not a plain
    ``metric op bound``."""
    grid = _bound_grid(gates, constraints, objective)
    if grid is None:
        return None
    if grid.cut is not None:
        _check_cut(arrays, retrieved_min_score, grid.cut, float(grid.ms.min()))
    columns = bound_columns(arrays, grid.ts, grid.ms, objective, grid.conf is None, grid.names, top_m)
    if columns is None:
        return None
    feasible = _violations(columns, constraints) <= 0
    return _gate_bound(feasible, np.asarray(columns[objective], dtype=float))


def bound_stacked(
    stack: Any,
    is_oos: np.ndarray,
    failed: np.ndarray,
    label_counts: np.ndarray,
    gains: str,
    gates: Sequence[GateRange],
    *,
    objective: str = scorecard.PRIMARY_METRIC,
    constraints: Sequence[Constraint] = (),
    retrieved_min_score: float = 0.0,
    top_m: int | None = None,
) -> list[GateBound | None] | None:
    """``bound_arrays`` of each setting of ``stack`` (tuner.evaluation.replay_batch.Stacked),
    in order, from one ``bound_columns_stacked``: the same bounds, a fraction of the cost of
    bounding each setting on its own. None where the stacked columns do not apply (a metric
    reading whole rankings, an unscored hit): bound each setting with ``bound_arrays``."""
    grid = _bound_grid(gates, constraints, objective)
    if grid is None:
        return [None] * stack.n
    if np.isnan(stack.scores).any():
        return None
    if grid.cut is not None and float(grid.ms.min()) < retrieved_min_score - _EPS:
        return None  # bound_arrays says why (ConfigError)
    columns = bound_columns_stacked(
        stack,
        is_oos,
        failed,
        label_counts,
        gains,
        grid.ts,
        grid.ms,
        objective,
        grid.conf is None,
        grid.names,
        top_m,
        grid.wanted,
    )
    if columns is None:
        return None
    feasible = (_violations(columns, constraints) <= 0).reshape(stack.n, -1)
    objective_col = np.asarray(columns[objective], dtype=float).reshape(stack.n, -1)
    return [_gate_bound(ok, values) for ok, values in zip(feasible, objective_col, strict=True)]


def solve_batch(
    batch: BatchResult,
    gates: Sequence[GateRange],
    *,
    objective: str = scorecard.PRIMARY_METRIC,
    constraints: Sequence[Constraint] = (),
    top_m: int | None = None,
) -> ThresholdSolution:
    """``solve`` on a batch retrieved with ``retrieval_values(gates)``."""
    low = next((g.low for g in gates if g.role == MIN_SCORE), 0.0)
    return _solve(HitArrays.from_batch(batch), gates, objective, constraints, 0.01, low, top_m)
