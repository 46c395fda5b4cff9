"""Seeded, stratified split of a query set into a *tune* part and a *holdout* part.

The sampler only ever sees tune-split scores; the holdout is touched once, at the end,
to check that the best trial's win over the baseline is not an artefact of choosing
the best of many noisy trials on the same queries (selection bias).

Why the split is built the way it is:

- Stratified by (query_type, scope) so the holdout has the same mix of query kinds and
  the same share of out-of-scope queries as the tune part; a holdout without OOS
  queries could not check the OOS constraint.
- Per-stratum holdout counts use largest-remainder rounding: the total is exactly
  ``round(N * fraction)`` and every stratum is within one query of ``n * fraction``.
- Inside a stratum, queries are ranked by a keyed hash of (seed, query_id), not by a
  shuffle of the file order: the split does not change when the file is reordered or
  reformatted, and adding a query moves at most a query or two of the old ones.
- A query set whose every query carries ``split: tune`` / ``split: holdout`` is taken
  as given (the user fixed the split by hand).

``holdout_report(baseline, best)`` is the end-of-study check on the holdout: paired
per-metric deltas with bootstrap intervals and a per-query paired test
(tuner.metrics.significance), Judged@10 of both sides, and a warning when the best trial's
win rests on unjudged hits.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from tuner.data.dataset import Query
from tuner.errors import ConfigError, EvaluationError, StudyError

if TYPE_CHECKING:  # an experiment file's holdout: section is read without pandas and scipy
    import pandas as pd

    from tuner.evaluation.result import BatchResult
    from tuner.metrics.significance import Test

TUNE = "tune"
HOLDOUT = "holdout"
StratumKey = Literal["query_type", "scope", "source"]


class HoldoutConfig(BaseModel):
    """The ``holdout:`` section of an experiment file."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    enabled: bool = True
    fraction: float = Field(0.3, gt=0.0, lt=1.0, description="share of each stratum kept for the holdout")
    seed: int = Field(0, description="changes which queries land in the holdout; keep it fixed across a study")
    stratify_by: tuple[StratumKey, ...] = ("query_type", "scope")
    use_split_field: bool = Field(
        True, description="when every query carries split: tune|holdout, use it instead of drawing a split"
    )


@dataclass(frozen=True)
class Split:
    """Which query ids are tuned on and which are held out (both in query-set order)."""

    tune: tuple[str, ...]
    holdout: tuple[str, ...]
    seed: int
    fraction: float
    source: Literal["drawn", "split_field"] = "drawn"

    def __post_init__(self) -> None:
        if overlap := set(self.tune) & set(self.holdout):
            raise ValueError(f"tune and holdout overlap on {sorted(overlap)[:5]}")

    def part(self, name: str) -> tuple[str, ...]:
        if name == TUNE:
            return self.tune
        if name == HOLDOUT:
            return self.holdout
        raise KeyError(f"unknown split part {name!r}; use {TUNE!r} or {HOLDOUT!r}")

    def to_dict(self) -> dict[str, object]:
        return {
            "seed": self.seed,
            "fraction": self.fraction,
            "source": self.source,
            "tune": list(self.tune),
            "holdout": list(self.holdout),
        }


def stratum_of(query: Any, keys: Sequence[str]) -> tuple[str, ...]:
    return tuple(str(getattr(query, key)) for key in keys)


def split_queries(queries: Iterable[Query], config: HoldoutConfig | None = None) -> Split:
    """Split ``queries`` per ``config`` (defaults: 30% holdout, seed 0, by query_type and scope)."""
    config = config or HoldoutConfig()
    queries = list(queries)
    if not queries:
        raise ConfigError("holdout: the query set is empty; nothing to split")
    if config.use_split_field and (given := _split_from_field(queries)) is not None:
        return given
    return draw_split(queries, fraction=config.fraction, seed=config.seed, stratify_by=config.stratify_by)


