"""`tuner apply`: put a trial's config into the target's config files, safely.

    plan_apply(experiment, trial_number=None) -> ApplyPlan      # what would change (diff)
    apply_plan(plan, tolerance=0.01, on_step=None) -> ApplyResult

The plan picks the best feasible trial (or a given one) and renders its assignment
onto the config files as they are now; a key whose value the trial leaves as the file
has it is not rewritten (its line stays byte for byte). Applying backs the files up under
``<state_dir>/backups/<time>/``, writes them atomically (with the restore journal, so a
crash mid-apply is undone by the next `tuner run` / `tuner apply`), restarts the
backend, waits for health, re-evaluates the query set and compares the objective with
the trial's value. Outside the tolerance -- or when the backend does not come up or the
evaluation fails -- it rolls back: originals back, backend restarted on them.

The crash window: from the write to the verdict (restart, health wait, re-evaluation,
comparison) the files hold the unchecked trial config and the journal is on disk;
everything that can be done before the write is (static checks, backups, target and
evaluator built), and the journal goes only after the verdict. A SIGKILL inside it
leaves the journal pending: every reader says so, and `recover_apply` (`tuner apply
--recover`) or the next `tuner run` / `tuner apply` replays it and restarts the backend
on the originals before measuring anything.

    recover_apply(experiment, on_step=None) -> str   # replay a pending journal, restart on it

``target.channel: request``: nothing on the backend holds the values. With
``target.request.apply_to`` the plan renders them into the file the calling application
reads (its ``paths``), and the apply re-checks that file against the declared request
(production as found, the study's baseline: a difference stops it unless ``force``),
backs it up, writes it with the same journal, re-measures with the request the
application will send (the declared request with the values read back from the written
file) and rolls the file back when that does not hold; the backend is not restarted.
Without it, ``request_fragment`` gives the part of the request that carries the values.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import optuna

from tuner.errors import LabelError, StudyError, TunerError
from tuner.study.feasibility import constraints_hold, is_feasible, pick_trial
from tuner.study.storage.study_storage import ATTR_CONFIG_SEEN, ATTR_HTTP_SEEN, load_study
from tuner.study.trial.attrs import ATTR_GATES_MOVED, ATTR_VARIANT, assignment_of, trial_attr
from tuner.study.wiring import Prepared, document_digest, labels_mismatch, prepare

if TYPE_CHECKING:
    from tuner.config.experiment import Experiment


@dataclass
class ApplyPlan:
    experiment: Experiment
    prepared: Prepared
    trial_number: int
    objective: str
    expected: float
    feasible: bool
    assignment: dict[str, Any]
    texts: dict[Path, str]
    diff: str
    #: keys the trial writes whose value in the config changed since the study saw it:
    #: (param, value the study saw, value now, value the trial writes)
    drift: list[tuple[str, Any, Any, Any]] = field(default_factory=list)
    #: which constraint moved a solved gate of the trial off its value as found, from what
    #: to what (tuner.study.gates.gate_choice); None: every solved gate keeps its value as found
    #: or moved only for the objective
    gates_moved: str | None = None
    #: channel: request with target.request.apply_to: the application's file the values go
    #: into (``texts`` and ``diff`` are its); None: the target's config files (or document)
    app: AppFile | None = None

    @property
    def changes(self) -> bool:
        return bool(self.diff)

    def drift_message(self) -> str:
        shown = "; ".join(
            f"{name}: study saw {seen!r}, now {now!r}, trial writes {new!r}" for name, seen, now, new in self.drift
        )
        return (
            f"{len(self.drift)} key(s) the trial writes were edited since the study measured them ({shown}); "
            "the trial's score was measured against the old values: re-run the study, or pass --force to "
            "overwrite the edits"
        )


@dataclass
class AppFile:
    """``target.request.apply_to``: the file the calling application reads the request's
    values from, journaled at the experiment's restore journal like a config file."""

    patcher: Any  # ConfigPatcher of the one file
    paths: dict[str, str]  # bound config key -> dotted path in the file
    binding: Any  # RequestBinding (target.request.bind)
    #: (config key, key in the file, the file's value, the declared request's value) where
    #: the file does not hold what the study measured as production
    mismatch: list[tuple[str, str, Any, Any]] = field(default_factory=list)

    @property
    def name(self) -> str:
        return str(self.patcher.names[0])

    def mismatch_message(self) -> str:
        shown = "; ".join(
            f"{where} is {now!r}, the request sends {sent!r} ({key})" for key, where, now, sent in self.mismatch
        )
        return (
            f"{self.name} does not hold the values of the request the study measured as production ({shown}): "
            "the trial's gain is against that request; make evaluation.request declare what the application "
            "sends and re-run the study, or pass --force to write over the file's values"
        )

    def request_as_written(self, declared: Any) -> Any:
        """``declared`` (evaluation.request) with the values the file holds now, read back
        from disk: the request the application will send."""
        from tuner.config.configpatch import get_path, load_text

        path = self.patcher.files[0]
        doc = load_text(path.read_text(encoding="utf-8"), path)
        return self.binding.render(declared, {key: get_path(doc, where) for key, where in self.paths.items()})


