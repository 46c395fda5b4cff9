"""Threshold solved per retrieval vs sampled: same or better best in fewer trials.

Two studies per seed with the same TPE configuration over the same space (fusion method,
RRF k, weights, normalisation, confidence threshold) under ``OOS_FP_Rate <= 0.10``:

- sampled: the sampler proposes the threshold like any other parameter;
- solved: the threshold is post-retrieval; each trial evaluates the whole range from
  its one retrieval (tuner.study.gates.threshold) and records the best feasible value.

Printed side by side (medians over seeds): best feasible score at equal trial counts,
and the trials each needs to reach 95% / 99% of the sampled study's final best.

    .venv/bin/python bench/threshold_bench.py [--datasets demo,cranfield] [--seeds 5] [--trials 40]
"""

from __future__ import annotations

import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_common import first_reaching, median_curve, quiet, run_study, study_bench_args, table, tpe  # noqa: E402
from cached_backend import CachedBackend, bundle  # noqa: E402

CHECKPOINTS = (5, 10, 15, 20, 30, 40, 60, 80)


def bench_dataset(name: str, work: Path, seeds: int, n_trials: int) -> dict[str, float]:
    started = time.perf_counter()
    cb = CachedBackend(bundle(name, work), work / f"{name}-index")
    curves: dict[str, list[list[float]]] = {"sampled": [], "solved": [], "solved+param": []}
    for seed in range(seeds):
        curves["sampled"].append(run_study(cb, tpe(seed), n_trials, solve_threshold=False, work=work))
        curves["solved"].append(run_study(cb, tpe(seed), n_trials, solve_threshold=True, work=work))
        curves["solved+param"].append(run_study(cb, tpe(seed), n_trials, solve_threshold=True, work=work,
                                                gate_as_param=True))
    med = {k: median_curve(v) for k, v in curves.items()}
    print(f"\n== {name}: {len(cb.queries)} queries, {seeds} seeds; median best feasible Primary_Metric_Score")
    print("(solved+param: the solved threshold also recorded as an Optuna param, as `tuner run` does for the"
          " dashboards, so the sampler's model sees it)")
    rows = [[n, med["sampled"][n - 1], med["solved"][n - 1], med["solved+param"][n - 1],
             med["solved"][n - 1] - med["sampled"][n - 1]]
            for n in CHECKPOINTS if n <= n_trials]
    print(table(["trials", "sampled", "solved", "solved+param", "solved-sampled"], rows))
    final = med["sampled"][n_trials - 1]
    out = {"sampled": final, "solved": med["solved"][n_trials - 1], "solved+param": med["solved+param"][n_trials - 1]}
    for share in (0.95, 0.99):
        target = share * final
        need = {k: [first_reaching(c, target) for c in v] for k, v in curves.items()}
        med_need = {k: _median_trials(v, n_trials) for k, v in need.items()}
        print(f"trials to reach {share:.0%} of the sampled study's final best ({target:.4f}): "
              f"sampled {need['sampled']} (median {med_need['sampled']}), solved {need['solved']} "
              f"(median {med_need['solved']}), solved+param {need['solved+param']} "
              f"(median {med_need['solved+param']})")
        out[f"trials_{int(share * 100)}_solved+param"] = med_need["solved+param"]
        out[f"trials_{int(share * 100)}_sampled"] = med_need["sampled"]
        out[f"trials_{int(share * 100)}_solved"] = med_need["solved"]
    ok = out["solved"] >= out["sampled"] and out["trials_99_solved"] <= out["trials_99_sampled"]
    print(f"GOAL same or better best in fewer trials: final {out['solved']:.4f} vs {out['sampled']:.4f}, "
          f"trials to 99% {out['trials_99_solved']} vs {out['trials_99_sampled']} -> {'MET' if ok else 'MISSED'}")
    print(f"[{name}] {time.perf_counter() - started:.0f} s")
    return out


def _median_trials(values: list[int | None], n_trials: int) -> float:
    """Median trials needed; a seed that never got there counts as n_trials + 1."""
    return statistics.median(v if v is not None else n_trials + 1 for v in values)


def main() -> None:
    ap = study_bench_args(__doc__)
    args = ap.parse_args()
    quiet()
    with tempfile.TemporaryDirectory(prefix="threshold-bench-") as tmp:
        results = {n: bench_dataset(n, Path(tmp), args.seeds, args.trials) for n in args.datasets.split(",")}
    print("\n== summary (medians)")
    print(table(["dataset", "final sampled", "final solved", "final solved+param", "trials to 99%: sampled",
                 "solved", "solved+param"],
                [[n, r["sampled"], r["solved"], r["solved+param"], r["trials_99_sampled"], r["trials_99_solved"],
                  r["trials_99_solved+param"]] for n, r in results.items()]))


if __name__ == "__main__":
    main()
