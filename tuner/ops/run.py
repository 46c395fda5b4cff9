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
from typing import TYPE_CHECKING

from optuna.trial import FrozenTrial

from tuner.errors import ConfigError, DatabaseUnreachable, DiskFull, StudyError, TunerError
from tuner.files import display_path
from tuner.ops.check import preflight_on_target
from tuner.ops.dashboard_specs import dashboard_commands
from tuner.ops.study_session import health_wait, open_measured_study, open_session, prepare_checked, start_tracking
from tuner.report.tracker import NullTracker, Tracker
from tuner.study.feasibility import best_feasible_trial
from tuner.study.loop import RunResult, StudyObserver
from tuner.study.stop import StopFlag
from tuner.study.storage.locks import StudyLease, patch_rights
from tuner.study.storage.paths import StudyPaths
from tuner.study.storage.queue import enqueue_initial, fail_stale_trials, remaining_trials, replay_trials_left
from tuner.study.storage.study_storage import ATTR_PREFLIGHT, database_unreachable
from tuner.study.storage.transient import ride_s
from tuner.study.trial.attrs import ATTR_VARIANT
from tuner.study.wiring import Prepared, adopt_backend, apply_mode_line, initial_variants, start_helpers
from tuner.targets.factory import make_target

if TYPE_CHECKING:
    import optuna

    from tuner.config.experiment import Experiment
    from tuner.ops.validate import HoldoutRun
    from tuner.study.crossval import CrossValResult
    from tuner.study.trial.runner import TrialRunner


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
    holdout: HoldoutRun | None = None  # when the holdout is enabled and a best trial exists
    crossval: CrossValResult | None = None  # validation cv or both, once a trial recorded per-query scores


def run_experiment(
    experiment: Experiment,
    *,
    n_trials: int | None = None,
    timeout: float | None = None,
    stop: StopFlag | None = None,
    observer: StudyObserver | None = None,
    use_cache: bool = True,
    skip_checks: bool = False,
    parallel: int = 1,
) -> RunSummary:
    """Create or resume the experiment's study and run trials; always restore.

    ``parallel``: trials measured at once on the one backend (target.channel: request only,
    tuner.study.parallel); ConfigError for a file channel, before anything is touched.

    The preflight (tuner.study.preflight) runs first: its static checks before anything is
    touched, its batch checks on the config as found before the first trial; a stop
    raises PreflightError (``skip_checks``: findings recorded, nothing stops).

    ``n_trials`` (this run) defaults to what the study still lacks of the experiment's
    ``n_trials``; ``timeout`` (s, this run) defaults to the experiment's ``timeout_s``.
    When the failure budget is spent the summary's ``error`` says so (the config is
    restored all the same); the CLI prints it and exits non-zero.
    """
    check_parallel(experiment, parallel)
    ride_s()  # a bad $TUNER_STORAGE_RIDE_S stops here, not at the first storage call after the preflight
    stop = stop or StopFlag()
    observer = observer or StudyObserver()
    experiment = experiment.bind_port()
    try:
        # Nothing is read from the journal or patched before both locks are ours.
        with patch_rights(
            experiment.storage,
            experiment.study,
            experiment.target.config_files,
            mode="exclusive",
            command="tuner run",
            urls=experiment.target.config_urls,
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
                parallel=parallel,
            )
    except Exception as exc:
        full = disk_full_in_state(exc, experiment) or database_away(exc, experiment)
        if full is None:
            raise
        raise full from exc


