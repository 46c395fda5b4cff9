"""The Optuna study: create or resume it, queue the baseline and the shortlist once,
run trials under a failure budget, stop gracefully, pick the best feasible trial.

`StudyLoop` is the loop over trials (ask -> TrialRunner.run -> tell) with the
failure budget, n-trials / timeout limits and the stop flag; it knows nothing about
files, backends or MLflow. The second half of this module wires its pieces from an
experiment file (`prepare`, `build_runner`); `tuner.ops.run.run_experiment` puts them
together for `tuner run`, and `tuner.ops.workers` for `tuner worker`.
"""

from __future__ import annotations

import hashlib
import json
import math
import threading
import time
import warnings
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import httpx
import optuna
from optuna.trial import FrozenTrial, TrialState

from tuner.errors import EvaluationError, StudyError
from tuner.report.tracking import MlflowTracker, NullTracker, Tracker
from tuner.study.attrs import ATTR_FAIL_REASON, ATTR_VARIANT, named_constraints
from tuner.study.preflight import PreflightReport
from tuner.study.result_cache import ResultCache
from tuner.study.trial import (
    Bookkeeper,
    Objective,
    OptunaArtifacts,
    StopFlag,
    TrialInterrupted,
    TrialOutcome,
    TrialRunner,
)
from tuner.study.trial import Constraint as TrialConstraint

if TYPE_CHECKING:
    from tuner.config.experiment import Experiment
    from tuner.data.dataset import QuerySet
    from tuner.evaluation.holdout import Split
    from tuner.study.threshold import GateRange

ATTR_ENQUEUED = "tuner.initial_trials_enqueued"
ATTR_ARTIFACT_DIR = "tuner.artifact_dir"
ATTR_OBJECTIVE = "tuner.objective"
ATTR_CONSTRAINTS = "tuner.constraints"
ATTR_PREFLIGHT = "tuner.preflight"
ATTR_CONFIG_SEEN = "tuner.config_seen"  # the space's keys as the study first found them (apply's drift check)
ATTR_REPLICA = "tuner.replica"
INTERRUPTED = "interrupted"
STALE = "stale"


# ---------------------------------------------------------------- observer


class StudyObserver:
    """Hooks for a progress display; every method is a no-op by default."""

    def study_started(self, study: optuna.Study, *, planned: int | None, timeout: float | None) -> None: ...

    def trial_started(self, number: int, variant: str | None) -> None: ...

    def phase(self, number: int, phase: str) -> None: ...

    def trial_finished(self, outcome: TrialOutcome, best: FrozenTrial | None) -> None: ...

    def note(self, text: str) -> None: ...


# ---------------------------------------------------------------- study set-up


def open_study(
    name: str,
    storage: str | optuna.storages.BaseStorage,
    *,
    sampler: optuna.samplers.BaseSampler | None,
    pruner: optuna.pruners.BasePruner | None = None,
    objective_metric: str = "Primary_Metric_Score",
    maximize: bool = True,
) -> optuna.Study:
    """Create the study, or load it when one of that name exists (resume)."""
    direction = "maximize" if maximize else "minimize"
    if isinstance(storage, str):
        from tuner.study.database import rdb_storage

        # rdb_storage names the installed PostgreSQL driver and creates the schema under a
        # lock (processes starting at once on an empty database would race on it).
        # pre-ping: a pooled connection cut by a database restart is replaced, not used.
        storage = (sqlite_storage(storage) if storage.startswith("sqlite:///")
                   else rdb_storage(storage, engine_kwargs={"pool_pre_ping": True}))
    try:
        study = optuna.create_study(
            study_name=name,
            storage=storage,
            sampler=sampler,
            pruner=pruner,
            direction=direction,
            load_if_exists=True,
        )
    except (ValueError, RuntimeError, ImportError) as exc:
        from tuner.dburl import redact

        where = redact(storage) if isinstance(storage, str) else "its storage"
        raise StudyError(f"study {name!r} in {where}: cannot open: {exc}; check storage in the experiment file") from exc
    if study.direction.name.lower() != direction:
        raise StudyError(
            f"study {name!r} exists with direction {study.direction.name.lower()}, the experiment asks {direction};"
            " use another study name or fix objective.direction"
        )
    if study.metric_names != [objective_metric]:
        with warnings.catch_warnings():  # experimental since 3.2, stable in practice
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            study.set_metric_names([objective_metric])
    return study


