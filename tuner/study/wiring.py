"""Wiring an experiment (tuner.config.experiment) into the pieces of a running study loop:
the search space checked against the config files, the query set and its labels
(``prepare``), the baseline and shortlist as queued variants, the per-query pruning
callback, the trial runner (``build_runner``: live evaluator, result cache, gates) and
the MLflow tracker. tuner.ops.run (`tuner run`) and tuner.ops.workers (`tuner worker`)
assemble them with tuner.study.loop.StudyLoop.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import httpx
import optuna

from tuner.dburl import redact
from tuner.errors import StudyError
from tuner.optuna_adapter import study_id_of
from tuner.report.resilient import ResilientTracker, fail_fast_http, is_server, server_health, store_probe
from tuner.report.tracking import MlflowTracker, NullTracker, Tracker
from tuner.study.notes import Links
from tuner.study.preflight import PreflightReport
from tuner.study.stop import StopFlag
from tuner.study.storage.paths import StudyPaths
from tuner.study.storage.queue import Variant
from tuner.study.storage.result_cache import ResultCache
from tuner.study.storage.study_storage import ATTR_CONFIG_SEEN, ATTR_HTTP_SEEN, ATTR_LABELS
from tuner.study.trial.bookkeeping import Bookkeeper, OptunaArtifacts
from tuner.study.trial.live import LiveEvaluator
from tuner.study.trial.pruning import trial_order_seed
from tuner.study.trial.runner import TrialRunner, compose_runner

if TYPE_CHECKING:
    from tuner.config.configpatch import ConfigPatcher
    from tuner.config.experiment import Experiment
    from tuner.config.space.searchspace import SearchSpace
    from tuner.data.dataset import QuerySet
    from tuner.evaluation.holdout import Split
    from tuner.report.report_worker import ReportWorker
    from tuner.study.gates.threshold import GateRange
    from tuner.study.replay.fusion_search import ReplayPlan
    from tuner.study.replay.replay_pool import ReplayPool
    from tuner.study.trial.http_channel import HttpConfigPatcher


class PatcherWriter:
    """`ConfigWriter` over tuner.config.configpatch: renders through the search space's edits,
    writes exactly the rendered texts (journal first, atomic writes); ``as_found`` gives
    an assignment the file's own values where it leaves a key unchanged."""

    def __init__(self, space: Any, patcher: Any, *, touches_backend: bool = True) -> None:
        self.space = space
        self.patcher = patcher
        # False (channel: http): the end of a run writes the original back through the
        # config API, which serves it; the backend needs no restart
        self.touches_backend = touches_backend
        self._found: tuple[tuple[str, ...], list[Any]] | None = None  # base texts -> their documents

    def as_found(self, assignment: Mapping[str, Any]) -> dict[str, Any]:
        texts = tuple(self.patcher.base_texts())
        if self._found is None or self._found[0] != texts:  # parsed once per base (the originals)
            self._found = (texts, self.patcher.documents())
        return self.space.as_found(assignment, self._found[1])

    def render(self, assignment: Mapping[str, Any]) -> dict[Path, str]:
        return self.patcher.render(self.space.edits(assignment))

    def write(self, texts: Mapping[Path, str]) -> None:
        self.patcher.write(texts)


@dataclass
class Prepared:
    """An experiment's pieces, loaded and checked before any trial runs."""

    experiment: Experiment
    space: SearchSpace
    patcher: ConfigPatcher | HttpConfigPatcher  # channel: http: the document at target.http.url
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
    replay: ReplayPlan | None = None  # fusion params replayed per trial (replay:)
    #: what the replay of a crash's restore journal restored, from whose journal (one line;
    #: None: no journal was replayed). A backend left up may still serve the crash's config.
    replayed: str | None = None
    #: channel: request: the declared request's bound values as one config document
    #: (tuner.study.trial.request_channel); None: the config files are the config
    request_document: dict[str, Any] | None = None

    def found_documents(self) -> list[Any]:
        """The config as found, one document per config file (channel: request: the
        declared request's bound values, as one document)."""
        if self.request_document is not None:
            return [self.request_document]
        return list(self.patcher.documents())


