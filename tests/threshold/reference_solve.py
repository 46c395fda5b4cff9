"""Today's gate solve and regate, kept verbatim as the slow reference (the code of
tuner.study.gates.threshold and tuner.evaluation.regate before they were vectorised; only
Retrieval.from_batch is a function here, and regate scores through the reference copy
of evaluate_responses in reference_result.py).

tests/threshold/test_solve_vectorised.py and bench/solve_bench.py check that the
vectorised code returns exactly what this returns. Do not "fix" or speed up this copy.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from threshold.reference_result import PRIMARY, evaluate_responses
from tuner import metrics as scorecard
from tuner.errors import ConfigError, EvaluationError
from tuner.evaluation import oos
from tuner.evaluation.mapping import Hit, ParsedResponse
from tuner.evaluation.oos import threshold_grid
from tuner.evaluation.outcomes import QueryResponse
from tuner.study.gates.threshold import (
    CONFIDENCE,
    MIN_SCORE,
    GateRange,
    QueryRetrieval,
    Retrieval,
    ThresholdSolution,
)

if TYPE_CHECKING:
    from tuner.evaluation.result import BatchResult

_EPS = 1e-9


def retrieval_from_batch(
    batch: BatchResult, *, retrieved_min_score: float = 0.0, top_m: int | None = None,
) -> Retrieval:
    """Today's Retrieval.from_batch."""
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
    return Retrieval(tuple(rows), batch.qrels, retrieved_min_score, top_m, batch.gains)


def solve(
    retrieval: Retrieval,
    gates: Sequence[GateRange],
    *,
    objective: str = scorecard.PRIMARY_METRIC,
    constraints: Sequence[Any] = (),
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


def _violations(table: pd.DataFrame, constraints: Sequence[Any]) -> np.ndarray:
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



def solve_batch(
    batch: BatchResult,
    gates: Sequence[GateRange],
    *,
    objective: str = scorecard.PRIMARY_METRIC,
    constraints: Sequence[Any] = (),
    top_m: int | None = None,
) -> ThresholdSolution:
    """``solve`` on a batch retrieved with ``retrieval_values(gates)``."""
    low = next((g.low for g in gates if g.role == MIN_SCORE), 0.0)
    return solve(retrieval_from_batch(batch, retrieved_min_score=low, top_m=top_m), gates,
                 objective=objective, constraints=constraints)


def regate(
    result: BatchResult,
    *,
    confidence_threshold: float | None,
    min_score: float | None,
    sweep_range: tuple[float, float, float] | None = None,
) -> BatchResult:
    """``result`` as if the backend had run with these gates (None: that gate as retrieved).

    Exact when the batch was retrieved with both gates at or below the given values
    (hits the backend already dropped cannot come back). ``sweep_range``
    ``(low, high, step)``: the confidence gate's declared range, the grid of the
    result's threshold sweep (default: oos.threshold_grid over the observed
    confidences); ``confidence_threshold`` is always one of its rows."""
    pq = result.per_query
    failed_ids = {f.query_id for f in result.failed}
    responses: list[QueryResponse] = []
    for q in result.queries:
        qid = q.query_id
        if qid in failed_ids:
            continue
        row = pq.loc[qid]
        hits = result.hits[qid]
        kept = hits if min_score is None else tuple(h for h in hits if _kept(h, min_score))
        conf = None if _missing(row["confidence"]) else float(row["confidence"])
        handoff = row["handoff"]
        handoff = None if _missing(handoff) else bool(handoff)
        if confidence_threshold is not None:
            handoff = conf is None or conf < confidence_threshold
        if min_score is not None and not kept:
            handoff = True  # an emptied result list is handed off
        fallback = row["fallback_level"]
        responses.append(QueryResponse(
            qid, str(row["request_id"]),
            ParsedResponse(kept, conf, handoff, None if _missing(fallback) else str(fallback),
                           handoff_reason=None if _missing(row.get("handoff_reason")) else str(row["handoff_reason"]),
                           truncated=int(row["n_truncated"]) if not _missing(row.get("n_truncated")) else 0,
                           repeats=int(row["n_repeats"]) if not _missing(row.get("n_repeats")) else 0),
            latency_ms=float(row["latency_ms"]), attempts=int(row["attempts"]),
        ))
    ranking = [m for m in result.metric_names if m != PRIMARY]
    in_effect = confidence_threshold if confidence_threshold is not None else result.threshold_in_effect
    grid = threshold_grid(pq["confidence"].tolist(), sweep_range=sweep_range, include=(in_effect,))
    return evaluate_responses(
        result.queries, result.qrels, responses, result.failed,
        gains=result.gains, metrics=ranking or None, sweep_thresholds=grid, threshold_in_effect=in_effect,
    )


def _kept(hit: Hit, min_score: float) -> bool:
    return hit.score is None or math.isnan(hit.score) or hit.score >= min_score - _EPS


def _missing(value: object) -> bool:
    return value is None or (isinstance(value, float) and math.isnan(value))
