"""One trial: suggest -> render -> cache lookup -> patch -> restart -> health ->
evaluate -> record.

`TrialRunner.run(trial)` never lets an expected failure escape: a backend that never
becomes healthy, a crash, too many failed queries or an interrupt all end as a FAIL
outcome with a one-line reason (the study loop then applies its failure budget).
Only a second Ctrl-C (KeyboardInterrupt) propagates, after the trial is recorded.

Critical path and bookkeeping. Everything Optuna needs before ``tell`` (metrics,
constraints, user attributes, the names of the trial's artifacts) is set on the
critical path. The slow bookkeeping -- the per-trial report files, the artifact bytes
and the MLflow child run -- is handed to a `Bookkeeper`, one worker thread that runs
it in order while the next trial restarts the backend and waits for its health. So
a trial costs little more than its restart, health wait and search calls
(bench/trial_overhead.py measures it). `Bookkeeper.flush()` waits for the backlog.

The collaborators are small interfaces so this module is tested with real Optuna
trials and a fake evaluator at the edge: `ConfigWriter` (render and write the
patched config files), a `Target`, a health wait callable and a `BatchEvaluator`.
"""

from __future__ import annotations

import json
import mimetypes
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Literal, Protocol

import optuna

from tuner.data.inputs import InputsFingerprint, changed_files, describe_files
from tuner.errors import BackendExited, EvaluationError, HealthTimeout, TargetError, TunerError
from tuner.files import atomic_write_text
from tuner.report.tracking import TAG_CACHE_HIT, Tracker, TrialRecord
from tuner.study.attrs import (
    ATTR_ASSIGNMENT,
    ATTR_CACHE_HIT,
    ATTR_FAIL_REASON,
    ATTR_METRICS,
    ATTR_MLFLOW_RUN,
    ATTR_PHASES,
    ATTR_REPORTS,
)
from tuner.study.result_cache import CachedResult, CacheKey, ResultCache, cache_key, short_fingerprint
from tuner.targets.health import health_fingerprint

Phase = Literal["suggest", "render", "cache", "patch", "restart", "health", "evaluate", "solve", "complete", "record"]
SOLVED_PREFIX = "solved."  # metrics holding a solved gate's value and the sweep's counts
SWEEP_REPORT = "threshold_sweep_csv"  # TrialOutcome.reports key of the sweep table
SWEEP_FILE = "threshold_sweep.csv"
LEGACY_CONSTRAINTS_ATTR = "constraints"  # the system attr optuna-dashboard 0.21 reads
ATTR_CACHE_NOTE = "cache_note"  # why a trial missed the cache, or why its result was not stored
ATTR_DATA_FINGERPRINT = "data_fingerprint"  # {"inputs": digest, "backend": fingerprint} it was measured on
TAG_CACHE_NOTE = "tuner.cache_note"
_REPORT_MAX_FILES = 20  # per-file digests in a report's context up to this many inputs
OnResult = Callable[[str, Mapping[str, Any]], None]


# ------------------------------------------------------------------- interfaces


class SpaceLike(Protocol):
    def suggest(self, trial: optuna.Trial) -> dict[str, Any]: ...


class InputsLike(Protocol):
    """``target.inputs`` (tuner.data.inputs.InputsWatch): the declared data files' fingerprint now."""

    def current(self) -> InputsFingerprint: ...


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
    #: seconds from the first request sent to the last answer read, of the last evaluate()
    last_search_seconds: float

    def evaluate(self, *, order_seed: int, on_result: OnResult | None) -> EvalOutcome:
        """Evaluate every query; ``on_result(query_id, per_query_row)`` after each answer.
        An exception raised by the callback (optuna.TrialPruned) stops the batch."""

    def report_paths(self, result: EvalOutcome, out_dir: Path) -> Mapping[str, Path]:
        """The files `write_reports` will write for ``result`` (kind -> path)."""

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
    state: Literal["COMPLETE", "FAIL", "PRUNED"]
    value: float | None = None
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
    reports: dict[str, str] = field(default_factory=dict)
    # critical-path phases; "search" = first request to last answer inside "evaluate";
    # "report" / "track" are filled by the bookkeeper later (overlapped)
    phase_seconds: dict[str, float] = field(default_factory=dict)

    @property
    def feasible(self) -> bool:
        return self.state == "COMPLETE" and all(v <= 0 for v in self.constraints.values())