@dataclass
class ApplyResult:
    plan: ApplyPlan
    applied: bool
    rolled_back: bool = False
    measured: float | None = None
    backups: list[Path] = field(default_factory=list)
    message: str = ""


def apply_rights(experiment: Experiment) -> Any:
    """The locks a real apply holds from planning to its last restart (tuner.study.storage.locks)."""
    from tuner.study.storage.locks import patch_rights

    # the URL as a run locks it: {port} filled (a fixed port; "auto" has no URL to meet)
    bound = experiment.bind_port() if isinstance(experiment.target.port, int) else experiment
    apply_to = experiment.target.apply_to  # channel: request: the application's file, locked like a config file
    return patch_rights(
        experiment.storage,
        experiment.study,
        [*experiment.target.config_files, *([apply_to.file] if apply_to is not None else [])],
        mode="exclusive",
        command="tuner apply",
        urls=bound.target.config_urls,
    )


def plan_apply(
    experiment: Experiment,
    *,
    trial_number: int | None = None,
    recover_journal: bool = True,
    on_replay: Callable[[str], None] = lambda line: None,
) -> ApplyPlan:
    """Render the chosen trial onto the config files as they are now (nothing written).

    ``recover_journal``: replay a restore journal left by a crash first; only a caller
    holding `apply_rights` may (a dry run must not: the journal may be a live run's, and
    its originals are the right base to render from anyway). ``on_replay`` gets the line
    saying what the replay restored, at once (before anything else can stop the plan)."""
    study = load_study(experiment)
    maximize = experiment.objective.maximize
    prepared = prepare(experiment, recover_journal=recover_journal)
    if prepared.replayed:
        on_replay(prepared.replayed)
    problem = labels_mismatch(study, experiment, prepared.labels_fingerprint)
    if problem is not None:  # the trials were ranked, and their scores measured, on other labels
        raise LabelError(problem)
    trial = pick_trial(study, trial_number, maximize=maximize, choose=_chooser(experiment))
    if experiment.target.channel == "request":
        return _plan_app_file(experiment, prepared, study, trial)
    docs = prepared.patcher.documents()
    # A key the trial leaves as the file has it is not rewritten: the file's own value
    # stands (a study recorded before that rule may hold a simplex's 0.5/0.5 for 1.0/1.0).
    assignment = prepared.space.as_found(assignment_of(trial) or prepared.space.suggest(trial), docs)
    edits = prepared.space.edits(assignment)
    now = prepared.space.current_assignment(docs)
    return ApplyPlan(
        experiment=experiment,
        prepared=prepared,
        trial_number=trial.number,
        objective=experiment.objective.metric,
        expected=float(trial.values[0]),
        feasible=is_feasible(trial),
        assignment=dict(assignment),
        texts=prepared.patcher.render(edits),
        diff=prepared.patcher.diff(edits),
        # config_seen as found now where it matches (older studies kept normalised weights)
        drift=find_drift(prepared.space.as_found(config_seen(study), docs), now, assignment),
        gates_moved=trial_attr(trial, ATTR_GATES_MOVED) or None,
    )


