"""One trial: suggest -> render -> cache lookup -> patch -> restart -> health ->
evaluate -> reports -> record.

`TrialRunner.run(trial)` never lets an expected failure escape: a backend that never
becomes healthy, a crash, too many failed queries or an interrupt all end as a FAIL
outcome with a one-line reason (the study loop then applies its failure budget).
Only a second Ctrl-C (KeyboardInterrupt) propagates, after the trial is recorded.

The collaborators are small interfaces so this module is tested with real Optuna
trials and a fake evaluator at the edge: `ConfigWriter` (render and write the
patched config files), a `Target`, a health wait callable and a `BatchEvaluator`.
"""

from __future__ import annotations

import json
import mimetypes
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Protocol

import optuna

from tuner import analysis as A
from tuner.errors import BackendExited, EvaluationError, HealthTimeout, TargetError, TunerError
from tuner.result_cache import CachedResult, ResultCache, cache_key
from tuner.tracking import TAG_CACHE_HIT, Tracker, TrialRecord

Phase = Literal["suggest", "render", "cache", "patch", "restart", "health", "evaluate", "report", "track"]
PHASES: tuple[Phase, ...] = ("suggest", "render", "cache", "patch", "restart", "health", "evaluate", "report", "track")
LEGACY_CONSTRAINTS_ATTR = "constraints"  # the system attr optuna-dashboard 0.21 reads


# ------------------------------------------------------------------- interfaces


class SpaceLike(Protocol):
    def suggest(self, trial: optuna.Trial) -> dict[str, Any]: ...


class ConfigWriter(Protocol):
    """Renders an assignment into config text(s) and writes them (atomic, journaled)."""

    def render(self, assignment: Mapping[str, Any]) -> dict[Path, str]: ...

    def write(self, texts: Mapping[Path, str]) -> None: ...


class EvalOutcome(Protocol):
    """What the study needs from a batch evaluation result."""

    metrics: Mapping[str, float]


class BatchEvaluator(Protocol):
    """The batch evaluation of the live backend plus its reports.

    The three fingerprints (query set content, labels, evaluation settings) are part
    of the result-cache key.
    """

    dataset_hash: str
    labels_fingerprint: str
    spec_fingerprint: str

    def evaluate(self, *, order_seed: int, on_result: Callable[[Any], None]) -> EvalOutcome: ...

    def write_reports(
        self, result: EvalOutcome, out_dir: Path, *, context: Mapping[str, Any], config_snapshot: str
    ) -> Mapping[str, Path]: ...


@dataclass(frozen=True)
class Constraint:
    """``violation(metrics) <= 0`` means satisfied (Optuna's convention)."""

    name: str
    violation: Callable[[Mapping[str, float]], float]


@dataclass(frozen=True)
class Objective:
    metric: str = "Primary_Metric_Score"
    maximize: bool = True


class StopFlag:
    """Set by a signal handler; checked between phases. Thread-safe."""

    def __init__(self) -> None:
        self._event = threading.Event()
        self.reason = "interrupted"

    def set(self, reason: str = "interrupted") -> None:
        self.reason = reason
        self._event.set()

    def is_set(self) -> bool:
        return self._event.is_set()


class TrialInterrupted(TunerError):
    """A stop was requested before the trial reached its evaluation."""


# ---------------------------------------------------------------------- outcome


@dataclass
class TrialOutcome:
    number: int
    state: Literal["COMPLETE", "FAIL"]
    value: float | None = None
    assignment: dict[str, Any] = field(default_factory=dict)
    metrics: dict[str, float] = field(default_factory=dict)
    constraints: dict[str, float] = field(default_factory=dict)
    fail_reason: str | None = None
    cache_hit: bool = False
    interrupted: bool = False
    reports: dict[str, str] = field(default_factory=dict)
    phase_seconds: dict[str, float] = field(default_factory=dict)

    @property
    def feasible(self) -> bool:
        return self.state == "COMPLETE" and all(v <= 0 for v in self.constraints.values())


# ----------------------------------------------------------------------- runner


class ArtifactUploader(Protocol):
    def __call__(self, trial: optuna.Trial, path: Path) -> None: ...


def optuna_artifact_uploader(store_dir: Path) -> ArtifactUploader:
    """Upload files as Optuna artifacts (shown by optuna-dashboard --artifact-dir DIR)."""
    from optuna.artifacts import FileSystemArtifactStore, upload_artifact

    store_dir.mkdir(parents=True, exist_ok=True)
    store = FileSystemArtifactStore(str(store_dir))

    def upload(trial: optuna.Trial, path: Path) -> None:
        mimetype, _ = mimetypes.guess_type(path.name)
        if path.suffix in {".yaml", ".yml", ".md"}:
            mimetype = "text/plain"
        upload_artifact(artifact_store=store, file_path=str(path), study_or_trial=trial, mimetype=mimetype)

    return upload


