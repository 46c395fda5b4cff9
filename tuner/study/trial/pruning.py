"""Per-query reporting for pruners, and the OOS-constraint early stop.

A trial's batch is evaluated query by query (``run_batch(..., on_result=...)``) in an
order shuffled per trial, so the first queries of any trial are a fair sample of the
set. ``QueryReporter`` turns each per-query record into Optuna intermediate values:

- ``per_query`` (for ``WilcoxonPruner``): step = a stable number of the query id, value
  = that query's objective score. The pruner pairs the current trial's steps with the
  best trial's same steps (the same queries), so the step must identify the query,
  not the position in this trial's shuffled order.
- ``shard_mean`` (for the median / percentile pruners): after every ``shard_size``
  in-scope queries, step = shard number, value = running mean of the objective so far.
  These pruners compare trials at equal steps, which the shuffled order makes fair.

Only in-scope queries carry an objective score; OOS queries feed the OOS budget.

OOS early stop: with the constraint ``OOS_FP_Rate <= b`` over ``n_oos`` OOS queries, at
most ``budget = floor(b * n_oos)`` OOS queries may be answered. Once more than that
have been answered, no outcome of the remaining queries can make the trial feasible,
so the batch stops (``OOSBudgetExceeded``, a ``TrialPruned``). The check is exact: it
never stops a trial that could still end feasible. The trial runner records such a trial
as COMPLETE and infeasible (its OOS_FP_Rate lower bound breaks the constraint), valued at
the running mean of the queries measured, so the dashboards and the samplers' constraint
models see it. When the confidence threshold is
solved per retrieval (tuner.study.gates.threshold), an OOS query counts as answered only if it
would be answered even at the highest threshold of the range.
"""

from __future__ import annotations

import math
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

import optuna

Mode = Literal["per_query", "shard_mean", "none"]
_FP_SLACK = 1e-9  # b * n_oos computed in floats: 0.1 * 30 must allow 3, not 2


class TrialLike(Protocol):
    """The part of optuna.Trial the reporter uses (report + should_prune)."""

    number: int

    def report(self, value: float, step: int) -> None: ...

    def should_prune(self) -> bool: ...


class OOSBudgetExceeded(optuna.TrialPruned):
    """More OOS queries were answered than the OOS_FP_Rate constraint allows."""

    def __init__(
        self,
        answered: int,
        budget: int,
        n_oos: int,
        bound: float,
        *,
        running_mean: float = math.nan,
        evaluated: int = 0,
    ) -> None:
        self.answered, self.budget, self.n_oos, self.bound = answered, budget, n_oos, bound
        # the objective's mean over the in-scope queries measured before the stop, and how
        # many queries that was: the trial's recorded value (COMPLETE, infeasible)
        self.running_mean, self.evaluated = running_mean, evaluated
        super().__init__(
            f"OOS early stop: {answered} of {n_oos} OOS queries answered, the constraint OOS_FP_Rate <= {bound:g} "
            f"allows {budget}; the trial cannot become feasible"
        )

    @property
    def fp_rate_lower_bound(self) -> float:
        """The trial's final OOS_FP_Rate is at least this (the violation is at least this minus the bound)."""
        return self.answered / self.n_oos


def query_steps(query_ids: Sequence[str]) -> dict[str, int]:
    """Stable step number per query id: its position among the sorted ids of the whole
    query set (independent of file order and of any trial's shuffled order)."""
    ids = sorted(set(query_ids))
    if len(ids) != len(query_ids):
        raise ValueError("query ids must be unique to number them as pruning steps")
    return {qid: i for i, qid in enumerate(ids)}


def trial_order_seed(study_seed: int | None, trial_number: int) -> int:
    """The query-order seed of one trial: differs per trial, reproducible per study."""
    return random.Random(f"{study_seed}:{trial_number}").getrandbits(32)


def mode_for(pruner: optuna.pruners.BasePruner) -> Mode:
    """The reporting a pruner needs: per-query steps for Wilcoxon, shard means otherwise."""
    if isinstance(pruner, optuna.pruners.NopPruner):
        return "none"
    if isinstance(pruner, optuna.pruners.WilcoxonPruner):
        return "per_query"
    return "shard_mean"


def oos_budget(bound: float, n_oos: int) -> int:
    """How many OOS queries may be answered while keeping OOS_FP_Rate <= bound."""
    if n_oos <= 0:
        return 0
    return max(-1, math.floor(bound * n_oos + _FP_SLACK))


