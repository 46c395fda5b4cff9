"""One study set-up for `tuner run` and `tuner worker`: what a process does around the loop.

Both commands prepare the experiment (journal replayed, static preflight), open the
study and record what it is measured on, open MLflow (closing the runs a killed process
left), build the trial runner and the loop, and at the end put the originals back, restart
the backend on them and close everything they opened. They differ only in what this
module takes as arguments: where the study lives (a worker's storage has heartbeats),
which trial folders a killed process may have left, the loop's replica and study-wide
count. Written once, a clean-up one of them forgot (a worker never closed the reload
client) cannot happen again.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from tuner.dburl import redact
from tuner.errors import StudyError, TargetError
from tuner.ops.check import static_preflight
from tuner.study.feasibility import summary_metrics
from tuner.study.loop import StudyLoop, StudyObserver
from tuner.study.storage.study_storage import ATTR_ARTIFACT_DIR, ATTR_CONSTRAINTS, ATTR_OBJECTIVE, open_study
from tuner.study.trial.bookkeeping import Bookkeeper, OptunaArtifacts
from tuner.study.trial.tracking_record import close_killed_runs
from tuner.study.wiring import (
    Helpers,
    Prepared,
    build_runner,
    links_for,
    make_tracker,
    prepare,
    record_config_seen,
    record_labels_seen,
)
from tuner.targets.health import wait_target_healthy

if TYPE_CHECKING:
    import optuna
    from optuna.storages import BaseStorage

    from tuner.config.experiment import Experiment
    from tuner.report.tracker import Tracker
    from tuner.study.preflight import PreflightReport
    from tuner.study.stop import StopFlag
    from tuner.study.storage.locks import StudyLease
    from tuner.study.trial.runner import TrialRunner

Note = Callable[[str], None]
#: waits until the backend is healthy; its health answer (the data fingerprint a trial ran on)
Wait = Callable[[], dict[str, Any]]


class ServedTarget(Protocol):
    """What the set-up does with a backend: `tuner.targets.base.Target`, or a worker's
    `PidRecordingTarget` around one."""

    def start(self) -> None: ...

    def restart(self) -> None: ...

    def failure(self) -> str | None: ...

    def close(self) -> None: ...


def health_wait(experiment: Experiment, target: ServedTarget) -> Wait:
    """How this process waits for its backend to be healthy (`tuner.targets.health`)."""
    health = experiment.target.health
    return lambda: wait_target_healthy(health, target)


def prepare_checked(
    experiment: Experiment, *, owner: str, note: Note, skip_checks: bool, where: str = "preflight"
) -> tuple[Prepared, PreflightReport]:
    """The experiment prepared (a journal a killed command left replayed first) and its
    static preflight, whose stops raise here; ``owner`` names the process in the restore
    journal this one may leave."""
    prepared = prepare(experiment)
    for line in prepared.patcher.notes:  # a config written in place (its owner kept)
        note(line)
    if prepared.replayed:  # what a killed command left, put back before anything reads the config
        note(prepared.replayed)
    if prepared.patcher.journal is not None:  # whose writes a journal this process leaves would undo
        prepared.patcher.journal.owner = owner
    preflight = static_preflight(prepared, skip=skip_checks)
    preflight.raise_for_stops(where)
    return prepared, preflight


def open_measured_study(
    prepared: Prepared, storage: str | BaseStorage, *, artifact_dir: Path, note: Note
) -> optuna.Study:
    """The experiment's study, created or resumed, with what it is measured on recorded:
    the labels (a study measured on other labels stops here), the artifact store, the
    objective and constraints, the holdout split and the config as first found."""
    exp = prepared.experiment
    study = open_study(
        exp.study,
        storage,
        sampler=exp.sampler.create(),
        pruner=exp.pruner.create(),
        objective_metric=exp.objective.metric,
        maximize=exp.objective.maximize,
        secondary=None
        if exp.secondary_objective is None
        else (exp.secondary_objective.metric, exp.secondary_objective.maximize),
    )
    labels_note = record_labels_seen(study, prepared)
    if labels_note:
        note(labels_note)
    study.set_user_attr(ATTR_ARTIFACT_DIR, str(artifact_dir))
    study.set_user_attr(ATTR_OBJECTIVE, exp.objective.metric)
    study.set_user_attr(ATTR_CONSTRAINTS, [c.name for c in exp.constraints])
    if prepared.split is not None:
        from tuner.evaluation.holdout import record_split

        record_split(study, prepared.split)
    record_config_seen(study, prepared)
    return study


def start_tracking(
    prepared: Prepared,
    study: optuna.Study,
    preflight: PreflightReport,
    *,
    note: Note,
    params: Mapping[str, str],
    trials_dirs: Sequence[Path],
    config_names: Sequence[str],
    live_trials: Sequence[int] = (),
    killed: str = "a killed run",
) -> Tracker:
    """The study's MLflow tracker with its parent run started, after closing the runs a
    killed process left RUNNING (completed from Optuna's record when it had told Optuna
    the trial; ``live_trials`` are another live process's and left alone)."""
    exp = prepared.experiment
    tracker = make_tracker(exp, on_warning=note)
    closed = close_killed_runs(
        tracker,
        study,
        live_trials=live_trials,
        killed=killed,
        trials_dirs=trials_dirs,
        config_names=config_names,
        objective=exp.objective.metric,
        constraints=exp.constraints,
        links=links_for(exp, study, tracker),
    )
    if closed:
        note(closed)
    tracker.start_study(
        exp.study,
        params=dict(params),
        tags={
            "tuner.experiment_file": str(exp.source),
            "tuner.optuna_storage": redact(exp.storage),
            "tuner.preflight": preflight.verdict,
        },
    )
    return tracker


@dataclass
class StudySession:
    """A study's trial runner and loop with what they hold open, from `open_session`;
    `finish` puts the originals back and closes it all."""

    prepared: Prepared
    study: optuna.Study
    target: ServedTarget
    wait: Wait
    tracker: Tracker
    runner: TrialRunner
    loop: StudyLoop
    note: Note

    @property
    def maximize(self) -> bool:
        return self.loop.maximize

    def finish(self, status: str) -> list[Path]:
        """Originals back from the journal; when a trial had touched the backend, it is
        restarted on them and waited for (so it is never left on a trial's config). Then
        everything the session opened is closed, whatever happened: the bookkeeping
        thread, the evaluator, the replay scorers, the reload client, the target, and
        the MLflow parent run ended with ``status``. The files put back are returned."""
        try:
            return self._restore()
        finally:
            self.close(status)

    def close(self, status: str) -> None:
        runner = self.runner
        runner.bookkeeper.close()
        runner.evaluator.close()
        if runner.replay_pool is not None:
            runner.replay_pool.close()
        if runner.applier is not None:
            runner.applier.close()
        self.target.close()
        self.prepared.patcher.close()
        self.tracker.end_study(status=status, summary=summary_metrics(self.study, maximize=self.maximize))

    def _restore(self) -> list[Path]:
        restored = self.prepared.patcher.restore()
        if self.runner.touched_backend:
            self.note("restarting the backend on the original config")
            try:
                self.target.restart()
                self.wait()
            except TargetError as exc:
                raise StudyError(
                    f"original config restored ({', '.join(map(str, restored)) or 'unchanged'}) but the backend "
                    f"did not come back healthy on it: {exc}"
                ) from exc
        return restored


def open_session(
    prepared: Prepared,
    study: optuna.Study,
    preflight: PreflightReport,
    *,
    target: ServedTarget,
    wait: Wait,
    tracker: Tracker,
    stop: StopFlag,
    observer: StudyObserver,
    note: Note,
    lease: StudyLease,
    artifact_dir: Path,
    max_retry: int,
    use_cache: bool = True,
    helpers: Helpers | None = None,
    replica: int | None = None,
    study_total: int | None = None,
    parallel: int = 1,
) -> StudySession:
    """The trial runner and the one loop over trials for this process (a worker's has its
    ``replica`` number and stops at ``study_total`` trials study-wide)."""
    exp = prepared.experiment
    runner = build_runner(
        prepared,
        study,
        target=target,
        wait_healthy=wait,
        stop=stop,
        use_cache=use_cache,
        tracker=tracker,
        artifacts=OptunaArtifacts(artifact_dir),
        bookkeeper=Bookkeeper(threaded=True, on_error=lambda msg: note(f"warning: {msg}")),
        on_phase=observer.phase,
        preflight=preflight,
        helpers=helpers,
        parallel=parallel,
    )
    loop = StudyLoop(
        study,
        runner,
        budget=exp.failure_budget,
        stop=stop,
        observer=observer,
        maximize=exp.objective.maximize,
        study_total=study_total,
        replica=replica,
        lease=lease,
        pipeline=exp.pipeline,
        parallel=parallel,
        max_retry=max_retry,  # of a trial the study's storage failed under
    )
    return StudySession(prepared, study, target, wait, tracker, runner, loop, note)