def _plan_app_file(experiment: Experiment, prepared: Prepared, study: optuna.Study, trial: Any) -> ApplyPlan:
    """channel: request: the trial's values rendered into ``target.request.apply_to``'s
    file as it is now (a key whose value the trial keeps is not rewritten), and where the
    file differs from the declared request (the study's production as found)."""
    from tuner.config.configpatch import MISSING, ConfigPatcher, get_path
    from tuner.config.flatten import flatten
    from tuner.errors import ConfigError
    from tuner.files import display_path
    from tuner.study.trial.request_channel import binding_of, declared_values

    apply_to = experiment.target.apply_to
    if apply_to is None:
        raise ConfigError(
            f"{experiment.source}: target.request.apply_to is not set: there is no file to write "
            "(tuner apply prints the request fragment instead)"
        )
    if not apply_to.file.is_file():
        raise ConfigError(
            f"{display_path(apply_to.file)}: the application's file does not exist (check target.request.apply_to.file)"
        )
    docs = prepared.found_documents()
    assignment = prepared.space.as_found(assignment_of(trial) or prepared.space.suggest(trial), docs)
    values: dict[str, Any] = {}
    for per_file in prepared.space.edits(assignment).values():
        values.update(flatten(per_file))
    binding = binding_of(experiment)
    declared = declared_values(binding, experiment.evaluation.request)
    patcher = ConfigPatcher([apply_to.file], journal_path=experiment.journal_path)
    doc = patcher.documents()[0]
    found: dict[str, Any] = {}
    for key, where in apply_to.paths.items():
        found[key] = get_path(doc, where)
        if found[key] is MISSING:
            raise ConfigError(
                f"{patcher.names[0]}: no key {where} (target.request.apply_to.paths.{key}); add it with the value "
                f"the application sends today ({declared[key]!r}), or fix the key"
            )
    unplaced = sorted(set(values) - set(apply_to.paths))
    if unplaced:
        raise ConfigError(
            f"{experiment.source}: target.request.apply_to.paths has no place for {', '.join(unplaced)}; add it"
        )
    edits = {apply_to.paths[key]: value for key, value in values.items() if not _same_value(found[key], value)}
    mismatch = [
        (key, where, found[key], declared[key])
        for key, where in apply_to.paths.items()
        if not _same_value(found[key], declared[key])
    ]
    return ApplyPlan(
        experiment=experiment,
        prepared=prepared,
        trial_number=trial.number,
        objective=experiment.objective.metric,
        expected=float(trial.values[0]),
        feasible=is_feasible(trial),
        assignment=dict(assignment),
        texts=patcher.render({0: edits}),
        diff=patcher.diff({0: edits}),
        # the declared request changed since the study measured it (the drift of the file path)
        drift=find_drift(
            prepared.space.as_found(config_seen(study), docs), prepared.space.current_assignment(docs), assignment
        ),
        gates_moved=trial_attr(trial, ATTR_GATES_MOVED) or None,
        app=AppFile(patcher, dict(apply_to.paths), binding, mismatch),
    )


def _same_value(a: Any, b: Any) -> bool:
    """``_same``, a value the file spells as text equal to the number it spells (a URL's
    or header's value is read as its type: tuner.study.trial.request_channel)."""
    import json

    def typed(v: Any) -> Any:
        try:
            return json.loads(v) if isinstance(v, str) else v
        except ValueError:
            return v

    return _same(a, b) or _same(typed(a), typed(b))


@dataclass(frozen=True)
class RequestFragment:
    """``target.channel: request``: the chosen trial's values where the request carries
    them (nothing to write: the application that sends the requests sets them)."""

    trial_number: int
    expected: float
    feasible: bool
    fragment: dict[str, Any]


def _chooser(experiment: Experiment) -> Any:
    """The study's ``selection`` rule for the trial to apply (tuner.study.query_scores)."""
    from tuner.study.query_scores import trial_chooser

    return trial_chooser(experiment.objective, experiment.constraints, experiment.selection)


def request_fragment(experiment: Experiment, *, trial_number: int | None = None) -> RequestFragment:
    """The chosen trial's values as the part of the request that carries them."""
    from tuner.config.flatten import flatten
    from tuner.study.trial.request_channel import binding_of

    study = load_study(experiment)
    prepared = prepare(experiment, recover_journal=False)
    problem = labels_mismatch(study, experiment, prepared.labels_fingerprint)
    if problem is not None:
        raise LabelError(problem)
    trial = pick_trial(study, trial_number, maximize=experiment.objective.maximize, choose=_chooser(experiment))
    docs = prepared.found_documents()
    assignment = prepared.space.as_found(assignment_of(trial) or prepared.space.suggest(trial), docs)
    values: dict[str, Any] = {}
    for per_file in prepared.space.edits(assignment).values():
        values.update(flatten(per_file))
    return RequestFragment(
        trial.number, float(trial.values[0]), is_feasible(trial), binding_of(experiment).fragment(values)
    )