@dataclass
class OOSBudget:
    """Counts answered OOS queries against the constraint's budget."""

    bound: float
    n_oos: int
    answered: int = 0
    seen: int = 0

    @property
    def budget(self) -> int:
        return oos_budget(self.bound, self.n_oos)

    def observe(self, answered: bool) -> None:
        self.seen += 1
        self.answered += bool(answered)
        if self.seen > self.n_oos:
            raise ValueError(f"OOS budget saw {self.seen} OOS queries but the batch has only {self.n_oos}")

    def exceeded(self) -> bool:
        return self.n_oos > 0 and self.answered > self.budget


@dataclass
class QueryReporter:
    """An ``on_result`` callback for run_batch that reports to a trial and stops early.

    ``steps`` numbers every query of the set (query_steps). ``oos`` is None when the
    study has no OOS_FP_Rate constraint. ``oos_threshold_max`` is the top of a solved
    confidence-threshold range (None when the threshold is not solved per retrieval).
    """

    trial: TrialLike
    steps: Mapping[str, int]
    mode: Mode = "per_query"
    objective: str = "Primary_Metric_Score"
    shard_size: int = 10
    oos: OOSBudget | None = None
    oos_threshold_max: float | None = None
    evaluated: int = 0
    _sum: float = 0.0
    _n_in: int = 0
    reported: list[tuple[int, float]] = field(default_factory=list)

    def __post_init__(self) -> None:
        if self.shard_size < 1:
            raise ValueError(f"shard_size must be >= 1, got {self.shard_size}")

    def __call__(self, query_id: str, record: Mapping[str, Any]) -> None:
        self.evaluated += 1
        if record.get("scope") == "oos":
            self._observe_oos(record)
            return
        value = float(record[self.objective])
        if math.isnan(value):
            value = 0.0  # the evaluation core scores a handed-off or failed query 0
        self._sum += value
        self._n_in += 1
        if self.mode == "per_query":
            self._report(value, self.steps[query_id])
        elif self.mode == "shard_mean" and self._n_in % self.shard_size == 0:
            self._report(self._sum / self._n_in, self._n_in // self.shard_size)

    @property
    def running_mean(self) -> float:
        return self._sum / self._n_in if self._n_in else math.nan

    def _report(self, value: float, step: int) -> None:
        self.trial.report(value, step)
        self.reported.append((step, value))
        if self.trial.should_prune():
            raise optuna.TrialPruned(
                f"pruned after {self.evaluated} queries ({self._n_in} in scope, running mean {self.running_mean:.4f})"
            )

    def _observe_oos(self, record: Mapping[str, Any]) -> None:
        if self.oos is None:
            return
        self.oos.observe(self._oos_answered(record))
        if self.oos.exceeded():
            raise OOSBudgetExceeded(
                self.oos.answered,
                self.oos.budget,
                self.oos.n_oos,
                self.oos.bound,
                running_mean=self.running_mean,
                evaluated=self.evaluated,
            )

    def _oos_answered(self, record: Mapping[str, Any]) -> bool:
        answered = bool(record.get("answered"))
        if self.oos_threshold_max is None or record.get("status") == "failed":
            return answered
        conf = record.get("confidence")
        has_results = int(record.get("n_results") or 0) > 0
        return has_results and conf is not None and not math.isnan(conf) and conf >= self.oos_threshold_max


def oos_bound(constraints: Sequence[Any]) -> float | None:
    """The tightest ``OOS_FP_Rate <= b`` among experiment constraints (None: no such constraint)."""
    bounds = [c.bound for c in constraints if getattr(c, "metric", None) == "OOS_FP_Rate" and c.op == "<="]
    return min(bounds) if bounds else None


def reporter_factory(
    pruner: optuna.pruners.BasePruner,
    query_set: Any,
    *,
    objective: str = "Primary_Metric_Score",
    constraints: Sequence[Any] = (),
    threshold_max: float | None = None,
    shard_size: int = 10,
) -> Any:
    """A ``trial -> on_result`` factory for the study (None when neither a pruner nor an
    OOS constraint needs per-query reports). ``query_set`` is the tuned query set (its
    ``query_ids`` and ``oos()``); ``threshold_max`` is the top of a solved
    confidence-threshold range."""
    mode = mode_for(pruner)
    bound = oos_bound(constraints)
    n_oos = len(query_set.oos())
    if mode == "none" and (bound is None or n_oos == 0):
        return None
    steps = query_steps(query_set.query_ids)

    def make(trial: TrialLike) -> QueryReporter:
        budget = OOSBudget(bound, n_oos) if bound is not None and n_oos else None
        return QueryReporter(
            trial,
            steps,
            mode=mode,
            objective=objective,
            shard_size=shard_size,
            oos=budget,
            oos_threshold_max=threshold_max,
        )

    return make