def sqlite_storage(url: str) -> optuna.storages.RDBStorage:
    """Optuna's RDBStorage on a SQLite file in WAL mode with synchronous=NORMAL.

    Optuna commits every suggested parameter and attribute separately; with SQLite's
    default rollback journal each commit waits for an fsync, which made bookkeeping a
    visible share of a short trial. WAL + NORMAL stays consistent after a crash of the
    tuner (only an OS crash may lose the last commits) and lets optuna-dashboard read
    while the study writes.
    """
    import sqlite3

    path = Path(url[len("sqlite:///"):])
    if str(path) != ":memory:":
        path.parent.mkdir(parents=True, exist_ok=True)

    def connect() -> sqlite3.Connection:
        conn = sqlite3.connect(str(path), timeout=60, check_same_thread=False)
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("PRAGMA synchronous=NORMAL")
        return conn

    from tuner.study.database import rdb_storage

    return rdb_storage(url, engine_kwargs={"creator": connect})


@dataclass(frozen=True)
class Variant:
    """A fixed parameter set queued before the sampler takes over."""

    name: str
    params: Mapping[str, Any]  # Optuna params (SearchSpace.params_for(assignment))


def enqueue_initial(study: optuna.Study, variants: Sequence[Variant]) -> int:
    """Queue the baseline and the shortlist once per study; a resumed study already has
    them (a study user attr marks it). Returns how many were queued now."""
    if study.user_attrs.get(ATTR_ENQUEUED):
        return 0
    for v in variants:
        study.enqueue_trial(dict(v.params), user_attrs={ATTR_VARIANT: v.name}, skip_if_exists=False)
    study.set_user_attr(ATTR_ENQUEUED, True)
    return len(variants)


def fail_stale_trials(study: optuna.Study) -> list[int]:
    """Mark trials left RUNNING by a killed run as FAIL, so they neither block nor count.

    Only for a process holding the study lock exclusively (tuner.study.locks): then no
    other process has a live trial. Workers fail stale trials by heartbeat instead.
    """
    stale = study.get_trials(deepcopy=False, states=(TrialState.RUNNING,))
    for t in stale:
        study._storage.set_trial_user_attr(t._trial_id, ATTR_FAIL_REASON, f"{STALE}: left running by an interrupted run")
        study.tell(t.number, state=TrialState.FAIL)
    return [t.number for t in stale]


def is_feasible(trial: FrozenTrial) -> bool:
    return trial.state == TrialState.COMPLETE and all(
        v <= 0 for v in named_constraints(trial.constraints).values()
    )


def best_feasible_trial(trials: Sequence[FrozenTrial], *, maximize: bool = True) -> FrozenTrial | None:
    """The best COMPLETE trial whose constraints all hold (None when none does).

    Own selection instead of ``study.best_trial``, which raises when nothing is feasible
    and cannot be asked for 'best but feasible' in reports. Ties: the earlier trial.
    """
    feasible = [t for t in trials if is_feasible(t) and t.values]
    if not feasible:
        return None
    sign = -1.0 if maximize else 1.0
    return min(feasible, key=lambda t: (sign * t.values[0], t.number))


# ---------------------------------------------------------------- failure budget


@dataclass
class FailureBudget:
    """Stop the study after too many failed trials (in this run)."""

    max_consecutive: int | None = 3
    max_total: int | None = 10
    consecutive: int = 0
    total: int = 0
    last_reason: str | None = None

    def record(self, outcome: TrialOutcome) -> None:
        if outcome.state in ("COMPLETE", "PRUNED"):
            self.consecutive = 0
            return
        if outcome.interrupted:
            return
        self.consecutive += 1
        self.total += 1
        self.last_reason = outcome.fail_reason

    def exceeded(self) -> str | None:
        """Why the budget is spent, or None."""
        if self.max_consecutive is not None and self.consecutive >= self.max_consecutive:
            return f"{self.consecutive} consecutive failed trials (failure_budget.max_consecutive={self.max_consecutive})"
        if self.max_total is not None and self.total >= self.max_total:
            return f"{self.total} failed trials in this run (failure_budget.max_total={self.max_total})"
        return None


# ---------------------------------------------------------------- the loop


@dataclass
class RunResult:
    """What one `tuner run` did."""

    study_name: str
    ran: list[TrialOutcome] = field(default_factory=list)
    stopped_by: str = "n_trials"  # n_trials | timeout | signal | failure_budget | lock_lost
    stale_failed: list[int] = field(default_factory=list)
    elapsed_s: float = 0.0
    flush_s: float = 0.0  # waiting for the last trials' bookkeeping at the end


class Clock(Protocol):
    def __call__(self) -> float: ...