def prepare(experiment: Experiment, *, recover_journal: bool = True) -> Prepared:
    """Replay a crash's journal, load the space (checked against the config files),
    the query set and the labels (imported from the experiment's label files when the
    label store has none for the dataset; a label file changed since its import stops
    here, see `load_dataset`), and split off the holdout queries."""
    from tuner.config.configpatch import ConfigPatcher
    from tuner.config.journal import pending, recover
    from tuner.config.space.loading import load_space
    from tuner.evaluation.holdout import tune_split
    from tuner.study.gates.threshold import check_gate_mapping, solvable_gates

    found = pending(experiment.journal_path) if recover_journal else None
    recovered = recover(experiment.journal_path) if found is not None else []
    replayed = found.replayed_line(recovered) if found is not None else None
    if recover_journal and experiment.target.channel == "http":
        from tuner.study.trial.http_channel import recover_http

        # a killed run's writes undone before the document is read as the baseline
        replayed = recover_http(experiment) or replayed
    space = load_space(experiment.search_space, experiment.target.config_files)
    # ConfigError now, not after the first trial; solvable_gates goes in sorted name order.
    gates = dict(zip(sorted(space.post_retrieval), solvable_gates(space), strict=True))
    check_gate_mapping(gates.values(), experiment.evaluation.response, where=f"{experiment.source}: ")
    if gates and not experiment.objective.maximize:
        from tuner.errors import ConfigError

        raise ConfigError(
            f"{experiment.source}: objective.direction: minimize, but post_retrieval gates "
            f"({', '.join(gates)}) are solved for the highest objective; maximise, or drop post_retrieval"
        )
    replay = None
    if experiment.replay is not None:
        from tuner.study.replay.fusion_search import ReplayPlan

        replay = ReplayPlan(space, experiment.replay, where=f"{experiment.source}: replay")
        if not experiment.objective.maximize and gates:
            from tuner.errors import ConfigError

            raise ConfigError(f"{experiment.source}: replay with solved gates needs objective.direction: maximize")
    if experiment.replay is not None and experiment.replay.subscores is not None:
        from tuner.errors import ConfigError

        if experiment.target.channel != "request":
            raise ConfigError(
                f"{experiment.source}: replay.subscores reads the setting served from the request, so it needs "
                "target.channel: request; use replay.explain with a config file, or set the channel"
            )
        if gates:
            raise ConfigError(
                f"{experiment.source}: replay.subscores with post_retrieval gates ({', '.join(gates)}) is not "
                "supported (the sub-scores carry no confidence); make them sampled params"
            )
    patcher: ConfigPatcher | HttpConfigPatcher
    if experiment.target.channel == "http" and replay is not None:
        from tuner.errors import ConfigError

        raise ConfigError(
            f"{experiment.source}: replay with target.channel: http is not supported yet; "
            "remove replay (every trial then writes its document and is measured live)"
        )
    if experiment.target.channel == "http":
        from tuner.study.trial.http_channel import http_patcher_of

        patcher = http_patcher_of(experiment)  # GET: the document as found is the baseline
    else:
        patcher = ConfigPatcher(experiment.target.config_files, journal_path=experiment.journal_path)
    request_document = None
    if experiment.target.channel == "request":
        from tuner.study.trial.request_channel import request_document_of

        request_document = request_document_of(experiment, space)
        if replay is not None and replay.config.subscores is not None:
            from tuner.study.trial.replay_measure import answer_reader

            answer_reader(replay, experiment.evaluation, request_document)  # replay.subscores.limit: now, not later
        documents: list[Any] = [request_document]
        names = ["evaluation.request"]
    else:
        documents, names = list(patcher.documents()), list(patcher.names)
    warnings = list(experiment.warnings) + space.validate_against(documents, names)
    all_queries, qrels, labels_fp, dataset_note = load_dataset(experiment)
    if dataset_note:
        warnings.append(dataset_note)
    queries, split = tune_split(all_queries, experiment.holdout)
    return Prepared(
        experiment,
        space,
        patcher,
        queries,
        qrels,
        labels_fp,
        warnings,
        recovered,
        all_queries=all_queries,
        split=split,
        gates=gates,
        dataset_note=dataset_note,
        replay=replay,
        replayed=replayed,
        request_document=request_document,
    )


