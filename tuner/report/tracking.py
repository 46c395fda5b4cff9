"""Experiment tracking: one parent run per study, one nested child run per trial.

The study loop talks to a small `Tracker` interface; `MlflowTracker` writes MLflow
runs through an explicit `MlflowClient` (no global active-run state, so nothing leaks
between studies or tests), `NullTracker` records nothing. This is written here
rather than taken from optuna-integration because its MLflowCallback is deprecated and
logs neither constraints nor artifacts.

Everything the MlflowTracker logs passes tuner.secrets on the way: a param or tag under
a secret name is ``***``, other values lose URL passwords, secret query parameters and
the secret values this process has read; config texts lose the latter. The tracking
database and the run artifacts (mlflow.db and mlruns/ are 0644) never hold one.
"""

from __future__ import annotations

import math
import re
import time
from abc import ABC, abstractmethod
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from tuner import secrets
from tuner.dburl import redact, sqlalchemy_url
from tuner.errors import StudyError

TrialState = Literal["COMPLETE", "FAIL", "PRUNED"]

# Tags that tie runs to the Optuna study; `tuner dashboard` and tests search by them.
TAG_STUDY = "tuner.study_name"
TAG_ROLE = "tuner.role"
TAG_TRIAL = "tuner.trial_number"
TAG_STATE = "tuner.state"
TAG_FAIL_REASON = "tuner.fail_reason"
TAG_CACHE_HIT = "tuner.cache_hit"
TAG_INTERRUPTED = "tuner.interrupted_runs"
_PARENT_TAG = "mlflow.parentRunId"

_MLFLOW_STATUS = {"COMPLETE": "FINISHED", "FAIL": "FAILED", "PRUNED": "KILLED"}
_PARAM_VALUE_LIMIT = 6000
INTERRUPTED = "interrupted: the run that ran this trial was killed"


def mlflow_name(name: str) -> str:
    """A metric / param name MLflow accepts: '@' (as in NDCG@10) becomes '_at_', other
    characters outside MLflow's set become '_'."""
    return re.sub(r"[^/\w.\- :]", "_", name.replace("@", "_at_"))


@dataclass(frozen=True)
class TrialRecord:
    """Everything a tracker records about one finished trial."""

    number: int
    state: TrialState
    params: Mapping[str, Any]
    metrics: Mapping[str, float] = field(default_factory=dict)
    # artifact file name (e.g. "config/config.yaml") -> the exact text written
    config_texts: Mapping[str, str] = field(default_factory=dict)
    # kind (json, markdown, per_query_csv, pr_curve_png) -> file
    reports: Mapping[str, Path] = field(default_factory=dict)
    fail_reason: str | None = None
    tags: Mapping[str, str] = field(default_factory=dict)


class Tracker(ABC):
    """Where trial records go. One instance serves one study run."""

    @abstractmethod
    def start_study(self, study_name: str, *, params: Mapping[str, Any], tags: Mapping[str, str]) -> str | None:
        """Open (or, on resume, reopen) the study's parent run; returns its id."""

    @abstractmethod
    def start_trial(self, number: int, params: Mapping[str, Any]) -> str | None:
        """Open the child run of trial ``number``; returns its id (stored as a trial attr)."""

    @abstractmethod
    def finish_trial(self, run_id: str | None, record: TrialRecord) -> None:
        """Log a finished trial into the child run opened by `start_trial` and close it."""

    @abstractmethod
    def end_study(self, *, status: str, summary: Mapping[str, float]) -> None:
        """Close the parent run with the study's summary metrics."""

    def close_stale_runs(self, study_name: str, live_trials: Collection[int]) -> list[int]:
        """Close the runs a killed run left open (see MlflowTracker); returns the trial
        numbers closed. Trackers without runs have nothing to close."""
        return []

class NullTracker(Tracker):
    """Tracking switched off."""

    def start_study(self, study_name: str, *, params: Mapping[str, Any], tags: Mapping[str, str]) -> str | None:
        return None

    def start_trial(self, number: int, params: Mapping[str, Any]) -> str | None:
        return None

    def finish_trial(self, run_id: str | None, record: TrialRecord) -> None:
        return None

    def end_study(self, *, status: str, summary: Mapping[str, float]) -> None:
        return None

    def close_stale_runs(self, study_name: str, live_trials: Collection[int]) -> list[int]:
        return []


def default_artifact_root(uri: str) -> Path | None:
    """Artifacts next to a SQLite tracking database (``mlruns/`` for the default URI)."""
    prefix = "sqlite:///"
    if uri.startswith(prefix) and uri[len(prefix) :].startswith("/"):
        return Path(uri[len(prefix) :]).parent
    return None


