"""Pruning: query evaluations saved and final best, with vs without, same seeds.

Each configuration runs the same TPE study (seeded, demo configuration) over the fusion
space + confidence threshold under ``OOS_FP_Rate <= 0.10``. A trial's queries are fed
in an order shuffled per trial (tuner.study.trial.pruning.trial_order_seed) through the tuner's
``QueryReporter``, exactly as ``run_batch(on_result=...)`` feeds them in a study:

- none: every query of every trial is evaluated;
- oos-stop: the OOS early stop only (stop once more OOS queries were answered than the
  constraint allows);
- wilcoxon + oos-stop: per-query steps (stable query ids), WilcoxonPruner(p=0.1);
- median + oos-stop: running means per shard of 10 in-scope queries, MedianPruner.

"Query evaluations" counts the queries a trial had sent when it finished or stopped
(a live batch has up to ``concurrency`` more in flight). Medians over seeds.
Goal: >= 40% fewer query evaluations with the final best within 0.5% of no pruning.

    .venv/bin/python bench/pruning_bench.py [--datasets demo,cranfield] [--seeds 5] [--trials 40]
"""

from __future__ import annotations

import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

import optuna

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_common import (  # noqa: E402
    BASELINE,
    CONSTRAINT,
    OOS_BOUND,
    OosViolation,
    best_so_far,
    make_space,
    quiet,
    study_bench_args,
    table,
    tpe,
)
from cached_backend import CachedBackend, bundle  # noqa: E402

from tuner.study.trial.pruning import OOSBudget, QueryReporter, mode_for, query_steps, trial_order_seed  # noqa: E402

CONFIGS = ("none", "oos-stop", "wilcoxon+oos", "median+oos")


def pruner_for(config: str) -> optuna.pruners.BasePruner:
    if config.startswith("wilcoxon"):
        return optuna.pruners.WilcoxonPruner(p_threshold=0.1, n_startup_steps=2)
    if config.startswith("median"):
        return optuna.pruners.MedianPruner(n_startup_trials=5, n_warmup_steps=1)
    return optuna.pruners.NopPruner()


def run(cb: CachedBackend, work: Path, config: str, seed: int, n_trials: int) -> tuple[float, int]:
    """(final best feasible value, query evaluations) of one study."""
    space = make_space(work)
    steps = query_steps(cb.queries.query_ids)
    n_oos = len(cb.queries.oos())
    pruner = pruner_for(config)
    constraint = OosViolation()
    evaluations = 0

    def objective(trial: optuna.Trial) -> float:
        nonlocal evaluations
        assignment = space.suggest(trial)
        batch = cb.evaluate(assignment)
        rows = batch.per_query
        order = list(rows.index)
        random.Random(trial_order_seed(seed, trial.number)).shuffle(order)
        reporter = QueryReporter(trial, steps, mode=mode_for(pruner), shard_size=10,
                                 oos=OOSBudget(OOS_BOUND, n_oos) if config != "none" else None)
        try:
            for qid in order:
                reporter(qid, rows.loc[qid].to_dict())
        finally:
            evaluations += reporter.evaluated
        trial.set_constraint(CONSTRAINT, constraint.violation(batch.metrics))
        return batch.primary

    study = optuna.create_study(direction="maximize", sampler=tpe(seed), pruner=pruner)
    study.enqueue_trial(space.params_for(BASELINE))
    study.optimize(objective, n_trials=n_trials)
    return best_so_far(study.trials)[-1], evaluations


def bench_dataset(name: str, work: Path, seeds: int, n_trials: int) -> dict[str, tuple[float, float]]:
    started = time.perf_counter()
    cb = CachedBackend(bundle(name, work), work / f"{name}-index")
    results = {c: [run(cb, work, c, s, n_trials) for s in range(seeds)] for c in CONFIGS}
    full = n_trials * len(cb.queries)
    base_best = statistics.median(b for b, _ in results["none"])
    rows, out = [], {}
    for c in CONFIGS:
        best = statistics.median(b for b, _ in results[c])
        evals = statistics.median(e for _, e in results[c])
        per_seed = [f"{b:.4f}" for b, _ in results[c]]
        rows.append([c, evals, 1 - evals / full, best, best / base_best - 1, " ".join(per_seed)])
        out[c] = (1 - evals / full, best / base_best - 1)
    print(f"\n== {name}: {len(cb.queries)} queries ({len(cb.queries.oos())} OOS), {seeds} seeds x {n_trials} trials; "
          f"no pruning evaluates {full} queries per study")
    print(table(["pruning", "query evals", "saved", "final best", "vs none", "final best per seed"], rows))
    for c in CONFIGS[1:]:
        saved, delta = out[c]
        ok = saved >= 0.40 and delta >= -0.005
        print(f"GOAL {c}: {saved:.0%} fewer evaluations (>= 40%), final best {delta:+.2%} vs none (>= -0.5%) -> "
              f"{'MET' if ok else 'MISSED'}")
    print(f"[{name}] {time.perf_counter() - started:.0f} s")
    return out


def main() -> None:
    ap = study_bench_args(__doc__)
    args = ap.parse_args()
    quiet()
    with tempfile.TemporaryDirectory(prefix="pruning-bench-") as tmp:
        for name in args.datasets.split(","):
            bench_dataset(name, Path(tmp), args.seeds, args.trials)


if __name__ == "__main__":
    main()
