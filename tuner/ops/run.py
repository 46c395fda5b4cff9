"""`tuner run`: one process runs an experiment's study from start to restore.

The top of the orchestration: it takes the pieces tuner.study.wiring wires from an experiment
file (the prepared space, dataset and patcher, the trial runner, the loop) and adds
what happens once per run around them: the preflight (tuner.ops.check), the
study's attributes, the MLflow parent run, the backend started on the config as found,
and the clean-up every run ends with (originals back from the journal, the backend
restarted on them and healthy), then the holdout validation (tuner.ops.validate).
Nothing below tuner.ops.run imports it, so the layers above study never loop back.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from optuna.trial import FrozenTrial

from tuner.dburl import redact
from tuner.errors import DatabaseUnreachable, DiskFull, StudyError, TargetError, TunerError
from tuner.evaluation.holdout import record_split
from tuner.files import display_path
from tuner.ops.check import preflight_on_target, static_preflight
from tuner.ops.dashboard_specs import dashboard_commands
from tuner.study.feasibility import best_feasible_trial, summary_metrics
from tuner.study.loop import RunResult, StudyLoop, StudyObserver
from tuner.study.stop import StopFlag
from tuner.study.storage.locks import StudyLease, patch_rights
from tuner.study.storage.paths import StudyPaths
from tuner.study.storage.queue import enqueue_initial, fail_stale_trials, remaining_trials, replay_trials_left
from tuner.study.storage.study_storage import (
    ATTR_ARTIFACT_DIR,
    ATTR_CONSTRAINTS,
    ATTR_OBJECTIVE,
    ATTR_PREFLIGHT,
    database_unreachable,
    open_study,
)
from tuner.study.trial.attrs import ATTR_VARIANT
from tuner.study.trial.bookkeeping import Bookkeeper, OptunaArtifacts
from tuner.study.trial.tracking_record import close_killed_runs
from tuner.study.wiring import (
    Prepared,
    adopt_backend,
    apply_mode_line,
    build_runner,
    initial_variants,
    links_for,
    make_tracker,
    prepare,
    record_config_seen,
    record_labels_seen,
    start_helpers,
)
from tuner.targets.factory import make_target
from tuner.targets.health import wait_target_healthy

if TYPE_CHECKING:
    from tuner.config.experiment import Experiment


@dataclass
class RunSummary:
    """What `tuner run` prints at the end."""

    study_name: str
    result: RunResult
    best: FrozenTrial | None
    baseline: FrozenTrial | None
    n_trials_total: int
    dashboards: dict[str, str]
    warnings: list[str]
    recovered: list[Path]
    restored: list[Path]
    error: str | None = None
    holdout: Any = None  # tuner.ops.validate.HoldoutRun, when the holdout is enabled and a best trial exists


def run_experiment(
    experiment: Experiment,
    *,
    n_trials: int | None = None,
    timeout: float | None = None,
    stop: StopFlag | None = None,
    observer: StudyObserver | None = None,
    use_cache: bool = True,
    skip_checks: bool = False,
) -> RunSummary:
    """Create or resume the experiment's study and run trials; always restore.

    The preflight (tuner.study.preflight) runs first: its static checks before anything is
    touched, its batch checks on the config as found before the first trial; a stop
    raises PreflightError (``skip_checks``: findings recorded, nothing stops).

    ``n_trials`` (this run) defaults to what the study still lacks of the experiment's
    ``n_trials``; ``timeout`` (s, this run) defaults to the experiment's ``timeout_s``.
    When the failure budget is spent the summary's ``error`` says so (the config is
    restored all the same); the CLI prints it and exits non-zero.
    """
    stop = stop or StopFlag()
    observer = observer or StudyObserver()
    experiment = experiment.bind_port()
    try:
        # Nothing is read from the journal or patched before both locks are ours.
        with patch_rights(
            experiment.storage, experiment.study, experiment.target.config_files, mode="exclusive", command="tuner run"
        ) as lease:
            for line in lease.notes:
                observer.note(line)
            return _run_locked(
                experiment,
                lease,
                n_trials=n_trials,
                timeout=timeout,
                stop=stop,
                observer=observer,
                use_cache=use_cache,
                skip_checks=skip_checks,
            )
    except Exception as exc:
        full = disk_full_in_state(exc, experiment) or database_away(exc, experiment)
        if full is None:
            raise
        raise full from exc


def database_away(exc: BaseException, experiment: Experiment) -> DatabaseUnreachable | None:
    """The one-line error of a run the study's database ended by staying away (past the
    ~9 s the loop's calls wait out), else None: what is kept and how to resume."""
    return database_unreachable(
        exc,
        study=experiment.study,
        url=experiment.storage,
        kept=f"every trial told before it went away is in the study, {_restored(experiment)}",
        resume=f"`tuner run {display_path(experiment.source)}` resumes the study (the trial under way is "
        "failed as stale, and queued again if it was a queued variant)",
    )