def load_dataset(experiment: Experiment) -> tuple[QuerySet, dict[str, dict[str, int]], str, str | None]:
    """The query set (``dataset.unjudged_queries`` applied), its labels, the labels'
    fingerprint and the one-line note of what the unjudged-queries policy did (or None).

    The declared label files are imported when the label store has no labels for the
    dataset; otherwise a label file that changed since its import (declared, or imported
    with `tuner labels import`) is a LabelError naming it, the judgments added / changed /
    removed and the `tuner labels import --replace` command (tuner.data.labels)."""
    from tuner.data.dataset import judged_subset, load_queryset
    from tuner.data.labelfiles import read_judgments
    from tuner.data.labels import DeclaredSource, LabelStore, stale_labels_message
    from tuner.data.qrels import GradeMap
    from tuner.errors import LabelError

    ds = experiment.dataset
    queries = load_queryset(ds.queries, ds.dataset_id)
    maps = [GradeMap({int(k): v for k, v in s.grade_map.items()}) if s.grade_map else None for s in ds.labels]
    created = not ds.labels_path.exists()
    store = LabelStore(ds.labels_path)
    if queries.dataset_id in store.datasets():
        # labels are imported once; a label file edited since then must not go unnoticed
        declared = [DeclaredSource(s.path, s.format, m) for s, m in zip(ds.labels, maps, strict=True)]
        changes = store.source_changes(queries.dataset_id, declared)
        if changes:
            raise LabelError(stale_labels_message(changes, queries.dataset_id, ds.labels_path))
    else:
        try:
            if not ds.labels:
                store.qrels(queries.dataset_id)  # raises the LabelError that says how to import
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
    """Keep the search space's values as the study first finds them in the config (the
    file's own values, weights not normalised), so `tuner apply` can tell a hand edit
    made since then (tuner.ops.apply.find_drift)."""
    if ATTR_CONFIG_SEEN not in study.user_attrs:
        current = prepared.space.current_assignment(prepared.found_documents())
        study.set_user_attr(ATTR_CONFIG_SEEN, json.loads(json.dumps(current, default=str)))
    from tuner.study.trial.http_channel import HttpConfigPatcher

    if isinstance(prepared.patcher, HttpConfigPatcher) and ATTR_HTTP_SEEN not in study.user_attrs:
        # channel: http: the whole document (apply refuses a served document other than this one)
        study.set_user_attr(ATTR_HTTP_SEEN, document_digest(prepared.patcher.base_texts()[0]))


