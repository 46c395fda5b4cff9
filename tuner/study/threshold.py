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

Candidate values: the grid ``low, low+step, ..., high`` of each gate (the search
space's step, else ``resolution``). Outcomes are step functions of t and m, so a fine
grid covers the whole range; ties on the objective go to the lowest constraint
violation and then to the middle of the tied plateau, which keeps the chosen value
away from a breakpoint that the next batch of queries might cross.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np
import pandas as pd

from tuner import metrics as scorecard
from tuner.config.space.gates import GATE_ROLES, REFERENCE_GATES
from tuner.errors import ConfigError, EvaluationError
from tuner.evaluation import oos

if TYPE_CHECKING:
    from tuner.evaluation.result import BatchResult

CONFIDENCE, MIN_SCORE = GATE_ROLES  # the roles (tuner.config.space.gates.GATE_ROLES)
# The reference backend's keys of those roles (a GateRange on them needs no role).
CONFIDENCE_PARAM = "confidence.threshold"
MIN_SCORE_PARAM = "citation.min_score"
#: the response field each role reads (tuner.evaluation.spec.ResponseMapping)
RESPONSE_FIELD = {CONFIDENCE: "confidence", MIN_SCORE: "score"}
_EPS = 1e-9  # the reference backend keeps scores equal to min_score up to rounding


class ConstraintLike(Protocol):
    """Anything with ``violation(metrics) -> float`` (<= 0 feasible), e.g. experiment.Constraint."""

    def violation(self, metrics: Mapping[str, float]) -> float: ...


@dataclass(frozen=True)
class GateRange:
    """One post-retrieval parameter (``param``: its config key), its role and the values
    to try. ``role`` "" takes the reference key's role; any other key must name one."""

    param: str
    low: float
    high: float
    step: float | None = None
    role: str = ""

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
        n = int(math.floor((self.high - self.low) / step + 1e-9)) + 1
        grid = self.low + step * np.arange(n)
        decimals = max(0, -int(math.floor(math.log10(step)))) + 3
        return np.unique(np.round(np.append(grid, self.high), decimals))


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
        rows = []
        for q in batch.queries:
            rec = pq.loc[q.query_id]
            conf = rec["confidence"]
            hits = tuple((h.doc_id, math.nan if h.score is None else float(h.score)) for h in batch.hits[q.query_id])
            failed = rec["status"] == "failed"
            rows.append(QueryRetrieval(
                q.query_id, q.scope, None if pd.isna(conf) else float(conf), hits, failed=failed,
                handoff=not failed and not bool(rec["answered"]),
            ))
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


def solve(
    retrieval: Retrieval,
    gates: Sequence[GateRange],
    *,
    objective: str = scorecard.PRIMARY_METRIC,
    constraints: Sequence[ConstraintLike] = (),
    resolution: float = 0.01,
) -> ThresholdSolution:
    """Evaluate every grid point of ``gates`` on ``retrieval`` and pick the best feasible one.

    ``gates`` holds at most one gate per role (a role not given keeps the value the
    retrieval ran with: no confidence gate, no extra score filter). When no grid point
    is feasible, the one with the smallest violation wins and ``feasible`` is False, so
    the trial still reports an honest constraint value.
    """
    by_role = _by_role(gates)
    conf, cut = by_role.get(CONFIDENCE), by_role.get(MIN_SCORE)
    ts = conf.values(resolution) if conf else np.array([-math.inf])
    # Without a min_score gate nothing is filtered (-inf keeps every hit, scored or not).
    ms = cut.values(resolution) if cut else np.array([-math.inf])
    if cut is not None:
        _check_cut(retrieval, cut, float(ms.min()))
    # An unsolved confidence gate ran in the backend at its own value: its handoffs stand.
    backend_handoff = conf is None
    names = (conf.param if conf else None, cut.param if cut else None)
    table = sweep(retrieval, ts, ms, objective=objective, backend_handoff=backend_handoff, names=names)
    table["violation"] = _violations(table, constraints)
    row = table.loc[_pick(table, objective)]
    t = float(row[conf.param]) if conf else -math.inf
    m = float(row[cut.param]) if cut else -math.inf
    chosen = {g.role: (t if g.role == CONFIDENCE else m) for g in gates}
    metric_cols = [c for c in table.columns if c not in names and c != "violation"]
    # The whole scorecard at the chosen pair, so a trial's NDCG@20 etc. match its objective
    # (the batch's own are those of the ungated retrieval).
    card = scorecard_at(retrieval, t, m, backend_handoff=backend_handoff)
    return ThresholdSolution(
        values={g.param: chosen[g.role] for g in gates}, objective=float(row[objective]),
        metrics=card | {c: float(row[c]) for c in metric_cols},
        violation=float(row["violation"]), feasible=bool(row["violation"] <= 0), table=table, by_role=chosen,
    )


def _by_role(gates: Sequence[GateRange]) -> dict[str, GateRange]:
    """The gates by role; one per role and one per key (both name a sweep column)."""
    out: dict[str, GateRange] = {}
    for g in gates:
        if g.role in out:
            raise ConfigError(
                f"{g.param}: a second {g.role} gate (after {out[g.role].param}); solve one gate per role"
            )
        out[g.role] = g
    if len({g.param for g in gates}) < len(gates):
        raise ConfigError(f"gates {[g.param for g in gates]} repeat a key; give each gate its own key")
    return out


def _check_cut(retrieval: Retrieval, cut: GateRange, lowest: float) -> None:
    """A score cut-off is exact only over scored hits retrieved at or below its lowest value."""
    if unscored := [q.query_id for q in retrieval.queries if any(math.isnan(s) for _, s in q.hits)]:
        raise ConfigError(
            f"{cut.param}: query {unscored[0]} has hits without a score, so a score filter cannot be "
            "evaluated; map response.score to the field the backend filters on"
        )
    if lowest < retrieval.retrieved_min_score - _EPS:
        raise ConfigError(
            f"{cut.param}: the retrieval ran with min_score={retrieval.retrieved_min_score:g}, so values "
            f"down to {lowest:g} cannot be evaluated; retrieve with min_score at the range's low end"
        )


def sweep(
    retrieval: Retrieval, thresholds: np.ndarray, min_scores: np.ndarray, *, objective: str,
    backend_handoff: bool = False, names: tuple[str | None, str | None] = (CONFIDENCE, MIN_SCORE),
) -> pd.DataFrame:
    """One row per (threshold, min_score): the objective (in-scope mean), the OOS metrics,
    and the counts that flag approximations. ``backend_handoff``: a query the backend
    handed off stays handed off (the confidence gate is not being solved). ``names``:
    the columns of the threshold and the min_score (the gates' keys); None leaves a gate
    that is not being solved out of the table."""
    qs = retrieval.queries
    if not qs:
        raise EvaluationError("threshold sweep over an empty batch; evaluate at least one query")
    is_oos = np.array([q.scope == "oos" for q in qs])
    failed = np.array([q.failed for q in qs])
    conf = np.array([-math.inf if q.confidence is None else q.confidence for q in qs])
    kept = _kept_counts(qs, min_scores)                              # (M, Q)
    scores = _scores_by_cut(retrieval, min_scores, kept, objective)  # (M, Q), 0 for OOS
    t_grid, m_idx = np.meshgrid(thresholds, np.arange(len(min_scores)), indexing="ij")
    t_flat, m_flat = t_grid.ravel(), m_idx.ravel()
    conf_ok = conf[None, :] >= t_flat[:, None]                      # (T*M, Q)
    if backend_handoff:
        conf_ok &= ~np.array([q.handoff for q in qs])[None, :]
    answered = conf_ok & (kept[m_flat] > 0)
    answered = np.where(failed[None, :], is_oos[None, :], answered)
    value = np.where(answered, scores[m_flat], 0.0)
    ins = ~is_oos
    gate_cols = {n: v for n, v in zip(names, (t_flat, min_scores[m_flat]), strict=True) if n is not None}
    frame = pd.DataFrame({**gate_cols, objective: value[:, ins].mean(axis=1) if ins.any() else 0.0})
    for name, col in oos.oos_rates(is_oos, answered).items():
        frame[name] = col
    frame["n_answered"] = answered.sum(axis=1)
    frame["n_emptied"] = ((kept[m_flat] == 0) & np.array([len(q.hits) > 0 for q in qs])[None, :]).sum(axis=1)
    if retrieval.top_m is not None:
        frame["n_below_top_m"] = ((kept[m_flat] > 0) & (kept[m_flat] < retrieval.top_m)).sum(axis=1)
    return frame


def scorecard_at(
    retrieval: Retrieval, threshold: float, min_score: float, *, backend_handoff: bool = False,
) -> dict[str, float]:
    """Mean of every scorecard metric over the in-scope queries with the gates at
    (threshold, min_score): a handed-off, emptied or failed query scores 0
    (``backend_handoff`` as in ``sweep``)."""
    ins = [q for q in retrieval.queries if q.scope != "oos"]
    if not ins:
        return {}
    rankings: dict[str, list[str]] = {}
    for q in ins:
        ranking = [doc for doc, score in q.hits if math.isnan(score) or score >= min_score - _EPS]
        conf = -math.inf if q.confidence is None else q.confidence
        handed_off = conf < threshold or (backend_handoff and q.handoff)
        rankings[q.query_id] = [] if q.failed or handed_off else ranking
    ids = [q.query_id for q in ins]
    frame = scorecard.score_rankings(rankings, {i: dict(retrieval.qrels.get(i, {})) for i in ids}, ids,
                                     gains=retrieval.gains)
    return {str(c): float(frame[c].mean()) for c in frame.columns}


def _kept_counts(qs: Sequence[QueryRetrieval], min_scores: np.ndarray) -> np.ndarray:
    out = np.zeros((len(min_scores), len(qs)), dtype=np.int64)
    for j, q in enumerate(qs):
        s = np.nan_to_num(np.array([score for _, score in q.hits], dtype=float), nan=math.inf)
        if s.size:
            out[:, j] = (s[None, :] >= min_scores[:, None] - _EPS).sum(axis=1)
    return out


def _scores_by_cut(retrieval: Retrieval, min_scores: np.ndarray, kept: np.ndarray, objective: str) -> np.ndarray:
    """Per (min_score, query): the objective of the filtered ranking, each distinct
    (query, filtered list) scored once in one scorecard call.

    A higher cut keeps a subset of a lower one, so a query's filtered lists differ only
    in length: each is built once per distinct kept count (not once per cut), and the
    grid is filled from the score array by position."""
    rankings: dict[str, list[str]] = {}
    qrels: dict[str, Mapping[str, int]] = {}
    pos = np.full(kept.shape, -1, dtype=np.int64)  # (M, Q) -> index into the scored lists
    for j, q in enumerate(retrieval.queries):
        if q.scope == "oos" or q.failed:
            continue
        counts = kept[:, j]
        distinct, first = np.unique(counts, return_index=True)
        scores = np.array([score for _, score in q.hits], dtype=float)
        labels = retrieval.qrels.get(q.query_id, {})
        slot_of: dict[int, int] = {}
        for count, i in sorted(zip(distinct.tolist(), first.tolist(), strict=True), key=lambda ci: ci[1]):
            keep = np.isnan(scores) | (scores >= min_scores[i] - _EPS)
            key = f"{q.query_id}\x00{count}"
            slot_of[count] = len(rankings)
            rankings[key] = [doc for (doc, _), k in zip(q.hits, keep.tolist(), strict=True) if k]
            qrels[key] = labels
        pos[:, j] = [slot_of[c] for c in counts.tolist()]
    out = np.zeros(kept.shape)
    if not rankings:
        return out
    metric_list = None if objective == scorecard.PRIMARY_METRIC else [objective]
    _, columns, _ = scorecard.score_arrays(rankings, qrels, list(rankings), gains=retrieval.gains,
                                           metrics=metric_list, judged_depths=())
    values = np.asarray(columns[objective], dtype=float)
    scored = pos >= 0
    out[scored] = values[pos[scored]]
    return out


def _violations(table: pd.DataFrame, constraints: Sequence[ConstraintLike]) -> np.ndarray:
    if not constraints:
        return np.zeros(len(table))
    records = table.to_dict("records")
    return np.array([max(c.violation(r) for c in constraints) for r in records])


def _pick(table: pd.DataFrame, objective: str) -> int:
    """Feasible rows first (else the least violating), best objective, lowest violation,
    then the middle row of the tied plateau (rows are in grid order)."""
    feasible = table["violation"] <= 0
    pool = table[feasible] if feasible.any() else table[table["violation"] == table["violation"].min()]
    best = pool[objective].max()
    tied = pool[np.isclose(pool[objective], best, rtol=0, atol=1e-12)]
    tied = tied[tied["violation"] == tied["violation"].min()]
    return int(tied.index[len(tied) // 2])


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


def solve_batch(
    batch: BatchResult,
    gates: Sequence[GateRange],
    *,
    objective: str = scorecard.PRIMARY_METRIC,
    constraints: Sequence[ConstraintLike] = (),
    top_m: int | None = None,
) -> ThresholdSolution:
    """``solve`` on a batch retrieved with ``retrieval_values(gates)``."""
    low = next((g.low for g in gates if g.role == MIN_SCORE), 0.0)
    return solve(Retrieval.from_batch(batch, retrieved_min_score=low, top_m=top_m), gates,
                 objective=objective, constraints=constraints)
