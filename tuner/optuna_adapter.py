"""Every Optuna name the tuner uses that is not Optuna's public API, in one place.

Optuna keeps some of what the tuner needs behind underscores (a study's storage and id,
a trial's id, the RDB engine under the cache layer, a distribution's range test, how an
artifact is registered) or in system attributes it writes for itself (a queued trial's
``fixed_params``, the heartbeat retry's ``failed_trial`` / ``retry_history``, the
legacy ``constraints`` list optuna-dashboard reads); likewise optuna-dashboard's private
``_note`` module, loaded alone to write notes. Every other module goes through
here, so an Optuna upgrade that moves one of them breaks in this file, and
tests/study/test_optuna_adapter.py, pinned to the installed Optuna's behaviour, says which.

Layer 0: it imports Optuna and nothing of the tuner, so the config layer (the search
space's distributions) can use it as well as the study.
"""

from __future__ import annotations

import contextlib
import functools
import importlib.util
import json
import threading
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from dataclasses import asdict
from pathlib import Path
from types import ModuleType
from typing import Any

import optuna
from optuna.distributions import BaseDistribution, FloatDistribution, IntDistribution

# System attributes Optuna writes and reads itself.
FIXED_PARAMS = "fixed_params"  # study.enqueue_trial: the params a queued trial was given
FAILED_TRIAL = "failed_trial"  # the heartbeat retry (RetryHeartbeatStaleTrialCallback): the trial it copies
RETRY_HISTORY = "retry_history"  # the heartbeat retry: the trials before this retry
LEGACY_CONSTRAINTS_ATTR = "constraints"  # the constraint values optuna-dashboard 0.21 reads

#: RDBStorage's calls that are safe to repeat after a lost connection: reads, and writes
#: that set a value (a repeat after a commit whose answer was lost changes nothing).
#: ``_get_trials`` is how Optuna's cache layer reads trials. Not here: creating a study
#: or a trial, and finishing one (``set_trial_state_values`` refuses a finished trial):
#: the loop repeats those with logic of its own (tuner.study.loop).
RDB_CALLS_SAFE_TO_REPEAT = (
    "get_all_studies",
    "get_study_id_from_name",
    "get_study_name_from_id",
    "get_study_directions",
    "get_study_user_attrs",
    "get_study_system_attrs",
    "get_trial",
    "get_all_trials",
    "_get_trials",
    "get_n_trials",
    "get_best_trial",
    "get_trial_id_from_study_id_trial_number",
    "get_trial_number_from_id",
    "get_trial_param",
    "get_trial_params",
    "get_trial_user_attrs",
    "get_trial_system_attrs",
    "set_study_user_attr",
    "set_study_system_attr",
    "set_trial_user_attr",
    "set_trial_system_attr",
    "set_trial_param",
    "set_trial_intermediate_value",
    "record_heartbeat",
)


_CONSTRUCTING = threading.Lock()


@contextlib.contextmanager
def rdb_construction(existing: bool) -> Iterator[None]:
    """Build an RDBStorage inside this (one construction at a time in the process).

    ``existing``: the schema is there already (a study a run made). RDBStorage's
    constructor then still builds a ``_VersionManager`` that reads the alembic revision,
    importing alembic and its migration machinery (about 0.3 s of a 1.6 s `tuner best`)
    to learn what a skipped compatibility check never asks. Here that manager is built
    without its two start-up steps (the version row and the alembic stamp, both present
    in a schema a run created); it still answers every call (``get_current_version``,
    ``upgrade``) when one is made. Not ``existing``: Optuna's own manager, unchanged."""
    from optuna.storages._rdb import storage as rdb_module

    with _CONSTRUCTING:
        if not existing:
            yield
            return
        real = rdb_module._VersionManager

        class _OpenedVersionManager(real):  # type: ignore[misc,valid-type]  # a private class of Optuna's
            def __init__(self, url: str, engine: Any, scoped_session: Any) -> None:
                self.url, self.engine, self.scoped_session = url, engine, scoped_session

        setattr(rdb_module, "_VersionManager", _OpenedVersionManager)  # noqa: B010  (mypy: a class name)
        try:
            yield
        finally:
            setattr(rdb_module, "_VersionManager", real)  # noqa: B010