def check_parallel(experiment: Experiment, parallel: int) -> None:
    """Parallel trials need the values in the requests: a config file serves one config at a time."""
    if parallel > 1 and experiment.target.channel != "request":
        raise ConfigError(
            f"{display_path(experiment.source)}: --parallel {parallel} needs target.channel: request (a config file "
            "serves one config at a time); for parallel trials through config files run `tuner worker "
            "EXPERIMENT --replica N`, one backend replica each, on PostgreSQL storage (docs/tuning.md)"
        )


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
    if experiment.target.channel == "http" and experiment.http_journal_path.exists():
        return (
            f"a restore journal is left ({experiment.http_journal_path}): the next `tuner run` or `tuner apply` "
            "puts the original config document back"
        )
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
    parallel: int,
) -> RunSummary:
    note = observer.note
    prepared, preflight = prepare_checked(
        experiment, owner=f"tuner run of study {experiment.study!r}", note=note, skip_checks=skip_checks
    )
    paths = StudyPaths(experiment.state_dir, experiment.study)
    maximize = experiment.objective.maximize
    study = open_measured_study(prepared, experiment.storage, artifact_dir=paths.artifact_dir, note=note)
    requeued: dict[int, int] = {}
    stale = fail_stale_trials(study, requeued=requeued)
    if stale:
        again = "".join(f"; #{n} was a queued variant: queued again as trial #{r}" for n, r in sorted(requeued.items()))
        note(f"trials {stale} were left running by a killed run: failed as stale{again}")
    enqueue_initial(study, initial_variants(prepared))
    if n_trials is None:
        n_trials = remaining_trials(study, experiment.n_trials)
    if prepared.replay is not None:
        left = replay_trials_left(study, prepared.space, prepared.replay.names)
        if left is not None and (n_trials is None or n_trials > left):
            note(
                f"every param is replayed per trial or solved per retrieval: one replay trial covers the "
                f"whole space, so this run stops after {left} trial(s) (queued ones included); "
                "more would repeat it"
            )
            n_trials = left
    if timeout is None:
        timeout = experiment.timeout_s
    target = make_target(experiment.target, experiment.state_dir)
    wait = health_wait(experiment, target)
    helpers = start_helpers(prepared) if n_trials != 0 else None  # they import during the preflight
    if n_trials != 0:
        try:
            preflight_on_target(prepared, preflight, target, wait, note=note, stop=stop)
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

    # This run holds the study alone: an MLflow run still RUNNING belongs to a killed one,
    # completed from Optuna's record when the killed run had told Optuna the trial.
    tracker = start_tracking(
        prepared,
        study,
        preflight,
        note=note,
        params={
            "sampler": experiment.sampler.type,
            "objective": f"{experiment.objective.direction} {experiment.objective.metric}",
            "constraints": "; ".join(c.name for c in experiment.constraints) or "none",
            "search_space": str(experiment.search_space),
            "dataset": prepared.queries.dataset_id,
        },
        trials_dirs=[paths.trials_dir],
        config_names=[p.name for p in experiment.target.config_files],
    )
    session = open_session(
        prepared,
        study,
        preflight,
        target=target,
        wait=wait,
        tracker=tracker,
        stop=stop,
        observer=observer,
        note=note,
        lease=lease,
        artifact_dir=paths.artifact_dir,
        max_retry=experiment.workers.max_retry,
        use_cache=use_cache,
        helpers=helpers,
        # more lanes than trials to run would only cut each batch's share of the concurrency
        parallel=max(1, min(parallel, n_trials)) if n_trials is not None else parallel,
    )
    loop = session.loop
    result = RunResult(experiment.study, stale_failed=stale)
    error: str | None = None
    status = "FAILED"  # the parent run's status unless the loop ends normally
    restored: list[Path] = []
    try:
        if n_trials != 0:
            target.start()
            note(apply_mode_line(experiment.target))
            if session.loop.parallel > 1:
                lanes, budget = session.loop.parallel, experiment.evaluation.concurrency
                note(
                    f"{lanes} trials at a time on the one backend, each batch sending up to "
                    f"{max(1, budget // lanes)} of evaluation.concurrency {budget} queries at once"
                )
            adopt_backend(session.runner, experiment.target.config_files, wait, note=note)
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
        restored = session.finish(status)
    summary = _summary(experiment, prepared, study, result, restored=restored, error=error, maximize=maximize)
    if prepared.split is not None and summary.best is not None and error is None and result.stopped_by != "signal":
        summary.holdout = _validate(experiment, summary, observer)
    summary.crossval = _crossval(experiment, study, summary)
    tracked = not isinstance(tracker, NullTracker)
    _publish(session.runner, study, experiment, summary, tracked=tracked)
    if tracked and result.stopped_by != "signal":
        _log_study_files(tracker, study, experiment, summary)
    # MLflow calls still queued (a store that stopped answering) get a bounded wait;
    # what it did not take is listed at the end
    untracked = tracker.close()
    if untracked:
        summary.warnings.append(untracked)
    return summary