def _restored(experiment: Experiment) -> str:
    """Whether the config files are back as found: the restore runs before any error
    leaves the run, and the restore journal is removed only once every file is back."""
    journal = experiment.journal_path
    if not journal.exists():
        return "the config files are restored"
    return f"a restore journal is left ({journal}): the next `tuner run` or `tuner apply` restores the config"


def disk_full_in_state(exc: BaseException, experiment: Experiment) -> DiskFull | None:
    """The one-line DiskFull of a run that ``exc`` ended, when a full
    filesystem caused it (SQLite's "database or disk is full" under Optuna's
    StorageInternalError, or ENOSPC), else None. It says whether the config files are
    back as found: the restore runs before any error leaves the run, and the restore
    journal is removed only once every file is back."""
    from tuner.diskspace import disk_full
    from tuner.study.storage.locks import sqlite_path

    restored = _restored(experiment)
    return disk_full(
        exc,
        experiment.state_dir,
        sqlite_path(experiment.storage),
        fix=f"{restored}; free space on it or point state_dir (and a SQLite storage) at a larger disk",
    )


def _run_locked(
    experiment: Experiment,
    lease: StudyLease,
    *,
    n_trials: int | None,
    timeout: float | None,
    stop: StopFlag,
    observer: StudyObserver,
    use_cache: bool,
    skip_checks: bool,
) -> RunSummary:
    prepared = prepare(experiment)
    for line in prepared.patcher.notes:  # a config written in place (its owner kept)
        observer.note(line)
    if prepared.replayed:  # what a killed command left, put back before anything reads the config
        observer.note(prepared.replayed)
    if prepared.patcher.journal is not None:  # whose writes a journal this run leaves would undo
        prepared.patcher.journal.owner = f"tuner run of study {experiment.study!r}"
    preflight = static_preflight(prepared, skip=skip_checks)
    preflight.raise_for_stops()
    paths = StudyPaths(experiment.state_dir, experiment.study)
    maximize = experiment.objective.direction == "maximize"
    study = open_study(
        experiment.study,
        experiment.storage,
        sampler=experiment.sampler.create(),
        pruner=experiment.pruner.create(),
        objective_metric=experiment.objective.metric,
        maximize=maximize,
    )
    labels_note = record_labels_seen(study, prepared)  # a study measured on other labels stops here
    if labels_note:
        observer.note(labels_note)
    study.set_user_attr(ATTR_ARTIFACT_DIR, str(paths.artifact_dir))
    study.set_user_attr(ATTR_OBJECTIVE, experiment.objective.metric)
    study.set_user_attr(ATTR_CONSTRAINTS, [c.name for c in experiment.constraints])
    if prepared.split is not None:
        record_split(study, prepared.split)
    requeued: dict[int, int] = {}
    stale = fail_stale_trials(study, requeued=requeued)
    if stale:
        again = "".join(f"; #{n} was a queued variant: queued again as trial #{r}" for n, r in sorted(requeued.items()))
        observer.note(f"trials {stale} were left running by a killed run: failed as stale{again}")
    record_config_seen(study, prepared)
    enqueue_initial(study, initial_variants(prepared))
    if n_trials is None:
        n_trials = remaining_trials(study, experiment.n_trials)
    if prepared.replay is not None:
        left = replay_trials_left(study, prepared.space, prepared.replay.names)
        if left is not None and (n_trials is None or n_trials > left):
            observer.note(
                f"every param is replayed per trial or solved per retrieval: one replay trial covers the "
                f"whole space, so this run stops after {left} trial(s) (queued ones included); "
                "more would repeat it"
            )
            n_trials = left
    if timeout is None:
        timeout = experiment.timeout_s
    target = make_target(experiment.target, experiment.state_dir)
    health = experiment.target.health

    def wait() -> dict[str, Any]:  # the health answer: the data fingerprint a trial ran on
        return wait_target_healthy(health, target)

    helpers = start_helpers(prepared) if n_trials != 0 else None  # they import during the preflight
    if n_trials != 0:
        try:
            preflight_on_target(prepared, preflight, target, wait, note=observer.note, stop=stop)
        except BaseException:
            assert helpers is not None
            helpers.close()
            raise
        if stop.is_set():  # a stop during the preflight: its batch aborted, the backend stopped, no trial starts
            assert helpers is not None
            helpers.close()
            return _stopped_in_preflight(experiment, prepared, study, stale, maximize)
    from tuner.secrets import redact_mapping

    study.set_user_attr(ATTR_PREFLIGHT, redact_mapping(preflight.to_dict()))  # findings may quote a raw response

    tracker = make_tracker(experiment, on_warning=observer.note)
    # This run holds the study alone: an MLflow run still RUNNING belongs to a killed one,
    # completed from Optuna's record when the killed run had told Optuna the trial.
    closed = close_killed_runs(
        tracker,
        study,
        trials_dirs=[paths.trials_dir],
        config_names=[p.name for p in experiment.target.config_files],
        objective=experiment.objective.metric,
        constraints=experiment.constraints,
        links=links_for(experiment, study, tracker),
    )
    if closed:
        observer.note(closed)
    tracker.start_study(
        experiment.study,
        params={
            "sampler": experiment.sampler.type,
            "objective": f"{experiment.objective.direction} {experiment.objective.metric}",
            "constraints": "; ".join(c.name for c in experiment.constraints) or "none",
            "search_space": str(experiment.search_space),
            "dataset": prepared.queries.dataset_id,
        },
        tags={
            "tuner.experiment_file": str(experiment.source),
            "tuner.optuna_storage": redact(experiment.storage),
            "tuner.preflight": preflight.verdict,
        },
    )
    runner = build_runner(
        prepared,
        study,
        target=target,
        wait_healthy=wait,
        stop=stop,
        use_cache=use_cache,
        tracker=tracker,
        artifacts=OptunaArtifacts(paths.artifact_dir),
        bookkeeper=Bookkeeper(threaded=True, on_error=lambda msg: observer.note(f"warning: {msg}")),
        on_phase=observer.phase,
        preflight=preflight,
        helpers=helpers,
    )
    loop = StudyLoop(
        study,
        runner,
        budget=experiment.failure_budget,
        stop=stop,
        observer=observer,
        maximize=maximize,
        lease=lease,
        pipeline=experiment.pipeline,
        max_retry=experiment.workers.max_retry,  # of a trial the study's storage failed under
    )
    result = RunResult(experiment.study, stale_failed=stale)
    error: str | None = None
    status = "FAILED"  # the parent run's status unless the loop ends normally
    restored: list[Path] = []
    try:
        if n_trials != 0:
            target.start()
            observer.note(apply_mode_line(experiment.target))
            adopt_backend(runner, experiment.target.config_files, wait, note=observer.note)
        result = loop.run(n_trials=n_trials, timeout=timeout)
        result.stale_failed = stale
        status = "KILLED" if result.stopped_by == "signal" else "FINISHED"
    except StudyError as exc:
        error = str(exc)
        result = loop.result or result  # what ran before the stop, and why it stopped
        result.stale_failed = stale
    except KeyboardInterrupt:
        status = "KILLED"
        raise
    finally:
        try:
            restored = _restore(prepared, runner.touched_backend, target, wait, observer)
        finally:
            runner.bookkeeper.close()
            runner.evaluator.close()
            if runner.replay_pool is not None:
                runner.replay_pool.close()
            if runner.applier is not None:
                runner.applier.close()
            target.close()
            tracker.end_study(status=status, summary=summary_metrics(study, maximize=maximize))
    summary = _summary(experiment, prepared, study, result, restored=restored, error=error, maximize=maximize)
    if prepared.split is not None and summary.best is not None and error is None and result.stopped_by != "signal":
        summary.holdout = _validate(experiment, summary, observer)
    _publish(runner, study, experiment, summary)
    # MLflow calls still queued (a store that stopped answering) get a bounded wait;
    # what it did not take is listed at the end
    untracked = tracker.close()
    if untracked:
        summary.warnings.append(untracked)
    return summary