def storage_of(study: optuna.Study) -> optuna.storages.BaseStorage:
    """The storage ``study`` reads and writes (an RDBStorage sits behind Optuna's cache layer)."""
    return study._storage


def study_id_of(study: optuna.Study) -> int:
    """The study's id in its storage (the dashboard's URLs use it)."""
    return study._study_id


def trial_id_of(trial: optuna.Trial | optuna.trial.FrozenTrial) -> int:
    """The trial's id in its storage (not its number): a running Trial or a FrozenTrial."""
    return trial._trial_id


def set_trial_system_attr(trial: optuna.Trial, key: str, value: Any) -> None:
    """A system attribute on a running trial (``Trial.set_system_attr`` is deprecated)."""
    trial.storage.set_trial_system_attr(trial._trial_id, key, value)


def set_trial_attrs(trial: optuna.Trial, *, user: Mapping[str, Any], system: Mapping[str, Any]) -> None:
    """Set user and system attributes of a running trial together. On an RDB storage in
    one transaction (one session, one commit): Optuna opens a session and commits once per
    attribute (a SELECT of the trial, an upsert, a commit), and a trial's record is about
    twenty of them. On SQLite and PostgreSQL the trial is read and checked once and each
    kind of attribute is one multi-row upsert (one per attribute cost 15 ms of CPU a demo
    trial, this 4 ms); on another database, Optuna's upsert per attribute. Another
    storage: one call each. The running Trial's own copy of its user attributes is
    updated as ``Trial.set_user_attr`` does. Safe to repeat (upserts)."""
    storage: Any = trial.storage
    rdb = getattr(storage, "_backend", storage)
    if not (hasattr(rdb, "scoped_session") and hasattr(rdb, "_set_trial_attr_without_commit")):
        for key, value in user.items():
            storage.set_trial_user_attr(trial._trial_id, key, value)
        for key, value in system.items():
            storage.set_trial_system_attr(trial._trial_id, key, value)
    elif user or system:
        from optuna.storages._rdb import models
        from optuna.storages._rdb.storage import _create_scoped_session

        with _create_scoped_session(rdb.scoped_session, True) as session:
            upsert = _multi_row_upsert(rdb.engine.name)
            if upsert is None:
                for key, value in user.items():
                    rdb._set_trial_attr_without_commit(
                        session, models.TrialUserAttributeModel, trial._trial_id, key, value
                    )
                for key, value in system.items():
                    rdb._set_trial_attr_without_commit(
                        session, models.TrialSystemAttributeModel, trial._trial_id, key, value
                    )
            else:
                # what Optuna's _set_trial_attr_without_commit does per attribute, once
                found = models.TrialModel.find_or_raise_by_id(trial._trial_id, session)
                rdb.check_trial_is_updatable(trial._trial_id, found.state)
                for model, attrs in (
                    (models.TrialUserAttributeModel, user),
                    (models.TrialSystemAttributeModel, system),
                ):
                    rows = [
                        {"trial_id": trial._trial_id, "key": k, "value_json": json.dumps(v)} for k, v in attrs.items()
                    ]
                    for start in range(0, len(rows), _UPSERT_ROWS):
                        insert = upsert(model).values(rows[start : start + _UPSERT_ROWS])
                        session.execute(
                            insert.on_conflict_do_update(
                                index_elements=[model.trial_id, model.key],
                                set_={"value_json": insert.excluded.value_json},
                            )
                        )
    trial._cached_frozen_trial.user_attrs.update(user)


#: rows per multi-row upsert (3 bound values a row: far under SQLite's oldest limit of 999)
_UPSERT_ROWS = 200