# ----------------------------------------------------------------- bookkeeping


class Bookkeeper:
    """Runs queued bookkeeping in order on one worker thread (or inline when
    ``threaded`` is false). Errors never fail a trial that already completed; they
    are collected (``errors``) and passed to ``on_error``."""

    def __init__(self, *, threaded: bool = True, on_error: Callable[[str], None] = lambda message: None) -> None:
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="tuner-bookkeeper") if threaded else None
        self._pending: list[Future[Any]] = []
        self.on_error = on_error
        self.errors: list[str] = []

    def submit(self, what: str, fn: Callable[..., Any], *args: Any) -> Future[Any]:
        def guarded() -> Any:
            try:
                return fn(*args)
            except Exception as exc:  # noqa: BLE001 - reported, never raised into the study
                message = f"{what}: {type(exc).__name__}: {exc}".splitlines()[0]
                self.errors.append(message)
                self.on_error(message)
                return None

        if self._pool is None:
            done: Future[Any] = Future()
            done.set_result(guarded())
            return done
        future = self._pool.submit(guarded)
        self._pending = [f for f in self._pending if not f.done()] + [future]
        return future

    def flush(self) -> None:
        """Wait until everything queued so far is done."""
        for future in list(self._pending):
            future.result()
        self._pending = []

    def close(self) -> None:
        self.flush()
        if self._pool is not None:
            self._pool.shutdown(wait=True)


class OptunaArtifacts:
    """Optuna artifacts (optuna-dashboard --artifact-dir DIR) whose bytes arrive late.

    ``register`` records an artifact on the running trial exactly as
    ``optuna.artifacts.upload_artifact`` does (a ``artifacts:<id>`` system attribute
    holding its ArtifactMeta); ``write`` stores its bytes later, from the bookkeeper,
    when the trial is already finished (upload_artifact cannot do that: a finished
    trial's attributes are frozen).
    """

    def __init__(self, store_dir: Path) -> None:
        from optuna.artifacts import FileSystemArtifactStore

        store_dir.mkdir(parents=True, exist_ok=True)
        self.store_dir = store_dir
        self.store = FileSystemArtifactStore(str(store_dir))

    def register(self, trial: optuna.Trial, filename: str) -> str:
        from optuna.artifacts._upload import ARTIFACTS_ATTR_PREFIX, ArtifactMeta

        mimetype, encoding = mimetypes.guess_type(filename)
        if Path(filename).suffix in {".yaml", ".yml", ".md"}:
            mimetype = "text/plain"  # shown inline by the dashboard
        artifact_id = str(uuid.uuid4())
        meta = ArtifactMeta(artifact_id=artifact_id, filename=filename,
                            mimetype=mimetype or "application/octet-stream", encoding=encoding)
        trial.storage.set_trial_system_attr(trial._trial_id, ARTIFACTS_ATTR_PREFIX + artifact_id, json.dumps(asdict(meta)))
        return artifact_id

    def write(self, artifact_id: str, path: Path) -> None:
        with open(path, "rb") as fh:
            self.store.write(artifact_id, fh)


# ----------------------------------------------------------------------- runner


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