def draw_split(
    queries: Sequence[Query], *, fraction: float, seed: int, stratify_by: Sequence[str] = ("query_type", "scope")
) -> Split:
    """The seeded stratified split (see the module docstring for the rules)."""
    if not 0.0 < fraction < 1.0:
        raise ConfigError(f"holdout.fraction must be in (0, 1), got {fraction}; e.g. 0.3 keeps 30% for the holdout")
    strata: dict[tuple[str, ...], list[Query]] = {}
    for query in queries:
        strata.setdefault(stratum_of(query, stratify_by), []).append(query)
    quotas = allocate(
        {key: len(members) for key, members in strata.items()},
        fraction,
        tiebreak=lambda key: _rank_key(seed, "|".join(key)),
    )
    held: set[str] = set()
    for key, members in strata.items():
        ranked = sorted(members, key=lambda q: _rank_key(seed, q.query_id))
        held.update(q.query_id for q in ranked[: quotas[key]])
    tune = tuple(q.query_id for q in queries if q.query_id not in held)
    holdout = tuple(q.query_id for q in queries if q.query_id in held)
    if not tune:
        raise ConfigError(f"holdout.fraction={fraction} leaves no query to tune on; lower it")
    return Split(tune=tune, holdout=holdout, seed=seed, fraction=fraction)


def stratified_folds(
    queries: Sequence[Any], k: int, *, seed: int, stratify_by: Sequence[str] = ("query_type", "scope")
) -> dict[str, int]:
    """Query id -> fold (0..k-1) for k-fold cross-validation (tuner.study.crossval), by the
    split's rules: stratified by ``stratify_by`` (every fold holds its share of each stratum,
    within one query), queries ranked inside a stratum by the keyed hash of (seed, query_id),
    so reordering the file moves nothing. ``queries``: anything with ``query_id`` and the
    ``stratify_by`` attributes. Strata are dealt in turn from where the last one ended, so the
    fold sizes differ by at most one."""
    if k < 2:
        raise ConfigError(f"cross-validation needs at least 2 folds, got {k}; set cv.folds to 5")
    strata: dict[tuple[str, ...], list[Any]] = {}
    for query in queries:
        strata.setdefault(stratum_of(query, stratify_by), []).append(query)
    folds: dict[str, int] = {}
    position = 0
    for key in sorted(strata):
        for query in sorted(strata[key], key=lambda q: _rank_key(seed, q.query_id)):
            folds[query.query_id] = position % k
            position += 1
    return folds


def allocate(
    sizes: dict[tuple[str, ...], int], fraction: float, tiebreak: Callable[[tuple[str, ...]], bytes] | None = None
) -> dict[tuple[str, ...], int]:
    """Largest-remainder rounding of ``n * fraction`` per stratum.

    The quotas sum to ``round(total * fraction)`` (ties of the total rounded half up)
    and each quota is ``floor`` or ``ceil`` of its stratum's exact share.
    """
    exact = {key: n * fraction for key, n in sizes.items()}
    quotas = {key: math.floor(share) for key, share in exact.items()}
    target = math.floor(sum(sizes.values()) * fraction + 0.5)
    order = sorted(
        exact,
        key=lambda key: (-(exact[key] - quotas[key]), tiebreak(key) if tiebreak else key),
    )
    for key in order[: max(0, target - sum(quotas.values()))]:
        quotas[key] += 1
    return quotas


def _rank_key(seed: int, name: str) -> bytes:
    return hashlib.blake2b(f"{seed}\x00{name}".encode(), digest_size=16).digest()


def _split_from_field(queries: Sequence[Query]) -> Split | None:
    values = {q.split for q in queries}
    if values != {TUNE, HOLDOUT}:  # partial or other split names: draw a split instead
        return None
    tune = tuple(q.query_id for q in queries if q.split == TUNE)
    holdout = tuple(q.query_id for q in queries if q.split == HOLDOUT)
    return Split(tune=tune, holdout=holdout, seed=-1, fraction=len(holdout) / len(queries), source="split_field")


# --------------------------------------------------------------------------- validation