@dataclass
class StudyLoop:
    """The one loop over trials, for `tuner run` and for every `tuner worker`.

    A worker is this loop with a ``replica`` number: each trial runs under an Optuna
    heartbeat (a trial whose worker dies goes stale and is failed and retried by a
    live worker, which looks before each trial), records its replica, and the loop
    stops once the study as a whole has ``study_total`` trials counted (finished
    ones plus those running elsewhere, so parallel workers overshoot by at most the
    trials already running). ``lease`` (tuner.study.locks.StudyLease) is checked before
    each trial: a study lock lost to another process stops the loop.
    """

    study: optuna.Study
    runner: Any  # TrialRunner, or anything with run(trial) -> TrialOutcome and flush()
    budget: FailureBudget = field(default_factory=FailureBudget)
    stop: StopFlag = field(default_factory=StopFlag)
    observer: StudyObserver = field(default_factory=StudyObserver)
    maximize: bool = True
    clock: Clock = time.monotonic
    study_total: int | None = None
    replica: int | None = None
    lease: Any = None
    #: what the last ``run`` did so far (kept when it raises, for the summary)
    result: RunResult | None = None

    def run(self, *, n_trials: int | None, timeout: float | None) -> RunResult:
        """Run up to ``n_trials`` trials (None: until stopped) for at most ``timeout`` s.

        Raises StudyError when the failure budget is spent (after the failing trial is
        recorded); the caller restores the config in a ``finally``.
        """
        result = self.result = RunResult(self.study.study_name)
        started = self.clock()
        self.observer.study_started(self.study, planned=n_trials, timeout=timeout)
        try:
            self._loop(result, started, n_trials=n_trials, timeout=timeout)
        finally:
            flush_started = self.clock()
            self.runner.flush()  # the last trial's reports and MLflow run
            result.flush_s = self.clock() - flush_started
            result.elapsed_s = self.clock() - started
        return result

    def _loop(self, result: RunResult, started: float, *, n_trials: int | None, timeout: float | None) -> None:
        while True:
            if self.stop.is_set():
                result.stopped_by = "signal"
                break
            if n_trials is not None and len(result.ran) >= n_trials:
                result.stopped_by = "n_trials"
                break
            if timeout is not None and self.clock() - started >= timeout:
                result.stopped_by = "timeout"
                break
            lost = self.lease.lost() if self.lease is not None else None
            if lost is not None:
                result.stopped_by = "lock_lost"
                raise StudyError(f"study {self.study.study_name!r} stopped: {lost}; check for another process on it")
            if self.replica is not None:
                result.stale_failed.extend(fail_stale_heartbeats(self.study))
            if self.study_total is not None and count_counted(self.study) >= self.study_total:
                result.stopped_by = "n_trials"
                break
            outcome = self._one_trial()
            result.ran.append(outcome)
            self.budget.record(outcome)
            why = self.budget.exceeded()
            if why is not None:
                result.stopped_by = "failure_budget"
                raise StudyError(
                    f"study {self.study.study_name!r} stopped: {why}; last failure: {self.budget.last_reason};"
                    " fix the backend or the search space, then `tuner run` resumes the study"
                )

    def _one_trial(self) -> TrialOutcome:
        asked = time.perf_counter()
        with warnings.catch_warnings():
            # optuna warns that heartbeats are meant for study.optimize; `heartbeat`
            # below does for ask/tell what optimize does.
            warnings.filterwarnings("ignore", message="Heartbeat of storage", category=UserWarning)
            trial = self.study.ask()
        if self.replica is not None:
            self.study._storage.set_trial_system_attr(trial._trial_id, ATTR_REPLICA, self.replica)
        ask_s = time.perf_counter() - asked
        variant = trial.user_attrs.get(ATTR_VARIANT)
        self.observer.trial_started(trial.number, variant)
        try:
            with heartbeat(self.study._storage, trial._trial_id):
                outcome = self.runner.run(trial)
        except KeyboardInterrupt:
            self.study.tell(trial, state=TrialState.FAIL)
            raise
        told = time.perf_counter()
        if outcome.state == "COMPLETE":
            assert outcome.value is not None
            self.study.tell(trial, outcome.value)
        elif outcome.state == "PRUNED":
            self.study.tell(trial, state=TrialState.PRUNED)
        else:
            self.study.tell(trial, state=TrialState.FAIL)
        # Loop-side costs, kept on the outcome only (the trial is finished by now).
        outcome.phase_seconds["ask"] = ask_s
        outcome.phase_seconds["tell"] = time.perf_counter() - told
        best = best_feasible_trial(self.study.get_trials(deepcopy=False), maximize=self.maximize)
        self.observer.trial_finished(outcome, best)
        return outcome