@dataclass
class TrialRunner:
    """Runs one trial end to end; one instance serves a whole study run."""

    study_name: str
    space: SpaceLike
    writer: ConfigWriter
    target: Any  # tuner.targets.base.Target (start/restart/stop/failure)
    wait_healthy: Callable[[], Any]  # the health JSON when it has one (target.health.fingerprint reads it)
    evaluator: BatchEvaluator
    trials_dir: Path
    objective: Objective = field(default_factory=Objective)
    constraints: Sequence[Constraint] = ()
    cache: ResultCache | None = None
    tracker: Tracker | None = None
    artifacts: OptunaArtifacts | None = None
    bookkeeper: Bookkeeper = field(default_factory=lambda: Bookkeeper(threaded=False))
    stop: StopFlag = field(default_factory=StopFlag)
    on_phase: Callable[[int, str], None] = lambda number, phase: None
    # Config names (artifact / cache-key names) relative to this directory when below it.
    project_dir: Path | None = None
    # Builds the per-query callback that reports intermediate values to the pruner
    # (tuner.study.pruning.QueryReporter); it raises optuna.TrialPruned to stop the batch.
    reporter_factory: Callable[[optuna.Trial], OnResult] | None = None
    # Query order of a trial's batch (shuffled per trial so early queries are a fair sample).
    order_seed: Callable[[int], int] = lambda number: number
    # Bookkeeping timings per trial number (filled on the bookkeeper thread).
    background_seconds: dict[int, dict[str, float]] = field(default_factory=dict)
    # Whether any trial wrote a config (the backend then needs a restart on the original).
    touched_backend: bool = False
    # Post-retrieval params solved from each trial's retrieval (param name ->
    # tuner.study.threshold.GateRange); empty: every param is sampled.
    gates: Mapping[str, Any] = field(default_factory=dict)
    # The data the backend serves, part of the cache key: the declared target.inputs
    # (hashed at the first trial, re-stat'ed before each one) and the dotted field of the
    # health answer holding the backend's own data fingerprint (target.health.fingerprint;
    # ``wait_healthy`` must then return the health JSON).
    inputs: InputsLike | None = None
    backend_fingerprint_field: str | None = None
    # The backend fingerprint of the last health answer: what the running backend serves.
    backend_fingerprint: str | None = None

    def run(self, trial: optuna.Trial) -> TrialOutcome:
        """Run ``trial``; sets its user attrs and constraints; does not call ``tell``."""
        out = TrialOutcome(number=trial.number, state="FAIL")
        texts: dict[Path, str] = {}
        result: Any = None
        sweep: Any = None
        run_id: Future[Any] | None = None
        try:
            with self._phase(out, "suggest"):
                if self.gates:
                    out.assignment = dict(self.space.suggest(trial, skip_post_retrieval=True))  # type: ignore[call-arg]
                else:
                    out.assignment = dict(self.space.suggest(trial))
                solving = {n: g for n, g in self.gates.items() if n not in out.assignment}
                trial.set_user_attr(ATTR_ASSIGNMENT, _jsonable(out.assignment))
            if self.tracker is not None:
                run_id = self.bookkeeper.submit("MLflow run", self.tracker.start_trial, trial.number, out.assignment)
            with self._phase(out, "render"):
                # The retrieval runs with every solved gate at the low end of its range, so
                # the backend gates nothing away that another candidate value would keep.
                texts = self.writer.render({**out.assignment, **{n: g.low for n, g in solving.items()}})
            with self._phase(out, "cache"):
                key = self._cache_key(texts, solving)
                out.inputs, out.backend_fingerprint = key.inputs, key.backend
                cached = self._lookup(key, out)
            if cached is not None:
                out.cache_hit = True
                out.metrics = dict(cached.metrics)
                out.reports = dict(cached.reports)
                out.assignment.update({n: out.metrics[SOLVED_PREFIX + n] for n in solving})
                trial.set_user_attr("cached_from_trial", cached.source_trial)
            else:
                result = self._measure(trial, out, texts)
                stored_key = self._measured_key(key, out)
                if solving:
                    with self._phase(out, "solve"):
                        # The reports describe the batch at the solved gates (the trial's score),
                        # not the retrieval at the low end; the sweep keeps every grid point.
                        sweep, result = self._solve(out, result, solving)
            if solving:
                texts = self.writer.render(out.assignment)  # the snapshot shows the solved values
                trial.set_user_attr(ATTR_ASSIGNMENT, _jsonable(out.assignment))
            with self._phase(out, "complete"):
                self._complete(trial, out)
                if cached is None and result is not None:
                    paths = self.evaluator.report_paths(result, self._dir(trial.number))
                    out.reports = {k: str(v) for k, v in paths.items()}
                    if sweep is not None:
                        out.reports[SWEEP_REPORT] = str(self._dir(trial.number) / SWEEP_FILE)
                    if self.cache is not None and stored_key is not None:
                        stored = CachedResult(out.metrics, out.reports, trial.number, self.study_name)
                        self.cache.put(stored_key, stored)
        except KeyboardInterrupt:
            self._fail(out, "interrupted (second interrupt: trial aborted)")
            out.interrupted = True
            self._record(trial, out, texts, None, run_id)
            raise
        except TrialInterrupted as exc:
            self._fail(out, str(exc))
            out.interrupted = True
        except optuna.TrialPruned as exc:
            self._fail(out, str(exc) or "pruned")
            out.state = "PRUNED"
            # The OOS early stop knows a lower bound of the rate it stopped on.
            bound = getattr(exc, "fp_rate_lower_bound", None)
            if bound is not None:
                trial.set_user_attr("oos_fp_rate_lower_bound", float(bound))
        except (HealthTimeout, BackendExited, TargetError, EvaluationError, TunerError) as exc:
            self._fail(out, f"{type(exc).__name__}: {exc}")
        except Exception as exc:  # a crash in a collaborator fails this trial, not the study
            self._fail(out, f"crash: {type(exc).__name__}: {exc}")
        self._record(trial, out, texts, result, run_id, sweep)
        return out

    def flush(self) -> None:
        """Wait for the bookkeeping of every trial run so far."""
        self.bookkeeper.flush()

    # -------------------------------------------------------------- the steps

    def _measure(self, trial: optuna.Trial, out: TrialOutcome, texts: dict[Path, str]) -> Any:
        self._check_stop()
        with self._phase(out, "patch"):
            self.touched_backend = True
            self.writer.write(texts)
        self._check_stop()
        with self._phase(out, "restart"):
            self.backend_fingerprint = None  # unknown until the restarted backend answers
            self.target.restart()
        with self._phase(out, "health"):
            self._observe_backend(self.wait_healthy())
        self._check_stop()
        # Without a pruner no per-query callback is passed: building each query's row
        # costs about a millisecond of the event loop's time per query.
        on_result = self.reporter_factory(trial) if self.reporter_factory is not None else None
        with self._phase(out, "evaluate"):
            try:
                result = self.evaluator.evaluate(order_seed=self.order_seed(trial.number), on_result=on_result)
            finally:  # also for a batch stopped early (pruned, failure budget)
                out.phase_seconds["search"] = float(getattr(self.evaluator, "last_search_seconds", 0.0) or 0.0)
        out.metrics = {k: float(v) for k, v in result.metrics.items() if _is_number(v)}
        return result

    def _measured_key(self, key: CacheKey, out: TrialOutcome) -> CacheKey | None:
        """The key a measured result is stored under: with the backend fingerprint seen
        after this trial's restart (the data it was measured on), or None (not stored)
        when a declared input changed while the trial ran (which version the backend
        loaded is unknown)."""
        if self.backend_fingerprint_field is not None and self.backend_fingerprint != key.backend:
            if self.cache is not None and key.backend is not None:
                self._note(out, f"backend fingerprint after the restart: {short_fingerprint(self.backend_fingerprint)}"
                                f" (looked up with {short_fingerprint(key.backend)})")
            key = replace(key, backend=self.backend_fingerprint)
            out.backend_fingerprint = key.backend
        if self.inputs is not None and key.inputs is not None:
            now = self.inputs.current()
            if now.digest != key.inputs.digest:
                changed = describe_files(changed_files(key.inputs.files, now.files))
                self._note(out, f"target.inputs changed while the trial ran ({changed}): which version the"
                                " backend loaded is unknown, so the result is not cached")
                return None
        return key

    def _observe_backend(self, body: Any) -> None:
        """Keep the data fingerprint of a health answer (when one is declared)."""
        if self.backend_fingerprint_field is None:
            return
        if not isinstance(body, Mapping):
            raise TargetError(
                f"target.health.fingerprint {self.backend_fingerprint_field!r} is set, but the health wait returned"
                " no health answer to read it from (wait_healthy must return wait_target_healthy's JSON)"
            )
        self.backend_fingerprint = health_fingerprint(body, self.backend_fingerprint_field)

    def _lookup(self, key: CacheKey, out: TrialOutcome) -> CachedResult | None:
        if self.cache is None:
            return None
        if self.backend_fingerprint_field is not None and key.backend is None:
            out.cache_note = "cache miss: the backend's data fingerprint is unknown until it restarts healthy"
            return None
        cached = self.cache.get(key)
        if cached is None:
            out.cache_note = self.cache.explain_miss(key)
        return cached

    def _lookup_backend_fingerprint(self) -> str | None:
        """What the running backend serves. Before this run's first restart the backend
        the run started is asked once (one health request); after a restart that never
        became healthy it stays unknown (the trial is measured, not looked up)."""
        if self.backend_fingerprint_field is None:
            return None
        if self.backend_fingerprint is None and not self.touched_backend:
            try:
                self._observe_backend(self.wait_healthy())
            except TargetError:
                pass  # the restart of this trial tells (and fails it with the reason)
        return self.backend_fingerprint

    @staticmethod
    def _note(out: TrialOutcome, text: str) -> None:
        out.cache_note = f"{out.cache_note}; {text}" if out.cache_note else text

    def _solve(self, out: TrialOutcome, result: Any, solving: Mapping[str, Any]) -> tuple[Any, Any]:
        """Pick the solved gate values from the retrieval; the trial's metrics become those
        of the batch re-scored at those values. Returns the sweep and the re-scored batch."""
        from tuner.evaluation.regate import regate
        from tuner.study.threshold import CONFIDENCE, MIN_SCORE, solve_batch

        sol = solve_batch(result, list(solving.values()), objective=self.objective.metric,
                          constraints=self.constraints)
        # By role, not by key: the backend's own names for its gates do not matter here.
        solved = {name: sol.by_role[g.role] for name, g in solving.items()}
        out.assignment.update(solved)
        gated = regate(result, confidence_threshold=sol.by_role.get(CONFIDENCE),
                       min_score=sol.by_role.get(MIN_SCORE))
        # One source for the score and the reports: the re-scored batch (equal to the
        # solver's values, tests/evaluation/test_regate.py); the solver adds what a batch lacks.
        out.metrics = {k: float(v) for k, v in gated.metrics.items() if _is_number(v)}
        out.metrics.update({k: v for k, v in sol.metrics.items() if not k.startswith("n_") and k not in out.metrics})
        counts = {f"{SOLVED_PREFIX}{k}": v for k, v in sol.metrics.items() if k.startswith("n_")}
        # Kept in the metrics too, so a cache hit restores the solved values.
        out.metrics.update(counts | {SOLVED_PREFIX + n: float(v) for n, v in solved.items()})
        return sol.table, gated

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

    def _fail(self, out: TrialOutcome, reason: str) -> None:
        out.state = "FAIL"
        out.value = None
        from tuner.secrets import redact_text

        out.fail_reason = redact_text(reason.splitlines()[0]) if reason else "unknown failure"

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
                trial.set_user_attr(key, _jsonable(value))
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
            context = {"study": self.study_name, "trial": p.number, "assignment": _jsonable(out.assignment)}
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

    # ------------------------------------------------------------------ helpers

    def _dir(self, number: int) -> Path:
        return self.trials_dir / str(number)

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

    def _cache_key(self, texts: Mapping[Path, str], solving: Mapping[str, Any] | None = None) -> CacheKey:
        spec = self.evaluator.spec_fingerprint
        if solving:
            # A solved result also depends on the gate grids, the objective and the constraints.
            spec += json.dumps({"solve": {n: [g.low, g.high, g.step, g.role] for n, g in sorted(solving.items())},
                                "objective": self.objective.metric,
                                "constraints": [c.name for c in self.constraints]}, sort_keys=True)
        base = cache_key(
            self._named_texts(texts),
            dataset_hash=self.evaluator.dataset_hash,
            labels_fingerprint=self.evaluator.labels_fingerprint,
            eval_spec_json=spec,
        )
        inputs = self.inputs.current() if self.inputs is not None else None
        backend = self._lookup_backend_fingerprint() if self.cache is not None else self.backend_fingerprint
        return CacheKey(base, inputs, backend)

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
