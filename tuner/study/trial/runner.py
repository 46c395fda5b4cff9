"""One trial in three stages: ``begin`` (suggest -> render -> cache lookup), ``measure``
(patch -> reload or restart -> evaluate; the only stage that needs the backend) and
``end`` (score -> solve -> record). ``run`` runs them in a row; the pipelined loop
(tuner.study.pipeline) overlaps one trial's measure with its neighbours' begin and end.

`TrialRunner.run(trial)` never lets an expected failure escape: a backend that never
becomes healthy, a crash, too many failed queries or an interrupt all end as a FAIL
outcome with a one-line reason (the study loop then applies its failure budget). Which
reason, and whether the study's storage failed under the trial (``infrastructure``: the
loop queues its params again), is decided by tuner.study.trial.failures.classify_failure.
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

Module map: the collaborators' interfaces and the objective/constraints are in
tuner.study.trial.interfaces, the outcome in tuner.study.trial.outcome, the stop flag in
tuner.study.stop; the cache key and lookup (`CacheLookup`) in tuner.study.trial.cache_lookup
and the record and its bookkeeping (`TrialRecording`) in tuner.study.trial.records, both
mixed into `TrialRunner`; the `Bookkeeper` and `OptunaArtifacts` in
tuner.study.trial.bookkeeping.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import Future
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import optuna
from optuna.distributions import BaseDistribution

from tuner.config.objective import Constraint, Objective
from tuner.report.tracking import Tracker
from tuner.study.notes import Links
from tuner.study.stop import StopFlag, TrialInterrupted
from tuner.study.storage.result_cache import CachedResult, ResultCache
from tuner.study.storage.study_storage import is_transient_storage_error, retry_transient
from tuner.study.trial.attrs import ATTR_ASSIGNMENT, ATTR_CACHED_FROM, set_record
from tuner.study.trial.bookkeeping import Bookkeeper, OptunaArtifacts
from tuner.study.trial.cache_lookup import CacheLookup
from tuner.study.trial.failures import classify_failure
from tuner.study.trial.interfaces import (
    BatchEvaluator,
    ConfigWriter,
    InputsLike,
    OnResult,
    SpaceLike,
)
from tuner.study.trial.outcome import (
    FUSION_PLOT_FILE,
    FUSION_PLOT_REPORT,
    FUSION_SWEEP_FILE,
    FUSION_SWEEP_REPORT,
    SOLVED_PREFIX,
    SWEEP_FILE,
    SWEEP_REPORT,
    TrialOutcome,
    is_number,
    jsonable,
)
from tuner.study.trial.pruning import OOSBudgetExceeded
from tuner.study.trial.records import TrialRecording
from tuner.study.trial.replay_measure import ReplayMeasure
from tuner.study.trial.scoring import TrialScoring

Phase = Literal[
    "suggest",
    "render",
    "cache",
    "patch",
    "restart",
    "health",
    "reload",
    "confirm",
    "evaluate",
    "score",
    "solve",
    "complete",
    "record",
    "backlog",
    "explain",
    "replay",
    "verify",
]


@dataclass
class TrialJob:
    """One trial between its stages (``TrialRunner.begin`` / ``measure`` / ``end``)."""

    trial: optuna.Trial
    out: TrialOutcome
    texts: dict[Path, str] = field(default_factory=dict)
    solving: dict[str, Any] = field(default_factory=dict)
    run_id: Future[Any] | None = None
    key: Any = None  # tuner.study.trial.cache_lookup.CacheKey
    cached: CachedResult | None = None
    stored_key: Any = None
    result: Any = None  # the BatchResult, or a callable that finishes scoring it (deferred)
    sweep: Any = None
    error: Exception | None = None  # of any stage; settled by ``end``
    suggested: dict[str, Any] = field(default_factory=dict)  # the Optuna params as suggested (a requeue's)
    replaying: bool = False  # fusion params solved from one explained retrieval (tuner.study.trial.replay_measure)
    fusion_sweep: Any = None  # every replayed setting scored (pandas), best first


@dataclass
class TrialRunner(CacheLookup, TrialRecording, TrialScoring, ReplayMeasure):
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
    # A trial the study's storage failed under, before it is recorded: the loop queues its
    # retry here (tuner.study.loop), so its fail_reason names the retry in every record
    # (the Optuna attr, the trial note, the MLflow run the bookkeeper logs later).
    on_infrastructure_failure: Callable[[optuna.Trial, TrialOutcome], None] | None = None
    # Config names (artifact / cache-key names) relative to this directory when below it.
    project_dir: Path | None = None
    # Builds the per-query callback that reports intermediate values to the pruner
    # (tuner.study.trial.pruning.QueryReporter); it raises optuna.TrialPruned to stop the batch.
    reporter_factory: Callable[[optuna.Trial], OnResult] | None = None
    # Query order of a trial's batch (shuffled per trial so early queries are a fair sample).
    order_seed: Callable[[int], int] = lambda number: number
    # Bookkeeping timings per trial number (filled on the bookkeeper thread).
    background_seconds: dict[int, dict[str, float]] = field(default_factory=dict)
    # Whether any trial wrote a config (the backend then needs a restart on the original).
    touched_backend: bool = False
    # Post-retrieval params solved from each trial's retrieval (param name ->
    # tuner.study.gates.threshold.GateRange); empty: every param is sampled.
    gates: Mapping[str, Any] = field(default_factory=dict)
    # The data the backend serves, part of the cache key: the declared target.inputs
    # (hashed at the first trial, re-stat'ed before each one) and the dotted field of the
    # health answer holding the backend's own data fingerprint (target.health.fingerprint;
    # ``wait_healthy`` must then return the health JSON).
    inputs: InputsLike | None = None
    backend_fingerprint_field: str | None = None
    # The backend fingerprint of the last health answer: what the running backend serves.
    backend_fingerprint: str | None = None
    # The space's Optuna distributions by name (default: ``space.distributions()``): a solved
    # gate is recorded as a param under its declared one (tuner.study.trial.applied_params).
    declared: Mapping[str, BaseDistribution] = field(default_factory=dict)
    # "slim" (default) or "full": the report detail of trials that are neither the baseline
    # nor a new best feasible trial (those are always full; tuner.study.trial.records).
    report_detail: str = "slim"
    # Where the dashboards serve this study: the notes and MLflow runs link to each other.
    links: Links | None = None
    # Gets a written config served (tuner.targets.reload.ConfigApplier: reload when the
    # experiment declares how, else restart); None: ``target.restart()`` + ``wait_healthy()``.
    applier: Any = None
    # Finish a batch's scoring in ``end`` (off the backend's path) rather than in ``measure``.
    defer_scoring: bool = False
    # Fusion params solved per trial from one explained retrieval and verified live
    # (tuner.study.replay.fusion_search.ReplayPlan; tuner.study.trial.replay_measure); None: all sampled.
    replay: Any = None
    # Helper processes scoring replayed settings beside this one (tuner.study.replay.replay_pool); None: in process.
    replay_pool: Any = None
    _best_value: float | None = field(default=None, init=False, repr=False)
    _best_known: bool = field(default=False, init=False, repr=False)
    _full_best: Any = field(default=None, init=False, repr=False)
    _details: dict[int, tuple[str, bool]] = field(default_factory=dict, init=False, repr=False)

    def __post_init__(self) -> None:
        if not self.declared and hasattr(self.space, "distributions"):
            self.declared = dict(self.space.distributions())

    def run(self, trial: optuna.Trial) -> TrialOutcome:
        """Run ``trial`` start to end (``begin`` -> ``measure`` -> ``end``); sets its user
        attrs and constraints; does not call ``tell``."""
        job = self.begin(trial)
        try:
            self.measure(job)
        except KeyboardInterrupt:
            self.abort(job, "interrupted (second interrupt: trial aborted)")
            raise
        return self.end(job)

    # --------------------------------------------------------- the three stages
    #
    # A pipelined loop (tuner.study.loop) runs ``measure`` of one trial on its thread
    # while another thread ends the trial before it and begins the next one: only
    # ``measure`` holds the backend, so only it is on the critical path.

    def begin(self, trial: optuna.Trial) -> TrialJob:
        """Suggest, render and look up the cache; never touches the backend. A connection
        to the study's database lost while the params are recorded (before anything else
        is started for the trial) is retried: suggesting the same names again gives the
        same values."""
        wait = 0.2
        for _ in range(4):
            job = self._begin_once(trial)
            if job.error is None or job.run_id is not None or not is_transient_storage_error(job.error):
                return job
            time.sleep(wait)
            wait *= 2
        return job

    def _begin_once(self, trial: optuna.Trial) -> TrialJob:
        job = TrialJob(trial, TrialOutcome(number=trial.number, state="FAIL"))
        out = job.out
        try:
            with self._phase(out, "suggest"):
                if self.replay is not None:
                    out.assignment = dict(
                        self.space.suggest(
                            trial,
                            skip_post_retrieval=True,  # type: ignore[call-arg]
                            skip=self.replay.names,
                        )
                    )
                elif self.gates:
                    out.assignment = dict(self.space.suggest(trial, skip_post_retrieval=True))  # type: ignore[call-arg]
                else:
                    out.assignment = dict(self.space.suggest(trial))
                # The baseline (and any key a trial leaves as found) carries the file's own
                # values, not the sampler's rendering of them (weights 1.0/1.0, not 0.5/0.5):
                # it records them and writes the file byte for byte.
                out.assignment = self._as_found(out.assignment)
                job.suggested = dict(trial.params)
                out.suggested = dict(job.suggested)
                job.solving = {n: g for n, g in self.gates.items() if n not in out.assignment}
                job.replaying = self._replays(out.assignment)
                set_record(trial, ATTR_ASSIGNMENT, jsonable(out.assignment))
            if self.tracker is not None:
                job.run_id = self.bookkeeper.submit(
                    "MLflow run", self.tracker.start_trial, trial.number, out.assignment, eager=True
                )
            with self._phase(out, "render"):
                # The retrieval runs with every solved gate at the low end of its range, so
                # the backend gates nothing away that another candidate value would keep.
                if job.replaying:
                    job.texts = self._retrieval_texts(out.assignment, job.solving)
                else:
                    job.texts = self.writer.render({**out.assignment, **{n: g.low for n, g in job.solving.items()}})
                if self.applier is not None:
                    self.applier.prepare(job.texts)  # the restart-key comparison's parse, off the backend's path
            if job.replaying:
                return job  # scored from settings chosen inside the trial: not a cacheable config
            with self._phase(out, "cache"):
                job.key = self._cache_key(job.texts, job.solving)
                out.inputs, out.backend_fingerprint = job.key.inputs, job.key.backend
                job.cached = self._lookup(job.key, out)
        except Exception as exc:  # noqa: BLE001 - settled in end()
            job.error = exc
        return job

    def measure(self, job: TrialJob, written: Callable[[], None] | None = None) -> None:
        """Patch, get the backend to serve the config (reload or restart), evaluate. The
        only stage that holds the backend. Errors are kept for ``end``; KeyboardInterrupt
        propagates (the caller then calls ``abort``). ``written()`` is called once the
        config is written, before the backend is asked to serve it (a replay trial: at
        its start); it is not called when nothing is written."""
        if job.error is not None or job.cached is not None:
            return
        trial, out = job.trial, job.out
        if job.replaying:
            if written is not None:
                written()
            try:
                self._measure_replay(job)
            except Exception as exc:  # noqa: BLE001 - settled in end()
                job.error = exc
            return
        try:
            self._check_stop()
            with self._phase(out, "patch"):
                self.touched_backend = True
                self.writer.write(job.texts)
            if written is not None:
                written()
            self._check_stop()
            self._serve(out, job.texts)
            self._check_stop()
            # Without a pruner no per-query callback is passed: building each query's row
            # costs about a millisecond of the event loop's time per query.
            on_result = self.reporter_factory(trial) if self.reporter_factory is not None else None
            with self._phase(out, "evaluate"):
                try:
                    job.result = self.evaluator.evaluate(
                        order_seed=self.order_seed(trial.number),
                        on_result=on_result,
                        **({"defer": True} if self.defer_scoring else {}),
                    )
                finally:  # also for a batch stopped early (pruned, failure budget)
                    handling = float(getattr(self.evaluator, "last_handling_seconds", 0.0) or 0.0)
                    window = float(getattr(self.evaluator, "last_search_seconds", 0.0) or 0.0)
                    # strict: the tuner's own handling of the answers inside the window is not search
                    out.phase_seconds["search"] = max(window - handling, 0.0)
                    out.phase_seconds["handle"] = handling
        except Exception as exc:  # noqa: BLE001 - settled in end()
            job.error = exc

    def end(self, job: TrialJob) -> TrialOutcome:
        """Score (and solve the gates of) a measured trial, or settle its error; record it."""
        trial, out = job.trial, job.out
        if job.error is None:
            try:
                self._score(job)
            except Exception as exc:  # noqa: BLE001 - settled below
                job.error = exc
        if job.error is not None:
            with self._phase(out, "complete"):  # an OOS early stop's completion writes to the study too
                self._settle(job)
        if out.infrastructure and out.state == "FAIL" and self.on_infrastructure_failure is not None:
            self.on_infrastructure_failure(trial, out)
        self._record(trial, out, job.texts, job.result, job.run_id, job.sweep, job.fusion_sweep)
        return out

    def abort(self, job: TrialJob, reason: str, *, ran: bool = True) -> TrialOutcome:
        """Record ``job`` as failed (interrupted) without scoring it: a second Ctrl-C, or a
        trial begun ahead that the loop will not run (``ran`` False)."""
        self._fail(job.out, reason)
        job.out.interrupted = True
        self._record(job.trial, job.out, job.texts if ran else {}, None, job.run_id)
        return job.out

    def flush(self) -> None:
        """Wait for the bookkeeping of every trial run so far."""
        self.bookkeeper.flush()

    # -------------------------------------------------------------- the steps

    def _serve(self, out: TrialOutcome, texts: Mapping[Path, str]) -> None:
        """Get the backend to serve ``texts`` (just written): through the applier (reload
        when declared and allowed, else restart), or a restart and a health wait."""
        self.backend_fingerprint = None  # unknown until the backend answers on the new config
        if self.applier is not None:
            applied = self.applier.apply(texts, phase=lambda name: self._phase(out, name))
            out.applied = applied.mode if not applied.reason else f"{applied.mode}: {applied.reason}"
            self._observe_backend(applied.health)
            return
        with self._phase(out, "restart"):
            self.target.restart()
        with self._phase(out, "health"):
            self._observe_backend(self.wait_healthy())
        out.applied = "restart"

    def _score(self, job: TrialJob) -> None:
        trial, out = job.trial, job.out
        if job.cached is not None:
            out.cache_hit = True
            out.metrics = dict(job.cached.metrics)
            out.reports = dict(job.cached.reports)
            out.assignment.update({n: out.metrics[SOLVED_PREFIX + n] for n in job.solving})
            trial.set_user_attr(ATTR_CACHED_FROM, job.cached.source_trial)
        else:
            if callable(job.result):  # deferred: the batch's scoring finishes here, off the backend's path
                with self._phase(out, "score"):
                    job.result = job.result()
            out.metrics = {k: float(v) for k, v in job.result.metrics.items() if is_number(v)}
            job.stored_key = None if job.key is None else self._measured_key(job.key, out)
            if job.solving:
                with self._phase(out, "solve"):
                    # The reports describe the batch at the solved gates (the trial's score),
                    # not the retrieval at the low end; the sweep keeps every grid point.
                    job.sweep, job.result = self._solve(out, job.result, job.solving)
        if job.solving or job.replaying:
            out.assignment = self._as_found(out.assignment)  # a solved or replayed value that keeps the file's
            job.texts = self.writer.render(out.assignment)  # the snapshot shows the solved values
            set_record(trial, ATTR_ASSIGNMENT, jsonable(out.assignment))
        with self._phase(out, "complete"):
            self._complete(trial, out)
            if job.cached is None and job.result is not None:
                # may read the study's trials (the best so far): a lost connection is retried
                detail, _ = retry_transient(lambda: self._detail_of(trial, out))
                paths = self.evaluator.report_paths(job.result, self._dir(trial.number), detail=detail)
                out.reports = {k: str(v) for k, v in paths.items()}
                if job.sweep is not None:
                    out.reports[SWEEP_REPORT] = str(self._dir(trial.number) / SWEEP_FILE)
                if job.fusion_sweep is not None:
                    out.reports[FUSION_SWEEP_REPORT] = str(self._dir(trial.number) / FUSION_SWEEP_FILE)
                    out.reports[FUSION_PLOT_REPORT] = str(self._dir(trial.number) / FUSION_PLOT_FILE)
                if self.cache is not None and job.stored_key is not None:
                    stored = CachedResult(out.metrics, out.reports, trial.number, self.study_name)
                    self.cache.put(job.stored_key, stored)

    def _settle(self, job: TrialJob) -> None:
        """An error of any stage: the trial's state and one-line reason."""
        out, exc = job.out, job.error
        if callable(job.result):
            job.result = None  # a deferred batch that never finished scoring
        assert exc is not None
        failure = classify_failure(exc)  # the one place a failure gets its kind and reason
        if failure.kind == "early_stop":
            assert isinstance(exc, OOSBudgetExceeded)
            self._complete_early_stop(job.trial, out, exc)
            return
        # a crash in a collaborator fails this trial, not the study; a storage failure
        # (infrastructure) is queued again by the loop
        self._fail(out, failure.reason)
        out.interrupted = failure.kind == "interrupted"
        out.infrastructure = failure.kind == "infrastructure"
        if failure.kind == "pruned":
            out.state = "PRUNED"

    def _fail(self, out: TrialOutcome, reason: str) -> None:
        out.state = "FAIL"
        out.value = None
        from tuner.secrets import redact_text

        out.fail_reason = redact_text(reason.splitlines()[0]) if reason else "unknown failure"

    # ------------------------------------------------------------------ helpers

    def _as_found(self, assignment: dict[str, Any]) -> dict[str, Any]:
        as_found = getattr(self.writer, "as_found", None)  # optional (tuner.study.trial.interfaces.ConfigWriter)
        return dict(as_found(assignment)) if as_found is not None else assignment

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