@dataclass
class HoldoutReport:
    """Baseline vs best feasible trial on the holdout queries (delta = best - baseline)."""

    n_queries: int
    n_in_scope: int
    comparison: pd.DataFrame  # significance.compare: one row per metric
    judged: dict[str, float]  # Judged@k (mean over in-scope queries) per side
    oos_fp: dict[str, float]  # OOS_FP_Rate per side
    condensed_delta: float  # primary delta with unjudged hits removed from both rankings
    primary: str
    alpha: float
    judged_k: int
    warnings: list[str] = field(default_factory=list)

    @property
    def verdict(self) -> str:
        row = self.comparison.loc[self.primary]
        if row["p_value"] >= self.alpha or row["delta"] == 0:
            return "no significant difference"
        return "best trial significantly better" if row["delta"] > 0 else "best trial significantly worse"

    def to_dict(self) -> dict[str, object]:
        return {
            "n_queries": self.n_queries,
            "n_in_scope": self.n_in_scope,
            "primary": self.primary,
            "alpha": self.alpha,
            "verdict": self.verdict,
            "judged_k": self.judged_k,
            "judged": self.judged,
            "oos_fp_rate": self.oos_fp,
            "condensed_delta": self.condensed_delta,
            "warnings": self.warnings,
            "test": self.comparison.attrs.get("test"),
            "confidence": self.comparison.attrs.get("confidence"),
            "metrics": self.comparison.reset_index().to_dict("records"),
        }

    def to_markdown(self) -> str:
        conf = self.comparison.attrs.get("confidence", 0.95)
        lines = [
            f"## Holdout validation ({self.n_in_scope} in-scope of {self.n_queries} held-out queries)",
            "",
            f"**{self.verdict}** on {self.primary} (paired {self.comparison.attrs.get('test')} test, "
            f"alpha {self.alpha:g}; {conf:.0%} paired bootstrap intervals).",
            "",
            "| metric | baseline | best | delta | CI | p | p (Holm) | wins/losses/ties |",
            "| --- | ---: | ---: | ---: | --- | ---: | ---: | --- |",
        ]
        for name, r in self.comparison.iterrows():
            lines.append(
                f"| {name} | {r.baseline:.4f} | {r.candidate:.4f} | {r.delta:+.4f} | "
                f"[{r.ci_low:+.4f}, {r.ci_high:+.4f}] | {r.p_value:.4f} | {r.p_holm:.4f} | "
                f"{r.wins}/{r.losses}/{r.ties} |"
            )
        lines += [
            "",
            f"Judged@{self.judged_k}: baseline {self.judged['baseline']:.3f}, best {self.judged['best']:.3f}. "
            f"OOS_FP_Rate: baseline {self.oos_fp['baseline']:.3f}, best {self.oos_fp['best']:.3f}. "
            f"{self.primary} delta with unjudged hits removed: {self.condensed_delta:+.4f}.",
        ]
        lines += [f"\n> warning: {w}" for w in self.warnings]
        return "\n".join(lines) + "\n"


