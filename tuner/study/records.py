"""A trial's record: everything ``tell`` must find on the Optuna trial (user attrs,
artifact names), then the bookkeeping queued on the `Bookkeeper` -- the config
snapshot and report files, the artifact bytes and the MLflow child run.

`TrialRecording` is mixed into `tuner.study.trial.TrialRunner`: it reads the runner's
fields annotated below and its ``_dir`` / ``_named_texts`` helpers.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import optuna

from tuner.files import atomic_write_text
from tuner.report.tracking import TAG_CACHE_HIT, Tracker, TrialRecord
from tuner.study.attrs import (
    ATTR_CACHE_HIT,
    ATTR_FAIL_REASON,
    ATTR_METRICS,
    ATTR_MLFLOW_RUN,
    ATTR_PHASES,
    ATTR_REPORTS,
)
from tuner.study.bookkeeping import Bookkeeper, OptunaArtifacts
from tuner.study.interfaces import BatchEvaluator
from tuner.study.outcome import SOLVED_PREFIX, SWEEP_FILE, SWEEP_REPORT, TrialOutcome, jsonable

ATTR_CACHE_NOTE = "cache_note"  # why a trial missed the cache, or why its result was not stored
ATTR_DATA_FINGERPRINT = "data_fingerprint"  # {"inputs": digest, "backend": fingerprint} it was measured on
TAG_CACHE_NOTE = "tuner.cache_note"
_REPORT_MAX_FILES = 20  # per-file digests in a report's context up to this many inputs


@dataclass
class _Pending:
    """What the bookkeeper needs to finish a trial after ``tell``."""

    number: int
    outcome: TrialOutcome
    texts: dict[Path, str]
    result: Any
    run_id: Future[Any] | None
    artifacts: dict[str, str]  # artifact id -> file it holds
    sweep: Any = None  # the threshold sweep table (pandas), when gates were solved


class TrialRecording:
    """The record and bookkeeping steps of `TrialRunner` (see the module docstring)."""

    # TrialRunner fields read here (background_seconds is filled on the bookkeeper thread)
    study_name: str
    evaluator: BatchEvaluator
    tracker: Tracker | None
    artifacts: OptunaArtifacts | None
    bookkeeper: Bookkeeper
    gates: Mapping[str, Any]
    background_seconds: dict[int, dict[str, float]]

    def _record(
        self, trial: optuna.Trial, out: TrialOutcome, texts: dict[Path, str], result: Any,
        run_id: Future[Any] | None, sweep: Any = None,
    ) -> None:
        """Everything ``tell`` must find on the trial, then queue the bookkeeping."""
        started = time.perf_counter()
        self._record_attrs(trial, out, texts, result, run_id, sweep)
        out.phase_seconds["record"] = time.perf_counter() - started

    def _record_attrs(
        self, trial: optuna.Trial, out: TrialOutcome, texts: dict[Path, str], result: Any,
        run_id: Future[Any] | None, sweep: Any = None,
    ) -> None:
        attrs: dict[str, Any] = {
            ATTR_METRICS: out.metrics,
            ATTR_CACHE_HIT: out.cache_hit,
            ATTR_REPORTS: out.reports,
            ATTR_PHASES: out.phase_seconds,
        }
        if out.metrics:
            attrs["judged@10"] = out.metrics.get("Judged@10")
            attrs["failed_queries"] = out.metrics.get("Failed_Queries")
        if out.fail_reason:
            attrs[ATTR_FAIL_REASON] = out.fail_reason
        attrs[ATTR_CACHE_NOTE] = out.cache_note
        attrs[ATTR_DATA_FINGERPRINT] = _data_fingerprint(out) or None
        if run_id is not None:
            # Created on the bookkeeper during restart and health wait: long done by now.
            attrs[ATTR_MLFLOW_RUN] = run_id.result()
        for key, value in attrs.items():
            if value is not None or key == ATTR_MLFLOW_RUN:
                trial.set_user_attr(key, jsonable(value))
        artifacts: dict[str, str] = {}
        if self.artifacts is not None and out.state == "COMPLETE":
            files = [self._dir(trial.number) / Path(n).name for n in self._named_texts(texts)]
            files += [Path(out.reports[k]) for k in ("json", "markdown", SWEEP_REPORT) if k in out.reports]
            artifacts = {self.artifacts.register(trial, f.name): str(f) for f in files}
        pending = _Pending(trial.number, out, texts, result, run_id, artifacts,
                           sweep if out.state == "COMPLETE" else None)
        self.bookkeeper.submit(f"bookkeeping of trial #{trial.number}", self._finish, pending)

    def _finish(self, p: _Pending) -> None:
        """On the bookkeeper: config snapshot and report files, artifact bytes, MLflow."""
        out, timings = p.outcome, self.background_seconds.setdefault(p.number, {})
        started = time.perf_counter()
        trial_dir = self._dir(p.number)
        named = self._named_texts(p.texts)
        if named:
            trial_dir.mkdir(parents=True, exist_ok=True)
            for name, text in named.items():
                atomic_write_text(trial_dir / Path(name).name, text, mode=0o600)  # the config may hold secrets
        if p.result is not None and out.state == "COMPLETE":
            context = {"study": self.study_name, "trial": p.number, "assignment": jsonable(out.assignment)}
            context.update(_data_context(out))
            solved = {n: out.metrics[SOLVED_PREFIX + n] for n in self.gates if SOLVED_PREFIX + n in out.metrics}
            if solved:
                context["solved_gates"] = solved
                context["solved_gates_note"] = (
                    "retrieved with these gates at the low end of their range, then solved client-side; "
                    f"this report is the batch re-scored at the solved values (every candidate: {SWEEP_FILE})")
            self.evaluator.write_reports(p.result, trial_dir, context=context, config_snapshot=self._snapshot(p.texts))
        if p.sweep is not None:
            trial_dir.mkdir(parents=True, exist_ok=True)
            atomic_write_text(trial_dir / SWEEP_FILE, p.sweep.to_csv(index=False))
        if self.artifacts is not None:
            for artifact_id, path in p.artifacts.items():
                if Path(path).is_file():
                    self.artifacts.write(artifact_id, Path(path))
        timings["report"] = time.perf_counter() - started
        if self.tracker is not None:
            started = time.perf_counter()
            run_id = p.run_id.result() if p.run_id is not None else None
            self.tracker.finish_trial(run_id, self._tracking_record(out, named))
            timings["track"] = time.perf_counter() - started

    def _tracking_record(self, out: TrialOutcome, named: Mapping[str, str]) -> TrialRecord:
        metrics = dict(out.metrics)
        if out.value is not None:
            metrics["objective"] = out.value
        metrics.update({f"constraint.{k}": v for k, v in out.constraints.items()})
        tags = {TAG_CACHE_HIT: str(out.cache_hit).lower(), "tuner.feasible": str(out.feasible).lower()}
        if out.cache_note:
            tags[TAG_CACHE_NOTE] = out.cache_note
        return TrialRecord(
            number=out.number,
            state=out.state,
            params=out.assignment,
            metrics=metrics,
            config_texts={f"config/{Path(n).name}": t for n, t in named.items()},
            reports={k: Path(v) for k, v in out.reports.items()},
            fail_reason=out.fail_reason,
            tags=tags,
        )

    def _snapshot(self, texts: Mapping[Path, str]) -> str:
        named = self._named_texts(texts)
        if len(named) == 1:
            return next(iter(named.values()))
        return "".join(f"# ---- {name}\n{text}" for name, text in named.items())


def _data_fingerprint(out: TrialOutcome) -> dict[str, str]:
    """The trial's user attr: the data it was measured on (or its cached result was)."""
    data = {}
    if out.inputs is not None:
        data["inputs"] = out.inputs.digest
    if out.backend_fingerprint is not None:
        data["backend"] = out.backend_fingerprint
    return data


def _data_context(out: TrialOutcome) -> dict[str, Any]:
    """What a trial's report says about the data and the cache (tuner.report context)."""
    context: dict[str, Any] = {}
    if out.cache_note:
        context["cache"] = out.cache_note
    if out.inputs is not None:
        context["inputs_digest"] = out.inputs.digest
        files = out.inputs.files
        context["inputs_files"] = dict(files) if len(files) <= _REPORT_MAX_FILES else f"{len(files)} files"
    if out.backend_fingerprint is not None:
        context["backend_fingerprint"] = out.backend_fingerprint
    return context