def config_seen(study: optuna.Study) -> dict[str, Any]:
    """The search space's keys as the study found them in the config (recorded at its
    first run; older studies: the baseline trial's assignment; else nothing)."""
    seen = study.user_attrs.get(ATTR_CONFIG_SEEN)
    if isinstance(seen, dict):
        return seen
    for t in study.get_trials(deepcopy=False):
        if t.user_attrs.get(ATTR_VARIANT) == "baseline" and assignment_of(t):
            return assignment_of(t)
    return {}


def find_drift(seen: dict[str, Any], now: dict[str, Any], writes: dict[str, Any]) -> list[tuple[str, Any, Any, Any]]:
    """(param, seen, now, written) for every param the trial writes whose current value
    differs from what the study saw (floats compared to 1e-9)."""
    out = []
    for name, new in writes.items():
        if name in seen and name in now and not _same(seen[name], now[name]):
            out.append((name, seen[name], now[name], new))
    return out


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, (int, float)) and isinstance(b, (int, float)) and not isinstance(a, bool):
        return abs(float(a) - float(b)) <= 1e-9
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    return bool(a == b)


def backup_configs(files: list[Path], backup_root: Path) -> list[Path]:
    """Copy each config file to ``backup_root/<UTC time>/`` (index-prefixed names)."""
    from tuner.files import copy_preserving

    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    folder = backup_root / stamp
    n = 1
    while folder.exists():
        n += 1
        folder = backup_root / f"{stamp}-{n}"
    folder.mkdir(parents=True)
    out = []
    for i, f in enumerate(files):  # the config's mode (and owner where permitted): a 0600 config stays 0600
        out.append(copy_preserving(f, folder / f"{i}-{f.name}"))
    return out


def apply_plan(
    plan: ApplyPlan,
    *,
    tolerance: float = 0.01,
    on_step: Callable[[str], None] = lambda step: None,
    skip_checks: bool = False,
    force: bool = False,
) -> ApplyResult:
    """Write, restart, check health, re-evaluate, compare; roll back when it does not hold.

    The preflight's static checks run before anything is written (PreflightError); its
    batch checks run on the re-measured batch, and a stop there rolls back like a miss."""
    from tuner.ops.check import static_preflight
    from tuner.study.trial.live import LiveEvaluator
    from tuner.targets.factory import make_target
    from tuner.targets.health import wait_target_healthy

    if tolerance < 0:
        raise StudyError(f"--tolerance must be >= 0, got {tolerance}")
    if plan.drift and not force:
        raise StudyError(f"tuner apply: {plan.drift_message()}")
    static_preflight(plan.prepared, skip=skip_checks).raise_for_stops("tuner apply")
    if plan.app is not None:
        return _apply_app_file(plan, tolerance=tolerance, on_step=on_step, skip_checks=skip_checks, force=force)
    exp = plan.experiment.bind_port()
    prepared = plan.prepared
    patcher = prepared.patcher
    if patcher.journal is not None:  # a crash inside the window below leaves a journal naming this apply
        patcher.journal.owner = f"tuner apply of trial #{plan.trial_number} (study {exp.study!r})"
    http = exp.target.channel == "http"
    if http:  # re-check: the served document is still the one the study started from
        changed = http_baseline_problem(plan)
        if changed is not None and not force:
            raise StudyError(f"tuner apply: {changed}")
    on_step("backing up the config files")
    backups = (
        backup_document(patcher.base_texts()[0], exp.state_dir / "backups")
        if http
        else backup_configs(patcher.files, exp.state_dir / "backups")
    )
    result = ApplyResult(plan, applied=False, backups=backups)
    target = make_target(exp.target, exp.state_dir)
    health = exp.target.health
    # Built before the write: the crash window (write .. verdict) holds only what needs
    # the new config served.
    evaluator = LiveEvaluator(exp, prepared.queries, prepared.qrels, prepared.labels_fingerprint)
    evaluator.abort = target.failure  # a backend that dies mid-batch ends it at once

    def restart_and_wait() -> None:
        if not http:  # channel: http: the confirmed write (or restore) is what the backend serves
            target.restart()
        wait_target_healthy(health, target)

    try:
        on_step(f"writing trial #{plan.trial_number}'s config")
        try:
            patcher.write(plan.texts)  # channel: http: written and confirmed by read-back
            on_step("waiting for the backend" if http else "restarting the backend")
            restart_and_wait()
            on_step("re-evaluating the query set")
            batch = evaluator.evaluate(order_seed=0, on_result=lambda qid, row: None)
            result.measured, problem = _verdict(plan, batch, exp, tolerance=tolerance, skip_checks=skip_checks)
        except TunerError as exc:
            problem = f"{type(exc).__name__}: {exc}"
        except BaseException:
            patcher.restore()  # Ctrl-C or a bug: never leave a half-checked config behind
            raise
        if problem is None:
            _commit(patcher)
            result.applied = True
            result.message = (
                f"applied trial #{plan.trial_number}: {plan.objective} {result.measured:.4f} "
                f"(trial {plan.expected:.4f}, within {tolerance:g}); backups in {backups[0].parent}"
            )
            return result
        on_step("rolling back")
        patcher.restore()
        result.rolled_back = True
        try:
            restart_and_wait()
            back = "backend restarted on the original config"
        except TunerError as exc:
            back = f"but the backend did not come back healthy on it: {exc}"
        result.message = f"rolled back: {problem}; original config restored, {back}"
        return result
    finally:
        target.close()


