"""How much of a study's gain is real: k-fold cross-validation of the selection itself.

A study reports the best of many trials on the very queries it picked it on, so its best
value is optimistic (the winner of many noisy draws). This module estimates what "tune,
then deploy the winner" gives on queries the selection never saw, from the per-query
scores the study already recorded (tuner.study.query_scores), without one more request:

1. the tuned queries are dealt into ``k`` folds, stratified by query_type and scope and
   seeded (tuner.evaluation.holdout.stratified_folds, the holdout split's rules);
2. for each fold, the best feasible candidate on the *other* folds is picked -- feasible
   by the one rule (tuner.study.feasibility.constraints_hold) with every constraint
   recomputed on those training queries (a constraint without per-query values, e.g. a
   latency percentile, keeps the trial's whole-set value), ranked by
   tuner.study.feasibility.rank_key -- and scored on the held-out fold; a fold where no
   candidate is feasible deploys the baseline (nothing to apply);
3. the held-out scores of the picks, one per in-scope query, are the cross-validated
   score; its gain over the baseline on the same queries gets a paired bootstrap interval
   and a paired test (tuner.metrics.significance.compare).

The in-sample best is the same pick made on all queries; the optimism is in-sample minus
cross-validated. When the interval of the gain includes 0, `verdict` says plainly that
there is no evidence the winner beats the baseline on new queries.

Candidates are COMPLETE trials and, for replay trials, the best fusion settings they
scored exactly (tuner.study.query_scores). The interval covers the query sample, not the fold assignment (another seed
deals other folds); pure: arrays in, numbers out.

The pick rule is a parameter (``selection``, the experiment's ``selection:`` key):

- ``best``: the feasible candidate with the best mean on the queries picked on;
- ``robust``: the feasible candidate whose *neighbourhood* has the best mean: itself and
  its ``NEIGHBOURS - 1`` nearest feasible candidates with the same categorical values
  (fusion method, any string or bool param), by Euclidean distance over the numeric
  params each normalised by its range over all candidates. A lone spike among poor
  neighbours loses to a broad plateau; a candidate without a like neighbour is its own
  neighbourhood. Ties rank as ``best`` does (rank_key: the lower trial number).

`compare_selection` cross-validates both rules with the same folds, so the study can say
which rule generalises better on its own queries.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import numpy as np

from tuner.config.objective import Constraint
from tuner.config.validation import Selection
from tuner.study.feasibility import constraints_hold, rank_key

DEFAULT_FOLDS = 5
NEIGHBOURS = 5  # a robust pick's neighbourhood, itself included (module doc)
SELECTIONS: tuple[Selection, ...] = ("best", "robust")


class QueryInfo(NamedTuple):
    """A tuned query as the folds see it (tuner.evaluation.holdout.stratified_folds)."""

    query_id: str
    query_type: str
    scope: str


@dataclass(frozen=True)
class Candidate:
    """A setting a study could deploy, with its per-query values over the study's queries
    (``QueryInfo`` order): ``objective`` (NaN where a query has no score: OOS queries), and
    per constraint metric the per-query values whose mean over any query subset is that
    metric on the subset (``OOS_FP_Rate``: 1.0 for an answered OOS query, 0.0 for a handed
    off one, NaN for in-scope queries). ``fixed``: whole-set violations of the constraints
    that have no per-query values (constraint name -> violation). ``params``: the setting
    (param name -> value), what the robust rule's neighbourhood is measured on."""

    number: int  # the trial
    label: str  # "#12", or "#12 setting 40" for a replayed fusion setting
    objective: np.ndarray
    metrics: Mapping[str, np.ndarray] = field(default_factory=dict)
    fixed: Mapping[str, float] = field(default_factory=dict)
    params: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class FoldPick:
    fold: int
    label: str | None  # None: nothing feasible on the training folds, the baseline is kept
    train_score: float
    heldout_score: float
    n_heldout: int  # in-scope queries of the fold


