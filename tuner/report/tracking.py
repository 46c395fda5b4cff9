"""Experiment tracking in MLflow: `MlflowTracker` writes one parent run per study and
one nested child run per trial through an explicit `MlflowClient` (no global active-run
state, so nothing leaks between studies or tests). The interface it implements
(`Tracker`, `TrialRecord`, `NullTracker`) lives in `tuner.report.tracker`, the value
rules (names, params per component, run names, descriptions) in
`tuner.report.mlflow_values`; both are re-exported here. Written here rather than taken
from optuna-integration because its MLflowCallback is deprecated and logs neither
constraints nor artifacts.

What a user sees: the experiment opens on its runs (tag mlflow.experimentKind); a dict
or list param is one param per component; a child run is named after its trial and
score and describes itself with links (to its Optuna trial page); the parent run's
description summarises the study (`summarize_study`). Report files are hard-linked into
a local artifact store, so each exists once on disk (copied only across file systems or
to a remote store).

Everything the MlflowTracker logs passes tuner.secrets on the way: a param or tag under
a secret name is ``***``, other values lose URL passwords, secret query parameters and
the secret values this process has read; config texts lose the latter. The tracking
database and the run artifacts (mlflow.db and mlruns/ are 0644) never hold one.
"""

from __future__ import annotations

import math
import re
import time
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tuner import secrets
from tuner.dburl import redact, sqlalchemy_url
from tuner.errors import StudyError
from tuner.files import atomic_write_text, hard_link
from tuner.report.mlflow_values import (
    PARAM_VALUE_LIMIT,
    as_int,
    cap_text,
    default_artifact_root,
    flat_params,
    local_artifact_dir,
    mlflow_name,
    quote,
    run_note,
    safe_value,
    trial_run_name,
    ui_base,
)
from tuner.report.tracker import (
    EXPERIMENT_KIND,
    INTERRUPTED,
    TAG_CACHE_HIT,
    TAG_EXPERIMENT_KIND,
    TAG_FAIL_REASON,
    TAG_INTERRUPTED,
    TAG_NOTE,
    TAG_ROLE,
    TAG_STATE,
    TAG_STUDY,
    TAG_TRIAL,
    NullTracker,
    StaleRuns,
    Tracker,
    TrialRecord,
    TrialState,
)

__all__ = [
    "CLASSIC_VIEW",
    "EXPERIMENT_KIND",
    "INTERRUPTED",
    "PARAM_VALUE_LIMIT",
    "TAG_CACHE_HIT",
    "TAG_EXPERIMENT_KIND",
    "TAG_FAIL_REASON",
    "TAG_INTERRUPTED",
    "TAG_NOTE",
    "TAG_ROLE",
    "TAG_STATE",
    "TAG_STUDY",
    "TAG_TRIAL",
    "MlflowTracker",
    "NullTracker",
    "StaleRuns",
    "Tracker",
    "TrialRecord",
    "TrialState",
    "default_artifact_root",
    "flat_params",
    "mlflow_name",
    "safe_value",
    "trial_run_name",
]

#: The query every link into the MLflow UI carries. MLflow 3.17's UI picks its GenAI or
#: its machine-learning layout from the page's ``workflowType`` query parameter, else the
#: browser's stored choice (localStorage ``mlflow.workflowType``), by default GenAI -- not
#: from the experiment's mlflow.experimentKind tag: a run page opened from a plain link sat
#: under a GenAI "Evaluations" breadcrumb that leads to the evaluation-runs tab.
CLASSIC_VIEW = "?workflowType=machine_learning"
_PARENT_TAG = "mlflow.parentRunId"
_RUN_NAME_TAG = "mlflow.runName"  # MLflow renames a run from this tag
_MLFLOW_STATUS = {"COMPLETE": "FINISHED", "FAIL": "FAILED", "PRUNED": "KILLED"}