def _multi_row_upsert(engine: str) -> Any:
    """The dialect ``insert`` whose ``on_conflict_do_update`` Optuna's RDB storage itself
    uses for an attribute on ``engine`` (SQLite from 3.24, PostgreSQL); None elsewhere."""
    if engine == "postgresql":
        from sqlalchemy.dialects import postgresql

        return postgresql.insert
    if engine == "sqlite":
        import sqlite3

        from sqlalchemy.dialects import sqlite

        return sqlite.insert if sqlite3.sqlite_version_info >= (3, 24, 0) else None
    return None


class _DeferredParams:
    """A trial's storage, but the params its ``suggest_*`` calls record are kept here
    (``pending``) for one write later; everything else goes to ``storage``. The check
    Optuna's cache layer makes against a param's earlier distribution is made at once,
    so an incompatible one still raises where the suggest call is."""

    def __init__(self, storage: Any, trial_id: int) -> None:
        self._storage = storage
        self._trial_id = trial_id
        self.pending: dict[str, tuple[float, BaseDistribution]] = {}

    def set_trial_param(self, trial_id: int, name: str, value: float, distribution: BaseDistribution) -> None:
        if trial_id != self._trial_id:
            self._storage.set_trial_param(trial_id, name, value, distribution)
            return
        from optuna.distributions import check_distribution_compatibility

        with self._storage._lock:
            study_id, _ = self._storage._trial_id_to_study_id_and_number[trial_id]
            known = self._storage._studies[study_id].param_distribution.get(name)
        if known is not None:
            check_distribution_compatibility(known, distribution)
        self.pending[name] = (value, distribution)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._storage, name)


@contextlib.contextmanager
def params_recorded_together(
    trial: optuna.Trial, retry: Callable[[Callable[[], list[str]]], list[str]] = lambda write: write()
) -> Iterator[None]:
    """Within the block, the params ``trial``'s ``suggest_*`` calls draw are recorded
    when it ends, in one transaction (`add_trial_params`, under ``retry``: safe to
    repeat), where Optuna commits each in a transaction of its own (a SELECT of the trial
    and an insert: a demo trial draws eight, 15 ms of CPU). The running trial knows its
    params meanwhile (Optuna keeps them on it), and the samplers read only other trials.
    An RDB storage behind Optuna's cache layer only; elsewhere, as Optuna records them.
    Params drawn before an error are recorded too, as they would have been."""
    storage: Any = getattr(trial, "storage", None)
    if not (
        isinstance(trial, optuna.Trial)
        and hasattr(storage, "_studies")
        and hasattr(storage, "_trial_id_to_study_id_and_number")
        and hasattr(getattr(storage, "_backend", None), "_set_trial_param_without_commit")
    ):
        yield
        return
    deferred = _DeferredParams(storage, trial._trial_id)
    trial.storage = deferred  # type: ignore[assignment]  # the storage's own interface, but set_trial_param
    try:
        yield
    finally:
        trial.storage = storage
        if deferred.pending:
            clashes = retry(lambda: add_trial_params(trial, deferred.pending))
            if clashes:  # recorded meanwhile by another process under another kind: what Optuna raises
                raise ValueError(
                    f"params {clashes} of trial {trial.number} were recorded by another process under other "
                    "distributions meanwhile; the study's search space changed under it"
                )


