"""A measured trial's score: the gates solved from its retrieval, the objective and
constraints set on the Optuna trial, and the OOS early stop's COMPLETE-infeasible record.

`TrialScorer` owns the experiment's objective and constraints; `TrialRunner`
(tuner.study.trial.runner) hands it a measured trial in ``end``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import optuna

from tuner.config.objective import Constraint, Objective
from tuner.errors import EvaluationError
from tuner.optuna_adapter import set_legacy_constraints
from tuner.study.trial.outcome import SOLVED_PREFIX, TrialOutcome, is_number
from tuner.study.trial.pruning import OOSBudgetExceeded

if TYPE_CHECKING:
    from tuner.study.gates.threshold import GateRange


@dataclass
class TrialScorer:
    """Scores a measured trial by the objective and constraints (module doc)."""

    objective: Objective = field(default_factory=Objective)
    constraints: Sequence[Constraint] = ()
    secondary: Objective | None = None  # a multi-objective study's second objective

    def solve(self, out: TrialOutcome, result: Any, solving: Mapping[str, GateRange]) -> tuple[Any, Any]:
        """Pick the solved gate values from the retrieval; the trial's metrics become those
        of the batch re-scored at those values. Returns the sweep and the re-scored batch."""
        from tuner.evaluation.regate import regate
        from tuner.study.gates.threshold import CONFIDENCE, MIN_SCORE, solve_batch

        sol = solve_batch(result, list(solving.values()), objective=self.objective.metric, constraints=self.constraints)
        # By role, not by key: the backend's own names for its gates do not matter here.
        solved = {name: sol.by_role[g.role] for name, g in solving.items()}
        out.assignment.update(solved)
        out.gates_moved = sol.moved or None
        # The report's sweep and PR plot cover the confidence gate's declared range and
        # the solved value itself (not a fixed grid the trial's own threshold may miss).
        conf = next((g for g in solving.values() if g.role == CONFIDENCE), None)
        gated = regate(
            result,
            confidence_threshold=sol.by_role.get(CONFIDENCE),
            min_score=sol.by_role.get(MIN_SCORE),
            sweep_range=None if conf is None else (conf.low, conf.high, conf.step or 0.01),
        )
        # One source for the score and the reports: the re-scored batch (equal to the
        # solver's values, tests/evaluation/test_regate.py); the solver adds what a batch lacks.
        out.metrics = {k: float(v) for k, v in gated.metrics.items() if is_number(v)}
        out.metrics.update({k: v for k, v in sol.metrics.items() if not k.startswith("n_") and k not in out.metrics})
        counts = {f"{SOLVED_PREFIX}{k}": v for k, v in sol.metrics.items() if k.startswith("n_")}
        # Kept in the metrics too, so a cache hit restores the solved values.
        out.metrics.update(counts | {SOLVED_PREFIX + n: float(v) for n, v in solved.items()})
        return sol.table, gated

    def complete(self, trial: optuna.Trial, out: TrialOutcome) -> None:
        if self.objective.metric not in out.metrics:
            raise EvaluationError(
                f"objective metric {self.objective.metric!r} is not in the evaluation's metrics"
                f" ({', '.join(sorted(out.metrics)[:8])}, ...); fix objective.metric in the experiment file"
            )
        out.value = out.metrics[self.objective.metric]
        if self.secondary is not None:
            if self.secondary.metric not in out.metrics:
                raise EvaluationError(
                    f"secondary_objective metric {self.secondary.metric!r} is not in the evaluation's metrics"
                    f" ({', '.join(sorted(out.metrics)[:8])}, ...);"
                    " fix secondary_objective.metric in the experiment file"
                )
            out.secondary_value = out.metrics[self.secondary.metric]
        constraints: dict[str, float] = {}
        for c in self.constraints:
            try:
                constraints[c.name] = float(c.violation(out.metrics))
            except KeyError as exc:
                raise EvaluationError(
                    f"constraint {c.name!r} needs metric {exc.args[0]!r}, which the evaluation does not report;"
                    " fix constraints in the experiment file"
                ) from exc
        # Both the optuna 5 API (read by the samplers and FrozenTrial.constraints) and the
        # legacy list optuna-dashboard 0.21 reads, on every COMPLETE path (cached too):
        # a COMPLETE trial without constraints would count as feasible.
        for name, value in constraints.items():
            trial.set_constraint(name, value)
        set_legacy_constraints(trial, list(constraints.values()))
        out.constraints = constraints
        out.state = "COMPLETE"

    def complete_early_stop(self, trial: optuna.Trial, out: TrialOutcome, exc: OOSBudgetExceeded) -> None:
        """A batch the OOS early stop ended: COMPLETE and infeasible, not PRUNED, so the
        dashboards mark it infeasible and the samplers' constraint models learn from it.
        The OOS constraint is valued at the rate's lower bound (already over its bound);
        other constraints, unmeasured, at 0; the value is the running mean of the queries
        measured (the ``early_stop`` attr says so)."""
        rate = float(exc.fp_rate_lower_bound)
        value = float(exc.running_mean)
        if value != value:  # no in-scope query measured yet: the worst value
            value = 0.0 if self.objective.maximize else float("inf")
        out.metrics = {"OOS_FP_Rate": rate, self.objective.metric: value}
        constraints: dict[str, float] = {}
        for c in self.constraints:
            metric = getattr(c, "metric", None) or c.name.split()[0]
            constraints[c.name] = float(c.violation({"OOS_FP_Rate": rate})) if metric == "OOS_FP_Rate" else 0.0
        for name, violation in constraints.items():
            trial.set_constraint(name, violation)
        set_legacy_constraints(trial, list(constraints.values()))
        out.state, out.value, out.constraints = "COMPLETE", value, constraints
        if self.secondary is not None:  # unmeasured: its worst (the trial is infeasible anyway)
            out.secondary_value = -math.inf if self.secondary.maximize else math.inf
        # short: a trial-table column; the trial note says the rest
        out.early_stop = f"OOS_FP_Rate >= {rate:.4g} after {exc.evaluated} queries"
        out.early_stop_detail = (
            f"{exc} (OOS_FP_Rate is at least {rate:.4g}; {self.objective.metric} {value:.4f} is "
            f"the running mean of the {exc.evaluated} queries measured)"
        )