@contextmanager
def heartbeat(storage: optuna.storages.BaseStorage, trial_id: int) -> Iterator[None]:
    """Record an Optuna heartbeat for ``trial_id`` every interval while the block runs
    (nothing when the storage has no heartbeat configured). Optuna starts its own
    heartbeat thread only inside ``study.optimize``; the tuner's loop is ask/tell."""
    beat: Any = storage if hasattr(storage, "record_heartbeat") else None
    interval = beat.get_heartbeat_interval() if beat is not None else None
    if beat is None or interval is None:
        yield
        return
    stop = threading.Event()

    def loop() -> None:
        while True:
            try:
                beat.record_heartbeat(trial_id)
            except Exception:  # a blip of the database must not kill the trial; the next beat retries
                pass
            if stop.wait(interval):
                return

    thread = threading.Thread(target=loop, name=f"heartbeat-{trial_id}", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()


def fail_stale_heartbeats(study: optuna.Study) -> list[int]:
    """Fail the trials whose worker stopped beating (Optuna's retry callback queues a
    copy); returns their numbers."""
    before = {t.number for t in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,))}
    if not before:
        return []
    with warnings.catch_warnings():  # experimental since 2.9, the documented way all the same
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        optuna.storages.fail_stale_trials(study)
    after = {t.number for t in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,))}
    return sorted(before - after)


class ObjectiveRunner:
    """A plain objective (returns a float, raises TrialPruned) as a loop's runner: for
    library use and for tests of the loop without a backend."""

    touched_backend = False

    def __init__(self, objective: Any) -> None:
        self.objective = objective

    def run(self, trial: optuna.Trial) -> TrialOutcome:
        try:
            return TrialOutcome(trial.number, "COMPLETE", float(self.objective(trial)))
        except optuna.TrialPruned as exc:
            return TrialOutcome(trial.number, "PRUNED", fail_reason=str(exc) or None)
        except Exception as exc:  # an objective's failure is the trial's, not the loop's
            reason = f"{type(exc).__name__}: {exc}"
            from tuner.secrets import redact_text

            trial.set_user_attr(ATTR_FAIL_REASON, redact_text(reason))  # counted, like a TrialRunner failure
            return TrialOutcome(trial.number, "FAIL", fail_reason=reason)

    def flush(self) -> None:
        return None


def counts_toward_total(trial: FrozenTrial) -> bool:
    """Whether a trial uses up one of the study's ``n_trials``: COMPLETE and PRUNED
    ones, and FAILed ones the trial runner failed for a reason. Interrupted trials
    (Ctrl-C, a killed run or worker; no reason, or ``interrupted``/``stale``) never
    ran to the end and are not counted: their retries are."""
    if trial.state in (TrialState.COMPLETE, TrialState.PRUNED):
        return True
    if trial.state != TrialState.FAIL:
        return False
    reason = str(trial.user_attrs.get(ATTR_FAIL_REASON, ""))
    return bool(reason) and not reason.startswith((INTERRUPTED, STALE))


def count_finished(study: optuna.Study) -> int:
    """Trials that count against the study's n_trials (see counts_toward_total)."""
    return sum(counts_toward_total(t) for t in study.get_trials(deepcopy=False))


def count_counted(study: optuna.Study) -> int:
    """Counted trials plus those running now (in this or another process)."""
    trials = study.get_trials(deepcopy=False)
    return sum(counts_toward_total(t) or t.state == TrialState.RUNNING for t in trials)


def remaining_trials(study: optuna.Study, total: int | None) -> int | None:
    if total is None:
        return None
    return max(0, total - count_finished(study))


def summary_metrics(study: optuna.Study, *, maximize: bool) -> dict[str, float]:
    """Numbers for the parent run: trials by state and the best feasible value."""
    trials = study.get_trials(deepcopy=False)
    out = {f"trials_{s.name.lower()}": float(sum(t.state == s for t in trials)) for s in
           (TrialState.COMPLETE, TrialState.FAIL, TrialState.PRUNED)}
    best = best_feasible_trial(trials, maximize=maximize)
    out["feasible_trials"] = float(sum(is_feasible(t) for t in trials))
    if best is not None:
        out["best_feasible_value"] = float(best.values[0])
        out["best_feasible_trial"] = float(best.number)
    else:
        out["best_feasible_value"] = math.nan
    return out


# ================================================================ wiring an experiment
#
# Everything below turns an Experiment (tuner.config.experiment) into the pieces of a running
# StudyLoop: the search space checked against the config files, the labels, MLflow,
# the Optuna artifact store and the result cache (tuner.ops.run assembles them).