def document_digest(text: str) -> str:
    """sha256 of a JSON document's canonical form (sorted keys, no spaces): the same for
    the same values however the server lays them out."""
    import hashlib

    canonical = json.dumps(json.loads(text), sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(canonical.encode("utf-8")).hexdigest()


def labels_mismatch(study: optuna.Study, experiment: Experiment, fingerprint: str) -> str | None:
    """One line when the study's measured trials were scored on other labels than
    ``fingerprint`` (the label store's now): ranking them with new trials would compare
    scores of two label sets. The fix is a new study; the old one stays readable."""
    seen = study.user_attrs.get(ATTR_LABELS)
    if not isinstance(seen, dict) or seen.get("fingerprint") == fingerprint:
        return None
    measured = _measured(study)
    if not measured:
        return None
    from tuner.data.labels import shown_path

    was, now = str(seen.get("fingerprint"))[:12], fingerprint[:12]
    return (
        f"study {experiment.study!r} has {measured} trial(s) measured on other labels of dataset "
        f"{seen.get('dataset_id')} (fingerprint {was}..., now {now}...): their scores are not comparable with "
        f"new trials; start a new study: give `study:` in {shown_path(experiment.source)} a new name "
        "(the old study stays readable under its name), or put the old labels back"
    )


def record_labels_seen(study: optuna.Study, prepared: Prepared) -> str | None:
    """Record the labels the study's trials are measured on; LabelError when its measured
    trials used other labels (`labels_mismatch`). Returns a note for a study that has
    trials but no record (written before labels were recorded): they are taken as
    measured on the labels now."""
    from tuner.errors import LabelError

    exp = prepared.experiment
    problem = labels_mismatch(study, exp, prepared.labels_fingerprint)
    if problem is not None:
        raise LabelError(problem)
    seen = study.user_attrs.get(ATTR_LABELS)
    record = {"dataset_id": prepared.queries.dataset_id, "fingerprint": prepared.labels_fingerprint}
    if seen == record:
        return None
    study.set_user_attr(ATTR_LABELS, record)
    measured = _measured(study) if seen is None else 0
    if measured:
        return (
            f"study {exp.study!r} has {measured} trial(s) from before the labels were recorded: they are taken "
            f"as measured on the labels now (fingerprint {prepared.labels_fingerprint[:12]}...)"
        )
    return None


def _measured(study: optuna.Study) -> int:
    from optuna.trial import TrialState

    return len(study.get_trials(deepcopy=False, states=(TrialState.COMPLETE, TrialState.PRUNED)))


def gates_as_found(prepared: Prepared, study: optuna.Study) -> dict[str, GateRange]:
    """The solved gates, each with its value as the study found it in the config (recorded
    at its first run; else the config now): the value a gate keeps unless the objective or
    a constraint asks for another (tuner.study.gates.gate_choice)."""
    from tuner.study.gates.threshold import with_found

    seen = study.user_attrs.get(ATTR_CONFIG_SEEN)
    if not isinstance(seen, dict) and prepared.gates:
        seen = prepared.space.current_assignment(prepared.found_documents())
    return with_found(prepared.gates, seen or {})


def initial_variants(prepared: Prepared) -> list[Variant]:
    """The baseline (the config as found) and the shortlist, as Optuna params. The
    baseline's params are the sampler's coordinates of the file's values (a simplex's
    stick-breaking ones); its trial records and writes the file's values themselves
    (`PatcherWriter.as_found`), so it measures the file byte for byte."""
    exp, space = prepared.experiment, prepared.space
    out: list[Variant] = []
    if exp.baseline:
        current = space.current_assignment(prepared.found_documents())
        out.append(Variant("baseline", space.params_for(current)))
    for i, v in enumerate(exp.variants):
        out.append(Variant(v.name or f"shortlist-{i + 1}", space.params_for(v.values)))
    return out


def reporters_for(
    experiment: Experiment,
    pruner: optuna.pruners.BasePruner,
    queries: QuerySet,
    gates: Mapping[str, GateRange] | None = None,
) -> Any:
    """The experiment's per-query callback factory (tuner.study.trial.pruning.reporter_factory):
    intermediate values for the pruner, and the exact OOS early stop (a trial whose answered OOS queries already
    exceed what ``OOS_FP_Rate <= b`` allows is stopped, COMPLETE and infeasible). None when neither
    applies (no per-query callback then).

    With a solved confidence gate an OOS query counts as answered only when it would
    be at the top of the range. A solved min_score gate can empty a result
    list, which the per-query row at the retrieval's minimum cannot show, so the OOS
    early stop is off then (it could stop a trial that a higher minimum makes feasible).
    """
    from tuner.study.gates.threshold import CONFIDENCE, MIN_SCORE
    from tuner.study.trial import pruning

    by_role = {g.role: g for g in (gates or {}).values()}
    constraints = () if MIN_SCORE in by_role else experiment.constraints
    top = by_role[CONFIDENCE].high if CONFIDENCE in by_role else None
    return pruning.reporter_factory(
        pruner, queries, objective=experiment.objective.metric, constraints=constraints, threshold_max=top
    )


@dataclass
class Helpers:
    """The helper processes of a run: the report writer (pipelined studies) and the replay
    scorers (``replay:``), either None. Started early (``start_helpers``), their imports
    overlap the preflight and the backend's start instead of the first trial."""

    report_worker: ReportWorker | None = None
    replay_pool: ReplayPool | None = None

    def close(self) -> None:
        for helper in (self.report_worker, self.replay_pool):
            if helper is not None:
                helper.close()


def start_helpers(prepared: Prepared) -> Helpers:
    """Start the run's helper processes (see `Helpers`)."""
    exp = prepared.experiment
    helpers = Helpers()
    if exp.pipeline:  # reports are written beside the next trial's search calls: in a helper process
        from tuner.report.report_worker import ReportWorker

        helpers.report_worker = ReportWorker()
        helpers.report_worker.start()
    if prepared.replay is not None and exp.replay is not None:
        from tuner.study.replay.replay_pool import ReplayPool, default_workers

        workers = default_workers() if exp.replay.workers == "auto" else int(exp.replay.workers)
        helpers.replay_pool = ReplayPool(workers)
        helpers.replay_pool.start()
    return helpers


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
    helpers: Helpers | None = None,
    parallel: int = 1,
) -> TrialRunner:
    """The trial runner of an experiment (shared by `tuner run` and `tuner worker`):
    the live evaluator on the tune queries, objective and constraints, result cache,
    per-query pruning callback and the post-retrieval gates solved per trial.
    ``parallel``: trials measured at once (tuner.study.parallel), who share the batch's concurrency."""
    exp = prepared.experiment
    paths = StudyPaths(exp.state_dir, exp.study)
    gates = gates_as_found(prepared, study)
    extra: dict[str, Any] = {}
    if bookkeeper is not None:
        extra["bookkeeper"] = bookkeeper
    if on_phase is not None:
        extra["on_phase"] = on_phase
    evaluator = LiveEvaluator(exp, prepared.queries, prepared.qrels, prepared.labels_fingerprint)
    evaluator.preflight = preflight  # every trial's report says whether the set-up was checked
    evaluator.share = parallel
    helpers = helpers if helpers is not None else start_helpers(prepared)
    evaluator.report_worker = helpers.report_worker
    from tuner.evaluation.batch import StopAfterGrace, any_abort

    # A dead backend ends the batch at once; a stop lets the batch under way finish for
    # STOP_GRACE_S, then ends it (SIGTERM bound: grace + ABORT_POLL_S + target stop + restore).
    evaluator.abort = any_abort(
        target.failure, StopAfterGrace(lambda: stop.reason if stop.is_set() else None, STOP_GRACE_S)
    )
    evaluator.stop = stop
    from tuner.data.inputs import InputsWatch

    # hashed at the first trial's cache lookup, re-checked (stat) before every later one
    inputs = InputsWatch(exp.target.inputs, root=exp.project_root) if exp.target.inputs else None
    applier: Any = None
    writer: Any = PatcherWriter(prepared.space, prepared.patcher)
    if exp.target.channel == "http":
        from tuner.study.trial.http_channel import HttpServe

        writer = PatcherWriter(prepared.space, prepared.patcher, touches_backend=False)
        applier = HttpServe(wait_healthy)
    elif exp.target.channel == "request":
        from tuner.study.trial.request_channel import RequestServe, request_writer_of

        writer = request_writer_of(exp, prepared.space)
        evaluator.request_of_snapshot = writer.request_of_snapshot
        applier = RequestServe(wait_healthy)
    elif exp.target.reload is not None:
        from tuner.targets.reload import ConfigApplier

        # what the backend serves is unknown until the caller adopts the started backend
        applier = ConfigApplier(target, wait_healthy, exp.target.reload, exp.target.health, exp.target.config_files)
    return compose_runner(
        study_name=exp.study,
        space=prepared.space,
        writer=writer,
        target=target,
        wait_healthy=wait_healthy,
        evaluator=evaluator,
        trials_dir=paths.trials_dir,
        objective=exp.objective,
        secondary_objective=exp.secondary_objective,
        constraints=list(exp.constraints),
        cache=ResultCache(paths.cache_path) if use_cache else None,
        tracker=tracker,
        artifacts=artifacts,
        stop=stop,
        project_dir=exp.project_root,
        reporter_factory=reporters_for(exp, study.pruner, prepared.queries, gates),
        order_seed=lambda number: trial_order_seed(exp.sampler.seed, number),
        gates=gates,
        inputs=inputs,
        backend_fingerprint_field=exp.target.health.fingerprint,
        report_detail=exp.tracking.report_detail,
        crossval=exp.cv if exp.cross_validates else None,
        links=links_for(exp, study, tracker),
        applier=applier,
        replay=prepared.replay,
        replay_pool=helpers.replay_pool,
        defer_scoring=exp.pipeline,  # pipelined: a batch's scoring finishes while the next trial is measured
        **extra,
    )


