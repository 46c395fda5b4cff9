"""One trial in three stages: ``begin`` (suggest -> render -> cache lookup), ``measure``
(patch -> reload or restart -> evaluate; the only stage that needs the backend) and
``end`` (score -> solve -> record). ``run`` runs them in a row; the pipelined loop
(tuner.study.pipeline) overlaps one trial's measure with its neighbours' begin and end.

`TrialRunner` only orders the stages; each step belongs to a collaborator passed in,
which owns the state it uses:

- `CacheLookup` (tuner.study.trial.cache_lookup): the result cache, the cache key, the
  lookup and the key a measured result is stored under;
- `Measurer` (tuner.study.trial.measure): writer, target, applier, evaluator and stop
  flag -- patch, serve, evaluate one batch; its `ServedBackend` is what the running
  backend serves (the cache lookup reads its data fingerprint);
- `ReplayMeasurer` (tuner.study.trial.replay_measure), when fusion params are replayed:
  one explained retrieval, the settings scored from it, the best verified live;
- `TrialScorer` (tuner.study.trial.scoring): objective and constraints -- the gates
  solved, the trial COMPLETE with its value and constraints (or an OOS early stop's record);
- `Recorder` (tuner.study.trial.records): the MLflow run, the attrs ``tell`` needs and the
  bookkeeping queued on its `Bookkeeper` (tuner.study.trial.bookkeeping).

tuner.study.wiring builds them for an experiment (`compose_runner` below takes the
flat settings and builds them; a test can instead hand `TrialRunner` a fake measurer
or recorder). Phases are timed by one `Phases` (tuner.study.trial.phases) all share.

`TrialRunner.run(trial)` never lets an expected failure escape: a backend that never
becomes healthy, a crash, too many failed queries or an interrupt all end as a FAIL
outcome with a one-line reason (the study loop then applies its failure budget). Which
reason, and whether the study's storage failed under the trial (``infrastructure``: the
loop queues its params again), is decided by tuner.study.trial.failures.classify_failure.
Only a second Ctrl-C (KeyboardInterrupt) propagates, after the trial is recorded.

Critical path and bookkeeping. Everything Optuna needs before ``tell`` (metrics,
constraints, user attributes, the names of the trial's artifacts) is set on the
critical path. The slow bookkeeping -- the per-trial report files, the artifact bytes
and the MLflow child run -- is handed to the recorder's `Bookkeeper`, one worker thread
that runs it in order while the next trial restarts the backend and waits for its
health. So a trial costs little more than its restart, health wait and search calls
(bench/trial_overhead.py measures it). ``flush()`` waits for the backlog.

The objective/constraints and the collaborators' small interfaces (`ConfigWriter`, a
`BatchEvaluator`, ...) are in tuner.study.trial.interfaces, the outcome in
tuner.study.trial.outcome, the stop flag in tuner.study.stop.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import optuna
from optuna.distributions import BaseDistribution

from tuner.config.objective import Constraint, Objective
from tuner.config.validation import CrossValConfig
from tuner.optuna_adapter import params_recorded_together
from tuner.report.tracking import Tracker
from tuner.study.notes import Links
from tuner.study.stop import StopFlag
from tuner.study.storage.result_cache import CachedResult, CacheKey, ResultCache
from tuner.study.storage.transient import retry_transient
from tuner.study.trial.attrs import ATTR_ASSIGNMENT, ATTR_CACHED_FROM, set_record
from tuner.study.trial.bookkeeping import Bookkeeper, OptunaArtifacts
from tuner.study.trial.cache_lookup import CacheLookup
from tuner.study.trial.config_names import ConfigNames
from tuner.study.trial.failures import classify_failure
from tuner.study.trial.interfaces import (
    BatchEvaluator,
    ConfigWriter,
    EvalOutcome,
    InputsLike,
    OnResult,
    SpaceLike,
)
from tuner.study.trial.measure import Applier, Measurer, Restartable, ServedBackend
from tuner.study.trial.outcome import SOLVED_PREFIX, TrialOutcome, is_number, jsonable
from tuner.study.trial.phases import Phase, Phases
from tuner.study.trial.pruning import OOSBudgetExceeded
from tuner.study.trial.records import Recorder
from tuner.study.trial.replay_measure import ExplainingEvaluator, ReplayMeasurer
from tuner.study.trial.scoring import TrialScorer

if TYPE_CHECKING:
    import pandas as pd

    from tuner.study.gates.threshold import GateRange
    from tuner.study.replay.fusion_search import ReplayPlan
    from tuner.study.replay.replay_pool import ReplayPool

__all__ = ["Phase", "TrialJob", "TrialRunner", "compose_runner"]


@dataclass
class TrialJob:
    """One trial between its stages (``TrialRunner.begin`` / ``measure`` / ``end``)."""

    trial: optuna.Trial
    out: TrialOutcome
    texts: dict[Path, str] = field(default_factory=dict)
    solving: dict[str, GateRange] = field(default_factory=dict)
    run_id: Future[str | None] | None = None
    key: CacheKey | None = None
    cached: CachedResult | None = None
    stored_key: CacheKey | None = None
    # the batch result, or (deferred scoring) the callable that finishes scoring it
    result: EvalOutcome | Callable[[], EvalOutcome] | None = None
    sweep: pd.DataFrame | None = None  # the solved gates' grid
    error: Exception | None = None  # of any stage; settled by ``end``
    suggested: dict[str, Any] = field(default_factory=dict)  # the Optuna params as suggested (a requeue's)
    replaying: bool = False  # fusion params solved from one explained retrieval (tuner.study.trial.replay_measure)
    fusion_sweep: pd.DataFrame | None = None  # every replayed setting scored, best first


@dataclass
class TrialRunner:
    """Runs one trial end to end by ordering its collaborators (module doc); one
    instance serves a whole study run."""

    space: SpaceLike
    writer: ConfigWriter  # renders a trial's config (the measurer writes it)
    lookup: CacheLookup
    measurer: Measurer
    scorer: TrialScorer
    recorder: Recorder
    # The fusion params replayed per trial (tuner.study.trial.replay_measure); None: all sampled.
    replay: ReplayMeasurer | None = None
    # Post-retrieval params solved from each trial's retrieval (param name -> gate range);
    # empty: every param is sampled.
    gates: Mapping[str, GateRange] = field(default_factory=dict)
    # The phase timer (default: the measurer's, so the runner and the measurer time and
    # report phases to one observer).
    phases: Phases | None = None
    # A trial the study's storage failed under, before it is recorded: the loop queues its
    # retry here (tuner.study.loop), so its fail_reason names the retry in every record
    # (the Optuna attr, the trial note, the MLflow run the bookkeeper logs later).
    on_infrastructure_failure: Callable[[optuna.Trial, TrialOutcome], None] | None = None

    def __post_init__(self) -> None:
        shared = self.phases or getattr(self.measurer, "phases", None)
        self._phases: Phases = shared if isinstance(shared, Phases) else Phases()

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
        to the study's database lost while the params are recorded is ridden out by the
        storage itself (tuner.study.storage.transient); past that, the trial fails for an
        infrastructure reason and the loop queues it again."""
        job = TrialJob(trial, TrialOutcome(number=trial.number, state="FAIL"))
        out = job.out
        try:
            # the params drawn are recorded in one transaction, not one each
            with self._phases.time(out, "suggest"), params_recorded_together(trial, retry_transient):
                if self.replay is not None:
                    out.assignment = dict(
                        self.space.suggest(trial, skip_post_retrieval=True, skip=self.replay.plan.names)
                    )
                elif self.gates:
                    out.assignment = dict(self.space.suggest(trial, skip_post_retrieval=True))
                else:
                    out.assignment = dict(self.space.suggest(trial))
                # The baseline (and any key a trial leaves as found) carries the file's own
                # values, not the sampler's rendering of them (weights 1.0/1.0, not 0.5/0.5):
                # it records them and writes the file byte for byte.
                out.assignment = self._as_found(out.assignment)
                job.suggested = dict(trial.params)
                out.suggested = dict(job.suggested)
                job.solving = {n: g for n, g in self.gates.items() if n not in out.assignment}
                job.replaying = self.replay is not None and self.replay.replays(out.assignment)
                set_record(trial, ATTR_ASSIGNMENT, jsonable(out.assignment))
            job.run_id = self.recorder.start(trial, out.assignment)
            with self._phases.time(out, "render"):
                # The retrieval runs with every solved gate at the low end of its range, so
                # the backend gates nothing away that another candidate value would keep.
                if job.replaying and self.replay is not None:
                    job.texts = self.replay.retrieval_texts(out.assignment, job.solving)
                else:
                    job.texts = self.writer.render({**out.assignment, **{n: g.low for n, g in job.solving.items()}})
                self.measurer.prepare(job.texts)  # the restart-key comparison's parse, off the backend's path
            if job.replaying:
                return job  # scored from settings chosen inside the trial: not a cacheable config
            with self._phases.time(out, "cache"):
                job.key = self.lookup.key(job.texts, job.solving)
                out.inputs, out.backend_fingerprint = job.key.inputs, job.key.backend
                job.cached = self.lookup.lookup(job.key, out)
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
        try:
            if job.replaying and self.replay is not None:
                if written is not None:
                    written()
                replayed = self.replay.measure(job.trial, job.out, job.texts, job.solving)
                job.result, job.texts, job.fusion_sweep = replayed.result, replayed.texts, replayed.fusion_sweep
            else:
                job.result = self.measurer.batch(job.trial, job.out, job.texts, written)
        except Exception as exc:  # noqa: BLE001 - settled in end()
            job.error = exc

    def end(self, job: TrialJob) -> TrialOutcome:
        """Score (and solve the gates of) a measured trial, or settle its error; record it."""
        if job.error is None:
            try:
                self._score(job)
            except Exception as exc:  # noqa: BLE001 - settled below
                job.error = exc
        if job.error is not None:
            with self._phases.time(job.out, "complete"):  # an OOS early stop's completion writes to the study too
                self._settle(job)
        if job.out.infrastructure and job.out.state == "FAIL" and self.on_infrastructure_failure is not None:
            self.on_infrastructure_failure(job.trial, job.out)
        result = None if callable(job.result) else job.result  # (settled: never callable here)
        self.recorder.record(job.trial, job.out, job.texts, result, job.run_id, job.sweep, job.fusion_sweep)
        return job.out

    def abort(self, job: TrialJob, reason: str, *, ran: bool = True) -> TrialOutcome:
        """Record ``job`` as failed (interrupted) without scoring it: a second Ctrl-C, or a
        trial begun ahead that the loop will not run (``ran`` False)."""
        _fail(job.out, reason)
        job.out.interrupted = True
        self.recorder.record(job.trial, job.out, job.texts if ran else {}, None, job.run_id)
        return job.out

    def flush(self) -> None:
        """Wait for the bookkeeping of every trial run so far."""
        self.recorder.flush()

    # -------------------------------------------------------------- the steps

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
                with self._phases.time(out, "score"):
                    job.result = job.result()
            assert job.result is not None
            out.metrics = {k: float(v) for k, v in job.result.metrics.items() if is_number(v)}
            job.stored_key = None if job.key is None else self.lookup.measured_key(job.key, out)
            if job.solving:
                with self._phases.time(out, "solve"):
                    # The reports describe the batch at the solved gates (the trial's score),
                    # not the retrieval at the low end; the sweep keeps every grid point.
                    job.sweep, job.result = self.scorer.solve(out, job.result, job.solving)
        if job.solving or job.replaying:
            out.assignment = self._as_found(out.assignment)  # a solved or replayed value that keeps the file's
            job.texts = self.writer.render(out.assignment)  # the snapshot shows the solved values
            set_record(trial, ATTR_ASSIGNMENT, jsonable(out.assignment))
        with self._phases.time(out, "complete"):
            self.scorer.complete(trial, out)
            if job.cached is None and job.result is not None and not callable(job.result):
                out.reports = self.recorder.report_files(
                    trial, out, job.result, sweep=job.sweep is not None, fusion_sweep=job.fusion_sweep is not None
                )
                self.lookup.store(job.stored_key, out, trial.number)

    def _settle(self, job: TrialJob) -> None:
        """An error of any stage: the trial's state and one-line reason."""
        out, exc = job.out, job.error
        if callable(job.result):
            job.result = None  # a deferred batch that never finished scoring
        assert exc is not None
        failure = classify_failure(exc)  # the one place a failure gets its kind and reason
        if failure.kind == "early_stop":
            assert isinstance(exc, OOSBudgetExceeded)
            self.scorer.complete_early_stop(job.trial, out, exc)
            return
        # a crash in a collaborator fails this trial, not the study; a storage failure
        # (infrastructure) is queued again by the loop
        _fail(out, failure.reason)
        out.interrupted = failure.kind == "interrupted"
        out.infrastructure = failure.kind == "infrastructure"
        if failure.kind == "pruned":
            out.state = "PRUNED"

    def _as_found(self, assignment: dict[str, Any]) -> dict[str, Any]:
        as_found = getattr(self.writer, "as_found", None)  # optional (tuner.study.trial.interfaces.ConfigWriter)
        return dict(as_found(assignment)) if as_found is not None else assignment

    @property
    def on_phase(self) -> Callable[[int, str], None]:
        """Told ``(trial number, phase)`` as each phase starts (the loop's progress line)."""
        return self._phases.on_phase

    @on_phase.setter
    def on_phase(self, observer: Callable[[int, str], None]) -> None:
        self._phases.on_phase = observer

    # ---------------------------------------- what ops reads and closes at the end of a run

    @property
    def touched_backend(self) -> bool:
        """Whether any trial wrote a config (the backend then needs a restart on the original)."""
        return self.measurer.served.touched

    @property
    def bookkeeper(self) -> Bookkeeper:
        return self.recorder.bookkeeper

    @property
    def evaluator(self) -> BatchEvaluator:
        return self.measurer.evaluator

    @property
    def applier(self) -> Applier | None:
        return self.measurer.applier

    @property
    def replay_pool(self) -> ReplayPool | None:
        return self.replay.pool if self.replay is not None else None

    def publish_study(
        self, study: optuna.Study, *, holdout: str | None = None, apply_hint: str | None = None, crossval: Any = None
    ) -> None:
        """Refresh the study note and the MLflow parent run's summary (tuner.study.notes)."""
        self.recorder.publish_study(study, holdout=holdout, apply_hint=apply_hint, crossval=crossval)