@dataclass(frozen=True)
class StudyPaths:
    """Where a study keeps its files under the experiment's state dir."""

    state_dir: Path
    study_name: str

    @property
    def trials_dir(self) -> Path:
        return self.state_dir / "trials" / _safe(self.study_name)

    @property
    def artifact_dir(self) -> Path:
        # One store for all studies: optuna-dashboard takes a single --artifact-dir.
        return self.state_dir / "optuna-artifacts"

    @property
    def cache_path(self) -> Path:
        return self.state_dir / "result-cache.sqlite"


def _safe(name: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in name)


class LiveEvaluator:
    """`BatchEvaluator` over the live search API (tuner.evaluation.run_batch) and the
    per-trial reports (tuner.report.write_reports)."""

    def __init__(self, experiment: Experiment, queries: QuerySet, qrels: Mapping[str, Mapping[str, int]], labels_fp: str) -> None:
        self.experiment = experiment
        self.spec = experiment.evaluation
        self.queries = queries
        self.qrels = qrels
        # A subset (the tune split) shares its parent's content hash; its query ids keep
        # its cached results apart from the whole set's.
        ids = hashlib.sha256("\n".join(queries.query_ids).encode()).hexdigest()[:16]
        self.dataset_hash = f"{queries.content_hash}:{ids}"
        self.labels_fingerprint = labels_fp
        self.spec_fingerprint = spec_fingerprint(self.spec)
        self.last_search_seconds = 0.0
        #: the preflight of the run (tuner.study.preflight), recorded in every report's context
        self.preflight: PreflightReport | None = None
        #: the batch's abort check and the run's stop flag (build_runner sets both)
        self.abort: Any = None
        self.stop: StopFlag | None = None

    def evaluate(self, *, order_seed: int, on_result: Any) -> Any:
        from tuner.evaluation import run_batch
        from tuner.evaluation.batch import BatchAborted
        from tuner.study.preflight import empty_results_problem

        clock = SearchClock(self.spec.concurrency)
        try:
            result = run_batch(self.spec, self.queries, self.qrels, order_seed=order_seed, on_result=on_result,
                               transport=clock, abort=self.abort)
        except BatchAborted as exc:
            stop = self.stop
            if stop is not None and stop.is_set() and exc.reason.startswith(stop.reason):
                raise TrialInterrupted(exc.reason) from exc  # a stop, not the config's failure
            raise
        finally:
            self.last_search_seconds = clock.seconds
        # A mostly empty batch is a broken request or mapping, not a config that scores 0:
        # failing the trial keeps the 0 out of the sampler's model and under the failure budget.
        problem = empty_results_problem(result, self.spec)
        if problem is not None:
            raise EvaluationError(f"{problem}; a broken request or response mapping, not a bad config "
                                  "(tuner check EXPERIMENT shows a raw response); raise evaluation.max_empty_share "
                                  "if empty results are expected")
        return result

    def report_paths(self, result: Any, out_dir: Path) -> dict[str, Path]:
        """The names tuner.report.write_reports gives its files (stem "report")."""
        paths = {
            "json": out_dir / "report.json",
            "markdown": out_dir / "report.md",
            "per_query_csv": out_dir / "report_per_query.csv",
        }
        if getattr(result, "threshold_sweep", None) is not None:
            paths["pr_curve_png"] = out_dir / "report_pr_curve.png"
        return paths

    def write_reports(self, result: Any, out_dir: Path, *, context: Mapping[str, Any], config_snapshot: str) -> dict[str, Path]:
        from tuner.report import ReportContext, write_reports

        ctx = ReportContext(
            title=f"Study {context.get('study')} - trial {context.get('trial')}",
            labels_fingerprint=self.labels_fingerprint,
            labels_db=str(self.experiment.dataset.labels_db),
            url=self.spec.request.url,
            queries_file=str(self.experiment.dataset.queries),
            spec=self.spec.model_dump(mode="json"),
            extra={**self._preflight_context(), **context},
        )
        written = {k: Path(v) for k, v in _fields(write_reports(result, out_dir, context=ctx, config_snapshot=config_snapshot)).items()
                   if v is not None}
        if written != self.report_paths(result, out_dir):
            raise EvaluationError(
                f"report files {sorted(map(str, written.values()))} differ from the paths recorded on the trial;"
                " update LiveEvaluator.report_paths to tuner.report's naming"
            )
        return written


    def _preflight_context(self) -> dict[str, Any]:
        if self.preflight is None:
            return {}
        return {"preflight": self.preflight.for_reports()}