def _stopped_in_preflight(
    experiment: Experiment, prepared: Prepared, study: optuna.Study, stale: list[int], maximize: bool
) -> RunSummary:
    """The summary of a run stopped (SIGTERM, Ctrl-C) before its first trial: nothing was
    patched (a journal left by a killed run was replayed by ``prepare``), no MLflow run made."""
    result = RunResult(experiment.study, stopped_by="signal", stale_failed=stale)
    return _summary(experiment, prepared, study, result, restored=[], error=None, maximize=maximize)


def _summary(
    experiment: Experiment,
    prepared: Prepared,
    study: optuna.Study,
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


def _publish(
    runner: TrialRunner, study: optuna.Study, experiment: Experiment, summary: RunSummary, *, tracked: bool = False
) -> None:
    """The study note and the MLflow parent's summary, final (with the holdout verdict;
    ``tracked``: its files are on the MLflow parent run too). Bookkeeping: a failure is a warning."""
    holdout = None
    if summary.holdout is not None:
        h = summary.holdout.report
        row = h.comparison.loc[h.primary]
        where = f"`{summary.holdout.markdown_path}`" + (
            f" (and the MLflow study run's artifacts, {HOLDOUT_FOLDER}/{summary.holdout.markdown_path.name})"
            if tracked
            else ""
        )
        holdout = (
            f"**{h.verdict}** on {h.primary} ({h.n_in_scope} held-out in-scope queries, never tuned on): "
            f"baseline #{summary.holdout.baseline_trial} {row['baseline']:.4f} -> best "
            f"#{summary.holdout.best_trial} {row['candidate']:.4f} ({row['delta']:+.4f}, "
            f"p {row['p_value']:.3f}); the whole comparison: {where}"
        )
    try:
        runner.publish_study(
            study, holdout=holdout, apply_hint=f"tuner apply {experiment.source}", crossval=summary.crossval
        )
    except Exception as exc:  # noqa: BLE001 - notes are bookkeeping; the study is intact
        summary.warnings.append(f"the study note was not updated: {type(exc).__name__}: {exc}".splitlines()[0])


#: the MLflow parent run's artifact folders: `tuner report`'s files, the holdout comparison
STUDY_FOLDER, HOLDOUT_FOLDER = "study", "holdout"


def _log_study_files(tracker: Tracker, study: optuna.Study, experiment: Experiment, summary: RunSummary) -> None:
    """The study's summary (`tuner report`'s report.md, trials.csv and plots, written to
    ``<state_dir>/reports/<study>/``) and this run's holdout comparison on the MLflow parent
    run. Bookkeeping: a failure is a warning."""
    from tuner.ops.analysis import write_experiment_report

    try:
        paths = write_experiment_report(study, experiment)
    except StudyError:
        return  # no trial yet: nothing to summarise
    except Exception as exc:  # noqa: BLE001 - the study is intact; `tuner report` can write them
        summary.warnings.append(f"the study report was not written: {type(exc).__name__}: {exc}".splitlines()[0])
        return
    files = [paths.markdown, paths.csv, paths.history_png, paths.importance_png, paths.score_vs_oos_png]
    tracker.log_study_files(STUDY_FOLDER, files + ([paths.pareto_csv] if paths.pareto_csv is not None else []))
    if summary.holdout is not None:
        tracker.log_study_files(HOLDOUT_FOLDER, [summary.holdout.markdown_path, summary.holdout.json_path])


def _crossval(experiment: Experiment, study: optuna.Study, summary: RunSummary) -> CrossValResult | None:
    """The cross-validated estimate from the trials' per-query scores (tuner.study.crossval);
    a failure is a warning (`tuner best` computes it again)."""
    if not experiment.cross_validates:
        return None
    from tuner.study.query_scores import study_crossval

    try:
        return study_crossval(study, experiment.objective, experiment.constraints, experiment.cv, experiment.selection)
    except (TunerError, ValueError) as exc:
        summary.warnings.append(f"the cross-validated estimate failed: {exc}; `tuner best` tries again")
        return None


def _validate(experiment: Experiment, summary: RunSummary, observer: StudyObserver) -> HoldoutRun | None:
    """The holdout validation at the end of a run; a failure is a warning (the study
    itself is fine, and `tuner validate` can be run again)."""
    from tuner.ops.validate import validate_holdout

    observer.note("validating baseline and best trial on the holdout queries")
    try:
        return validate_holdout(experiment, on_step=observer.note)
    except TunerError as exc:
        summary.warnings.append(f"holdout validation failed: {exc}; run `tuner validate {experiment.source}` again")
        return None
