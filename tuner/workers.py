"""Several worker processes on one study: storage rules, heartbeats, crash retry.

``tuner worker EXPERIMENT --replica N`` runs one worker; start several (on one machine
or several) against the same PostgreSQL storage. Each drives its own backend replica.

Rules, and why:

- **PostgreSQL (or MySQL) for more than one worker.** Several workers on one SQLite
  study race on queued trials: two of them can pop the same WAITING trial (optuna
  issues 4621, 4002), so a baseline runs twice and another is lost. ``check_storage``
  refuses that with the fix in the message.
- **Heartbeats, not "fail every RUNNING trial".** A single ``tuner run`` may fail all
  RUNNING trials at start (they were left by a killed run); with several workers that
  would fail the live trials of the others. Workers instead record a heartbeat per
  running trial; a trial whose heartbeat is older than ``grace_period_s`` belongs to a
  dead worker and is failed by whichever worker looks next
  (``optuna.storages.fail_stale_trials``), and ``RetryHeartbeatStaleTrialCallback`` queues a
  copy with the same parameters, which the next free worker runs. Optuna starts its
  own heartbeat thread only inside ``study.optimize``; the tuner's loop is ask/tell,
  so ``heartbeat`` does the same around each trial.
- **Enqueue once.** The baseline and shortlist are queued by the first worker under a
  storage-wide lock (a PostgreSQL advisory lock) with a study attribute as the
  "done" mark, so N workers starting together queue them exactly once.
- **Study-wide trial budget.** A worker stops when the study as a whole has
  ``n_trials`` finished trials (complete or pruned; failed ones are retried and so do
  not count), not after N trials of its own.
"""

from __future__ import annotations

import hashlib
import threading
import time
import warnings
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Protocol

import optuna
from optuna.trial import TrialState
from sqlalchemy import text

from tuner.errors import StudyError
from tuner.experiment import WorkerSettings
from tuner.storage import redact, sqlalchemy_url

DEFAULT_TEST_DSN = "postgresql://tuner:tuner@127.0.0.1:5432/tuner_test"
ATTR_REPLICA = "tuner.replica"
ATTR_WORKER = "tuner.worker"
COUNTED_STATES = (TrialState.COMPLETE, TrialState.PRUNED)


def storage_dialect(url: str) -> str:
    """``sqlite``, ``postgresql``, ``mysql``, ... from a SQLAlchemy URL."""
    scheme = url.split(":", 1)[0].lower()
    return scheme.split("+", 1)[0]


def check_storage(url: str, n_workers: int) -> None:
    """Refuse SQLite with more than one worker (StudyError says why and what to use)."""
    if n_workers > 1 and storage_dialect(url) == "sqlite":
        raise StudyError(
            f"storage {url} is SQLite, which cannot be shared by {n_workers} workers: queued trials race there "
            "(two workers can take the same baseline/shortlist trial; optuna issues 4621, 4002); set storage to a "
            "PostgreSQL URL, e.g. postgresql://USER:PASSWORD@HOST:5432/DB, or run a single `tuner run`"
        )
    if storage_dialect(url) not in ("sqlite", "postgresql", "mysql"):
        raise StudyError(f"storage {url}: unsupported database; use sqlite:///FILE (one worker) or postgresql://...")


def make_storage(url: str, settings: WorkerSettings | None = None) -> optuna.storages.RDBStorage:
    """RDBStorage with heartbeats and the retry-on-crash callback."""
    settings = settings or WorkerSettings()
    url = sqlalchemy_url(url)
    engine_kwargs: dict[str, Any] = {}
    if storage_dialect(url) == "postgresql":
        # A worker holds at most a couple of connections; pre-ping survives a server restart.
        engine_kwargs = {"pool_size": 2, "max_overflow": 4, "pool_pre_ping": True}
    try:
        with warnings.catch_warnings():  # heartbeats are "experimental" since optuna 2.9
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            return optuna.storages.RDBStorage(
                url,
                engine_kwargs=engine_kwargs,
                heartbeat_interval=settings.heartbeat_interval_s,
                grace_period=settings.grace,
                heartbeat_stale_trial_callback=optuna.storages.RetryHeartbeatStaleTrialCallback(
                    max_retry=settings.max_retry
                ),
            )
    except Exception as exc:  # sqlalchemy / driver errors: connection refused, bad credentials, ...
        raise StudyError(f"storage {redact(url)}: cannot connect ({type(exc).__name__}: {exc}); "
                         "check the URL and that the database server runs") from exc