@dataclass
class CrossValResult:
    """The cross-validated estimate of a study (module doc); scores are means over the
    ``n_queries`` in-scope tuned queries."""

    objective: str
    maximize: bool
    folds: int
    seed: int
    n_queries: int
    n_candidates: int
    picks: list[FoldPick]
    cv_score: float
    in_sample: float | None  # the best feasible candidate on all queries
    in_sample_label: str | None
    baseline: float | None
    gain: float | None  # cv_score - baseline
    ci_low: float | None
    ci_high: float | None
    p_value: float | None
    in_sample_gain: float | None
    confidence: float
    heldout_constraints: dict[str, float] = field(default_factory=dict)  # the picks' metrics on their held-out folds
    notes: list[str] = field(default_factory=list)
    baseline_feasible: bool | None = None  # the baseline meets every constraint on all queries
    selection: Selection = "best"  # the pick rule of this estimate
    rules: dict[str, float] = field(default_factory=dict)  # every rule's cross-validated score (compare_selection)
    # robust minus best on the same held-out queries: (delta, ci_low, ci_high), paired bootstrap
    rules_gain: tuple[float, float, float] | None = None
    deployed: np.ndarray | None = field(default=None, repr=False)  # the picks' held-out scores, in-scope queries

    @property
    def optimism(self) -> float | None:
        """In-sample minus cross-validated, signed so that a positive optimism is a flattering
        in-sample figure whatever the direction."""
        if self.in_sample is None:
            return None
        return (self.in_sample - self.cv_score) * (1.0 if self.maximize else -1.0)

    @property
    def established(self) -> bool | None:
        """The gain's interval excludes 0 on the better side (None: no baseline)."""
        if self.ci_low is None or self.ci_high is None:
            return None
        return self.ci_low > 0 if self.maximize else self.ci_high < 0

    @property
    def verdict(self) -> str:
        if self.established is None:
            return "no baseline to compare with: the cross-validated score stands alone"
        if self.established:
            return "the gain over the baseline holds on queries the selection did not see"
        assert self.ci_low is not None and self.ci_high is not None
        if (self.ci_high < 0) if self.maximize else (self.ci_low > 0):
            if self.baseline_feasible is False:
                return (
                    "the winner scores below the baseline on queries the selection did not see; the baseline "
                    "breaks a constraint, so that is the price of meeting it"
                )
            return "tuning loses to the baseline on queries the selection did not see: keep the baseline"
        return "no evidence the winner beats the baseline on new queries (the interval of the gain includes 0)"

    def summary_line(self) -> str:
        """One line for the run summary, the study note and `tuner best`."""
        text = f"{self.objective} {self.cv_score:.4f} cross-validated ({self.folds} folds, {self.n_queries} queries)"
        if self.gain is not None:
            pct = f"{self.confidence:.0%}"
            text += f", gain over the baseline {self.gain:+.4f} [{pct} CI {self.ci_low:+.4f}, {self.ci_high:+.4f}]"
        if self.in_sample is not None:
            what = "best" if self.selection == "best" else f"{self.selection} pick"
            text += f"; in-sample {what} {self.in_sample:.4f} ({self.in_sample_label}), optimism {self.optimism:+.4f}"
        return text + f". {self.verdict[0].upper()}{self.verdict[1:]}."

    def selection_line(self) -> str | None:
        """One line comparing the pick rules' cross-validated scores (None: one rule only)."""
        if len(self.rules) < 2:
            return None
        scores = ", ".join(f"{rule} {score:.4f}" for rule, score in self.rules.items())
        if self.rules_gain is None:
            return f"selection rules, cross-validated: {scores} (selection: {self.selection} in use)"
        delta, low, high = self.rules_gain
        sign = 1.0 if self.maximize else -1.0
        if low * sign > 0 and high * sign > 0:
            better = "robust generalises better on this study"
        elif low * sign < 0 and high * sign < 0:
            better = "best generalises better on this study"
        else:
            better = "neither rule generalises measurably better on this study"
        pct = f"{self.confidence:.0%}"
        return (
            f"selection rules, cross-validated: {scores}; robust - best {delta:+.4f} [{pct} CI {low:+.4f}, "
            f"{high:+.4f}]: {better} (selection: {self.selection} in use)"
        )

    def metrics(self) -> dict[str, float]:
        """Numbers for the MLflow parent run (``cv_`` names)."""
        out = {"cv_score": self.cv_score, "cv_folds": float(self.folds), "cv_queries": float(self.n_queries)}
        named = {
            "cv_gain": self.gain,
            "cv_gain_ci_low": self.ci_low,
            "cv_gain_ci_high": self.ci_high,
            "cv_gain_p_value": self.p_value,
            "cv_in_sample_best": self.in_sample,
            "cv_in_sample_gain": self.in_sample_gain,
            "cv_optimism": self.optimism,
            "cv_gain_established": None if self.established is None else float(self.established),
        }
        out.update({k: float(v) for k, v in named.items() if v is not None})
        out.update({f"cv_heldout_{k}": v for k, v in self.heldout_constraints.items()})
        out.update({f"cv_score_{rule}": score for rule, score in self.rules.items()})
        if self.rules_gain is not None:
            out["cv_robust_minus_best"], out["cv_robust_minus_best_ci_low"], out["cv_robust_minus_best_ci_high"] = (
                self.rules_gain
            )
        return out

    def to_dict(self) -> dict[str, Any]:
        return {
            "objective": self.objective,
            "folds": self.folds,
            "seed": self.seed,
            "n_queries": self.n_queries,
            "n_candidates": self.n_candidates,
            "cv_score": self.cv_score,
            "baseline": self.baseline,
            "gain": self.gain,
            "ci": None if self.ci_low is None else [self.ci_low, self.ci_high],
            "confidence": self.confidence,
            "p_value": self.p_value,
            "in_sample": self.in_sample,
            "in_sample_pick": self.in_sample_label,
            "in_sample_gain": self.in_sample_gain,
            "optimism": self.optimism,
            "established": self.established,
            "baseline_feasible": self.baseline_feasible,
            "verdict": self.verdict,
            "selection": self.selection,
            "rules": self.rules,
            "robust_minus_best": None if self.rules_gain is None else list(self.rules_gain),
            "heldout_constraints": self.heldout_constraints,
            "picks": [p.__dict__ for p in self.picks],
            "notes": self.notes,
        }

    def to_markdown(self) -> str:
        lines = [f"**Cross-validated** ({self.folds} folds): {self.summary_line()}", ""]
        if (rules := self.selection_line()) is not None:
            lines += [rules[0].upper() + rules[1:] + ".", ""]
        lines += ["| fold | pick (training folds) | training | held out | queries |", "|---:|---|---:|---:|---:|"]
        for p in self.picks:
            lines.append(
                f"| {p.fold + 1} | {p.label or 'baseline (nothing feasible)'} | {p.train_score:.4f} | "
                f"{p.heldout_score:.4f} | {p.n_heldout} |"
            )
        if self.heldout_constraints:
            held = ", ".join(f"{k} {v:.4g}" for k, v in self.heldout_constraints.items())
            lines += ["", f"The picks on their held-out folds: {held}."]
        lines += [f"\n> {n}" for n in self.notes]
        return "\n".join(lines) + "\n"