class MlflowTracker(Tracker):
    """MLflow runs through an explicit client.

    ``artifact_root`` is where a newly created MLflow experiment keeps its artifacts
    (default: the directory of the SQLite database, i.e. ``mlruns/``).
    """

    def __init__(self, tracking_uri: str, experiment_name: str, *, artifact_root: Path | None = None) -> None:
        from mlflow import MlflowClient
        from mlflow.exceptions import MlflowException

        self._mlflow_error = MlflowException
        self.tracking_uri = tracking_uri
        self.experiment_name = experiment_name
        self.artifact_root = artifact_root or default_artifact_root(tracking_uri)
        if self.artifact_root is not None:
            self.artifact_root.mkdir(parents=True, exist_ok=True)
        try:
            # A bare postgresql:// would make SQLAlchemy pick psycopg 3, often not installed.
            self.client = MlflowClient(tracking_uri=sqlalchemy_url(tracking_uri))
            self.experiment_id = self._experiment_id()
        except MlflowException as exc:
            raise StudyError(
                f"MLflow tracking store {redact(tracking_uri)} cannot be opened:"
                f" {secrets.redact_text(exc.message.splitlines()[0])};"
                " fix tracking.mlflow_uri in the experiment file"
            ) from exc
        self.parent_run_id: str | None = None
        self.study_name: str | None = None

    def _experiment_id(self) -> str:
        found = self.client.get_experiment_by_name(self.experiment_name)
        if found is not None:
            return str(found.experiment_id)
        # One folder per MLflow experiment under the artifact root (like MLflow's own
        # mlruns/<experiment id>/ layout), named after the experiment so it is found by eye.
        location = None
        if self.artifact_root is not None:
            folder = re.sub(r"[^\w.\-]", "_", self.experiment_name)
            location = (self.artifact_root / folder).resolve().as_uri()
        return str(self.client.create_experiment(self.experiment_name, artifact_location=location))

    def find_parent_run(self, study_name: str) -> str | None:
        """The parent run of ``study_name`` in this experiment, if one was created before."""
        runs = self.client.search_runs(
            [self.experiment_id],
            filter_string=f"tags.`{TAG_STUDY}` = '{_quote(study_name)}' and tags.`{TAG_ROLE}` = 'study'",
            max_results=1,
            order_by=["attributes.start_time ASC"],
        )
        return runs[0].info.run_id if runs else None

    def delete_study_runs(self, study_name: str) -> int:
        """Delete (MLflow soft-delete) every run of ``study_name``: a fresh study of the
        same name then starts a new parent run. Returns how many were deleted."""
        runs = self.client.search_runs(
            [self.experiment_id], filter_string=f"tags.`{TAG_STUDY}` = '{_quote(study_name)}'", max_results=50000
        )
        for run in runs:
            self.client.delete_run(run.info.run_id)
        return len(runs)

    def close_stale_runs(self, study_name: str, live_trials: Collection[int]) -> list[int]:
        """Close the MLflow runs of ``study_name`` that a killed run left RUNNING.

        Every RUNNING trial run whose trial number is not in ``live_trials`` (the trials
        a live process still runs) ends FAILED, tagged ``tuner.state=FAIL`` with the
        reason INTERRUPTED; returns their trial numbers, ascending. When no trial is
        live, no process works on the study, so a RUNNING parent run is a killed run's
        too: it ends FAILED and its ``tuner.interrupted_runs`` tag counts the kill (the
        next `start_study` reopens it as every resume does). The parent this tracker
        opened itself is never closed here.
        """
        live = set(live_trials)
        closed: list[int] = []
        for run in self._running_runs(study_name, role="trial"):
            number = _as_int(run.data.tags.get(TAG_TRIAL))
            if number is None or number in live:
                continue  # a live trial's, or not a run this tracker wrote
            self._log(run.info.run_id, tags={TAG_STATE: "FAIL", TAG_FAIL_REASON: INTERRUPTED})
            self.client.set_terminated(run.info.run_id, status=_MLFLOW_STATUS["FAIL"])
            closed.append(number)
        if not live:
            for run in self._running_runs(study_name, role="study"):
                if run.info.run_id == self.parent_run_id:
                    continue
                count = (_as_int(run.data.tags.get(TAG_INTERRUPTED)) or 0) + 1
                self._log(run.info.run_id, tags={TAG_INTERRUPTED: str(count)})
                self.client.set_terminated(run.info.run_id, status=_MLFLOW_STATUS["FAIL"])
        return sorted(closed)

    def _running_runs(self, study_name: str, *, role: str) -> list[Any]:
        return list(self.client.search_runs(
            [self.experiment_id],
            filter_string=(f"tags.`{TAG_STUDY}` = '{_quote(study_name)}' and tags.`{TAG_ROLE}` = '{role}'"
                           " and attributes.status = 'RUNNING'"),
            max_results=50000,
        ))

    def start_study(self, study_name: str, *, params: Mapping[str, Any], tags: Mapping[str, str]) -> str:
        self.study_name = study_name
        tags = {key: safe_value(key, value) for key, value in tags.items()}
        run_id = self.find_parent_run(study_name)
        if run_id is None:
            run = self.client.create_run(
                self.experiment_id,
                run_name=study_name,
                tags={TAG_STUDY: study_name, TAG_ROLE: "study", **tags},
            )
            run_id = run.info.run_id
            # Params are immutable in MLflow: only the first run of a study logs them;
            # a resumed study with edited settings keeps them as (mutable) tags.
            self._log(run_id, params=params)
        else:
            self.client.update_run(run_id, status="RUNNING")
            for key, value in tags.items():
                self.client.set_tag(run_id, key, value)
        self.parent_run_id = run_id
        return run_id

    def start_trial(self, number: int, params: Mapping[str, Any]) -> str:
        if self.parent_run_id is None or self.study_name is None:
            raise StudyError("MlflowTracker.start_trial called before start_study; call start_study first")
        run = self.client.create_run(
            self.experiment_id,
            run_name=f"trial-{number}",
            tags={
                _PARENT_TAG: self.parent_run_id,
                TAG_STUDY: self.study_name,
                TAG_ROLE: "trial",
                TAG_TRIAL: str(number),
                TAG_STATE: "RUNNING",
            },
        )
        self._log(run.info.run_id, params=params, tuned=True)
        return run.info.run_id

    def finish_trial(self, run_id: str | None, record: TrialRecord) -> None:
        if run_id is None:
            run_id = self.start_trial(record.number, record.params)
        tags = {TAG_STATE: record.state, **record.tags}
        if record.fail_reason:
            tags[TAG_FAIL_REASON] = secrets.redact_text(record.fail_reason)[:5000]
        self._log(run_id, metrics=record.metrics, tags=tags, step=record.number)
        for name, text in record.config_texts.items():
            # log_text keeps the YAML exactly as written (log_dict would sort keys and
            # drop comments).
            self.client.log_text(run_id, secrets.scrub_known(text), name)
        for path in record.reports.values():
            if Path(path).is_file():
                self.client.log_artifact(run_id, str(path), "reports")
        self.client.set_terminated(run_id, status=_MLFLOW_STATUS[record.state])

    def end_study(self, *, status: str, summary: Mapping[str, float]) -> None:
        if self.parent_run_id is None:
            return
        self._log(self.parent_run_id, metrics=summary)
        self.client.set_terminated(self.parent_run_id, status=status)

    def _log(
        self,
        run_id: str,
        *,
        params: Mapping[str, Any] | None = None,
        metrics: Mapping[str, float] | None = None,
        tags: Mapping[str, str] | None = None,
        step: int = 0,
        tuned: bool = False,
    ) -> None:
        """``tuned``: ``params`` are a trial's parameters (see `safe_value`)."""
        from mlflow.entities import Metric, Param, RunTag

        now = int(time.time() * 1000)
        metric_rows = [
            Metric(mlflow_name(k), float(v), now, step)
            for k, v in (metrics or {}).items()
            if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(float(v))
        ]
        param_rows = [Param(mlflow_name(k), safe_value(k, v, by_name=not tuned)[:_PARAM_VALUE_LIMIT])
                      for k, v in (params or {}).items()]
        tag_rows = [RunTag(k, safe_value(k, v)) for k, v in (tags or {}).items()]
        # log_batch caps each call at 1000 metrics, 100 params and 100 tags.
        for start in range(0, len(metric_rows), 1000):
            self.client.log_batch(run_id, metrics=metric_rows[start : start + 1000])
        for start in range(0, len(param_rows), 100):
            self.client.log_batch(run_id, params=param_rows[start : start + 100])
        for start in range(0, len(tag_rows), 100):
            self.client.log_batch(run_id, tags=tag_rows[start : start + 100])


def safe_value(name: str, value: Any, *, by_name: bool = True) -> str:
    """A param or tag value as MLflow stores it: ``***`` under a secret name (tuner.secrets)
    when ``by_name``, else the text with URL passwords, secret query parameters and
    known secrets hidden. A trial's params are search-space names (``rerank.key_boost``
    is a tuned number): they go ``by_name=False``."""
    if by_name and secrets.is_secret_name(name):
        return secrets.REDACTED
    return secrets.redact_text(str(value))


def _as_int(text: str | None) -> int | None:
    try:
        return int(text) if text is not None else None
    except ValueError:
        return None


def _quote(value: str) -> str:
    return value.replace("'", "\\'")