@dataclass
class _OpenRun:
    """What `finish_trial` needs of a run `start_trial` opened (saves a get_run)."""

    artifact_uri: str | None
    params: set[str]
    start_time: int | None = None  # ms since the epoch, as MLflow keeps it


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
        self._open: dict[str, _OpenRun] = {}  # run id -> what start_trial logged
        self._latest_trial = 0  # the highest trial number finished here: summarize_study's step
        # report files put into the artifact store: hard links, copies (log_artifact)
        self.report_files = {"linked": 0, "copied": 0}

    def _experiment_id(self) -> str:
        found = self.client.get_experiment_by_name(self.experiment_name)
        if found is not None:
            # The UI stores its guess (genai_development_inferred ...) when it opens an
            # experiment without the tag; a user's own choice stays.
            kind = found.tags.get(TAG_EXPERIMENT_KIND, "")
            if kind in ("", "no_inferred_type") or kind.endswith("_inferred"):
                self.client.set_experiment_tag(found.experiment_id, TAG_EXPERIMENT_KIND, EXPERIMENT_KIND)
            return str(found.experiment_id)
        # One folder per MLflow experiment under the artifact root (like MLflow's own
        # mlruns/<experiment id>/ layout), named after the experiment so it is found by eye.
        location = None
        if self.artifact_root is not None:
            folder = re.sub(r"[^\w.\-]", "_", self.experiment_name)
            location = (self.artifact_root / folder).resolve().as_uri()
        return str(
            self.client.create_experiment(
                self.experiment_name, artifact_location=location, tags={TAG_EXPERIMENT_KIND: EXPERIMENT_KIND}
            )
        )

    def experiment_url(self, base_url: str) -> str:
        """The experiment's runs table in the MLflow UI at ``base_url``."""
        return f"{ui_base(base_url)}#/experiments/{self.experiment_id}/runs{CLASSIC_VIEW}"

    def run_url(self, run_id: str, base_url: str) -> str:
        """Run ``run_id``'s page in the MLflow UI at ``base_url`` (e.g. http://127.0.0.1:5000/)."""
        return f"{ui_base(base_url)}#/experiments/{self.experiment_id}/runs/{run_id}{CLASSIC_VIEW}"

    def find_parent_run(self, study_name: str) -> str | None:
        """The parent run of ``study_name`` in this experiment, if one was created before."""
        runs = self.client.search_runs(
            [self.experiment_id],
            filter_string=f"tags.`{TAG_STUDY}` = '{quote(study_name)}' and tags.`{TAG_ROLE}` = 'study'",
            max_results=1,
            order_by=["attributes.start_time ASC"],
        )
        return runs[0].info.run_id if runs else None

    def delete_study_runs(self, study_name: str) -> int:
        """Delete (MLflow soft-delete) every run of ``study_name``: a fresh study of the
        same name then starts a new parent run. A run's artifacts in a local store are
        removed with it (MLflow's soft delete would keep their bytes on disk for good).
        Returns how many were deleted."""
        import shutil

        runs = self.client.search_runs(
            [self.experiment_id], filter_string=f"tags.`{TAG_STUDY}` = '{quote(study_name)}'", max_results=50000
        )
        for run in runs:
            self.client.delete_run(run.info.run_id)
            local = local_artifact_dir(run.info.artifact_uri)
            if local is not None and local.is_dir():
                shutil.rmtree(local, ignore_errors=True)
        return len(runs)

    def close_stale_runs(
        self, study_name: str, live_trials: Collection[int], finished: Mapping[int, TrialRecord] | None = None
    ) -> StaleRuns:
        """Close the MLflow runs of ``study_name`` that a killed run left RUNNING, and make
        the runs its finished trials lack, so MLflow agrees with the Optuna study.

        ``finished`` holds the study's finished trials by number, each as the record the
        live path logs (tuner.study.trial.tracking_record builds them from the Optuna trials).
        A RUNNING trial run whose trial number is not in ``live_trials`` (the trials a
        live process still runs) is completed from its record when ``finished`` has it:
        the killed process had told Optuna but not logged the run yet (that is
        bookkeeping, done after ``tell``), so it gets the params, metrics, verdict, files
        and status `finish_trial` gives it. Any other ends FAILED, tagged
        ``tuner.state=FAIL`` with the reason INTERRUPTED. A trial of ``finished`` with no
        run at all that began after the study's parent run was made (killed before its
        run was created) gets one, made from its record; one whose run an older tuner
        failed as interrupted has it completed from its record. When no trial is live, no
        process works on the study, so a RUNNING parent run is a killed run's too: it
        ends FAILED and its ``tuner.interrupted_runs`` tag counts the kill (the next
        `start_study` reopens it as every resume does). The parent this tracker opened
        itself is never closed here.
        """
        live = set(live_trials)
        finished = finished or {}
        recorded: dict[int, str] = {}
        interrupted: list[int] = []
        for run in self._running_runs(study_name, role="trial"):
            number = as_int(run.data.tags.get(TAG_TRIAL))
            if number is None or number in live:
                continue  # a live trial's, or not a run this tracker wrote
            record = finished.get(number)
            if record is not None:
                self.finish_trial(run.info.run_id, record)
                recorded[number] = record.state
                continue
            self._log(run.info.run_id, tags={TAG_STATE: "FAIL", TAG_FAIL_REASON: INTERRUPTED})
            self.client.set_terminated(run.info.run_id, status=_MLFLOW_STATUS["FAIL"])
            interrupted.append(number)
        repaired, created = self._settle_finished(study_name, finished, live) if finished else ({}, {})
        recorded.update(repaired)
        if not live:
            for run in self._running_runs(study_name, role="study"):
                if run.info.run_id == self.parent_run_id:
                    continue
                count = (as_int(run.data.tags.get(TAG_INTERRUPTED)) or 0) + 1
                self._log(run.info.run_id, tags={TAG_INTERRUPTED: str(count)})
                self.client.set_terminated(run.info.run_id, status=_MLFLOW_STATUS["FAIL"])
        return StaleRuns(recorded=recorded, created=created, interrupted=tuple(sorted(interrupted)))

    def _settle_finished(
        self, study_name: str, finished: Mapping[int, TrialRecord], live: Collection[int]
    ) -> tuple[dict[int, str], dict[int, str]]:
        """The runs of trials in ``finished`` that MLflow has wrong or lacks: a run an
        earlier start failed as interrupted although Optuna had finished its trial (the
        tuner did so before it completed such runs from the record) is completed from
        its record; a trial that recorded no run id, began after the study's parent run
        was made (a trial of the study before it was tracked here gets none) and has no
        run gets one. Returns (repaired, created), number -> state. Two searches and one
        per trial without a run id: a resumed study of hundreds of trials is not read
        back run by run."""
        parent = self.parent_run_id or self.find_parent_run(study_name)
        if parent is None:
            return {}, {}  # never tracked in this experiment
        repaired: dict[int, str] = {}
        for run in self.client.search_runs(
            [self.experiment_id],
            filter_string=(
                f"tags.`{TAG_STUDY}` = '{quote(study_name)}' and tags.`{TAG_ROLE}` = 'trial'"
                f" and attributes.status = 'FAILED' and tags.`{TAG_FAIL_REASON}` = '{quote(INTERRUPTED)}'"
            ),
            max_results=50000,
        ):
            number = as_int(run.data.tags.get(TAG_TRIAL))
            if number is not None and number in finished and number not in live:
                if not finished[number].fail_reason:
                    self.client.delete_tag(run.info.run_id, TAG_FAIL_REASON)  # it was not interrupted
                self.finish_trial(run.info.run_id, finished[number])
                repaired[number] = finished[number].state
        tracked_since = self.client.get_run(parent).info.start_time or 0
        created: dict[int, str] = {}
        for number in sorted(set(finished) - set(live) - set(repaired)):
            record = finished[number]
            if record.run_id is not None or record.started_ms is None or record.started_ms < tracked_since:
                continue
            if self.client.search_runs(
                [self.experiment_id],
                filter_string=(
                    f"tags.`{TAG_STUDY}` = '{quote(study_name)}' and tags.`{TAG_ROLE}` = 'trial'"
                    f" and tags.`{TAG_TRIAL}` = '{number}'"
                ),
                max_results=1,
            ):
                continue  # made after its record (the bookkeeping retries a run the store refused)
            run_id = self._create_trial_run(parent, study_name, number, record.params, start_time=record.started_ms)
            self.finish_trial(run_id, record)
            created[number] = record.state
        return repaired, created

    def _running_runs(self, study_name: str, *, role: str) -> list[Any]:
        return list(
            self.client.search_runs(
                [self.experiment_id],
                filter_string=(
                    f"tags.`{TAG_STUDY}` = '{quote(study_name)}' and tags.`{TAG_ROLE}` = '{role}'"
                    " and attributes.status = 'RUNNING'"
                ),
                max_results=50000,
            )
        )

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
            self._log(run_id, params=flat_params(params))
        else:
            self.client.update_run(run_id, status="RUNNING")
            for key, value in tags.items():
                self.client.set_tag(run_id, key, value)
        self.parent_run_id = run_id
        return run_id

    def start_trial(self, number: int, params: Mapping[str, Any], *, start_time: int | None = None) -> str:
        if self.parent_run_id is None or self.study_name is None:
            raise StudyError("MlflowTracker.start_trial called before start_study; call start_study first")
        return self._create_trial_run(self.parent_run_id, self.study_name, number, params, start_time=start_time)

    def _create_trial_run(
        self, parent_id: str, study_name: str, number: int, params: Mapping[str, Any], *, start_time: int | None = None
    ) -> str:
        """A RUNNING child run of ``parent_id`` for trial ``number`` with its params
        (``start_time``: ms since the epoch; default now)."""
        run = self.client.create_run(
            self.experiment_id,
            start_time=start_time,
            run_name=f"trial-{number}",
            tags={
                _PARENT_TAG: parent_id,
                TAG_STUDY: study_name,
                TAG_ROLE: "trial",
                TAG_TRIAL: str(number),
                TAG_STATE: "RUNNING",
            },
        )
        logged = flat_params(params, by_name=False)
        self._log(run.info.run_id, params=logged)
        self._open[run.info.run_id] = _OpenRun(run.info.artifact_uri, set(logged), run.info.start_time)
        return run.info.run_id

    def find_trial_run(self, number: int) -> str | None:
        """The RUNNING run of trial ``number`` under this study's parent run, if one was
        made: a `start_trial` that is tried again (its first answer lost with a server
        that stopped answering) reuses it instead of making a second run."""
        if self.parent_run_id is None or self.study_name is None:
            return None
        runs = self.client.search_runs(
            [self.experiment_id],
            filter_string=(
                f"tags.`{_PARENT_TAG}` = '{self.parent_run_id}' and tags.`{TAG_TRIAL}` = '{number}'"
                f" and tags.`{TAG_STUDY}` = '{quote(self.study_name)}' and attributes.status = 'RUNNING'"
            ),
            max_results=1,
        )
        return runs[0].info.run_id if runs else None

    def finish_trial(self, run_id: str | None, record: TrialRecord) -> None:
        """Log the record into the child run and close it: the params it lacks (e.g. the
        gates solved during the trial; a param logged at start keeps its value), metrics
        at step = trial number, tags, the description (summary and links), config
        texts, report files (hard links on a local store); its name after the trial and
        score (`trial_run_name`)."""
        if run_id is None:
            run_id = self.start_trial(record.number, record.params, start_time=record.started_ms)
        opened = self._open.pop(run_id, None) or self._opened_before(run_id)
        params = {k: v for k, v in flat_params(record.params, by_name=False).items() if k not in opened.params}
        tags = {TAG_STATE: record.state, **record.tags}
        if record.fail_reason:
            tags[TAG_FAIL_REASON] = secrets.redact_text(record.fail_reason)[:5000]
        note = run_note(record.summary, record.links)
        if note:
            tags[TAG_NOTE] = note
        # the run's name, set by its tag in the same log_batch (MLflow's stores rename a run
        # from it) rather than by a call of its own
        tags[_RUN_NAME_TAG] = trial_run_name(record.number, record.state, record.value, record.feasible)
        self._log(run_id, params=params, metrics=record.metrics, tags=tags, step=record.number)
        for name, text in record.config_texts.items():
            # as written (log_dict would sort keys and drop comments)
            self._log_text(run_id, opened.artifact_uri, secrets.scrub_known(text), name)
        self._log_reports(run_id, opened.artifact_uri, record.reports)
        # The run starts when its trial began (`start_trial`'s start_time) and ends its
        # duration later, not when its bookkeeping is done or a store that was down took
        # the calls: MLflow's Duration column then shows the trial's duration (as printed
        # and in trials.csv), not the time it waited for the trials around it.
        end_time = None
        if record.duration_s is not None and opened.start_time is not None:
            end_time = opened.start_time + round(record.duration_s * 1000)
        self.client.set_terminated(run_id, status=_MLFLOW_STATUS[record.state], end_time=end_time)
        self._latest_trial = max(self._latest_trial, record.number)

    def _opened_before(self, run_id: str) -> _OpenRun:
        """A run this tracker did not open (another process's): read it back."""
        run = self.client.get_run(run_id)
        return _OpenRun(run.info.artifact_uri, set(run.data.params), run.info.start_time)

    def _log_text(self, run_id: str, artifact_uri: str | None, text: str, name: str) -> None:
        """``text`` as the run's artifact ``name``, the file ``log_text`` would make: written
        straight into the run's folder when MLflow keeps its artifacts on this machine
        (``log_text`` writes a temporary folder and copies the file in: 7 ms of CPU a
        trial on the demo, this under 1 ms), else through ``log_text``."""
        local = local_artifact_dir(artifact_uri)
        relative = Path(name)
        if local is None or relative.is_absolute() or ".." in relative.parts:
            self.client.log_text(run_id, text, name)
            return
        atomic_write_text(local / relative, text, mode=0o644)

    def _log_reports(self, run_id: str, artifact_uri: str | None, reports: Mapping[str, Path]) -> None:
        """Report files under ``reports/`` of the run: a hard link to the trial's file
        when MLflow keeps the artifacts on this machine (one copy on disk), else -- a
        remote store, another file system -- a copy through log_artifact."""
        local = local_artifact_dir(artifact_uri)
        for path in map(Path, reports.values()):
            if not path.is_file():
                continue
            if local is not None and hard_link(path, local / "reports" / path.name):
                self.report_files["linked"] += 1
            else:
                self.client.log_artifact(run_id, str(path), "reports")
                self.report_files["copied"] += 1

    def log_study_files(self, folder: str, files: Sequence[Path]) -> None:
        """``files`` on the parent run under ``folder``: hard links on a local store (the
        study's reports folder holds each once), else copies through log_artifact.
        Nothing before `start_study`."""
        if self.parent_run_id is None:
            return
        local = local_artifact_dir(self.client.get_run(self.parent_run_id).info.artifact_uri)
        for path in map(Path, files):
            if not path.is_file():
                continue
            if local is None or not hard_link(path, local / folder / path.name):
                self.client.log_artifact(self.parent_run_id, str(path), folder)

    def summarize_study(
        self, *, note: str, metrics: Mapping[str, float], tags: Mapping[str, str], step: int | None = None
    ) -> None:
        """The parent run's description becomes ``note`` (a later call replaces it);
        ``metrics`` are logged at ``step`` (default: the highest trial number this
        tracker finished), so their history is kept and the runs table shows the latest;
        ``tags`` are set. Two log_batch calls; nothing before `start_study`."""
        if self.parent_run_id is None:
            return
        step = self._latest_trial if step is None else step
        self._log(self.parent_run_id, metrics=metrics, tags={**tags, TAG_NOTE: cap_text(note)}, step=step)

    def end_study(self, *, status: str, summary: Mapping[str, float]) -> None:
        if self.parent_run_id is None:
            return
        # At summarize_study's step: MLflow shows a metric's value at the highest step.
        self._log(self.parent_run_id, metrics=summary, step=self._latest_trial)
        self.client.set_terminated(self.parent_run_id, status=status)

    def _log(
        self,
        run_id: str,
        *,
        params: Mapping[str, str] | None = None,
        metrics: Mapping[str, float] | None = None,
        tags: Mapping[str, str] | None = None,
        step: int = 0,
    ) -> None:
        """``params``: made by `flat_params` (names and values already MLflow's)."""
        from mlflow.entities import Metric, Param, RunTag

        now = int(time.time() * 1000)
        metric_rows = [
            Metric(mlflow_name(k), float(v), now, step)
            for k, v in (metrics or {}).items()
            if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(float(v))
        ]
        param_rows = [Param(k, v) for k, v in (params or {}).items()]
        tag_rows = [RunTag(k, cap_text(safe_value(k, v))) for k, v in (tags or {}).items()]
        # One log_batch for all three kinds (each call is a transaction that reads the run
        # back first: three calls cost a trial three times that), split only where MLflow
        # caps a call: 100 params, 100 tags, 1000 entities in all.
        while metric_rows or param_rows or tag_rows:
            some_params, param_rows = param_rows[:100], param_rows[100:]
            some_tags, tag_rows = tag_rows[:100], tag_rows[100:]
            room = 1000 - len(some_params) - len(some_tags)
            some_metrics, metric_rows = metric_rows[:room], metric_rows[room:]
            self.client.log_batch(run_id, metrics=some_metrics, params=some_params, tags=some_tags)