def cross_validate(
    queries: Sequence[QueryInfo],
    candidates: Sequence[Candidate],
    baseline: Candidate | None,
    constraints: Sequence[Constraint],
    *,
    objective: str = "Primary_Metric_Score",
    maximize: bool = True,
    folds: int = DEFAULT_FOLDS,
    seed: int = 0,
    confidence: float = 0.95,
    n_resamples: int = 10_000,
    selection: Selection = "best",
) -> CrossValResult | None:
    """The estimate (module doc) with ``selection`` as the pick rule; None without a
    candidate or an in-scope query."""
    from tuner.evaluation.holdout import stratified_folds

    scored = np.array([q.scope != "oos" for q in queries], dtype=bool)
    if not candidates or not scored.any():
        return None
    k = min(folds, int(scored.sum()))
    fold_of = stratified_folds(queries, k, seed=seed)
    fold = np.array([fold_of[q.query_id] for q in queries])
    table = _Table(candidates, constraints, maximize, selection)
    notes: list[str] = []
    deployed = np.full(len(queries), np.nan)
    held: dict[str, list[np.ndarray]] = {}
    picks = []
    for j in range(k):
        test = fold == j
        pick = table.pick(~test)
        n_test = int((test & scored).sum())
        if pick is None:
            if baseline is None:
                notes.append(f"fold {j + 1}: no candidate is feasible on the other folds and there is no baseline")
                continue
            notes.append(f"fold {j + 1}: no candidate is feasible on the other folds; the baseline is kept there")
            chosen, label, train = baseline, None, _mean(baseline.objective, ~test)
        else:
            chosen, label, train = candidates[pick], candidates[pick].label, table.train_score(pick, ~test)
        deployed[test] = chosen.objective[test]
        for metric, values in chosen.metrics.items():
            held.setdefault(metric, []).append(values[test])
        picks.append(FoldPick(j, label, train, _mean(chosen.objective, test), n_test))
    ids = scored & ~np.isnan(deployed)
    whole = table.pick(np.ones(len(queries), dtype=bool))
    result = CrossValResult(
        objective=objective,
        maximize=maximize,
        folds=k,
        seed=seed,
        n_queries=int(ids.sum()),
        n_candidates=len(candidates),
        picks=picks,
        cv_score=float(deployed[ids].mean()),
        in_sample=None if whole is None else float(table.train_score(whole, scored)),
        in_sample_label=None if whole is None else candidates[whole].label,
        baseline=None,
        gain=None,
        ci_low=None,
        ci_high=None,
        p_value=None,
        in_sample_gain=None,
        confidence=confidence,
        selection=selection,
        heldout_constraints={m: _pooled(v) for m, v in held.items() if m in {c.metric for c in constraints}},
        notes=notes,
        deployed=deployed[ids],
    )
    if baseline is not None:
        _compare(result, baseline.objective[ids], deployed[ids], n_resamples=n_resamples, seed=seed)
        result.baseline_feasible = table.feasible(baseline, np.ones(len(queries), dtype=bool))
    return result