def _verdict(
    plan: ApplyPlan, batch: Any, exp: Experiment, *, tolerance: float, skip_checks: bool
) -> tuple[float, str | None]:
    """The re-measured objective, and why the apply must roll back (None: it holds): a
    preflight stop on the batch, a broken constraint, or the objective off the trial's."""
    from tuner.study.preflight import check_batch

    measured = float(batch.metrics[plan.objective])
    stops = [] if skip_checks else [f for f in check_batch(batch, exp.evaluation) if f.level == "stop"]
    if stops:
        return measured, f"preflight: {stops[0].message}"
    violated = violated_constraints(exp.constraints, batch.metrics)
    if violated:
        return measured, "constraint violated on the re-measured batch: " + "; ".join(violated)
    if abs(measured - plan.expected) > tolerance:
        return measured, (
            f"{plan.objective} re-measured {measured:.4f}, trial #{plan.trial_number} had {plan.expected:.4f}"
            f" (|delta| {abs(measured - plan.expected):.4f} > tolerance {tolerance:g})"
        )
    return measured, None


def _apply_app_file(
    plan: ApplyPlan, *, tolerance: float, on_step: Callable[[str], None], skip_checks: bool, force: bool
) -> ApplyResult:
    """channel: request: write the trial's values into the application's file
    (target.request.apply_to), then re-measure with the request the application will send
    (the declared request with the values read back from the written file); roll the
    file back when it does not hold. The engine is only searched: nothing on it changes."""
    from tuner.study.trial.live import LiveEvaluator
    from tuner.targets.factory import make_target
    from tuner.targets.health import wait_target_healthy

    app = plan.app
    assert app is not None
    if app.mismatch and not force:  # re-check: production as found is the study's baseline
        raise StudyError(f"tuner apply: {app.mismatch_message()}")
    exp = plan.experiment.bind_port()
    prepared = plan.prepared
    patcher = app.patcher
    if patcher.journal is not None:  # a crash inside the window below leaves a journal naming this apply
        patcher.journal.owner = f"tuner apply of trial #{plan.trial_number} (study {exp.study!r})"
    on_step(f"backing up {app.name}")
    backups = backup_configs(patcher.files, exp.state_dir / "backups")
    result = ApplyResult(plan, applied=False, backups=backups)
    target = make_target(exp.target, exp.state_dir)
    evaluator = LiveEvaluator(exp, prepared.queries, prepared.qrels, prepared.labels_fingerprint)
    evaluator.abort = target.failure  # a backend that dies mid-batch ends it at once
    try:
        # up before the write: the crash window (write .. verdict) holds only the re-measure
        on_step("waiting for the backend")
        target.start()
        wait_target_healthy(exp.target.health, target)
        on_step(f"writing trial #{plan.trial_number}'s values into {app.name}")
        problem: str | None
        try:
            patcher.write(plan.texts)
            on_step("re-evaluating the query set with the request the application will send")
            request = app.request_as_written(exp.evaluation.request)
            batch = evaluator.evaluate(order_seed=0, on_result=lambda qid, row: None, request=request)
            result.measured, problem = _verdict(plan, batch, exp, tolerance=tolerance, skip_checks=skip_checks)
        except TunerError as exc:
            problem = f"{type(exc).__name__}: {exc}"
        except BaseException:
            patcher.restore()  # Ctrl-C or a bug: never leave a half-checked file behind
            raise
        if problem is None:
            _commit(patcher)
            result.applied = True
            result.message = (
                f"applied trial #{plan.trial_number} to {app.name}: {plan.objective} {result.measured:.4f} "
                f"(trial {plan.expected:.4f}, within {tolerance:g}); backup in {backups[0].parent}"
            )
            return result
        on_step("rolling back")
        patcher.restore()
        result.rolled_back = True
        result.message = f"rolled back: {problem}; {app.name} restored as found (nothing on the engine changed)"
        return result
    finally:
        target.close()


