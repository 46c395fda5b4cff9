"""Where a study lives: opening (or creating) it on its storage, the storage rules for
one or several processes, the storage-wide lock, and the study-level attributes.

``open_study`` creates or resumes a study on a URL (SQLite files in WAL mode, other
databases through tuner.study.storage.database); ``make_storage`` is the worker's storage
(heartbeats, retry of a dead worker's trial); ``check_storage`` refuses SQLite for
more than one worker (queued trials race there, optuna issues 4621, 4002);
``storage_lock`` is a lock shared by every process on the same database;
``load_study`` opens an existing study for the commands that read one.
"""

from __future__ import annotations

import hashlib
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import optuna
from sqlalchemy import text

from tuner.config.workers import WorkerSettings
from tuner.dburl import redact, sqlalchemy_url
from tuner.errors import DatabaseUnreachable, StudyError
from tuner.optuna_adapter import rdb_engine
from tuner.study.storage.database import rdb_storage
from tuner.study.storage.transient import is_transient_storage_error, ride_s

if TYPE_CHECKING:
    from tuner.config.experiment import Experiment


ATTR_ENQUEUED = "tuner.initial_trials_enqueued"
ATTR_ARTIFACT_DIR = "tuner.artifact_dir"
ATTR_OBJECTIVE = "tuner.objective"
ATTR_CONSTRAINTS = "tuner.constraints"
ATTR_PREFLIGHT = "tuner.preflight"
ATTR_CONFIG_SEEN = "tuner.config_seen"  # the space's keys as the study first found them (apply's drift check)
#: channel: http: sha256 of the config document's canonical JSON as the study first found it (apply's re-check)
ATTR_HTTP_SEEN = "tuner.http_config_seen"
ATTR_REPLICA = "tuner.replica"
ATTR_LABELS = "tuner.labels"  # {"dataset_id", "fingerprint"} of the labels the study's trials are measured on


def open_study(
    name: str,
    storage: str | optuna.storages.BaseStorage,
    *,
    sampler: optuna.samplers.BaseSampler | None,
    pruner: optuna.pruners.BasePruner | None = None,
    objective_metric: str = "Primary_Metric_Score",
    maximize: bool = True,
    secondary: tuple[str, bool] | None = None,
) -> optuna.Study:
    """Create the study, or load it when one of that name exists (resume). ``secondary``:
    a second objective's (metric, maximize): the study is then multi-objective."""
    direction: Literal["minimize", "maximize"] = "maximize" if maximize else "minimize"
    directions: list[str] = [direction]
    metric_names = [objective_metric]
    if secondary is not None:
        directions.append("maximize" if secondary[1] else "minimize")
        metric_names.append(secondary[0])
    if isinstance(storage, str):
        from tuner.study.storage.database import rdb_storage

        # rdb_storage names the installed PostgreSQL driver and creates the schema under a
        # lock (processes starting at once on an empty database would race on it).
        # pre-ping: a pooled connection cut by a database restart is replaced, not used.
        storage = (
            sqlite_storage(storage)
            if storage.startswith("sqlite:///")
            else rdb_storage(storage, engine_kwargs={"pool_pre_ping": True})
        )
    try:
        study = optuna.create_study(
            study_name=name,
            storage=storage,
            sampler=sampler,
            pruner=pruner,
            # one objective: the same call as before multi-objective studies (direction=)
            **({"direction": direction} if secondary is None else {"directions": directions}),
            load_if_exists=True,
        )
    except (ValueError, RuntimeError, ImportError) as exc:
        from tuner.dburl import redact

        where = redact(storage) if isinstance(storage, str) else "its storage"
        raise StudyError(
            f"study {name!r} in {where}: cannot open: {exc}; check storage in the experiment file"
        ) from exc
    found = [d.name.lower() for d in study.directions]
    if found != directions:
        what = "direction" if len(found) == len(directions) == 1 else "directions"
        has, asks = (found[0], direction) if what == "direction" else (found, directions)
        raise StudyError(
            f"study {name!r} exists with {what} {has}, the experiment asks {asks};"
            " use another study name or fix objective.direction"
            + (" and secondary_objective" if what != "direction" else "")
        )
    if study.metric_names != metric_names:
        with warnings.catch_warnings():  # experimental since 3.2, stable in practice
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            study.set_metric_names(metric_names)
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

    path = Path(url[len("sqlite:///") :])
    if str(path) != ":memory:":
        path.parent.mkdir(parents=True, exist_ok=True)

    def connect() -> sqlite3.Connection:
        conn = sqlite3.connect(str(path), timeout=60, check_same_thread=False)
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("PRAGMA synchronous=NORMAL")
        return conn

    from tuner.study.storage.database import rdb_storage

    return rdb_storage(url, engine_kwargs={"creator": connect})