def compare_selection(
    queries: Sequence[QueryInfo],
    candidates: Sequence[Candidate],
    baseline: Candidate | None,
    constraints: Sequence[Constraint],
    *,
    selection: Selection = "best",
    **options: Any,
) -> CrossValResult | None:
    """The estimate of the ``selection`` rule in use, its ``rules`` holding every rule's
    cross-validated score on the same folds and ``rules_gain`` robust minus best on the
    same held-out queries with a paired bootstrap interval (the other rule's full estimate
    is not kept)."""
    results = {
        rule: cross_validate(queries, candidates, baseline, constraints, selection=rule, **options)
        for rule in SELECTIONS
    }
    result = results[selection]
    if result is None:
        return None
    result.rules = {rule: r.cv_score for rule, r in results.items() if r is not None}
    best, robust = results["best"], results["robust"]
    a = None if best is None else best.deployed
    b = None if robust is None else robust.deployed
    if a is not None and b is not None and a.shape == b.shape and a.size > 1:
        n_resamples = int(options.get("n_resamples", 10_000))
        result.rules_gain = _paired(a, b, confidence=result.confidence, n_resamples=n_resamples, seed=result.seed)
    return result


def neighbourhood_means(
    means: np.ndarray, feasible: Sequence[bool], params: Sequence[Mapping[str, Any]], k: int = NEIGHBOURS
) -> np.ndarray:
    """Per feasible candidate with a score, the mean of ``means`` over its neighbourhood:
    itself and its ``k - 1`` nearest feasible scored candidates with the same categorical
    values and the same numeric params, by Euclidean distance over the numeric params, each
    normalised by its range over all candidates (module doc). NaN for the others."""
    n = len(means)
    out = np.full(n, np.nan)
    numeric = [{k_: float(v) for k_, v in p.items() if _is_number(v)} for p in params]
    names = sorted({name for p in numeric for name in p})
    span = {}
    for name in names:
        values = [p[name] for p in numeric if name in p]
        span[name] = (max(values) - min(values)) or 1.0
    groups: dict[tuple[Any, ...], list[int]] = {}
    for i in range(n):
        if feasible[i] and not math.isnan(means[i]):
            kind = tuple(sorted((k_, repr(v)) for k_, v in params[i].items() if not _is_number(v)))
            groups.setdefault((kind, tuple(sorted(numeric[i]))), []).append(i)
    for members in groups.values():
        keys = sorted(numeric[members[0]])
        points = np.array([[numeric[i][name] / span[name] for name in keys] for i in members]).reshape(len(members), -1)
        for row, i in enumerate(members):
            distance = np.sqrt(((points - points[row]) ** 2).sum(axis=1))
            # itself first, then nearest; equal distances by candidate order (deterministic)
            order = np.lexsort((np.arange(len(members)), distance, np.arange(len(members)) != row))
            out[i] = float(np.mean([means[members[j]] for j in order[:k]]))
    return out


def pick_index(
    means: np.ndarray,
    feasible: Sequence[bool],
    numbers: Sequence[int],
    params: Sequence[Mapping[str, Any]],
    *,
    maximize: bool = True,
    selection: Selection = "best",
    k: int = NEIGHBOURS,
    eligible: Sequence[bool] | None = None,
) -> int | None:
    """The candidate ``selection`` picks (module doc) from their ``means`` on the queries
    picked on, or None when none is feasible with a score. ``eligible``: only these may be
    picked (every feasible candidate still counts as a neighbour). Ties: rank_key (lower
    trial number), then candidate order."""
    ranked_by = means if selection == "best" else neighbourhood_means(means, feasible, params, k)
    best: tuple[tuple[float, int], int] | None = None
    for i in range(len(means)):
        if not feasible[i] or math.isnan(means[i]) or math.isnan(ranked_by[i]):
            continue
        if eligible is not None and not eligible[i]:
            continue
        key = rank_key(float(ranked_by[i]), numbers[i], maximize=maximize)
        if best is None or key < best[0]:
            best = (key, i)
    return None if best is None else best[1]