def _fail(out: TrialOutcome, reason: str) -> None:
    out.state = "FAIL"
    out.value = None
    from tuner.secrets import redact_text

    out.fail_reason = redact_text(reason.splitlines()[0]) if reason else "unknown failure"


def _same_order(number: int) -> int:
    return number


def _nobody(number: int, phase: str) -> None:
    return None


def compose_runner(
    *,
    study_name: str,
    space: SpaceLike,
    writer: ConfigWriter,
    target: Restartable,
    wait_healthy: Callable[[], Any],
    evaluator: BatchEvaluator,
    trials_dir: Path,
    objective: Objective | None = None,
    secondary_objective: Objective | None = None,
    constraints: Sequence[Constraint] = (),
    cache: ResultCache | None = None,
    tracker: Tracker | None = None,
    artifacts: OptunaArtifacts | None = None,
    bookkeeper: Bookkeeper | None = None,
    stop: StopFlag | None = None,
    on_phase: Callable[[int, str], None] = _nobody,
    project_dir: Path | None = None,
    reporter_factory: Callable[[optuna.Trial], OnResult] | None = None,
    order_seed: Callable[[int], int] = _same_order,
    gates: Mapping[str, GateRange] | None = None,
    inputs: InputsLike | None = None,
    backend_fingerprint_field: str | None = None,
    declared: Mapping[str, BaseDistribution] | None = None,
    report_detail: str = "slim",
    links: Links | None = None,
    applier: Applier | None = None,
    defer_scoring: bool = False,
    replay: ReplayPlan | None = None,
    replay_pool: ReplayPool | None = None,
    crossval: CrossValConfig | None = None,
) -> TrialRunner:
    """A `TrialRunner` with its collaborators built from an experiment's settings
    (tuner.study.wiring.build_runner passes them; tests too).

    ``wait_healthy`` returns the health JSON when it has one; ``backend_fingerprint_field``
    is its dotted field holding the backend's data fingerprint (part of the cache key, with
    the declared ``inputs``); ``project_dir``: config names relative to it when below it;
    ``declared`` defaults to ``space.distributions()``; ``applier`` gets a written config
    served (None: ``target.restart()`` + ``wait_healthy()``); ``defer_scoring`` finishes a
    batch's scoring in ``end``; ``replay`` / ``replay_pool``: fusion params replayed per
    trial and the helper processes scoring them (None: all sampled / in process)."""
    objective = objective if objective is not None else Objective()
    gates = dict(gates or {})
    if declared is None:
        distributions = getattr(space, "distributions", None)
        declared = dict(distributions()) if distributions is not None else {}
    names = ConfigNames(project_dir)
    phases = Phases(on_phase)
    served = ServedBackend(wait_healthy, backend_fingerprint_field)
    measurer = Measurer(
        writer,
        target,
        served,
        evaluator,
        phases=phases,
        stop=stop if stop is not None else StopFlag(),
        applier=applier,
        reporter_factory=reporter_factory,
        order_seed=order_seed,
        defer_scoring=defer_scoring,
    )
    replaying = None
    if replay is not None:
        if not isinstance(evaluator, ExplainingEvaluator):
            raise TypeError(
                f"fusion replay needs an evaluator that explains a retrieval, not {type(evaluator).__name__}"
            )
        replaying = ReplayMeasurer(replay, measurer, evaluator, objective, constraints, replay_pool)
    recorder = Recorder(
        study_name,
        evaluator,
        trials_dir,
        objective=objective,
        constraints=constraints,
        gates=gates,
        declared=declared,
        tracker=tracker,
        artifacts=artifacts,
        bookkeeper=bookkeeper if bookkeeper is not None else Bookkeeper(threaded=False),
        report_detail=report_detail,
        links=links,
        names=names,
        crossval=crossval,
    )
    return TrialRunner(
        space,
        writer,
        CacheLookup(study_name, evaluator, served, cache, objective, constraints, inputs, names),
        measurer,
        TrialScorer(objective, constraints, secondary_objective),
        recorder,
        replay=replaying,
        gates=gates,
        phases=phases,
    )