class SearchClock(httpx.AsyncBaseTransport):
    """httpx's own transport (same connection limits as the evaluation client), timing
    the window from the first request sent to the last response body read: the search
    calls proper, measured without a per-query callback."""

    def __init__(self, concurrency: int) -> None:
        limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
        from tuner.evaluation.client import shared_ssl_context

        # one CA bundle load per process, not per batch (~30 ms a trial)
        self._inner = httpx.AsyncHTTPTransport(limits=limits, verify=shared_ssl_context())
        self._first: float | None = None
        self._last: float | None = None

    @property
    def seconds(self) -> float:
        return 0.0 if self._first is None or self._last is None else self._last - self._first

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        if self._first is None:
            self._first = time.perf_counter()
        response = await self._inner.handle_async_request(request)
        # the body is read by the evaluation client (deadline, byte cap) through this stream
        return httpx.Response(response.status_code, headers=response.headers,
                              stream=_ClockedStream(response.stream, self), extensions=response.extensions,
                              request=request)

    async def aclose(self) -> None:
        await self._inner.aclose()


class _ClockedStream(httpx.AsyncByteStream):
    """A response body passed through as it is read; its end (read or cut) is the clock's last answer."""

    def __init__(self, inner: Any, clock: SearchClock) -> None:
        self._inner = inner
        self._clock = clock

    async def __aiter__(self) -> Any:
        async for chunk in self._inner:
            yield chunk

    async def aclose(self) -> None:
        await self._inner.aclose()
        self._clock._last = time.perf_counter()


def _fields(obj: Any) -> dict[str, Any]:
    if hasattr(obj, "_asdict"):
        return dict(obj._asdict())
    if hasattr(obj, "__dataclass_fields__"):
        return {k: getattr(obj, k) for k in obj.__dataclass_fields__}
    return dict(obj)


def spec_fingerprint(spec: Any) -> str:
    """The evaluation settings that change a result: request body and path, response
    mapping, top_k, gains. Host and port are left out (``port: auto`` picks a new one
    each run, and a resumed study must still hit its cache), and so are concurrency,
    timeouts and retries (they change how fast, not what is measured)."""
    from urllib.parse import urlsplit

    data = spec.model_dump(mode="json")
    url = urlsplit(data["request"]["url"])
    data["request"]["url"] = url.path + (f"?{url.query}" if url.query else "")
    for key in ("concurrency", "timeout_s", "retries", "max_failed_queries", "backoff_s", "backoff_max_s",
                "deadline_s", "max_response_bytes"):
        data.pop(key, None)
    data["request"].pop("secret_fields", None)  # which values are redacted in records, not what is sent
    return json.dumps(data, sort_keys=True)


class PatcherWriter:
    """`ConfigWriter` over tuner.config.configpatch: renders through the search space's edits,
    writes exactly the rendered texts (journal first, atomic writes)."""

    def __init__(self, space: Any, patcher: Any) -> None:
        self.space = space
        self.patcher = patcher

    def render(self, assignment: Mapping[str, Any]) -> dict[Path, str]:
        return self.patcher.render(self.space.edits(assignment))

    def write(self, texts: Mapping[Path, str]) -> None:
        self.patcher.write(texts)


@dataclass
class Prepared:
    """An experiment's pieces, loaded and checked before any trial runs."""

    experiment: Experiment
    space: Any
    patcher: Any
    queries: QuerySet
    qrels: dict[str, dict[str, int]]
    labels_fingerprint: str
    warnings: list[str]
    recovered: list[Path]
    # ``queries`` is what the study tunes on: the tune part when the holdout is enabled.
    all_queries: QuerySet | None = None
    split: Split | None = None
    gates: dict[str, GateRange] = field(default_factory=dict)  # post-retrieval param -> its range, solved per trial
    dataset_note: str | None = None  # what dataset.unjudged_queries did (tuner.data.dataset.judged_subset)


def prepare(experiment: Experiment, *, recover_journal: bool = True) -> Prepared:
    """Replay a crash's journal, load the space (checked against the config files),
    the query set and the labels (imported from the experiment's label files when the
    label store has none for the dataset), and split off the holdout queries."""
    from tuner.config.configpatch import ConfigPatcher, recover
    from tuner.config.space import load_space
    from tuner.evaluation.holdout import tune_split
    from tuner.study.threshold import check_gate_mapping, solvable_gates

    recovered = recover(experiment.journal_path) if recover_journal else []
    space = load_space(experiment.search_space, experiment.target.config_files)
    # ConfigError now, not after the first trial; solvable_gates goes in sorted name order.
    gates = dict(zip(sorted(space.post_retrieval), solvable_gates(space), strict=True))
    check_gate_mapping(gates.values(), experiment.evaluation.response, where=f"{experiment.source}: ")
    if gates and experiment.objective.direction != "maximize":
        from tuner.errors import ConfigError

        raise ConfigError(
            f"{experiment.source}: objective.direction: minimize, but post_retrieval gates "
            f"({', '.join(gates)}) are solved for the highest objective; maximise, or drop post_retrieval"
        )
    patcher = ConfigPatcher(experiment.target.config_files, journal_path=experiment.journal_path)
    warnings = list(experiment.warnings) + space.validate_against(patcher.documents(), patcher.names)
    all_queries, qrels, labels_fp, dataset_note = load_dataset(experiment)
    if dataset_note:
        warnings.append(dataset_note)
    queries, split = tune_split(all_queries, experiment.holdout)
    return Prepared(experiment, space, patcher, queries, qrels, labels_fp, warnings, recovered,
                    all_queries=all_queries, split=split, gates=gates, dataset_note=dataset_note)


