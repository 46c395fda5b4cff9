"""Shared pieces of the tuning benchmarks: the search space, studies over the cached
backend, best-so-far curves, the dense grid's optimum, and printing medians.

The search space is the reference backend's fusion space (method, RRF k, weights,
normalisation) plus the confidence threshold, under the constraint
``OOS_FP_Rate <= 0.10``: the space a user of the demo tunes first. It is loaded with
the tuner's own ``tuner.config.space`` so sampling and encodings are the study's.
"""

from __future__ import annotations

import argparse
import math
import statistics
import warnings
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import optuna

from tuner.config.space.loading import load_space
from tuner.config.space.searchspace import SearchSpace
from tuner.study.gates.threshold import CONFIDENCE_PARAM, GateRange, Retrieval, solve

OOS_BOUND = 0.10
CONSTRAINT = f"OOS_FP_Rate <= {OOS_BOUND}"
THRESHOLD = GateRange(CONFIDENCE_PARAM, 0.0, 0.9, 0.01)

SPACE_YAML = """
params:
  fusion.method: {type: categorical, choices: [rrf, linear]}
  fusion.rrf_k: {type: int, low: 1, high: 200, log: true, when: {fusion.method: rrf}}
  fusion.weights: {type: simplex, components: [bm25, dense]}
  fusion.normalization: {type: categorical, choices: [minmax, z], when: {fusion.method: linear}}
%s
"""
THRESHOLD_YAML = "  confidence.threshold: {type: float, low: 0.0, high: 0.9, step: 0.01}"

# The demo's shortlist (experiments/shortlist_reference.yaml) restricted to this space.
SHORTLIST: list[dict[str, Any]] = [
    {"fusion.method": "rrf", "fusion.rrf_k": 20, "fusion.weights": {"bm25": 0.7, "dense": 0.3}},
    {"fusion.method": "rrf", "fusion.rrf_k": 60, "fusion.weights": {"bm25": 0.3, "dense": 0.7}},
    {"fusion.method": "linear", "fusion.normalization": "minmax", "fusion.weights": {"bm25": 0.5, "dense": 0.5}},
    {"confidence.threshold": 0.7},
]
BASELINE: dict[str, Any] = {"fusion.method": "rrf", "fusion.rrf_k": 60, "fusion.weights": {"bm25": 0.5, "dense": 0.5},
                            "confidence.threshold": 0.6}


class OosViolation:
    """``OOS_FP_Rate <= OOS_BOUND`` as a plain callable (the solver calls it per row)."""

    def violation(self, metrics: Mapping[str, float]) -> float:
        return float(metrics["OOS_FP_Rate"]) - OOS_BOUND


def make_space(work: Path, *, with_threshold: bool = True) -> SearchSpace:
    path = work / ("space.yaml" if with_threshold else "space_no_threshold.yaml")
    path.write_text(SPACE_YAML % (THRESHOLD_YAML if with_threshold else ""))
    return load_space(path)


def study_bench_args(doc: str) -> argparse.ArgumentParser:
    """The options every study benchmark takes (sampler, threshold, pruning), same defaults."""
    ap = argparse.ArgumentParser(description=doc.splitlines()[0])
    ap.add_argument("--datasets", default="demo,cranfield")
    ap.add_argument("--seeds", type=int, default=5)
    ap.add_argument("--trials", type=int, default=40)
    return ap


def quiet() -> None:
    optuna.logging.set_verbosity(optuna.logging.ERROR)
    warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)


def tpe(seed: int) -> optuna.samplers.BaseSampler:
    """The configured sampler of the demo experiment (experiments/demo.yaml)."""
    from tuner.config.sampling import TPESamplerConfig

    return TPESamplerConfig(seed=seed, multivariate=True, n_startup_trials=6).create()


def best_so_far(trials: Sequence[optuna.trial.FrozenTrial]) -> list[float]:
    """Best feasible value after each trial (NaN until a feasible trial exists)."""
    best, out = -math.inf, []
    for t in sorted(trials, key=lambda t: t.number):
        if t.state == optuna.trial.TrialState.COMPLETE and all(v <= 0 for v in t.constraints.values()):
            best = max(best, t.value)
        out.append(best if best > -math.inf else math.nan)
    return out


def full_assignment(partial: Mapping[str, Any]) -> dict[str, Any]:
    out = dict(BASELINE)
    out.update(partial)
    if out["fusion.method"] == "linear":
        out.pop("fusion.rrf_k", None)
        out.setdefault("fusion.normalization", "minmax")
    return out