@contextmanager
def storage_lock(storage: optuna.storages.BaseStorage, name: str, timeout_s: float = 60.0) -> Iterator[None]:
    """A lock shared by every process on the same database (PostgreSQL advisory lock,
    MySQL GET_LOCK). SQLite gets none: it is refused for several workers anyway."""
    # study._storage wraps the RDBStorage in a cache layer; the engine sits underneath.
    engine = getattr(getattr(storage, "_backend", storage), "engine", None)
    dialect = engine.dialect.name if engine is not None else "none"
    if dialect not in ("postgresql", "mysql"):
        yield
        return
    key = int.from_bytes(hashlib.blake2b(name.encode(), digest_size=8).digest(), "big", signed=True)
    with engine.connect() as conn:
        if dialect == "postgresql":
            conn.execute(text("SET lock_timeout = :ms"), {"ms": f"{int(timeout_s * 1000)}"})
            conn.execute(text("SELECT pg_advisory_lock(:k)"), {"k": key})
        else:
            got = conn.execute(text("SELECT GET_LOCK(:n, :t)"), {"n": f"tuner:{key}", "t": timeout_s}).scalar()
            if got != 1:
                raise StudyError(f"could not take the lock {name!r} within {timeout_s:g} s; is another worker stuck?")
        try:
            yield
        finally:
            if dialect == "postgresql":
                conn.execute(text("SELECT pg_advisory_unlock(:k)"), {"k": key})
            else:
                conn.execute(text("SELECT RELEASE_LOCK(:n)"), {"n": f"tuner:{key}"})
            conn.commit()


def enqueue_once(study: optuna.Study, enqueue: Callable[[optuna.Study], int]) -> int:
    """Run ``enqueue(study)`` (e.g. tuner.study.enqueue_initial) under the storage lock, so
    workers that start together do not interleave; ``enqueue`` itself checks the
    study's "already enqueued" attribute. Returns what it returned."""
    with storage_lock(study._storage, f"enqueue:{study.study_name}"):
        return enqueue(study)


@contextmanager
def heartbeat(storage: optuna.storages.BaseStorage, trial_id: int) -> Iterator[None]:
    """Record a heartbeat for ``trial_id`` every interval while the block runs."""
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


def finished_count(study: optuna.Study) -> int:
    return len(study.get_trials(deepcopy=False, states=COUNTED_STATES))


class Stoppable(Protocol):
    def is_set(self) -> bool: ...


class OutcomeLike(Protocol):
    """tuner.trial.TrialOutcome's shape: state COMPLETE / PRUNED / FAIL and the value."""

    state: str
    value: float | None


@dataclass
class SimpleOutcome:
    state: Literal["COMPLETE", "PRUNED", "FAIL"]
    value: float | None = None
    reason: str = ""


def objective_runner(objective: Callable[[optuna.Trial], float]) -> Callable[[optuna.Trial], SimpleOutcome]:
    """Adapt a plain objective (returns a float, raises TrialPruned) to the worker loop."""

    def run(trial: optuna.Trial) -> SimpleOutcome:
        try:
            return SimpleOutcome("COMPLETE", float(objective(trial)))
        except optuna.TrialPruned as exc:
            return SimpleOutcome("PRUNED", reason=str(exc))
        except Exception as exc:  # an objective's failure is the trial's, not the worker's
            return SimpleOutcome("FAIL", reason=f"{type(exc).__name__}: {exc}")

    return run


@dataclass
class WorkerReport:
    replica: int
    ran: list[int] = field(default_factory=list)
    stopped_by: str = "n_trials"


def run_worker(
    study: optuna.Study,
    run_trial: Callable[[optuna.Trial], OutcomeLike],
    *,
    n_trials: int | None,
    replica: int = 0,
    timeout_s: float | None = None,
    stop: Stoppable | None = None,
    clock: Callable[[], float] = time.monotonic,
) -> WorkerReport:
    """Run trials of ``study`` until it has ``n_trials`` finished ones (study-wide), the
    timeout passes or ``stop`` is set. Each trial runs under a heartbeat; stale
    trials of dead workers are failed (and so retried) before each new trial."""
    report = WorkerReport(replica)
    started = clock()
    stop = stop or threading.Event()
    while True:
        if stop.is_set():
            report.stopped_by = "signal"
            break
        if timeout_s is not None and clock() - started >= timeout_s:
            report.stopped_by = "timeout"
            break
        _fail_stale(study)
        if n_trials is not None and finished_count(study) >= n_trials:
            report.stopped_by = "n_trials"
            break
        with warnings.catch_warnings():
            # optuna warns that heartbeats are meant for study.optimize; `heartbeat` below
            # does for ask/tell what optimize does.
            warnings.filterwarnings("ignore", message="Heartbeat of storage", category=UserWarning)
            trial = study.ask()
        study._storage.set_trial_system_attr(trial._trial_id, ATTR_REPLICA, replica)
        with heartbeat(study._storage, trial._trial_id):
            outcome = run_trial(trial)
        _tell(study, trial, outcome)
        report.ran.append(trial.number)
    return report