def add_trial_params(trial: optuna.Trial, params: Mapping[str, tuple[float, BaseDistribution]]) -> list[str]:
    """Record ``params`` (name -> internal value, distribution) on a running trial, but
    the names it has already (drawn, or added before: safe to repeat); returns the names
    skipped because the study holds them under a distribution Optuna calls incompatible.

    On an RDB storage behind Optuna's cache layer: one transaction (the trial's names and
    the study's earlier distributions of these names read once, then the rows), where
    ``set_trial_param`` opens a session, reads the trial and the name's first record and
    commits once per param (a demo trial adds six: 15 ms of CPU). The compatibility
    check is Optuna's own (``check_distribution_compatibility``) against the same earlier
    distribution, and the cache layer learns the new names as ``set_trial_param`` does.
    Another storage: one ``set_trial_param`` each."""
    storage: Any = trial.storage
    trial_id = trial._trial_id
    rdb = getattr(storage, "_backend", None)
    cached = getattr(storage, "_studies", None)
    if rdb is None or cached is None or not hasattr(rdb, "_set_trial_param_without_commit"):
        have = storage.get_trial(trial_id).params
        skipped = []
        for name, (value, dist) in params.items():
            if name in have:
                continue
            try:
                storage.set_trial_param(trial_id, name, value, dist)
            except ValueError:
                skipped.append(name)  # recorded with another kind in an earlier trial
        return skipped
    from optuna.distributions import check_distribution_compatibility, json_to_distribution
    from optuna.storages._rdb import models
    from optuna.storages._rdb.storage import _create_scoped_session

    skipped, added = [], {}
    with storage._lock:
        study_id, _ = storage._trial_id_to_study_id_and_number[trial_id]
        known = dict(cached[study_id].param_distribution)
        with _create_scoped_session(rdb.scoped_session, True) as session:
            have = {n for (n,) in session.query(models.TrialParamModel.param_name).filter_by(trial_id=trial_id)}
            todo = {name: got for name, got in params.items() if name not in have}
            unknown = [name for name in todo if name not in known]
            if unknown:  # recorded by an earlier run, or by another worker: the first record, as Optuna reads it
                rows = (
                    session.query(models.TrialParamModel.param_name, models.TrialParamModel.distribution_json)
                    .join(models.TrialModel)
                    .filter(models.TrialModel.study_id == study_id)
                    .filter(models.TrialParamModel.param_name.in_(unknown))
                    .order_by(models.TrialParamModel.param_id)
                )
                for name, dist_json in rows:
                    known.setdefault(name, json_to_distribution(dist_json))
            for name, (value, dist) in todo.items():
                previous = known.get(name)
                if previous is not None:
                    try:
                        check_distribution_compatibility(previous, dist)
                    except ValueError:
                        skipped.append(name)
                        continue
                rdb._set_trial_param_without_commit(session, trial_id, name, value, dist, previous or dist)
                known.setdefault(name, dist)
                added[name] = dist
        for name, dist in added.items():
            cached[study_id].param_distribution.setdefault(name, dist)
    return skipped


def set_legacy_constraints(trial: optuna.Trial, values: Sequence[float]) -> None:
    """The trial's constraint values as the legacy list optuna-dashboard 0.21 reads to
    mark a trial infeasible (``Trial.set_constraint`` is what the samplers read)."""
    set_trial_system_attr(trial, LEGACY_CONSTRAINTS_ATTR, list(values))


def queued_params(trial: Any) -> Mapping[str, Any]:
    """The params ``study.enqueue_trial`` fixed for ``trial`` (a running optuna.Trial);
    empty for a sampled trial or anything that is not a storage-backed trial."""
    storage, trial_id = getattr(trial, "storage", None), getattr(trial, "_trial_id", None)
    if storage is None or trial_id is None:
        return {}
    return storage.get_trial_system_attrs(trial_id).get(FIXED_PARAMS) or {}


def contains(dist: BaseDistribution, value: float) -> bool:
    """Whether a numeric distribution holds ``value`` (on its step grid)."""
    if not isinstance(dist, IntDistribution | FloatDistribution):
        raise TypeError(f"contains: a numeric distribution, not {dist!r}")
    return bool(dist._contains(value))


def rdb_engine(storage: optuna.storages.BaseStorage) -> Any:
    """The SQLAlchemy engine of an RDB storage (under the cache layer a study wraps it
    in), else None (in-memory, journal)."""
    return getattr(getattr(storage, "_backend", storage), "engine", None)


def heartbeat_interval(study: optuna.Study) -> float | None:
    """The study storage's heartbeat interval in seconds; None when it has none."""
    get = getattr(study._storage, "get_heartbeat_interval", None)
    return get() if get is not None else None