def load_dataset(experiment: Experiment) -> tuple[QuerySet, dict[str, dict[str, int]], str, str | None]:
    """The query set (``dataset.unjudged_queries`` applied), its labels, the labels'
    fingerprint and the one-line note of what the unjudged-queries policy did (or None)."""
    from tuner.data.dataset import judged_subset, load_queryset
    from tuner.data.labels import LabelStore, read_judgments
    from tuner.data.qrels import GradeMap

    ds = experiment.dataset
    queries = load_queryset(ds.queries, ds.dataset_id)
    created = not Path(ds.labels_db).exists()
    store = LabelStore(ds.labels_db)
    if queries.dataset_id not in store.datasets():
        try:
            if not ds.labels:
                store.qrels(queries.dataset_id)  # raises the LabelError that says how to import
            maps = [GradeMap({int(k): v for k, v in s.grade_map.items()}) if s.grade_map else None for s in ds.labels]
            # every file parses before any is stored: a bad second file must not leave the
            # first one's labels looking like the whole set (the next run would not re-import)
            for source, grade_map in zip(ds.labels, maps, strict=True):
                read_judgments(source.path, source.format, grade_map)
            for source, grade_map in zip(ds.labels, maps, strict=True):
                store.import_file(source.path, queries.dataset_id, fmt=source.format, grade_map=grade_map)
        except BaseException:
            if created:  # a failed first import leaves no empty label store behind
                for suffix in ("", "-wal", "-shm", "-journal"):
                    Path(f"{ds.labels_db}{suffix}").unlink(missing_ok=True)
            raise
    qrels = store.qrels(queries.dataset_id)
    judged = judged_subset(queries, qrels, ds.unjudged_queries)
    return judged.queries, qrels, store.fingerprint(queries.dataset_id), judged.note


def record_config_seen(study: optuna.Study, prepared: Prepared) -> None:
    """Keep the search space's values as the study first finds them in the config, so
    `tuner apply` can tell a hand edit made since then (tuner.ops.apply.find_drift)."""
    if ATTR_CONFIG_SEEN not in study.user_attrs:
        current = prepared.space.current_assignment(prepared.patcher.documents())
        study.set_user_attr(ATTR_CONFIG_SEEN, json.loads(json.dumps(current, default=str)))


def initial_variants(prepared: Prepared) -> list[Variant]:
    """The baseline (the config as found) and the shortlist, as Optuna params."""
    exp, space = prepared.experiment, prepared.space
    out: list[Variant] = []
    if exp.baseline:
        current = space.current_assignment(prepared.patcher.documents())
        out.append(Variant("baseline", space.params_for(current)))
    for i, v in enumerate(exp.variants):
        out.append(Variant(v.name or f"shortlist-{i + 1}", space.params_for(v.values)))
    return out


def reporter_factory(
    experiment: Experiment, pruner: optuna.pruners.BasePruner, queries: QuerySet,
    gates: Mapping[str, GateRange] | None = None,
) -> Any:
    """The per-query callback factory of tuner.study.pruning: intermediate values for the
    pruner, and the exact OOS early stop (a trial whose answered OOS queries already
    exceed what ``OOS_FP_Rate <= b`` allows is stopped as PRUNED). None when neither
    applies (no per-query callback then).

    With a solved confidence gate an OOS query counts as answered only when it would
    be at the top of the range. A solved min_score gate can empty a result
    list, which the per-query row at the retrieval's minimum cannot show, so the OOS
    early stop is off then (it could stop a trial that a higher minimum makes feasible).
    """
    from tuner.study import pruning
    from tuner.study.threshold import CONFIDENCE, MIN_SCORE

    by_role = {g.role: g for g in (gates or {}).values()}
    constraints = () if MIN_SCORE in by_role else experiment.constraints
    top = by_role[CONFIDENCE].high if CONFIDENCE in by_role else None
    return pruning.reporter_factory(pruner, queries, objective=experiment.objective.metric,
                                    constraints=constraints, threshold_max=top)