def apply_mode_line(target: Any) -> str:
    """One line saying how trials get their config served (printed at the start of a run)."""
    reload = target.reload
    if target.channel == "http" and target.http is not None:
        from tuner.secrets import redact_url

        how = "read back" if target.http.read_back else f"the health answer's {target.http.fingerprint}"
        return (
            f"trials write their config document ({target.http.method} {redact_url(target.http.url)}), "
            f"confirmed by {how}; the backend is not restarted"
        )
    if target.channel == "request":
        return "each trial's values travel in its own search requests (target.channel: request): nothing is patched"
    if reload is None:
        return (
            f"each trial restarts the backend (target.apply: {target.apply}); declare target.reload when it can "
            "take a new config without a restart (docs/experiments.md)"
        )
    how = f"{reload.http.method} {reload.http.url}" if reload.http is not None else f"{reload.signal} to the backend"
    keys = ", ".join(reload.restart_keys) if reload.restart_keys else "none declared"
    return (
        f"trials reload the backend's config ({how}), confirmed by its {reload.fingerprint}; "
        f"a change under a restart-only key restarts it ({keys})"
    )


def adopt_backend(runner: TrialRunner, config_files: Any, wait_healthy: Any, *, note: Any) -> None:
    """With ``target.reload``: the started backend serves the config files on disk when its
    health answer reports their fingerprint (the first trial may then reload); otherwise
    the first trial restarts it, and ``note`` says why."""
    if runner.applier is None:
        return
    texts = {Path(p): Path(p).read_text(encoding="utf-8") for p in config_files}
    why_not = runner.applier.adopt(texts, wait_healthy())
    if why_not is not None:
        note(why_not)