def holdout_report(
    baseline: BatchResult,
    best: BatchResult,
    *,
    metrics: Sequence[str] | None = None,
    confidence: float = 0.95,
    alpha: float = 0.05,
    n_resamples: int = 10_000,
    seed: int = 0,
    test: Test = "permutation",
    judged_k: int = 10,
    min_judged: float = 0.8,
) -> HoldoutReport:
    """Compare two batch evaluations of the same holdout queries.

    Metrics are compared per in-scope query (handed-off queries score 0, as in the
    batch). Warnings: the best trial's win on the primary metric *rests on unjudged
    hits* when removing unjudged documents from both rankings (condensed lists, Sakai
    2007) takes the win away, i.e. the win needs the assumption that the documents
    nobody graded are irrelevant; and a side whose Judged@k is below ``min_judged``
    is named, with the labelling queue as the fix.
    """
    from tuner import metrics as scorecard
    from tuner.metrics.significance import compare

    primary = scorecard.PRIMARY_METRIC
    names = list(metrics) if metrics is not None else [*scorecard.PRIMARY_SCORECARD, primary]
    if primary not in names:
        names.append(primary)
    ids = _in_scope_ids(baseline)
    if _in_scope_ids(best) != ids:
        raise EvaluationError(
            "holdout report: baseline and best were evaluated on different queries; "
            "evaluate both on the same holdout split"
        )
    if not ids:
        raise EvaluationError(
            "holdout report: the holdout has no in-scope query; lower holdout.fraction's rounding loss or add queries"
        )
    table = compare(
        baseline.per_query.loc[ids, names],
        best.per_query.loc[ids, names],
        names,
        confidence=confidence,
        n_resamples=n_resamples,
        seed=seed,
        test=test,
    )
    judged = {side: _judged(result, ids, judged_k) for side, result in (("baseline", baseline), ("best", best))}
    condensed = _condensed_primary(best, ids) - _condensed_primary(baseline, ids)
    report = HoldoutReport(
        n_queries=len(baseline.queries),
        n_in_scope=len(ids),
        comparison=table,
        judged=judged,
        oos_fp={
            "baseline": float(baseline.metrics.get("OOS_FP_Rate", float("nan"))),
            "best": float(best.metrics.get("OOS_FP_Rate", float("nan"))),
        },
        condensed_delta=float(condensed),
        primary=primary,
        alpha=alpha,
        judged_k=judged_k,
    )
    delta = float(table.loc[primary, "delta"])
    if delta > 0 and condensed <= 0:
        report.warnings.append(
            f"the best trial's win on {primary} ({delta:+.4f}) rests on unjudged hits: with unjudged documents "
            f"removed from both rankings the delta is {condensed:+.4f}; grade them (tuner labels queue) before "
            "trusting the win"
        )
    for side, value in judged.items():
        if value < min_judged:
            report.warnings.append(
                f"Judged@{judged_k} of the {side} is {value:.2f} (< {min_judged:g}): unjudged hits count as "
                "irrelevant, so its scores are a lower bound; export them with tuner labels queue"
            )
    return report


def _in_scope_ids(result: BatchResult) -> list[str]:
    pq = result.per_query
    return [str(q) for q in pq.index[pq["scope"] != "oos"]]


def _scored_rankings(result: BatchResult, ids: Sequence[str]) -> dict[str, list[str]]:
    answered = result.per_query["answered"]
    return {q: [h.doc_id for h in result.hits.get(q, ())] if bool(answered.loc[q]) else [] for q in ids}


def _judged(result: BatchResult, ids: Sequence[str], k: int) -> float:
    from tuner import metrics as scorecard

    series = scorecard.judged_at_k(_scored_rankings(result, ids), result.qrels, list(ids), k).dropna()
    return float(series.mean()) if len(series) else 1.0


def _condensed_primary(result: BatchResult, ids: Sequence[str]) -> float:
    from tuner import metrics as scorecard

    rankings = {q: [d for d in r if d in result.qrels.get(q, {})] for q, r in _scored_rankings(result, ids).items()}
    frame = scorecard.score_rankings(rankings, result.qrels, list(ids), gains=result.gains)
    return float(frame[scorecard.PRIMARY_METRIC].mean())


def tune_split(queries: Any, config: HoldoutConfig | None) -> tuple[Any, Split | None]:
    """The query set a study tunes on (tuner.data.dataset.QuerySet) and its split: the tune
    part when the holdout is enabled, else every query and None."""
    if config is None or not config.enabled:
        return queries, None
    split = split_queries(queries, config)
    return queries.subset(query_ids=split.tune), split


# ------------------------------------------------------------------ the split on the study

ATTR_HOLDOUT = "tuner.holdout"  # study attr: the split the study tuned on (seed, fraction, counts)


def record_split(study: Any, split: Split) -> None:
    """Remember on the study which split it tunes on (call when the study starts)."""
    study.set_user_attr(
        ATTR_HOLDOUT,
        {
            "seed": split.seed,
            "fraction": split.fraction,
            "source": split.source,
            "n_tune": len(split.tune),
            "n_holdout": len(split.holdout),
        },
    )


def check_same_split(recorded: Any, split: Split) -> None:
    if not recorded:
        return
    if (recorded.get("seed"), recorded.get("n_holdout")) != (split.seed, len(split.holdout)):
        raise StudyError(
            f"the study tuned with holdout seed {recorded.get('seed')} ({recorded.get('n_holdout')} held out), this "
            f"validation draws seed {split.seed} ({len(split.holdout)}); use the experiment's holdout settings, "
            "or the holdout would contain queries the study tuned on"
        )
