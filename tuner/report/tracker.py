"""The tracking interface the study loop talks to: one parent run per study, one child
run per trial, described by a `TrialRecord`. `NullTracker` records nothing;
`tuner.report.tracking.MlflowTracker` writes MLflow runs (that module re-exports
everything here, so ``from tuner.report.tracking import Tracker`` keeps working).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

TrialState = Literal["COMPLETE", "FAIL", "PRUNED"]

# Tags that tie runs to the Optuna study; `tuner dashboard` and tests search by them.
TAG_STUDY = "tuner.study_name"
TAG_ROLE = "tuner.role"
TAG_TRIAL = "tuner.trial_number"
TAG_STATE = "tuner.state"
TAG_FAIL_REASON = "tuner.fail_reason"
TAG_CACHE_HIT = "tuner.cache_hit"
TAG_INTERRUPTED = "tuner.interrupted_runs"
# MLflow's own tags: a run's (or experiment's) description, and the experiment kind
# that decides whether the UI opens an experiment on its runs or its GenAI overview.
TAG_NOTE = "mlflow.note.content"
TAG_EXPERIMENT_KIND = "mlflow.experimentKind"
EXPERIMENT_KIND = "custom_model_development"

INTERRUPTED = "interrupted: the run that ran this trial was killed"


@dataclass(frozen=True)
class TrialRecord:
    """Everything a tracker records about one finished trial."""

    number: int
    state: TrialState
    # config key -> value; a dict or list value is logged per component
    # (fusion.weights.bm25, fallback.windows_days.0)
    params: Mapping[str, Any]
    metrics: Mapping[str, float] = field(default_factory=dict)
    # artifact file name (e.g. "config/config.yaml") -> the exact text written
    config_texts: Mapping[str, str] = field(default_factory=dict)
    # kind (json, markdown, per_query_csv, pr_curve_png) -> file
    reports: Mapping[str, Path] = field(default_factory=dict)
    fail_reason: str | None = None
    tags: Mapping[str, str] = field(default_factory=dict)
    # the trial's objective value and feasibility: they go into the run name
    value: float | None = None
    feasible: bool | None = None
    # label -> URL (e.g. "Optuna trial page"), written as Markdown links under `summary`
    # into the run's description
    links: Mapping[str, str] = field(default_factory=dict)
    summary: str | None = None  # short Markdown, the top of the run's description
    # the trial's duration (tuner.study.trial.outcome.trial_seconds): the run ends this long after it started
    duration_s: float | None = None
    # When it began (ms since the epoch; a run made for it after the fact starts then: the
    # live path's start, or read back from a finished trial by tuner.study.trial.tracking_record),
    # and the run id it recorded (None: it recorded none, e.g. the store failed when the run
    # was to be made)
    started_ms: int | None = None
    run_id: str | None = None


@dataclass(frozen=True)
class StaleRuns:
    """What `Tracker.close_stale_runs` did, by trial number."""

    # a run left RUNNING (or failed as interrupted by an older tuner) whose trial Optuna
    # finished, completed from the trial's record (number -> its state)
    recorded: Mapping[int, str] = field(default_factory=dict)
    # a finished trial that had no run: one made from its record (number -> its state)
    created: Mapping[int, str] = field(default_factory=dict)
    # a run left RUNNING by a trial that never finished: FAILED as INTERRUPTED (ascending)
    interrupted: tuple[int, ...] = ()

    def __bool__(self) -> bool:
        return bool(self.recorded or self.created or self.interrupted)


class Tracker(ABC):
    """Where trial records go. One instance serves one study run."""

    @abstractmethod
    def start_study(self, study_name: str, *, params: Mapping[str, Any], tags: Mapping[str, str]) -> str | None:
        """Open (or, on resume, reopen) the study's parent run; returns its id."""

    @abstractmethod
    def start_trial(self, number: int, params: Mapping[str, Any], *, start_time: int | None = None) -> str | None:
        """Open the child run of trial ``number``; returns its id (stored as a trial attr).
        ``start_time``: when the trial began (ms since the epoch; default now), which is
        when its run starts however late the store gets the call."""

    @abstractmethod
    def finish_trial(self, run_id: str | None, record: TrialRecord) -> None:
        """Log a finished trial into the child run opened by `start_trial` and close it."""

    @abstractmethod
    def summarize_study(
        self, *, note: str, metrics: Mapping[str, float], tags: Mapping[str, str], step: int | None = None
    ) -> None:
        """Describe the study on its parent run: ``note`` (Markdown) replaces the run's
        description, ``metrics`` and ``tags`` are logged. Cheap and idempotent: call it
        after every trial and at the end."""

    @abstractmethod
    def end_study(self, *, status: str, summary: Mapping[str, float]) -> None:
        """Close the parent run with the study's summary metrics."""

    def close_stale_runs(
        self, study_name: str, live_trials: Collection[int], finished: Mapping[int, TrialRecord] | None = None
    ) -> StaleRuns:
        """Close the runs a killed run left open (see MlflowTracker): a trial in
        ``finished`` (the study's finished trials, their records as the live path
        builds them) is completed from its record, and gets a run if it has none; any
        other trial not in ``live_trials`` fails as interrupted. Trackers without runs
        have nothing to close."""
        return StaleRuns()

    def log_study_files(self, folder: str, files: Sequence[Path]) -> None:
        """Put ``files`` on the study's parent run under artifact folder ``folder`` (e.g.
        ``study/report.md``), each under its own name; a later call replaces a file of
        the same name. Trackers without runs keep nothing."""
        return None

    def run_url(self, run_id: str, base_url: str) -> str | None:
        """The page of run ``run_id`` in the tracking UI at ``base_url``; None without one."""
        return None

    def close(self) -> str | None:
        """The end of the run: wait (bounded) for calls still under way; one line naming
        what the store did not get, or None. Trackers that call the store inline have
        nothing left to wait for (see tuner.report.resilient)."""
        return None

    def experiment_url(self, base_url: str) -> str | None:
        """The runs table of this tracker's experiment in the UI at ``base_url``; None without one."""
        return None


class NullTracker(Tracker):
    """Tracking switched off."""

    def start_study(self, study_name: str, *, params: Mapping[str, Any], tags: Mapping[str, str]) -> str | None:
        return None

    def start_trial(self, number: int, params: Mapping[str, Any], *, start_time: int | None = None) -> str | None:
        return None

    def finish_trial(self, run_id: str | None, record: TrialRecord) -> None:
        return None

    def summarize_study(
        self, *, note: str, metrics: Mapping[str, float], tags: Mapping[str, str], step: int | None = None
    ) -> None:
        return None

    def end_study(self, *, status: str, summary: Mapping[str, float]) -> None:
        return None

    def close_stale_runs(
        self, study_name: str, live_trials: Collection[int], finished: Mapping[int, TrialRecord] | None = None
    ) -> StaleRuns:
        return StaleRuns()