def links_for(exp: Experiment, study: optuna.Study, tracker: Tracker | None) -> Links:
    """Where the dashboards serve this study (tracking.optuna_dashboard_url / mlflow_ui_url)."""
    return Links(exp.tracking.optuna_dashboard_url, exp.tracking.mlflow_ui_url, study_id_of(study), tracker)


def make_tracker(experiment: Experiment, on_warning: Any = None, *, resilient: bool = True) -> Tracker:
    """The experiment's MLflow tracker. MLflow is bookkeeping: a store that cannot be
    opened does not stop a study (every trial is in the Optuna study all the same).
    With ``on_warning`` the tracker falls back to none and the warning says so; without
    it the StudyError is raised (for commands whose whole job is MLflow).

    ``resilient`` (a study run): the MlflowTracker behind a `ResilientTracker`, so a
    store that stops answering holds up neither a trial nor a stop (its notes go to
    ``on_warning``); MLflow's own HTTP retries are then cut to none (`fail_fast_http`,
    unless the user set MLFLOW_HTTP_REQUEST_MAX_RETRIES / _TIMEOUT): the breaker and
    its background retry replace them."""
    if not experiment.tracking.enabled:
        return NullTracker()
    uri = experiment.tracking.store_uri
    try:
        _probe_tracking_server(uri)
        if resilient and is_server(uri):
            fail_fast_http()
        tracker = MlflowTracker(
            uri,
            experiment.tracking.experiment_name or experiment.study,
            artifact_root=experiment.tracking.artifact_location,
        )
        if not resilient:
            return tracker
        waits = experiment.tracking.waits
        return ResilientTracker(
            tracker,
            probe=store_probe(uri, tracker),
            on_note=on_warning or (lambda message: None),
            where=redact(uri),
            drain_s=waits.drain_s,
            run_id_wait_s=waits.run_id_s,
            stuck_s=waits.stuck_s,
            probe_every_s=waits.probe_every_s,
        )
    except (StudyError, OSError) as exc:
        if on_warning is None:
            raise
        on_warning(
            f"warning: MLflow is off for this run: {str(exc).splitlines()[0]}; trials are recorded in the "
            "Optuna study only (fix tracking.mlflow_uri, or set tracking.enabled: false)"
        )
        return NullTracker()


def _probe_tracking_server(uri: str, timeout_s: float = 5.0) -> None:
    """An HTTP tracking server that does not answer /health within ``timeout_s`` is a
    StudyError now, instead of minutes of MLflow's own retries per call later."""
    if not is_server(uri):
        return
    try:
        server_health(uri, timeout_s)
    except httpx.HTTPError as exc:
        raise StudyError(f"MLflow tracking server {uri} does not answer /health ({type(exc).__name__}: {exc})") from exc
