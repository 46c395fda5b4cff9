"""A trial's record: everything ``tell`` must find on the Optuna trial (user attrs,
records, the applied values as params, artifact names), then the bookkeeping queued on
the `Bookkeeper` -- the config snapshot and report files, the artifact links, the
notes and the MLflow child run.

`Recorder` owns all of it: the trial folders, the tracker, the artifact store, the
bookkeeping queue and the best-so-far its report detail is chosen by. `TrialRunner`
(tuner.study.trial.runner) asks it for a trial's MLflow run in ``begin``, for the report
files' names in ``end`` and to ``record`` every trial.

Report detail: a trial's files are "slim" (scorecard, per-query metrics, the sweep
through the chosen gates, a short summary) unless it is the baseline or the best feasible
trial so far; those keep every query's top-k snapshot and all unjudged hits in their
JSON. When a later trial becomes the best, the previous best's files are rewritten slim
in place. ``tracking.report_detail: full`` keeps everything full (the whole solve grid
too). Each file is written once: the Optuna artifact store and MLflow's local store get
hard links to it, which is why a demotion rewrites the bytes in place (same inode).
"""

from __future__ import annotations

import functools
import tempfile
import time
from collections.abc import Mapping, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import optuna
from optuna.distributions import BaseDistribution

from tuner.config.objective import Constraint, Objective
from tuner.config.validation import CrossValConfig
from tuner.files import atomic_write_bytes, atomic_write_text, overwrite_in_place
from tuner.optuna_adapter import set_trial_attrs
from tuner.report.tracking import Tracker
from tuner.study.gates.sweep_table import slim_sweep
from tuner.study.notes import Links, publish_study, trial_note, write_note
from tuner.study.storage.transient import retry_transient
from tuner.study.trial.applied_params import record_applied_params
from tuner.study.trial.attrs import (
    ATTR_APPLIED,
    ATTR_CACHE_HIT,
    ATTR_CACHE_NOTE,
    ATTR_DATA_FINGERPRINT,
    ATTR_DURATION,
    ATTR_EARLY_STOP,
    ATTR_FAIL_REASON,
    ATTR_FAILED_QUERIES,
    ATTR_FEASIBLE,
    ATTR_GATES_MOVED,
    ATTR_JUDGED,
    ATTR_METRICS,
    ATTR_MLFLOW_RUN,
    ATTR_PHASES,
    ATTR_REPLAY,
    ATTR_REPLAY_SETTINGS,
    ATTR_REPORTS,
    ATTR_VARIANT,
    record_key,
)
from tuner.study.trial.bookkeeping import Bookkeeper, OptunaArtifacts
from tuner.study.trial.config_names import ConfigNames
from tuner.study.trial.interfaces import BatchEvaluator, EvalOutcome
from tuner.study.trial.outcome import (
    FUSION_PLOT_FILE,
    FUSION_PLOT_REPORT,
    FUSION_SWEEP_FILE,
    FUSION_SWEEP_REPORT,
    SOLVED_PREFIX,
    SWEEP_FILE,
    SWEEP_REPORT,
    TrialOutcome,
    jsonable,
)
from tuner.study.trial.tracking_record import TAG_CACHE_NOTE, tracking_record

if TYPE_CHECKING:
    import pandas as pd

    from tuner.study.gates.threshold import GateRange

__all__ = ["ATTR_CACHE_NOTE", "ATTR_DATA_FINGERPRINT", "TAG_CACHE_NOTE", "Recorder"]

_REPORT_MAX_FILES = 20  # per-file digests in a report's context up to this many inputs
_STUDY_NOTE_EVERY = 10  # trials between study-note refreshes (and on every new best)


@dataclass
class _Pending:
    """What the bookkeeper needs to finish a trial after ``tell``."""

    trial: optuna.Trial
    outcome: TrialOutcome
    texts: dict[Path, str]
    result: EvalOutcome | None
    run_id: Future[Any] | None
    artifacts: dict[str, str]  # artifact id -> file it holds
    detail: str  # "slim" or "full"
    best: bool = False  # full as the best feasible trial so far: rewritten slim when a better one comes
    sweep: pd.DataFrame | None = None  # the threshold sweep table, when gates were solved
    fusion_sweep: pd.DataFrame | None = None  # every replayed fusion setting scored, when fusion was replayed
    chosen: Mapping[str, float] | None = None  # the solved gate values (the sweep's chosen row)
    context: dict[str, Any] | None = None  # the report context it was written with

    @property
    def number(self) -> int:
        return self.outcome.number