def select(
    candidates: Sequence[Candidate],
    constraints: Sequence[Constraint],
    *,
    maximize: bool = True,
    selection: Selection = "best",
    eligible: Sequence[bool] | None = None,
) -> int | None:
    """The candidate ``selection`` picks on all queries (index), among ``eligible`` ones."""
    if not candidates:
        return None
    table = _Table(candidates, constraints, maximize, selection)
    return table.pick(np.ones(len(candidates[0].objective), dtype=bool), eligible)


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


class _Table:
    """The candidates' values as matrices, for one pick per training mask."""

    def __init__(
        self,
        candidates: Sequence[Candidate],
        constraints: Sequence[Constraint],
        maximize: bool,
        selection: Selection = "best",
    ) -> None:
        self.candidates, self.constraints, self.maximize = candidates, constraints, maximize
        self.selection = selection
        self.scores = np.vstack([c.objective for c in candidates])

    def train_score(self, index: int, mask: np.ndarray) -> float:
        return _mean(self.scores[index], mask)

    def pick(self, mask: np.ndarray, eligible: Sequence[bool] | None = None) -> int | None:
        """The candidate the selection rule picks among those feasible on the queries of
        ``mask`` (index), or None."""
        with warnings.catch_warnings():  # an all-NaN row (no score on these queries) is left out below
            warnings.simplefilter("ignore", RuntimeWarning)
            means = np.nanmean(self.scores[:, mask], axis=1)
        feasible = [not math.isnan(means[i]) and self.feasible(c, mask) for i, c in enumerate(self.candidates)]
        return pick_index(
            means,
            feasible,
            [c.number for c in self.candidates],
            [c.params for c in self.candidates],
            maximize=self.maximize,
            selection=self.selection,
            eligible=eligible,
        )

    def feasible(self, cand: Candidate, mask: np.ndarray) -> bool:
        """``cand`` meets every constraint on the queries of ``mask`` (the one rule)."""
        return constraints_hold(self._violations(cand, mask))

    def _violations(self, cand: Candidate, mask: np.ndarray) -> list[float]:
        out = []
        for c in self.constraints:
            values = cand.metrics.get(c.metric)
            if values is None:  # no per-query values: the trial's whole-set verdict
                out.append(float(cand.fixed.get(c.name, 0.0)))
                continue
            out.append(c.violation({c.metric: _mean(values, mask)}))
        return out


def _mean(values: np.ndarray, mask: np.ndarray) -> float:
    part = values[mask]
    part = part[~np.isnan(part)]
    return float(part.mean()) if part.size else math.nan


def _pooled(parts: list[np.ndarray]) -> float:
    values = np.concatenate(parts)
    values = values[~np.isnan(values)]
    return float(values.mean()) if values.size else math.nan


def _paired(
    a: np.ndarray, b: np.ndarray, *, confidence: float, n_resamples: int, seed: int
) -> tuple[float, float, float]:
    """b minus a per query: the mean and its paired bootstrap interval."""
    from tuner.metrics.significance import bootstrap_means

    diffs = (b - a).reshape(-1, 1)
    boot = bootstrap_means(diffs, n_resamples=n_resamples, seed=seed)
    tail = (1.0 - confidence) / 2.0
    low, high = np.quantile(boot, [tail, 1.0 - tail], axis=0)
    return float(diffs.mean()), float(low[0]), float(high[0])


def _compare(result: CrossValResult, base: np.ndarray, deployed: np.ndarray, *, n_resamples: int, seed: int) -> None:
    from tuner.metrics.significance import compare_arrays

    (row,) = compare_arrays(
        np.asarray(base, dtype=float).reshape(-1, 1),
        np.asarray(deployed, dtype=float).reshape(-1, 1),
        [result.objective],
        confidence=result.confidence,
        n_resamples=n_resamples,
        seed=seed,
    )
    result.baseline = row.baseline
    result.gain = row.delta
    result.ci_low, result.ci_high, result.p_value = row.ci_low, row.ci_high, float(row.p_value)
    if result.in_sample is not None:
        result.in_sample_gain = result.in_sample - result.baseline