def storage_dialect(url: str) -> str:
    """``sqlite``, ``postgresql``, ``mysql``, ... from a SQLAlchemy URL."""
    scheme = url.split(":", 1)[0].lower()
    return scheme.split("+", 1)[0]


def check_storage(url: str, n_workers: int) -> None:
    """Refuse SQLite with more than one worker (StudyError says why and what to use), and
    a bad $TUNER_STORAGE_RIDE_S (ConfigError), before anything starts."""
    ride_s()
    if n_workers > 1 and storage_dialect(url) == "sqlite":
        raise StudyError(
            f"storage {redact(url)} is SQLite, which cannot be shared by {n_workers} workers: queued trials race there "
            "(two workers can take the same baseline/shortlist trial; optuna issues 4621, 4002); set storage to a "
            "PostgreSQL URL, e.g. postgresql://USER:PASSWORD@HOST:5432/DB, or run a single `tuner run`"
        )
    if storage_dialect(url) not in ("sqlite", "postgresql", "mysql"):
        raise StudyError(
            f"storage {redact(url)}: unsupported database; use sqlite:///FILE (one worker) or postgresql://..."
        )


def make_storage(url: str, settings: WorkerSettings | None = None) -> optuna.storages.RDBStorage:
    """RDBStorage with heartbeats and the retry-on-crash callback."""
    settings = settings or WorkerSettings()
    url = sqlalchemy_url(url)
    engine_kwargs: dict[str, Any] = {}
    if storage_dialect(url) == "postgresql":
        # A worker holds at most a couple of connections; pre-ping survives a server restart.
        engine_kwargs = {"pool_size": 2, "max_overflow": 4, "pool_pre_ping": True}
    try:
        # rdb_storage: N workers on an empty database create Optuna's schema one at a time
        return rdb_storage(
            url,
            engine_kwargs=engine_kwargs,
            heartbeat_interval=settings.heartbeat_interval_s,
            grace_period=settings.grace,
            heartbeat_stale_trial_callback=optuna.storages.RetryHeartbeatStaleTrialCallback(
                max_retry=settings.max_retry
            ),
        )
    except StudyError:
        raise
    except Exception as exc:  # sqlalchemy / driver errors: connection refused, bad credentials, ...
        raise StudyError(
            f"storage {redact(url)}: cannot connect ({type(exc).__name__}: {exc}); "
            "check the URL and that the database server runs"
        ) from exc


def database_unreachable(
    exc: BaseException, *, study: str, url: str, kept: str, resume: str
) -> DatabaseUnreachable | None:
    """The one-line error of a command that ``exc`` ended because the study's database
    stayed away past what ``retry_transient`` waits out (a transient storage error, see
    is_transient_storage_error), else None. ``kept`` says what is safe, ``resume`` what
    goes on once the database answers again."""
    if not is_transient_storage_error(exc):
        return None
    import sqlalchemy as sa

    seen: BaseException | None = exc
    while seen is not None and not isinstance(seen, sa.exc.DBAPIError):
        seen = seen.__cause__ or seen.__context__
    cause = getattr(seen, "orig", None) or seen or exc  # the driver's own error says why
    lines = str(cause).strip().splitlines()
    why = f"{type(cause).__name__}: {lines[0]}" if lines else type(cause).__name__
    return DatabaseUnreachable(
        f"study {study!r}: its database {redact(url)} is unreachable ({why}) for longer than the "
        f"~{ride_s():g} s the tuner waits out; kept: {kept}; once it answers again, {resume}"
    )


@contextmanager
def storage_lock(storage: optuna.storages.BaseStorage, name: str, timeout_s: float = 60.0) -> Iterator[None]:
    """A lock shared by every process on the same database (PostgreSQL advisory lock,
    MySQL GET_LOCK). SQLite gets none: it is refused for several workers anyway."""
    engine = rdb_engine(storage)
    dialect = engine.dialect.name if engine is not None else "none"
    if engine is None or dialect not in ("postgresql", "mysql"):
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


def load_study(experiment: Experiment) -> optuna.Study:
    """The experiment's existing study (StudyError when it has not been run yet). Opened
    as a study a run made (no schema creation or version check: the commands that read
    a study answer sooner); a database without the schema, or with an old one, gets
    Optuna's full open and its message."""
    missing = StudyError(
        f"no study {experiment.study!r} in {redact(experiment.storage)}; run `tuner run {experiment.source}` first"
    )
    try:
        return optuna.load_study(study_name=experiment.study, storage=rdb_storage(experiment.storage, existing=True))
    except KeyError as exc:
        raise missing from exc
    except Exception:  # noqa: BLE001 - no schema yet, or an old one: the full open below says which
        pass
    try:
        return optuna.load_study(study_name=experiment.study, storage=sqlalchemy_url(experiment.storage))
    except KeyError as exc:
        raise missing from exc