def _in_order() -> Bookkeeper:
    return Bookkeeper(threaded=False)


@dataclass
class Recorder:
    """A trial's record and bookkeeping (module doc); one instance serves a whole study run."""

    study_name: str
    evaluator: BatchEvaluator  # writes the report files
    trials_dir: Path  # a trial's files are in trials_dir/<number>
    objective: Objective = field(default_factory=Objective)
    constraints: Sequence[Constraint] = ()
    # Post-retrieval params solved from each trial's retrieval (param name -> gate range).
    gates: Mapping[str, GateRange] = field(default_factory=dict)
    # The space's Optuna distributions by name: a solved gate is recorded as a param
    # under its declared one (tuner.study.trial.applied_params).
    declared: Mapping[str, BaseDistribution] = field(default_factory=dict)
    tracker: Tracker | None = None
    artifacts: OptunaArtifacts | None = None
    bookkeeper: Bookkeeper = field(default_factory=_in_order)
    # "slim" (default) or "full": the report detail of trials that are neither the
    # baseline nor a new best feasible trial (module doc).
    report_detail: str = "slim"
    # Where the dashboards serve this study: the notes and MLflow runs link to each other.
    links: Links | None = None
    names: ConfigNames = field(default_factory=ConfigNames)
    # the cross-validated estimate's folds (tuner.config.validation); None: not in the study note
    crossval: CrossValConfig | None = None
    # Bookkeeping timings per trial number (filled on the bookkeeper thread).
    background_seconds: dict[int, dict[str, float]] = field(default_factory=dict)
    _best_value: float | None = field(default=None, init=False, repr=False)
    _best_known: bool = field(default=False, init=False, repr=False)
    # the best so far whose files are full (its batch kept to rewrite them slim)
    _full_best: _Pending | None = field(default=None, init=False, repr=False)
    # when each trial began (ms since the epoch), its MLflow run's start time
    _began: dict[int, int] = field(default_factory=dict, init=False, repr=False)
    # a trial's report detail, chosen once (a record may be retried)
    _details: dict[int, tuple[str, bool]] = field(default_factory=dict, init=False, repr=False)
    # the query lists stored on the study so far (tuner.study.query_scores)
    _query_lists: set[str] = field(default_factory=set, init=False, repr=False)

    def start(self, trial: optuna.Trial, assignment: Mapping[str, Any]) -> Future[str | None] | None:
        """Ask the tracker for the trial's run, on the bookkeeper's eager lane (it runs
        while the trial is rendered and measured); None without a tracker."""
        if self.tracker is None:
            return None
        # the run starts when the trial began, also when the store gets the call late
        began = self._began[trial.number] = round(time.time() * 1000)
        start = functools.partial(self.tracker.start_trial, start_time=began)
        return self.bookkeeper.submit("MLflow run", start, trial.number, assignment, eager=True)

    def report_files(
        self, trial: optuna.Trial, out: TrialOutcome, result: EvalOutcome, *, sweep: bool, fusion_sweep: bool
    ) -> dict[str, str]:
        """The report files a measured trial's bookkeeping will write (kind -> path),
        named before ``tell``; choosing their detail may read the study (the best so far):
        a lost connection is retried."""
        detail, _ = retry_transient(lambda: self._detail_of(trial, out))
        trial_dir = self.dir(trial.number)
        reports = {k: str(v) for k, v in self.evaluator.report_paths(result, trial_dir, detail=detail).items()}
        if sweep:
            reports[SWEEP_REPORT] = str(trial_dir / SWEEP_FILE)
        if fusion_sweep:
            reports[FUSION_SWEEP_REPORT] = str(trial_dir / FUSION_SWEEP_FILE)
            reports[FUSION_PLOT_REPORT] = str(trial_dir / FUSION_PLOT_FILE)
        return reports

    def dir(self, number: int) -> Path:
        return self.trials_dir / str(number)

    def flush(self) -> None:
        """Wait for the bookkeeping of every trial recorded so far."""
        self.bookkeeper.flush()

    def record(
        self,
        trial: optuna.Trial,
        out: TrialOutcome,
        texts: dict[Path, str],
        result: EvalOutcome | None,
        run_id: Future[Any] | None,
        sweep: pd.DataFrame | None = None,
        fusion_sweep: pd.DataFrame | None = None,
    ) -> None:
        """Everything ``tell`` must find on the trial, then queue the bookkeeping (after
        waiting for room in its queue: the "backlog" phase, when there was a wait)."""
        waited = self.bookkeeper.wait_for_room()
        if waited > 0.001:
            out.phase_seconds["backlog"] = waited
        started = time.perf_counter()
        # the attrs are plain sets (repeatable): a connection lost meanwhile is retried
        retry_transient(lambda: self._record_attrs(trial, out, texts, result, run_id, sweep, fusion_sweep))
        out.phase_seconds["record"] = time.perf_counter() - started

    def _record_attrs(
        self,
        trial: optuna.Trial,
        out: TrialOutcome,
        texts: dict[Path, str],
        result: EvalOutcome | None,
        run_id: Future[Any] | None,
        sweep: pd.DataFrame | None = None,
        fusion_sweep: pd.DataFrame | None = None,
    ) -> None:
        unscored = self._details.get(trial.number, ("slim", False))  # a failed trial's files are slim
        detail, best = self._detail_of(trial, out) if result is not None else unscored
        user: dict[str, Any] = {ATTR_CACHE_HIT: out.cache_hit}
        if out.state == "COMPLETE":
            user[ATTR_FEASIBLE] = out.feasible
            for c in self.constraints:
                metric = getattr(c, "metric", None)
                if metric and metric in out.metrics:
                    user[metric] = out.metrics[metric]
        if out.metrics:
            user[ATTR_JUDGED] = out.metrics.get("Judged@10")
            user[ATTR_FAILED_QUERIES] = out.metrics.get("Failed_Queries")
        user[ATTR_FAIL_REASON] = (
            out.fail_reason
        )  # one line (tuner.study.trial.runner._fail), whole: tests and people grep it
        user[ATTR_EARLY_STOP] = out.early_stop
        user[ATTR_APPLIED] = out.applied
        if out.replay:  # the record itself is a system attribute (below): user attributes stay scalars
            user[ATTR_REPLAY_SETTINGS] = out.replay.get("settings", out.replay.get("scored"))
        user[ATTR_DURATION] = round(out.duration_s, 3)  # its phases are all timed by now (record is not in it)
        if run_id is not None:
            # Asked for on the bookkeeper during restart and health wait; a tracker waits
            # for its store only briefly (tuner.report.resilient): None when it did not answer.
            user[ATTR_MLFLOW_RUN] = run_id.result()
        user = {key: jsonable(value) for key, value in user.items() if value is not None or key == ATTR_MLFLOW_RUN}
        records = {
            ATTR_METRICS: out.metrics,
            ATTR_REPORTS: out.reports,
            ATTR_PHASES: out.phase_seconds,
            ATTR_CACHE_NOTE: out.cache_note,
            ATTR_DATA_FINGERPRINT: _data_fingerprint(out) or None,
            ATTR_GATES_MOVED: out.gates_moved,
            ATTR_REPLAY: out.replay,
        }
        system = {record_key(key): jsonable(value) for key, value in records.items() if value is not None}
        artifacts: dict[str, str] = {}
        if self.artifacts is not None and out.state == "COMPLETE" and (result is not None or out.cache_hit):
            files = [self.dir(trial.number) / Path(n).name for n in self.names.texts(texts)]
            files += [Path(f) for f in out.reports.values()]
            for f in files:
                artifact_id, key, listing = self.artifacts.listing(f.name)
                artifacts[artifact_id] = str(f)
                system[key] = listing
        set_trial_attrs(trial, user=user, system=system)  # one transaction, not one per attribute
        if out.assignment:
            record_applied_params(trial, out.assignment, self.declared)
        if out.state == "COMPLETE" and getattr(result, "per_query", None) is not None:
            self._record_per_query(trial, out, result)
        chosen = {n: out.assignment[n] for n in self.gates if n in out.assignment}
        pending = _Pending(
            trial,
            out,
            texts,
            result,
            run_id,
            artifacts,
            detail,
            best,
            sweep if out.state == "COMPLETE" else None,
            fusion_sweep if out.state == "COMPLETE" else None,
            chosen,
        )
        self.bookkeeper.submit(f"bookkeeping of trial #{trial.number}", self._finish, pending)
        self._details.pop(trial.number, None)

    def _record_per_query(self, trial: optuna.Trial, out: TrialOutcome, result: Any) -> None:
        """The trial's per-query scores, for the cross-validated estimate (tuner.study.query_scores)."""
        from tuner.study.query_scores import build_record, queries_of, save_record, settings_record

        queries = queries_of(result.per_query)
        record = build_record(result.per_query, out.metrics, self.objective.metric, self.constraints, queries)
        if record is not None:
            if out.replay_per_query:
                record["settings"] = settings_record(out.replay_per_query)
            save_record(trial, record, queries, self._query_lists)

    def _detail_of(self, trial: optuna.Trial, out: TrialOutcome) -> tuple[str, bool]:
        """The trial's report detail and whether it is a new best, chosen once per trial:
        choosing moves the best-so-far (the report paths are named with it before the
        record, and a retried record must not choose again)."""
        if trial.number not in self._details:
            self._details[trial.number] = self._choose_detail(trial, out)
        return self._details[trial.number]

    def _choose_detail(self, trial: optuna.Trial, out: TrialOutcome) -> tuple[str, bool]:
        """("full", is a new best) for the baseline, a new best feasible trial, or when the
        experiment asks; ("slim", False) otherwise."""
        if self.report_detail == "full":
            return "full", False
        if out.state == "COMPLETE" and trial.user_attrs.get(ATTR_VARIANT) == "baseline":
            return "full", False  # the reference every comparison is made against, feasible or not
        if out.state != "COMPLETE" or not out.feasible or out.value is None:
            return "slim", False
        if not self._best_known:
            from tuner.study.feasibility import best_feasible_trial

            done = trial.study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,))
            best = best_feasible_trial(done, maximize=self.objective.maximize)
            self._best_value, self._best_known = (best.values[0] if best is not None else None), True
        sign = 1.0 if self.objective.maximize else -1.0
        if self._best_value is None or sign * (out.value - self._best_value) > 0:
            self._best_value = out.value
            return "full", True
        return "slim", False

    def _finish(self, p: _Pending) -> None:
        """On the bookkeeper: config snapshot and report files, artifact links, notes, MLflow."""
        out, timings = p.outcome, self.background_seconds.setdefault(p.number, {})
        started = time.perf_counter()
        trial_dir = self.dir(p.number)
        named = self.names.texts(p.texts)
        if named:
            trial_dir.mkdir(parents=True, exist_ok=True)
            for name, text in named.items():
                atomic_write_text(trial_dir / Path(name).name, text, mode=0o600)  # the config may hold secrets
        if p.result is not None and out.state == "COMPLETE":
            context = {"study": self.study_name, "trial": p.number, "assignment": jsonable(out.assignment)}
            context.update(_data_context(out))
            solved = {n: out.metrics[SOLVED_PREFIX + n] for n in self.gates if SOLVED_PREFIX + n in out.metrics}
            if solved:
                context["solved_gates"] = solved
                context["solved_gates_note"] = (
                    "retrieved with these gates at the low end of their range, then solved client-side; "
                    f"this report is the batch re-scored at the solved values (the candidates scored: {SWEEP_FILE})"
                )
            self.evaluator.write_reports(
                p.result, trial_dir, context=context, config_snapshot=self._snapshot(p.texts), detail=p.detail
            )
            p.context = context
        if p.sweep is not None:
            trial_dir.mkdir(parents=True, exist_ok=True)
            found = {g.param: g.found for g in self.gates.values()} | {n: g.found for n, g in self.gates.items()}
            atomic_write_text(trial_dir / SWEEP_FILE, _sweep_text(p.sweep, p.chosen or {}, self.report_detail, found))
        if p.fusion_sweep is not None:
            trial_dir.mkdir(parents=True, exist_ok=True)
            atomic_write_text(trial_dir / FUSION_SWEEP_FILE, p.fusion_sweep.to_csv(index=False))
            from tuner.report.fusion_plot import fusion_sweep_png

            atomic_write_bytes(
                trial_dir / FUSION_PLOT_FILE,
                fusion_sweep_png(
                    p.fusion_sweep, objective=self.objective.metric, title=f"Trial {p.number}: fusion settings replayed"
                ),
            )
        if self.artifacts is not None:
            for artifact_id, path in p.artifacts.items():
                if Path(path).is_file():
                    self.artifacts.write(artifact_id, Path(path))
        if p.best:
            previous, self._full_best = self._full_best, p
            if previous is not None:
                self._demote(previous)
        timings["report"] = time.perf_counter() - started
        started = time.perf_counter()
        run_id = p.run_id.result() if p.run_id is not None else None
        note = self._trial_note(out, run_id, links=self._optuna_links(run_id))
        write_note(p.trial, note)
        if self.tracker is not None:
            record = tracking_record(out, named, constraints=self.constraints, note=self._trial_note(out, run_id))
            # a run made only now (its start failed) starts when the trial began too
            record = replace(record, started_ms=self._began.pop(p.number, None))
            self.tracker.finish_trial(run_id, record)
        if out.state == "COMPLETE" and (p.detail == "full" or p.number % _STUDY_NOTE_EVERY == 0):
            self.publish_study(p.trial.study)
        timings["track"] = time.perf_counter() - started

    def _demote(self, p: _Pending) -> None:
        """Rewrite a superseded best's report files slim, in place (their hard links in the
        artifact stores see the slim bytes; the full ones are freed). Its PR-curve PNG is
        kept as drawn (registered as an artifact, and the same bytes a redraw would give)."""
        assert p.result is not None  # only a measured trial becomes the best (a cache hit has no batch)
        trial_dir = self.dir(p.number)
        with tempfile.TemporaryDirectory(dir=trial_dir.parent, prefix=".slim-") as tmp:
            self.evaluator.write_reports(
                p.result,
                Path(tmp),
                context=p.context or {},
                config_snapshot=self._snapshot(p.texts),
                detail="slim",
                pr_curve="keep",
            )
            for fresh in Path(tmp).iterdir():
                if (trial_dir / fresh.name).is_file():
                    overwrite_in_place(trial_dir / fresh.name, fresh.read_bytes())
        p.result = None

    def publish_study(
        self, study: optuna.Study, *, holdout: str | None = None, apply_hint: str | None = None, crossval: Any = None
    ) -> None:
        """Refresh the study note and the MLflow parent run's summary (tuner.study.notes),
        with the cross-validated estimate (``crossval``, else computed when the experiment
        asks for it: tuner.study.query_scores)."""
        if crossval is None and self.crossval is not None:
            from tuner.study.query_scores import study_crossval

            crossval = study_crossval(study, self.objective, self.constraints, self.crossval)
        publish_study(
            study,
            objective=self.objective,
            links=self.links,
            tracker=self.tracker,
            holdout=holdout,
            apply_hint=apply_hint,
            crossval=crossval,
        )

    def _optuna_links(self, run_id: str | None) -> dict[str, str]:
        url = self.links.run(run_id) if self.links is not None else None
        return {"MLflow run": url} if url else {}

    def _trial_note(self, out: TrialOutcome, run_id: str | None, *, links: Mapping[str, str] | None = None) -> str:
        if links is None:  # the MLflow description links back to the Optuna trial page
            links = {"Optuna trial page": self.links.trial(out.number)} if self.links is not None else {}
        solved = {n: out.assignment[n] for n in self.gates if n in out.assignment and SOLVED_PREFIX + n in out.metrics}
        return trial_note(
            number=out.number,
            state=out.state,
            value=out.value,
            objective=self.objective.metric,
            feasible=out.feasible,
            constraints=out.constraints,
            metrics=out.metrics,
            solved=solved,
            early_stop=out.early_stop_detail or out.early_stop,
            fail_reason=out.fail_reason,
            links=links,
            gates_moved=out.gates_moved,
        )

    def _snapshot(self, texts: Mapping[Path, str]) -> str:
        named = self.names.texts(texts)
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


def _sweep_text(
    table: pd.DataFrame, chosen: Mapping[str, float], detail: str, found: Mapping[str, float | None] | None = None
) -> str:
    """The solve grid as CSV: whole when ``detail`` (the experiment's report_detail) is
    full, else the rows through the chosen gates (tuner.study.gates.sweep_table)."""
    if detail != "full":
        names = [c for c in table.columns if c in chosen]  # the table's gate order: confidence first
        table = slim_sweep(table, {n: chosen[n] for n in names}, names, found={n: (found or {}).get(n) for n in names})
    return str(table.to_csv(index=False))
