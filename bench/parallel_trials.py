"""Parallel trials on one backend: trials per hour with 1, 2 and 4 trials at a time.

    .venv/bin/python bench/parallel_trials.py [--trials 24] [--parallel 1,2,4] [--concurrency N] [--keep DIR]

On the demo in request mode (``target.channel: request``: every key of the demo's
search space bound under the reference backend's per-request ``overrides``, as
bench/trial_overhead.py's request mode; the result cache off so every trial runs) it
runs the same seeded study once per parallel count, side by side in one run, each on
a backend of its own started once (`tuner run --parallel N`, tuner.study.parallel).

Per count it prints the loop's wall time, trials per hour and the speed-up over one
at a time; the CPU seconds per trial of the backend process and of the tuner (its
threads and its report helper, sampled from /proc), the backend's CPU share (its CPU
seconds over the loop's wall time, in cores, and as a share of the machine); and how
busy the machine was (all that CPU over wall time x cores). Where the machine is busy
near 100 % more parallel trials cannot pay: that is where it saturates.

Value check: the sampler is random with a fixed seed, and a parallel run asks and
suggests its trials one at a time (tuner.study.parallel), so trial n gets the same
params at every count; each trial must score the same as at one at a time (a trial
the OOS early stop ended is compared by that verdict: its value is of the queries
answered by then, which the concurrency decides), and the best must be the same.

``evaluation.concurrency`` (the demo's 4, or ``--concurrency``) is the budget the
trials share: each batch sends up to ``concurrency // N`` queries at once.
Figures vary with load (the load average is printed before and after); the ratios are
measured side by side in the same run.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

import optuna

sys.path.insert(0, str(Path(__file__).resolve().parent))

from trial_overhead import CpuSampler, set_up

from tuner.config.experiment import load_experiment
from tuner.ops.run import run_experiment
from tuner.study.trial.attrs import ATTR_EARLY_STOP

BACKEND = "backend process(es)"


class MachineSampler:
    """The whole machine's CPU use (all processes, from /proc/stat) sampled every
    ``every_s``: ``busy(start, end)`` is the busy share of every core between two
    perf_counter times. It shows what this bench's processes cannot: the load of other
    jobs on a shared machine."""

    def __init__(self, every_s: float = 0.1) -> None:
        import threading

        self.every_s = every_s
        self.samples: list[tuple[float, int, int]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="bench-machine-sampler", daemon=True)

    def __enter__(self) -> MachineSampler:
        if Path("/proc/stat").exists():
            self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._thread.is_alive():
            self._stop.set()
            self._thread.join()

    def _run(self) -> None:
        import time

        while True:
            fields = [int(v) for v in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
            idle = fields[3] + fields[4]  # idle + iowait
            self.samples.append((time.perf_counter(), sum(fields) - idle, sum(fields)))
            if self._stop.wait(self.every_s):
                return

    def busy(self, start: float, end: float) -> float | None:
        inside = [s for s in self.samples if start <= s[0] <= end]
        if len(inside) < 2:
            return None
        (_, b0, t0), (_, b1, t1) = inside[0], inside[-1]
        return (b1 - b0) / (t1 - t0) if t1 > t0 else None


def experiment_for(request_path: Path, parallel: int, concurrency: int | None) -> Path:
    """The request-mode demo experiment with a study and state of its own, a seeded random sampler."""
    from ruamel.yaml import YAML

    yaml = YAML()
    doc = yaml.load(request_path.read_text())
    doc["study"] = f"demo-parallel-{parallel}"
    doc["state_dir"] = f".tuner-parallel-{parallel}"
    doc["sampler"] = {"type": "random", "seed": 7}
    if concurrency is not None:
        doc["evaluation"]["concurrency"] = concurrency
    path = request_path.with_name(f"experiment-parallel-{parallel}.yaml")
    with path.open("w") as fh:
        yaml.dump(doc, fh)
    return path


def measure(path: Path, parallel: int, n_trials: int) -> dict[str, Any]:
    exp = load_experiment(path)
    with CpuSampler() as sampler, MachineSampler() as machine:
        summary = run_experiment(exp, n_trials=n_trials, use_cache=False, parallel=parallel)
    if summary.error:
        raise SystemExit(f"study failed at --parallel {parallel}: {summary.error}")
    result = summary.result
    loop, n = result.elapsed_s, len(result.ran)
    cpu = sampler.per_window(result.ended_at - loop, result.ended_at)
    backend = cpu.get(BACKEND, 0.0)
    tuner = sum(v for g, v in cpu.items() if g != BACKEND and not g.startswith("("))
    trials = optuna.load_study(study_name=exp.study, storage=exp.storage).get_trials()
    values = {
        t.number: (
            tuple(sorted((k, repr(v)) for k, v in t.params.items())),
            "stopped early" if t.user_attrs.get(ATTR_EARLY_STOP) else t.value,
        )
        for t in trials
    }
    best = summary.best
    return {
        "n": n,
        "loop_s": loop,
        "per_hour": 3600 * n / loop,
        "backend_cpu": backend / n,
        "tuner_cpu": tuner / n,
        "backend_cores": backend / loop,
        "busy": (backend + tuner) / (loop * (os.cpu_count() or 1)),
        "machine": machine.busy(result.ended_at - loop, result.ended_at),
        "values": values,
        "best": (best.number, best.value) if best is not None else None,
        "concurrency": exp.evaluation.concurrency,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=24, help="trials of each count's study (default 24)")
    parser.add_argument("--parallel", default="1,2,4", help="the parallel counts, comma-separated (default 1,2,4)")
    parser.add_argument("--concurrency", type=int, help="evaluation.concurrency, the budget shared (default: 4)")
    parser.add_argument("--keep", type=Path, help="set up in this folder and keep it (default: a temp folder)")
    args = parser.parse_args()
    counts = [int(c) for c in args.parallel.split(",")]
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    from tuner.threads import limit_blas_threads

    limit_blas_threads()  # as `tuner run` does: the studies run in this process
    cores = os.cpu_count() or 1
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="parallel-trials-") as tmp:
        root = args.keep or Path(tmp)
        root.mkdir(parents=True, exist_ok=True)
        request = set_up(root, args.trials)["request"]
        runs = {n: measure(experiment_for(request, n, args.concurrency), n, args.trials) for n in counts}
    load_after = os.getloadavg()

    base = runs[counts[0]]
    budget = base["concurrency"]
    print(f"\n== trials per hour on one backend, request mode on the demo ({args.trials} trials each, cache off, "
          f"evaluation.concurrency {budget} shared; {cores} cores)")
    head = (f"  {'parallel':>8s} {'per batch':>9s} {'loop s':>8s} {'trials/h':>9s} {'speed-up':>8s} "
            f"{'backend CPU s/trial':>19s} {'backend cores':>13s} {'backend % of machine':>20s} "
            f"{'tuner CPU s/trial':>17s} {'ours busy':>9s} {'machine busy':>12s}  value check")
    print(head)
    for n, r in runs.items():
        same = [k for k, v in r["values"].items() if base["values"].get(k) == v]
        check = f"{len(same)}/{len(r['values'])} trials same params and score"
        if r["best"] is not None and base["best"] is not None:
            check += ", same best" if r["best"] == base["best"] else f", best #{r['best'][0]} (vs #{base['best'][0]})"
        print(f"  {n:8d} {max(1, budget // n):9d} {r['loop_s']:8.1f} {r['per_hour']:9.0f} "
              f"{r['per_hour'] / base['per_hour']:7.2f}x {r['backend_cpu']:19.3f} {r['backend_cores']:13.2f} "
              f"{100 * r['backend_cores'] / cores:19.0f}% {r['tuner_cpu']:17.3f} {100 * r['busy']:8.0f}% "
              f"{'?' if r['machine'] is None else format(100 * r['machine'], '.0f'):>11s}%  {check}")
    for n, r in runs.items():
        if r["best"] is not None:
            print(f"  best at --parallel {n}: trial #{r['best'][0]} = {r['best'][1]:.6f}")
    print(f"\nload average (1, 5, 15 min): before {load_before[0]:.2f} {load_before[1]:.2f} {load_before[2]:.2f}, "
          f"after {load_after[0]:.2f} {load_after[1]:.2f} {load_after[2]:.2f}")
    print("'ours busy': the backend's and the tuner's CPU over wall time x cores; 'machine busy': every process's"
          " (/proc/stat), other jobs included. The machine saturates where 'machine busy' nears 100 %: more trials"
          " at a time then only share the same cores (on a shared machine, partly by taking them from other jobs)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
