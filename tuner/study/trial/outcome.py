"""What one trial produced (`TrialOutcome`), the names its solved gates and threshold
sweep are kept under, and the helpers that turn its values into plain JSON."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from tuner.data.inputs import InputsFingerprint
from tuner.study import feasibility

SOLVED_PREFIX = "solved."  # metrics holding a solved gate's value and the sweep's counts
SWEEP_REPORT = "threshold_sweep_csv"  # TrialOutcome.reports key of the sweep table
SWEEP_FILE = "threshold_sweep.csv"
FUSION_SWEEP_REPORT = "fusion_sweep_csv"  # TrialOutcome.reports key of the replayed fusion settings
FUSION_SWEEP_FILE = "fusion_sweep.csv"
FUSION_PLOT_REPORT = "fusion_sweep_png"  # ... and of its plot
FUSION_PLOT_FILE = "fusion_sweep.png"


#: how a finished trial ended (what is told to Optuna)
FinishedState = Literal["COMPLETE", "FAIL", "PRUNED"]


@dataclass
class TrialOutcome:
    number: int
    state: FinishedState
    value: float | None = None
    # the experiment's secondary_objective (a multi-objective study), else None
    secondary_value: float | None = None
    assignment: dict[str, Any] = field(default_factory=dict)
    metrics: dict[str, float] = field(default_factory=dict)
    constraints: dict[str, float] = field(default_factory=dict)
    fail_reason: str | None = None
    cache_hit: bool = False
    # "cache miss: target.inputs changed (data/corpus.jsonl) since trial #3 ...", or why
    # a measured result was not stored; None on a hit or without a cache
    cache_note: str | None = None
    # the data it was measured on (or the cached result was): inputs digest, backend fingerprint
    inputs: InputsFingerprint | None = None
    backend_fingerprint: str | None = None
    interrupted: bool = False
    # the study's storage failed under it (tuner.study.trial.failures, kind "infrastructure"):
    # nothing is known about its config, so the loop queues its params again
    infrastructure: bool = False
    # the trial number its params were queued again as (an infrastructure failure retried,
    # tuner.study.storage.retry); it then counts in neither n_trials nor the failure budget
    retried_as: int | None = None
    # the Optuna params as suggested (what a retry queues again)
    suggested: dict[str, Any] = field(default_factory=dict)
    # why the batch stopped before its last query (the OOS early stop of an infeasible trial)
    early_stop: str | None = None
    early_stop_detail: str | None = None  # the whole story, for the trial's note
    reports: dict[str, str] = field(default_factory=dict)
    # how the backend came to serve the trial's config: "reload", "restart", or
    # "restart: <why not a reload>" (None: not measured)
    applied: str | None = None
    # the timed steps of the trial; "search" and "handle" are parts of "evaluate" (and of
    # a replay's "explain" / "verify"); "ask", "tell", "record" and "backlog" are the loop's
    # and the bookkeeping queue's, not in its duration (``duration_s``)
    phase_seconds: dict[str, float] = field(default_factory=dict)
    # fusion replay (tuner.study.trial.replay_measure): how the settings were chosen, how many were
    # scored, replayed vs live for each one verified; None: nothing replayed
    replay: dict[str, Any] | None = None
    # the best settings the replay scored exactly, each with its per-query scores at its solved
    # gates (setting, violation, objective, oos_answered): the cross-validation's candidates
    # (tuner.study.query_scores); None: nothing replayed
    replay_per_query: list[dict[str, Any]] | None = None
    # which constraint moved which solved gate away from the value it keeps otherwise (as
    # found), from what to what (tuner.study.gates.threshold.ThresholdSolution.moved); None: none did
    gates_moved: str | None = None

    @property
    def feasible(self) -> bool:
        return feasibility.feasible(self.state, self.constraints.values())

    @property
    def duration_s(self) -> float:
        """The trial's duration: see ``trial_seconds``."""
        return trial_seconds(self.phase_seconds)


#: phases in the phase record that are not part of a trial's duration: "search" and
#: "handle" are parts of "evaluate" / "explain" / "verify" (counted there); "ask" and
#: "tell" are the loop's Optuna calls around the trial, "record" its write of them, and
#: "backlog" the wait for room in the bookkeeping queue, i.e. time queued behind other
#: trials' reports.
NOT_IN_DURATION = frozenset({"search", "handle", "ask", "tell", "record", "backlog"})


def trial_seconds(phase_seconds: Mapping[str, float]) -> float:
    """A trial's duration, the one definition everywhere (the printed trial line,
    trials.csv ``duration_s``, the ``duration_s`` user attribute, the MLflow run's
    duration): the sum of its own timed steps -- begin (suggest, render, cache lookup),
    measure (patch, reload / restart and health wait, the search calls; a replay trial's
    explain, replay and verify) and end (score, solve, complete). Time it waits behind
    other trials is not in it: in the pipelined loop its begin and end run while its
    neighbours are measured, so a run's durations add up to more than its wall time by
    that overlap (docs/tuning.md, "A trial's duration")."""
    return float(sum(v for k, v in phase_seconds.items() if k not in NOT_IN_DURATION))


def is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def jsonable(value: Any) -> Any:
    """Optuna stores user attrs as JSON: turn tuples, paths and numpy scalars into plain values."""
    return json.loads(json.dumps(value, default=_default))


def _default(o: Any) -> Any:
    if isinstance(o, Path):
        return str(o)
    if hasattr(o, "item"):
        return o.item()
    if isinstance(o, (set, frozenset, tuple)):
        return list(o)
    return str(o)