@dataclass
class TrialRunner:
    """Runs one trial end to end; one instance serves a whole study run."""

    study_name: str
    space: SpaceLike
    writer: ConfigWriter
    target: Any  # tuner.targets.base.Target (start/restart/stop/failure)
    wait_healthy: Callable[[], None]
    evaluator: BatchEvaluator
    trials_dir: Path
    objective: Objective = field(default_factory=Objective)
    constraints: Sequence[Constraint] = ()
    cache: ResultCache | None = None
    tracker: Tracker | None = None
    upload_artifact: ArtifactUploader | None = None
    stop: StopFlag = field(default_factory=StopFlag)
    on_phase: Callable[[int, str], None] = lambda number, phase: None
    # Config names (artifact / cache-key names) relative to this directory when below it.
    project_dir: Path | None = None

    def run(self, trial: optuna.Trial) -> TrialOutcome:
        """Run ``trial``; sets its user attrs and constraints; does not call ``tell``."""
        out = TrialOutcome(number=trial.number, state="FAIL")
        run_id: str | None = None
        texts: dict[Path, str] = {}
        try:
            with self._phase(out, "suggest"):
                out.assignment = dict(self.space.suggest(trial))
                trial.set_user_attr(A.ATTR_ASSIGNMENT, _jsonable(out.assignment))
            if self.tracker is not None:
                run_id = self.tracker.start_trial(trial.number, out.assignment)
                if run_id:
                    trial.set_user_attr(A.ATTR_MLFLOW_RUN, run_id)
            with self._phase(out, "render"):
                texts = self.writer.render(out.assignment)
            with self._phase(out, "cache"):
                key = self._cache_key(texts)
                cached = self.cache.get(key) if self.cache is not None else None
            if cached is not None:
                out.cache_hit = True
                out.metrics = dict(cached.metrics)
                out.reports = dict(cached.reports)
                trial.set_user_attr("cached_from_trial", cached.source_trial)
            else:
                self._measure(trial, out, texts, key)
            self._complete(trial, out)
        except KeyboardInterrupt:
            self._fail(trial, out, "interrupted (second interrupt: trial aborted)")
            out.interrupted = True
            self._record(trial, out, run_id, texts)
            raise
        except TrialInterrupted as exc:
            self._fail(trial, out, str(exc))
            out.interrupted = True
        except (HealthTimeout, BackendExited) as exc:
            self._fail(trial, out, f"{type(exc).__name__}: {exc}")
        except (TargetError, EvaluationError, TunerError) as exc:
            self._fail(trial, out, f"{type(exc).__name__}: {exc}")
        except Exception as exc:  # a crash in a collaborator fails this trial, not the study
            self._fail(trial, out, f"crash: {type(exc).__name__}: {exc}")
        self._record(trial, out, run_id, texts)
        return out

    # -------------------------------------------------------------- the steps

    def _measure(self, trial: optuna.Trial, out: TrialOutcome, texts: dict[Path, str], key: str) -> None:
        trial_dir = self.trials_dir / str(trial.number)
        trial_dir.mkdir(parents=True, exist_ok=True)
        self._check_stop()
        with self._phase(out, "patch"):
            self.writer.write(texts)
        self._check_stop()
        with self._phase(out, "restart"):
            self.target.restart()
        with self._phase(out, "health"):
            self.wait_healthy()
        self._check_stop()
        last_result = [0.0]

        def on_result(_: Any) -> None:
            last_result[0] = time.perf_counter()

        with self._phase(out, "evaluate"):
            started = time.perf_counter()
            result = self.evaluator.evaluate(order_seed=trial.number, on_result=on_result)
        # Time from the first request to the last answer: the search calls proper. The
        # rest of "evaluate" (scoring, OOS analysis) is tuner overhead.
        out.phase_seconds["search"] = max(0.0, last_result[0] - started) if last_result[0] else 0.0
        out.metrics = {k: float(v) for k, v in result.metrics.items() if _is_number(v)}
        with self._phase(out, "report"):
            snapshot = self._snapshot(texts)
            context = {"study": self.study_name, "trial": trial.number, "assignment": _jsonable(out.assignment)}
            paths = self.evaluator.write_reports(result, trial_dir, context=context, config_snapshot=snapshot)
            out.reports = {k: str(v) for k, v in paths.items() if v is not None}
            for name, text in self._named_texts(texts).items():
                config_copy = trial_dir / Path(name).name
                config_copy.write_text(text, encoding="utf-8")
        if self.cache is not None:
            self.cache.put(key, CachedResult(out.metrics, out.reports, trial.number, self.study_name))

    def _complete(self, trial: optuna.Trial, out: TrialOutcome) -> None:
        if self.objective.metric not in out.metrics:
            raise EvaluationError(
                f"objective metric {self.objective.metric!r} is not in the evaluation's metrics"
                f" ({', '.join(sorted(out.metrics)[:8])}, ...); fix objective.metric in the experiment file"
            )
        out.value = out.metrics[self.objective.metric]
        constraints: dict[str, float] = {}
        for c in self.constraints:
            try:
                constraints[c.name] = float(c.violation(out.metrics))
            except KeyError as exc:
                raise EvaluationError(
                    f"constraint {c.name!r} needs metric {exc.args[0]!r}, which the evaluation does not report;"
                    " fix constraints in the experiment file"
                ) from exc
        # Both the optuna 5 API (read by the samplers and FrozenTrial.constraints) and the
        # legacy list optuna-dashboard 0.21 reads, on every COMPLETE path (cached too):
        # a COMPLETE trial without constraints would count as feasible.
        for name, value in constraints.items():
            trial.set_constraint(name, value)
        trial.storage.set_trial_system_attr(trial._trial_id, LEGACY_CONSTRAINTS_ATTR, list(constraints.values()))
        out.constraints = constraints
        out.state = "COMPLETE"

    def _fail(self, trial: optuna.Trial, out: TrialOutcome, reason: str) -> None:
        out.state = "FAIL"
        out.value = None
        out.fail_reason = reason.splitlines()[0] if reason else "unknown failure"

    def _record(self, trial: optuna.Trial, out: TrialOutcome, run_id: str | None, texts: dict[Path, str]) -> None:
        """User attrs, Optuna artifacts and the tracker's child run, for every outcome."""
        self.on_phase(trial.number, "track")
        started = time.perf_counter()
        attrs: dict[str, Any] = {
            A.ATTR_METRICS: out.metrics,
            A.ATTR_CACHE_HIT: out.cache_hit,
            A.ATTR_REPORTS: out.reports,
            A.ATTR_PHASES: out.phase_seconds,
        }
        if out.metrics:
            attrs["judged@10"] = out.metrics.get("Judged@10")
            attrs["failed_queries"] = out.metrics.get("Failed_Queries")
        if out.fail_reason:
            attrs[A.ATTR_FAIL_REASON] = out.fail_reason
        for key, value in attrs.items():
            trial.set_user_attr(key, _jsonable(value))
        if self.upload_artifact is not None and out.state == "COMPLETE":
            self._upload(trial, out, texts)
        if self.tracker is not None:
            named = self._named_texts(texts) if texts else {}
            record = TrialRecord(
                number=trial.number,
                state=out.state,
                params=out.assignment,
                metrics={**out.metrics, **({"objective": out.value} if out.value is not None else {}),
                         **{f"constraint.{k}": v for k, v in out.constraints.items()}},
                config_texts={f"config/{Path(n).name}": t for n, t in named.items()},
                reports={k: Path(v) for k, v in out.reports.items()},
                fail_reason=out.fail_reason,
                tags={TAG_CACHE_HIT: str(out.cache_hit).lower(), "tuner.feasible": str(out.feasible).lower()},
            )
            self.tracker.finish_trial(run_id, record)
        out.phase_seconds["track"] = time.perf_counter() - started

    def _upload(self, trial: optuna.Trial, out: TrialOutcome, texts: dict[Path, str]) -> None:
        assert self.upload_artifact is not None
        trial_dir = self.trials_dir / str(trial.number)
        trial_dir.mkdir(parents=True, exist_ok=True)
        for name, text in self._named_texts(texts).items():
            path = trial_dir / Path(name).name
            if not path.exists():  # cached trials: write the snapshot they stand for
                path.write_text(text, encoding="utf-8")
            self.upload_artifact(trial, path)
        for kind in ("markdown", "json"):
            report = out.reports.get(kind)
            if report and Path(report).is_file():
                self.upload_artifact(trial, Path(report))

    # ------------------------------------------------------------------ helpers

    @contextmanager
    def _phase(self, out: TrialOutcome, phase: Phase) -> Iterator[None]:
        self.on_phase(out.number, phase)
        started = time.perf_counter()
        try:
            yield
        finally:
            out.phase_seconds[phase] = out.phase_seconds.get(phase, 0.0) + time.perf_counter() - started

    def _check_stop(self) -> None:
        if self.stop.is_set():
            raise TrialInterrupted(f"{self.stop.reason} before evaluation; the trial did not run")

    def _named_texts(self, texts: Mapping[Path, str]) -> dict[str, str]:
        return {self._name(p): t for p, t in texts.items()}

    def _name(self, path: Path) -> str:
        p = Path(path)
        if self.project_dir is not None:
            try:
                return p.resolve().relative_to(self.project_dir.resolve()).as_posix()
            except ValueError:
                pass
        return p.as_posix()

    def _cache_key(self, texts: Mapping[Path, str]) -> str:
        return cache_key(
            self._named_texts(texts),
            dataset_hash=self.evaluator.dataset_hash,
            labels_fingerprint=self.evaluator.labels_fingerprint,
            eval_spec_json=self.evaluator.spec_fingerprint,
        )

    def _snapshot(self, texts: Mapping[Path, str]) -> str:
        named = self._named_texts(texts)
        if len(named) == 1:
            return next(iter(named.values()))
        return "".join(f"# ---- {name}\n{text}" for name, text in named.items())


def _is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _jsonable(value: Any) -> Any:
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
