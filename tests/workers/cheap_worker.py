"""A worker process with a cheap objective (a pure function of the params that sleeps),
used by the multi-worker tests before / besides the real trial runner.

Every trial logs ``start N PID`` and ``end N PID`` lines (O_APPEND, one write each), so
the test can tell which process ran which trial number and how often.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import optuna

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/: run as a script, support.* is not on the path

from support.workers import ObjectiveRunner  # noqa: E402

from tuner.config.workers import WorkerSettings  # noqa: E402
from tuner.study.loop import StudyLoop  # noqa: E402
from tuner.study.storage.queue import Variant, enqueue_initial, enqueue_once  # noqa: E402
from tuner.study.storage.study_storage import make_storage  # noqa: E402
from tuner.study.trial.attrs import ATTR_ASSIGNMENT, set_record  # noqa: E402

VARIANTS = [Variant("baseline", {"x": 0.5, "y": 1}), Variant("shortlist-1", {"x": 0.25, "y": 3})]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--storage", required=True)
    ap.add_argument("--study", required=True)
    ap.add_argument("--log", required=True)
    ap.add_argument("--n-trials", type=int, required=True)
    ap.add_argument("--replica", type=int, required=True)
    ap.add_argument("--sleep", type=float, default=0.2)
    ap.add_argument("--heartbeat", type=int, default=1)
    ap.add_argument("--grace", type=int, default=2)
    args = ap.parse_args()
    optuna.logging.set_verbosity(optuna.logging.WARNING)

    storage = make_storage(args.storage, WorkerSettings(heartbeat_interval_s=args.heartbeat, grace_period_s=args.grace))
    study = optuna.load_study(study_name=args.study, storage=storage,
                              sampler=optuna.samplers.TPESampler(seed=args.replica, constant_liar=True))
    enqueue_once(study, lambda s: enqueue_initial(s, VARIANTS))

    def log(line: str) -> None:
        fd = os.open(args.log, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, (line + "\n").encode())
        finally:
            os.close(fd)

    def objective(trial: optuna.Trial) -> float:
        x = trial.suggest_float("x", 0.0, 1.0)
        y = trial.suggest_int("y", 1, 5)
        set_record(trial, ATTR_ASSIGNMENT, {"x": x, "y": y})  # as the trial runner does after suggest
        log(f"start {trial.number} {os.getpid()} {args.replica}")
        time.sleep(args.sleep)
        log(f"end {trial.number} {os.getpid()} {args.replica}")
        return -((x - 0.3) ** 2) - 0.01 * (y - 2) ** 2

    StudyLoop(study, ObjectiveRunner(objective), study_total=args.n_trials, replica=args.replica).run(
        n_trials=None, timeout=None)


if __name__ == "__main__":
    main()