def register_artifact(
    trial: optuna.Trial, artifact_id: str, filename: str, mimetype: str, encoding: str | None
) -> None:
    """List an artifact on a running trial as ``optuna.artifacts.upload_artifact`` does
    (optuna-dashboard and ``get_all_artifact_meta`` read it), without its bytes: those
    are stored later, when the trial may be finished and its attributes frozen."""
    set_trial_system_attr(trial, *artifact_attr(artifact_id, filename, mimetype, encoding))


def artifact_attr(artifact_id: str, filename: str, mimetype: str, encoding: str | None) -> tuple[str, str]:
    """The system attribute (key, value) that lists an artifact on a trial, as
    `register_artifact` sets it (for `set_trial_attrs`)."""
    from optuna.artifacts._upload import ARTIFACTS_ATTR_PREFIX, ArtifactMeta

    meta = ArtifactMeta(artifact_id=artifact_id, filename=filename, mimetype=mimetype, encoding=encoding)
    return ARTIFACTS_ATTR_PREFIX + artifact_id, json.dumps(asdict(meta))


def _rdb(study: optuna.Study) -> Any:
    """The RDB storage under Optuna's cache layer (None for another kind of storage)."""
    storage: Any = study._storage
    backend = getattr(storage, "_backend", storage)
    return backend if hasattr(backend, "engine") else None


def heartbeat_grace(study: optuna.Study) -> float | None:
    """The storage's grace period in seconds (Optuna's default: twice the interval);
    None when the storage records no heartbeats."""
    backend = _rdb(study)
    interval = backend.get_heartbeat_interval() if backend is not None else None
    if interval is None:
        return None
    return float(backend.grace_period or 2 * interval)


def heartbeat_rows(study: optuna.Study, trial_ids: Collection[int]) -> set[int]:
    """Which of ``trial_ids`` have a heartbeat row (have beaten at least once): Optuna has no
    public read of its ``trial_heartbeats`` table."""
    import sqlalchemy as sa

    if not trial_ids:
        return set()
    query = sa.text("SELECT trial_id FROM trial_heartbeats WHERE trial_id IN :ids").bindparams(
        sa.bindparam("ids", expanding=True)
    )
    with _rdb(study).engine.connect() as conn:
        return {int(row[0]) for row in conn.execute(query, {"ids": sorted(trial_ids)})}


def save_dashboard_note(target: Any, markdown: str) -> None:
    """optuna-dashboard's ``save_note`` on an ``optuna.Study`` or ``optuna.Trial``."""
    _save_note()(target, markdown)


@functools.cache
def _save_note() -> Callable[[Any, str], None]:
    """optuna-dashboard's ``save_note`` without its web app: the package's ``__init__``
    imports the server and, through ``optuna.importance``, scikit-learn (about a second of
    CPU in every `tuner run`, for a function that only sets study attributes). Its
    ``_note`` module imports nothing but optuna, so it is loaded on its own from the
    installed package; where a release keeps it elsewhere, the package is imported as
    before. tests/study/test_dashboard_note.py pins that the dashboard reads what it writes."""
    try:
        save: Callable[[Any, str], None] = _dashboard_note_module().save_note
    except (ImportError, OSError, AttributeError, SyntaxError):
        from optuna_dashboard import save_note

        return save_note
    return save


def _dashboard_note_module() -> ModuleType:
    spec = importlib.util.find_spec("optuna_dashboard")  # finds the package, runs nothing of it
    if spec is None or spec.origin is None:
        raise ImportError("optuna_dashboard is not installed")
    note_spec = importlib.util.spec_from_file_location(
        "tuner._optuna_dashboard_note", Path(spec.origin).with_name("_note.py")
    )
    if note_spec is None or note_spec.loader is None:
        raise ImportError("optuna_dashboard/_note.py cannot be loaded")
    module = importlib.util.module_from_spec(note_spec)
    note_spec.loader.exec_module(module)  # FileNotFoundError when this release has no _note.py
    return module