def _stopped_in_preflight(
    experiment: Experiment, prepared: Prepared, study: Any, stale: list[int], maximize: bool
) -> RunSummary:
    """The summary of a run stopped (SIGTERM, Ctrl-C) before its first trial: nothing was
    patched (a journal left by a killed run was replayed by ``prepare``), no MLflow run made."""
    result = RunResult(experiment.study, stopped_by="signal", stale_failed=stale)
    return _summary(experiment, prepared, study, result, restored=[], error=None, maximize=maximize)


def _summary(
    experiment: Experiment,
    prepared: Prepared,
    study: Any,
    result: RunResult,
    *,
    restored: list[Path],
    error: str | None,
    maximize: bool,
) -> RunSummary:
    trials = study.get_trials(deepcopy=False)
    return RunSummary(
        study_name=experiment.study,
        result=result,
        best=best_feasible_trial(trials, maximize=maximize),
        baseline=next((t for t in trials if t.user_attrs.get(ATTR_VARIANT) == "baseline"), None),
        n_trials_total=len(trials),
        dashboards=dashboard_commands(experiment),
        warnings=prepared.warnings,
        recovered=prepared.recovered,
        restored=restored,
        error=error,
    )


def _publish(runner: Any, study: Any, experiment: Experiment, summary: RunSummary) -> None:
    """The study note and the MLflow parent's summary, final (with the holdout verdict).
    Bookkeeping: a failure is a warning."""
    holdout = None
    if summary.holdout is not None:
        h = summary.holdout.report
        row = h.comparison.loc[h.primary]
        holdout = (
            f"**{h.verdict}** on {h.primary} ({h.n_in_scope} held-out in-scope queries, never tuned on): "
            f"baseline #{summary.holdout.baseline_trial} {row['baseline']:.4f} -> best "
            f"#{summary.holdout.best_trial} {row['candidate']:.4f} ({row['delta']:+.4f}, "
            f"p {row['p_value']:.3f}); {summary.holdout.markdown_path.name} has the whole comparison"
        )
    try:
        runner.publish_study(study, holdout=holdout, apply_hint=f"tuner apply {experiment.source}")
    except Exception as exc:  # noqa: BLE001 - notes are bookkeeping; the study is intact
        summary.warnings.append(f"the study note was not updated: {type(exc).__name__}: {exc}".splitlines()[0])


def _validate(experiment: Experiment, summary: RunSummary, observer: StudyObserver) -> Any:
    """The holdout validation at the end of a run; a failure is a warning (the study
    itself is fine, and `tuner validate` can be run again)."""
    from tuner.ops.validate import validate_holdout

    observer.note("validating baseline and best trial on the holdout queries")
    try:
        return validate_holdout(experiment, on_step=observer.note)
    except TunerError as exc:
        summary.warnings.append(f"holdout validation failed: {exc}; run `tuner validate {experiment.source}` again")
        return None


def _restore(prepared: Prepared, touched: bool, target: Any, wait: Any, observer: StudyObserver) -> list[Path]:
    """Originals back from the journal; when a trial had touched the backend, restart it
    on them and wait until healthy (so it is never left on a trial's config)."""
    restored = prepared.patcher.restore()
    if touched:
        observer.note("restarting the backend on the original config")
        try:
            target.restart()
            wait()
        except TargetError as exc:
            raise StudyError(
                f"original config restored ({', '.join(map(str, restored)) or 'unchanged'}) but the backend did not"
                f" come back healthy on it: {exc}"
            ) from exc
    return restored