#: seconds a batch under way may go on after SIGTERM / Ctrl-C before it is aborted
STOP_GRACE_S = 10.0


def build_runner(
    prepared: Prepared,
    study: optuna.Study,
    *,
    target: Any,
    wait_healthy: Any,
    stop: StopFlag,
    use_cache: bool = True,
    tracker: Tracker | None = None,
    artifacts: OptunaArtifacts | None = None,
    bookkeeper: Bookkeeper | None = None,
    on_phase: Any = None,
    preflight: PreflightReport | None = None,
) -> TrialRunner:
    """The trial runner of an experiment (shared by `tuner run` and `tuner worker`):
    the live evaluator on the tune queries, objective and constraints, result cache,
    per-query pruning callback and the post-retrieval gates solved per trial."""
    exp = prepared.experiment
    paths = StudyPaths(exp.state_dir, exp.study)
    maximize = exp.objective.direction == "maximize"
    gates = prepared.gates
    extra: dict[str, Any] = {}
    if bookkeeper is not None:
        extra["bookkeeper"] = bookkeeper
    if on_phase is not None:
        extra["on_phase"] = on_phase
    evaluator = LiveEvaluator(exp, prepared.queries, prepared.qrels, prepared.labels_fingerprint)
    evaluator.preflight = preflight  # every trial's report says whether the set-up was checked
    from tuner.evaluation.batch import StopAfterGrace, any_abort

    # A dead backend ends the batch at once; a stop lets the batch under way finish for
    # STOP_GRACE_S, then ends it (SIGTERM bound: grace + ABORT_POLL_S + target stop + restore).
    evaluator.abort = any_abort(target.failure, StopAfterGrace(lambda: stop.reason if stop.is_set() else None,
                                                               STOP_GRACE_S))
    evaluator.stop = stop
    from tuner.data.inputs import InputsWatch

    # hashed at the first trial's cache lookup, re-checked (stat) before every later one
    inputs = InputsWatch(exp.target.inputs, root=exp.project_root) if exp.target.inputs else None
    return TrialRunner(
        study_name=exp.study,
        space=prepared.space,
        writer=PatcherWriter(prepared.space, prepared.patcher),
        target=target,
        wait_healthy=wait_healthy,
        evaluator=evaluator,
        trials_dir=paths.trials_dir,
        objective=Objective(exp.objective.metric, maximize),
        constraints=[TrialConstraint(c.name, c.violation) for c in exp.constraints],
        cache=ResultCache(paths.cache_path) if use_cache else None,
        tracker=tracker,
        artifacts=artifacts,
        stop=stop,
        project_dir=exp.project_root,
        reporter_factory=reporter_factory(exp, study.pruner, prepared.queries, gates),
        order_seed=order_seed_for(exp.sampler.seed),
        gates=gates,
        inputs=inputs,
        backend_fingerprint_field=exp.target.health.fingerprint,
        **extra,
    )


def order_seed_for(study_seed: int | None) -> Any:
    """Each trial's query order: shuffled, different per trial, reproducible per study."""
    import random

    return lambda number: random.Random(f"{study_seed}:{number}").getrandbits(32)


def make_tracker(experiment: Experiment, on_warning: Any = None) -> Tracker:
    """The experiment's MLflow tracker. MLflow is bookkeeping: a store that cannot be
    opened does not stop a study (every trial is in the Optuna study all the same).
    With ``on_warning`` the tracker falls back to none and the warning says so; without
    it the StudyError is raised (for commands whose whole job is MLflow)."""
    if not experiment.tracking.enabled:
        return NullTracker()
    uri = experiment.tracking.mlflow_uri
    try:
        _probe_tracking_server(uri)
        return MlflowTracker(
            uri,
            experiment.tracking.experiment_name or experiment.study,
            artifact_root=experiment.tracking.artifact_location,
        )
    except (StudyError, OSError) as exc:
        if on_warning is None:
            raise
        on_warning(f"warning: MLflow is off for this run: {str(exc).splitlines()[0]}; trials are recorded in the "
                   "Optuna study only (fix tracking.mlflow_uri, or set tracking.enabled: false)")
        return NullTracker()


def _probe_tracking_server(uri: str, timeout_s: float = 5.0) -> None:
    """An HTTP tracking server that does not answer /health within ``timeout_s`` is a
    StudyError now, instead of minutes of MLflow's own retries per call later."""
    if not uri.startswith(("http://", "https://")):
        return
    try:
        httpx.get(uri.rstrip("/") + "/health", timeout=timeout_s).raise_for_status()
    except httpx.HTTPError as exc:
        raise StudyError(f"MLflow tracking server {uri} does not answer /health ({type(exc).__name__}: {exc})") from exc