def http_baseline_problem(plan: ApplyPlan) -> str | None:
    """channel: http: why the served document is not the one the study started from
    (its sha256 over canonical JSON, recorded at the study's first run), or None."""
    study = load_study(plan.experiment)
    seen = study.user_attrs.get(ATTR_HTTP_SEEN)
    if not isinstance(seen, str):
        return None  # a study recorded before the channel kept it: the drift check covers its keys
    now = document_digest(plan.prepared.patcher.base_texts()[0])
    if now == seen:
        return None
    return (
        f"the config document at {plan.prepared.patcher.names[0]} changed since the study started "
        f"(canonical sha256 {seen[:12]}... then, {now[:12]}... now): the trial was measured against the old "
        "document; re-run the study, or pass --force to write it over the edits"
    )


def backup_document(text: str, backup_root: Path) -> list[Path]:
    """channel: http: the served document as found, to ``backup_root/<UTC time>/0-http-config.json``."""
    from tuner.files import atomic_write

    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    folder = backup_root / stamp
    n = 1
    while folder.exists():
        n += 1
        folder = backup_root / f"{stamp}-{n}"
    folder.mkdir(parents=True)
    out = folder / "0-http-config.json"
    atomic_write(out, text.encode("utf-8"), mode=0o600)
    return [out]


def violated_constraints(constraints: Any, metrics: Any) -> list[str]:
    """``"OOS_FP_Rate = 0.3100 > 0.1"`` for each constraint the metrics break (a metric
    missing from them counts as broken: nothing would say it holds)."""
    out = []
    for c in constraints:
        value = metrics.get(c.metric) if hasattr(metrics, "get") else None
        if value is None or value != value:  # missing or NaN
            out.append(f"{c.name}: {c.metric} was not measured")
        elif not constraints_hold([c.violation(metrics)]):
            out.append(f"{c.metric} = {float(value):.4f}, breaks {c.name}")
    return out


def _commit(patcher: Any) -> None:
    """Keep the written config: drop the restore journal instead of replaying it (the
    directory synced, so a power loss cannot bring it back to undo a checked apply)."""
    from tuner.files import fsync_dir

    journal = getattr(patcher, "journal", None)
    if journal is not None and journal.path.exists():
        journal.path.unlink()
        fsync_dir(journal.path.parent)


def restart_on_files(experiment: Experiment, on_step: Callable[[str], None] = lambda step: None) -> None:
    """Restart the backend on the config files as they are now and wait until healthy:
    after a replay, a backend left up may still serve the killed command's config."""
    from tuner.targets.factory import make_target
    from tuner.targets.health import wait_target_healthy

    if experiment.target.channel == "request":
        return  # the restored file is the application's (target.request.apply_to): the engine serves nothing of it
    exp = experiment.bind_port()
    http = exp.target.channel == "http"  # the restore wrote the document through the API, which serves it
    on_step(
        "waiting for the backend on the restored config" if http else "restarting the backend on the restored config"
    )
    target = make_target(exp.target, exp.state_dir)
    try:
        if not http:
            target.restart()
        wait_target_healthy(exp.target.health, target)
    finally:
        target.close()


def recover_apply(experiment: Experiment, on_step: Callable[[str], None] = lambda step: None) -> str:
    """`tuner apply --recover` (the caller holds `apply_rights`): replay a pending
    restore journal, restart the backend on the restored files and wait until healthy.
    Returns the line saying what it did."""
    from tuner.config.journal import pending, recover

    if experiment.target.channel == "http":
        from tuner.study.trial.http_channel import recover_http

        replayed = recover_http(experiment.bind_port())
        if replayed is None:
            return f"no restore journal pending ({experiment.http_journal_path}): nothing to recover"
        restart_on_files(experiment, on_step)
        return f"{replayed}; the backend is healthy"
    found = pending(experiment.journal_path)
    if found is None:
        return f"no restore journal pending ({experiment.journal_path}): nothing to recover"
    line = found.replayed_line(recover(experiment.journal_path))
    if experiment.target.channel == "request":  # the application's file: nothing on the engine to restart
        return f"{line}; the engine serves nothing from it, so it was not restarted"
    restart_on_files(experiment, on_step)
    return f"{line}; the backend was restarted on them and is healthy"