def grid_optimum(evaluate_retrieval: Callable[[dict[str, Any]], Any], *, k_values: int = 16,
                 w_values: int = 21) -> tuple[float, dict[str, Any], int]:
    """The best feasible value of a dense grid: RRF k (log-spaced) x bm25 share, and
    linear {minmax, z} x bm25 share, with the threshold solved exactly per grid point
    (tuner.study.gates.threshold; exact because the threshold gates a fixed retrieval)."""
    ks = sorted({int(round(v)) for v in np.geomspace(1, 200, k_values)})
    ws = np.round(np.linspace(0.0, 1.0, w_values), 4)
    points: list[dict[str, Any]] = []
    for w in ws:
        weights = {"bm25": float(w), "dense": float(round(1 - w, 4))}
        points += [{"fusion.method": "rrf", "fusion.rrf_k": k, "fusion.weights": weights} for k in ks]
        points += [{"fusion.method": "linear", "fusion.normalization": n, "fusion.weights": weights}
                   for n in ("minmax", "z")]
    best, arg = -math.inf, {}
    for point in points:
        value, threshold = solved_value(evaluate_retrieval(point))
        if value > best:
            best, arg = value, {**point, CONFIDENCE_PARAM: threshold}
    return best, arg, len(points)


def solved_value(batch: Any) -> tuple[float, float]:
    """(best feasible objective, its threshold) of one retrieval; -inf when infeasible."""
    sol = solve(Retrieval.from_batch(batch), [THRESHOLD], constraints=[OosViolation()])
    return (sol.objective if sol.feasible else -math.inf), sol.values[CONFIDENCE_PARAM]


def median_curve(curves: Sequence[Sequence[float]]) -> list[float]:
    n = min(len(c) for c in curves)
    return [statistics.median(_finite(c[i]) for c in curves) for i in range(n)]


def _finite(v: float) -> float:
    return v if not math.isnan(v) else 0.0


def first_reaching(curve: Sequence[float], target: float) -> int | None:
    """1-based trial count at which ``curve`` first reaches ``target`` (None: never)."""
    return next((i + 1 for i, v in enumerate(curve) if not math.isnan(v) and v >= target), None)


def table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    cells = [[_fmt(v) for v in row] for row in rows]
    widths = [max([len(h), *(len(r[i]) for r in cells)]) for i, h in enumerate(headers)]
    line = lambda vals: "  ".join(v.rjust(w) for v, w in zip(vals, widths))  # noqa: E731
    return "\n".join([line(headers), line(["-" * w for w in widths]), *(line(r) for r in cells)])


def _fmt(v: Any) -> str:
    if isinstance(v, float):
        return "-" if math.isnan(v) else f"{v:.4f}"
    return str(v)


def run_study(cb: Any, sampler: optuna.samplers.BaseSampler, n_trials: int, *, solve_threshold: bool,
              work: Path, gate_as_param: bool = False) -> list[float]:
    """Best-so-far curve of one study over the cached backend.

    ``solve_threshold``: the threshold is declared post-retrieval (as in
    search_space/reference_full.yaml), so the sampler proposes only the retrieval
    params and each trial's value is the best feasible threshold of its retrieval;
    otherwise the sampler proposes the threshold like any other parameter.
    ``gate_as_param``: the solved threshold is recorded as an Optuna param under its declared
    distribution, as the trial runner does for the dashboards (tuner.study.trial.applied_params),
    so the sampler's model sees it too.
    """
    from optuna.distributions import FloatDistribution

    from tuner.study.trial.applied_params import record_applied_params

    declared = {CONFIDENCE_PARAM: FloatDistribution(THRESHOLD.low, THRESHOLD.high, step=THRESHOLD.step)}
    space = make_space(work, with_threshold=not solve_threshold)
    constraint = OosViolation()

    def objective(trial: optuna.Trial) -> float:
        assignment = space.suggest(trial)
        if solve_threshold:
            batch = cb.evaluate({**assignment, CONFIDENCE_PARAM: 0.0})
            sol = solve(Retrieval.from_batch(batch), [THRESHOLD], constraints=[constraint])
            trial.set_user_attr(CONFIDENCE_PARAM, sol.values[CONFIDENCE_PARAM])
            if gate_as_param:
                record_applied_params(trial, {CONFIDENCE_PARAM: sol.values[CONFIDENCE_PARAM]}, declared)
            trial.set_constraint(CONSTRAINT, sol.violation)
            return sol.objective
        result = cb.evaluate(assignment)
        trial.set_constraint(CONSTRAINT, constraint.violation(result.metrics))
        return result.primary

    study = optuna.create_study(direction="maximize", sampler=sampler)
    baseline = {k: v for k, v in BASELINE.items() if k in {p.name for p in space.params}}
    study.enqueue_trial(space.params_for(baseline))  # a real study always starts from the baseline
    study.optimize(objective, n_trials=n_trials)
    return best_so_far(study.trials)
