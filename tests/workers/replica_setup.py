"""The experiment file the worker tests run (`tuner worker` on the reference backend)."""

from __future__ import annotations

from pathlib import Path

from support.reference_experiment import write_reference_experiment


def write_experiment(root: Path, *, study: str, storage: str, n_trials: int) -> Path:
    """experiment.yaml in ``root``; data/ and backend/config.yaml are the caller's."""
    # constant_liar: workers sampling in parallel should not pick the same point.
    return write_reference_experiment(
        root, study=study, n_trials=n_trials, storage=storage,
        sampler={"type": "tpe", "seed": 3, "n_startup_trials": 2, "constant_liar": True},
        timeout_s=240, constraints=["OOS_FP_Rate <= 1.0"], baseline=True,
        target={"process": {"stop_timeout_s": 10}}, evaluation={"concurrency": 4},
    )