def _fail_stale(study: optuna.Study) -> None:
    with warnings.catch_warnings():  # experimental since 2.9, the documented way all the same
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        optuna.storages.fail_stale_trials(study)


def _tell(study: optuna.Study, trial: optuna.Trial, outcome: OutcomeLike) -> None:
    if outcome.state == "COMPLETE" and outcome.value is not None:
        study.tell(trial, outcome.value)
    elif outcome.state == "PRUNED":
        study.tell(trial, state=TrialState.PRUNED)
    else:
        study.tell(trial, state=TrialState.FAIL)


def retries_of(trials: Sequence[optuna.trial.FrozenTrial]) -> dict[int, list[int]]:
    """Failed trial number -> numbers of the trials that retried it."""
    out: dict[int, list[int]] = {}
    for t in trials:
        if "failed_trial" in t.system_attrs:
            out.setdefault(int(t.system_attrs["failed_trial"]), []).append(t.number)
    return out


@dataclass
class ReplicaSummary:
    replica: int
    study_name: str
    report: WorkerReport
    restored: list[Path]
    port: int | None


def run_replica(
    experiment: Any,
    replica_index: int,
    *,
    settings: WorkerSettings | None = None,
    n_trials: int | None = None,
    timeout_s: float | None = None,
    stop: Any = None,
    note: Callable[[str], None] = lambda text: None,
    skip_checks: bool = False,
) -> ReplicaSummary:
    """Run one worker of the experiment's study on its own backend replica until the
    study has ``n_trials`` (default: the experiment's) finished trials. Always restores
    the replica's config and stops its backend; a reaper does both if this process is
    killed."""
    from tuner import study as S
    from tuner.health import wait_target_healthy
    from tuner.preflight_live import preflight_on_target, static_preflight
    from tuner.targets.factory import make_target
    from tuner.replicas import PidRecordingTarget, replica_of, start_reaper
    from tuner.trial import StopFlag

    check_storage(experiment.storage, n_workers=2)
    settings = settings or WorkerSettings()
    stop = stop or StopFlag()
    exp, replica = replica_of(experiment, replica_index)
    prepared = S.prepare(exp)
    preflight = static_preflight(prepared, skip=skip_checks)
    preflight.raise_for_stops(f"replica {replica_index} preflight")
    maximize = exp.objective.direction == "maximize"
    study = S.open_study(exp.study, make_storage(exp.storage, settings), sampler=exp.sampler.create(),
                         pruner=exp.pruner.create(), objective_metric=exp.objective.metric, maximize=maximize)
    study.set_user_attr(S.ATTR_OBJECTIVE, exp.objective.metric)
    study.set_user_attr(S.ATTR_CONSTRAINTS, [c.name for c in exp.constraints])
    if prepared.split is not None:
        from tuner.holdout import record_split

        record_split(study, prepared.split)
    enqueue_once(study, lambda s: S.enqueue_initial(s, S.initial_variants(prepared)))
    target = PidRecordingTarget(make_target(exp.target, exp.state_dir), replica.pid_file)
    health = exp.target.health

    def wait() -> None:
        wait_target_healthy(health, target)

    runner = S.build_runner(prepared, study, target=target, wait_healthy=wait, stop=stop, preflight=preflight)
    reaper = start_reaper(replica.pid_file, exp.journal_path)
    stop_event = _StopEvent(stop)
    restored: list[Path] = []
    replica.up(note)
    try:
        # each replica checks its own backend (its copy of the config, its port)
        preflight_on_target(prepared, preflight, target, wait, note=note)
        target.start()
        report = run_worker(study, runner.run, n_trials=n_trials or exp.n_trials, replica=replica_index,
                            timeout_s=timeout_s if timeout_s is not None else exp.timeout_s, stop=stop_event)
    finally:
        try:
            # Originals back; a backend that ran a trial restarts on them, so none is
            # left on a trial's config, and only then stops.
            restored = prepared.patcher.restore()
            if runner.touched_backend:
                target.restart()
                wait()
        finally:
            try:
                target.close()
            finally:
                replica.down()
                reaper.close()
    note(f"replica {replica_index}: ran trials {report.ran}; stopped by {report.stopped_by}")
    return ReplicaSummary(replica_index, exp.study, report, restored, exp.target.port)


class _StopEvent:
    """Adapts tuner.trial.StopFlag to the ``is_set`` the worker loop reads."""

    def __init__(self, flag: Any) -> None:
        self._flag = flag

    def is_set(self) -> bool:
        return bool(self._flag.is_set())
