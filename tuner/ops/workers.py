"""Several worker processes on one study: storage rules, the shared study lock, one
backend replica each.

``tuner worker EXPERIMENT --replica N`` runs one worker; start several (on one machine
or several) against the same PostgreSQL storage. Each drives its own backend replica
(tuner.targets.replicas) through the same loop as `tuner run` (tuner.study.loop.StudyLoop with a
replica number): the same failure budget, MLflow child runs and artifacts.

Rules, and why:

- **PostgreSQL (or MySQL) for more than one worker.** Several workers on one SQLite
  study race on queued trials: two of them can pop the same WAITING trial (optuna
  issues 4621, 4002), so a baseline runs twice and another is lost.
  tuner.study.storage.study_storage.check_storage refuses that with the fix in the message.
- **A shared study lock** (tuner.study.storage.locks): workers share it, a `tuner run` or `apply`
  needs it alone, so neither starts while the other patches.
- **Heartbeats, not "fail every RUNNING trial".** A trial whose heartbeat is older
  than ``grace_period_s`` belongs to a dead worker and is failed by whichever worker
  looks next; ``RetryHeartbeatStaleTrialCallback`` queues a copy with the same
  parameters, which the next free worker runs.
- **Enqueue once.** The baseline and shortlist are queued by the first worker under a
  storage-wide lock (a PostgreSQL advisory lock) with a study attribute as the
  "done" mark, so N workers starting together queue them exactly once
  (tuner.study.storage.queue.enqueue_once).
- **Study-wide trial budget.** A worker stops when the study as a whole has
  ``n_trials`` counted trials, running ones included (tuner.study.storage.queue.count_counted).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import optuna

from tuner.config.workers import WorkerSettings
from tuner.errors import StudyError
from tuner.optuna_adapter import storage_of
from tuner.study.loop import RunResult
from tuner.study.storage.study_storage import check_storage, make_storage, storage_lock

if TYPE_CHECKING:
    from tuner.config.experiment import Experiment
    from tuner.study.loop import StudyObserver
    from tuner.study.stop import StopFlag
    from tuner.study.storage.locks import StudyLease
    from tuner.targets.replica import Replica


@dataclass
class ReplicaSummary:
    replica: int
    study_name: str
    result: RunResult
    restored: list[Path]
    port: int | None
    error: str | None = None  # the failure budget or a lost lock stopped the worker
    notes: list[str] = field(default_factory=list)


def run_replica(
    experiment: Experiment,
    replica_index: int,
    *,
    settings: WorkerSettings | None = None,
    n_trials: int | None = None,
    timeout_s: float | None = None,
    stop: StopFlag | None = None,
    note: Callable[[str], None] = lambda text: None,
    observer: StudyObserver | None = None,
    skip_checks: bool = False,
    use_cache: bool = True,
) -> ReplicaSummary:
    """Run one worker of the experiment's study on its own backend replica until the
    study has ``n_trials`` (default: the experiment's) trials counted, study-wide.

    The worker holds the study lock shared (a `tuner run` on the study is refused while
    it runs, and it is refused while a run holds the study), the lock of its replica
    and of the replica's config copies; only then is the replica's restore journal
    replayed. It always restores the replica's config and stops its backend; a reaper
    does both if this process is killed.
    """
    from tuner.study.stop import StopFlag
    from tuner.study.storage.file_locks import config_locks, file_lock
    from tuner.study.storage.locks import StudyLease
    from tuner.targets.replicas import replica_of

    check_storage(experiment.storage, n_workers=2)
    if experiment.target.channel == "http":
        from tuner.errors import ConfigError

        # every replica would write the one document at target.http.url: each would measure the others' configs
        raise ConfigError(
            f"{experiment.source}: tuner worker with target.channel: http: the workers would share one config "
            "document; run the study with `tuner run`"
        )
    settings = settings or experiment.workers
    command = f"tuner worker --replica {replica_index}"
    with StudyLease.acquire(experiment.storage, experiment.study, mode="shared", command=command) as lease:
        replica_lock = experiment.state_dir / "replicas" / f".replica-{replica_index}.tuner-lock"
        with file_lock(
            replica_lock,
            what=f"replica {replica_index} of study {experiment.study!r}",
            command=command,
            fix="give each worker on this machine its own --replica number",
            notes=lease.notes,
        ):
            exp, replica = replica_of(experiment, replica_index)
            with config_locks(replica.config_files, command=command, notes=lease.notes):
                for line in lease.notes:
                    note(line)
                return _run_replica(
                    experiment,
                    exp,
                    replica,
                    lease,
                    settings=settings,
                    n_trials=n_trials,
                    timeout_s=timeout_s,
                    stop=stop or StopFlag(),
                    note=note,
                    observer=observer,
                    skip_checks=skip_checks,
                    use_cache=use_cache,
                )


def _run_replica(
    original: Experiment,
    exp: Experiment,
    replica: Replica,
    lease: StudyLease,
    *,
    settings: WorkerSettings,
    n_trials: int | None,
    timeout_s: float | None,
    stop: StopFlag,
    note: Callable[[str], None],
    observer: StudyObserver | None,
    skip_checks: bool,
    use_cache: bool,
) -> ReplicaSummary:
    from tuner.ops.check import preflight_on_target
    from tuner.ops.study_session import (
        health_wait,
        open_measured_study,
        open_session,
        prepare_checked,
        start_tracking,
    )
    from tuner.study.loop import StudyObserver, fail_stale_heartbeats
    from tuner.study.storage.paths import StudyPaths
    from tuner.study.storage.queue import enqueue_initial, enqueue_once
    from tuner.study.wiring import adopt_backend, initial_variants
    from tuner.targets.factory import make_target
    from tuner.targets.reaper import PidRecordingTarget, start_reaper

    prepared, preflight = prepare_checked(
        exp,
        owner=f"tuner worker --replica {replica.index} of study {exp.study!r}",
        note=note,
        skip_checks=skip_checks,
        where=f"replica {replica.index} preflight",
    )
    artifact_dir = StudyPaths(original.state_dir, exp.study).artifact_dir  # one store beside the study's
    # the replica's copy of the config is the original at start
    study = open_measured_study(prepared, make_storage(exp.storage, settings), artifact_dir=artifact_dir, note=note)
    enqueue_once(study, lambda s: enqueue_initial(s, initial_variants(prepared)))
    target = PidRecordingTarget(make_target(exp.target, exp.state_dir), replica.pid_file)
    wait = health_wait(exp, target)

    # MLflow: one parent run per study, found or made by the first worker (under the
    # storage lock, which also keeps N workers off a fresh MLflow store's schema at once).
    with storage_lock(storage_of(study), f"mlflow:{exp.study}"):
        # Runs of trials no live worker holds any more (failed by heartbeat) are closed.
        fail_stale_heartbeats(study)
        live = [t.number for t in study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.RUNNING,))]
        # A killed worker's trials: completed from Optuna's record when it had told Optuna.
        # Each replica keeps its trials' folders in its own state dir.
        replica_dirs = sorted(d for d in (original.state_dir / "replicas").glob("*") if d.is_dir())
        tracker = start_tracking(
            prepared,
            study,
            preflight,
            note=note,
            params={"sampler": exp.sampler.type, "workers": "yes"},
            live_trials=live,
            killed="a killed worker",
            trials_dirs=[StudyPaths(d, exp.study).trials_dir for d in replica_dirs],
            config_names=[p.name for p in original.target.config_files],
        )
    session = open_session(
        prepared,
        study,
        preflight,
        target=target,
        wait=wait,
        tracker=tracker,
        stop=stop,
        observer=observer or StudyObserver(),
        note=note,
        lease=lease,
        artifact_dir=artifact_dir,
        max_retry=settings.max_retry,
        use_cache=use_cache,
        replica=replica.index,
        study_total=n_trials or exp.n_trials,
    )
    loop = session.loop
    reaper = start_reaper(replica.pid_file, exp.journal_path)
    result = RunResult(exp.study)
    error: str | None = None
    status = "FAILED"
    restored: list[Path] = []
    replica.up(note)
    try:
        # each replica checks its own backend (its copy of the config, its port)
        preflight_on_target(
            prepared, preflight, target, wait, note=note, stop=stop, fresh=bool(getattr(replica, "brought_up", False))
        )
        if stop.is_set():  # a stop during the preflight: its batch aborted, the backend stopped, no trial starts
            result.stopped_by = "signal"
        else:
            target.start()
            adopt_backend(session.runner, exp.target.config_files, wait, note=note)
            result = loop.run(n_trials=None, timeout=timeout_s if timeout_s is not None else exp.timeout_s)
        status = "KILLED" if result.stopped_by == "signal" else "FINISHED"
    except StudyError as exc:
        error = str(exc)
        result = loop.result or result
    finally:
        try:
            # originals back, the backend restarted on them (never left on a trial's config), then stopped
            restored = session.finish(status)
        finally:
            replica.down()
            reaper.close()
    untracked = tracker.close()  # bounded: see tuner.report.resilient
    if untracked:
        note(f"warning: {untracked}")
    ran = [o.number for o in result.ran]
    note(f"replica {replica.index}: ran trials {ran}; stopped by {result.stopped_by}")
    port = exp.target.port  # bound by replica_of: a number (or None without a port), never "auto"
    return ReplicaSummary(
        replica.index, exp.study, result, restored, port if isinstance(port, int) else None, error=error
    )
