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

Module map: the collaborators' interfaces and the objective/constraints are in
tuner.study.interfaces, the outcome in tuner.study.outcome, the stop flag in
tuner.study.stop; the cache key and lookup (`CacheLookup`) in tuner.study.cache_lookup
and the record and its bookkeeping (`TrialRecording`) in tuner.study.records, both
mixed into `TrialRunner`; the `Bookkeeper` and `OptunaArtifacts` in
tuner.study.bookkeeping.
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

from tuner.errors import BackendExited, EvaluationError, HealthTimeout, TargetError, TunerError
from tuner.report.tracking import Tracker
from tuner.study.attrs import ATTR_ASSIGNMENT, ATTR_CACHED_FROM, set_record
from tuner.study.bookkeeping import Bookkeeper, OptunaArtifacts
from tuner.study.cache_lookup import CacheLookup
from tuner.study.interfaces import BatchEvaluator, ConfigWriter, Constraint, InputsLike, Objective, OnResult, SpaceLike
from tuner.study.notes import Links
from tuner.study.outcome import SOLVED_PREFIX, SWEEP_FILE, SWEEP_REPORT, TrialOutcome, is_number, jsonable
from tuner.study.pruning import OOSBudgetExceeded
from tuner.study.records import TrialRecording
from tuner.study.result_cache import CachedResult, ResultCache
from tuner.study.stop import StopFlag, TrialInterrupted

Phase = Literal["suggest", "render", "cache", "patch", "restart", "health", "evaluate", "solve", "complete", "record"]
LEGACY_CONSTRAINTS_ATTR = "constraints"  # the system attr optuna-dashboard 0.21 reads


@dataclass
class TrialRunner(CacheLookup, TrialRecording):
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
    # The space's Optuna distributions by name (default: ``space.distributions()``): a solved
    # gate is recorded as a param under its declared one (tuner.study.applied_params).
    declared: Mapping[str, BaseDistribution] = field(default_factory=dict)
    # "slim" (default) or "full": the report detail of trials that are neither the baseline
    # nor a new best feasible trial (those are always full; tuner.study.records).
    report_detail: str = "slim"
    # Where the dashboards serve this study: the notes and MLflow runs link to each other.
    links: Links | None = None
    _best_value: float | None = field(default=None, init=False, repr=False)
    _best_known: bool = field(default=False, init=False, repr=False)
    _full_best: Any = field(default=None, init=False, repr=False)

    def __post_init__(self) -> None:
        if not self.declared and hasattr(self.space, "distributions"):
            self.declared = dict(self.space.distributions())

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
                set_record(trial, ATTR_ASSIGNMENT, jsonable(out.assignment))
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
                trial.set_user_attr(ATTR_CACHED_FROM, cached.source_trial)
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
                set_record(trial, ATTR_ASSIGNMENT, jsonable(out.assignment))
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
        except OOSBudgetExceeded as exc:
            self._complete_early_stop(trial, out, exc)
        except optuna.TrialPruned as exc:
            self._fail(out, str(exc) or "pruned")
            out.state = "PRUNED"
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
        out.metrics = {k: float(v) for k, v in result.metrics.items() if is_number(v)}
        return result

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
        # The report's sweep and PR plot cover the confidence gate's declared range and
        # the solved value itself (not a fixed grid the trial's own threshold may miss).
        conf = next((g for g in solving.values() if g.role == CONFIDENCE), None)
        gated = regate(result, confidence_threshold=sol.by_role.get(CONFIDENCE),
                       min_score=sol.by_role.get(MIN_SCORE),
                       sweep_range=None if conf is None else (conf.low, conf.high, conf.step or 0.01))
        # One source for the score and the reports: the re-scored batch (equal to the
        # solver's values, tests/evaluation/test_regate.py); the solver adds what a batch lacks.
        out.metrics = {k: float(v) for k, v in gated.metrics.items() if is_number(v)}
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

    def _complete_early_stop(self, trial: optuna.Trial, out: TrialOutcome, exc: OOSBudgetExceeded) -> None:
        """A batch the OOS early stop ended: COMPLETE and infeasible, not PRUNED, so the
        dashboards mark it infeasible and the samplers' constraint models learn from it.
        The OOS constraint is valued at the rate's lower bound (already over its bound);
        other constraints, unmeasured, at 0; the value is the running mean of the queries
        measured (the ``early_stop`` attr says so)."""
        rate = float(exc.fp_rate_lower_bound)
        value = float(exc.running_mean)
        if value != value:  # no in-scope query measured yet: the worst value
            value = 0.0 if self.objective.maximize else float("inf")
        out.metrics = {"OOS_FP_Rate": rate, self.objective.metric: value}
        constraints: dict[str, float] = {}
        for c in self.constraints:
            metric = getattr(c, "metric", None) or c.name.split()[0]
            constraints[c.name] = float(c.violation({"OOS_FP_Rate": rate})) if metric == "OOS_FP_Rate" else 0.0
        for name, violation in constraints.items():
            trial.set_constraint(name, violation)
        trial.storage.set_trial_system_attr(trial._trial_id, LEGACY_CONSTRAINTS_ATTR, list(constraints.values()))
        out.state, out.value, out.constraints = "COMPLETE", value, constraints
        # short: a trial-table column; the trial note says the rest
        out.early_stop = f"OOS_FP_Rate >= {rate:.4g} after {exc.evaluated} queries"
        out.early_stop_detail = (f"{exc} (OOS_FP_Rate is at least {rate:.4g}; {self.objective.metric} {value:.4f} is "
                                 f"the running mean of the {exc.evaluated} queries measured)")

    def _fail(self, out: TrialOutcome, reason: str) -> None:
        out.state = "FAIL"
        out.value = None
        from tuner.secrets import redact_text

        out.fail_reason = redact_text(reason.splitlines()[0]) if reason else "unknown failure"

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
