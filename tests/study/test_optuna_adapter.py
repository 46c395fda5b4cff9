"""tuner.optuna_adapter, pinned to the installed Optuna: each function against real Optuna
objects, so an Optuna upgrade that moves a private name fails here, in one place. The
last test keeps the rest of the tuner off Optuna's private names."""

from __future__ import annotations

import contextlib
import json
import re
from pathlib import Path

import optuna
import pytest
from optuna.distributions import CategoricalDistribution, FloatDistribution, IntDistribution
from optuna.trial import TrialState
from workers.conftest import pg_dsn, pg_study  # noqa: F401  (a real PostgreSQL)

from tuner import optuna_adapter as oa

REPO = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.filterwarnings("ignore::optuna.exceptions.ExperimentalWarning")  # heartbeat_interval


@pytest.fixture
def study() -> optuna.Study:
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    return optuna.create_study(storage=optuna.storages.InMemoryStorage(), study_name="pinned")


@pytest.fixture
def rdb_study(tmp_path: Path) -> optuna.Study:
    storage = optuna.storages.RDBStorage(f"sqlite:///{tmp_path / 'study.db'}", heartbeat_interval=7)
    return optuna.create_study(storage=storage, study_name="pinned-rdb")


def test_storage_and_ids_are_the_ones_optuna_uses(study: optuna.Study) -> None:
    trial = study.ask()
    storage = oa.storage_of(study)
    assert isinstance(storage, optuna.storages.BaseStorage)
    assert storage.get_study_name_from_id(oa.study_id_of(study)) == "pinned"
    assert storage.get_trial_number_from_id(oa.trial_id_of(trial)) == trial.number
    frozen = study.tell(trial, 1.0)
    assert oa.trial_id_of(frozen) == oa.trial_id_of(trial)
    assert oa.trial_id_of(study.trials[0]) == oa.trial_id_of(trial)


def test_system_attrs_and_legacy_constraints_land_on_the_trial(study: optuna.Study) -> None:
    trial = study.ask()
    oa.set_trial_system_attr(trial, "tuner.replica", "r1")
    oa.set_legacy_constraints(trial, [0.5, -1.0])
    study.tell(trial, 1.0)
    attrs = study.trials[0].system_attrs
    assert attrs["tuner.replica"] == "r1"
    assert attrs[oa.LEGACY_CONSTRAINTS_ATTR] == [0.5, -1.0]
    assert oa.LEGACY_CONSTRAINTS_ATTR == "constraints"  # what optuna-dashboard 0.21 reads


def test_queued_params_are_what_enqueue_trial_fixed(study: optuna.Study) -> None:
    study.enqueue_trial({"x": 3})
    queued = study.ask()
    assert oa.queued_params(queued) == {"x": 3}
    assert study.trials[0].system_attrs[oa.FIXED_PARAMS] == {"x": 3}
    study.tell(queued, 1.0)
    assert oa.queued_params(study.ask()) == {}  # sampled
    assert oa.queued_params(object()) == {}  # not a storage-backed trial


def test_retry_attr_names_are_the_ones_optunas_retry_callback_writes(study: optuna.Study) -> None:
    trial = study.ask()
    trial.suggest_float("x", 0, 1)
    study.tell(trial, state=TrialState.FAIL)
    # what make_storage installs
    optuna.storages.RetryHeartbeatStaleTrialCallback(max_retry=2)(study, study.trials[0])
    retry = study.trials[-1]
    assert retry.state == TrialState.WAITING and retry.params == study.trials[0].params
    assert retry.system_attrs[oa.FAILED_TRIAL] == 0
    assert retry.system_attrs[oa.RETRY_HISTORY] == [0]


def test_contains_follows_the_step_grid() -> None:
    assert oa.contains(FloatDistribution(0.0, 1.0), 0.5)
    assert not oa.contains(FloatDistribution(0.0, 1.0), 1.5)
    assert oa.contains(FloatDistribution(0.0, 1.0, step=0.25), 0.75)
    assert not oa.contains(FloatDistribution(0.0, 1.0, step=0.25), 0.3)
    assert oa.contains(IntDistribution(2, 10, step=2), 6)
    assert not oa.contains(IntDistribution(2, 10, step=2), 7)
    with pytest.raises(TypeError):
        oa.contains(CategoricalDistribution(["a"]), 0)


def test_rdb_engine_is_found_under_the_cache_layer(study: optuna.Study, rdb_study: optuna.Study) -> None:
    engine = oa.rdb_engine(oa.storage_of(rdb_study))
    assert engine is not None and engine.dialect.name == "sqlite"
    assert oa.rdb_engine(oa.storage_of(study)) is None


def test_heartbeat_interval(study: optuna.Study, rdb_study: optuna.Study) -> None:
    assert oa.heartbeat_interval(rdb_study) == 7
    assert oa.heartbeat_interval(study) is None


def test_a_registered_artifact_is_listed_as_upload_artifact_lists_it(study: optuna.Study, tmp_path: Path) -> None:
    from optuna.artifacts import FileSystemArtifactStore, download_artifact, get_all_artifact_meta

    store = FileSystemArtifactStore(str(tmp_path))
    trial = study.ask()
    oa.register_artifact(trial, "a1", "config.yaml", "text/plain", None)
    study.tell(trial, 1.0)
    (tmp_path / "a1").write_text("k: v\n")  # the bytes, stored after the trial finished
    [meta] = get_all_artifact_meta(study.trials[0], storage=oa.storage_of(study))
    assert (meta.artifact_id, meta.filename, meta.mimetype, meta.encoding) == ("a1", "config.yaml", "text/plain", None)
    download_artifact(artifact_store=store, artifact_id="a1", file_path=str(tmp_path / "out.yaml"))
    assert (tmp_path / "out.yaml").read_text() == "k: v\n"
    assert json.loads(study.trials[0].system_attrs["artifacts:a1"])["filename"] == "config.yaml"


@pytest.mark.parametrize("kind", ["rdb", "memory"])
def test_trial_attrs_set_together_read_back_as_set_one_by_one(
    kind: str, study: optuna.Study, rdb_study: optuna.Study
) -> None:
    import sqlalchemy

    on = rdb_study if kind == "rdb" else study
    trial = on.ask()
    commits: list[int] = []
    engine = getattr(oa.storage_of(on), "_backend", oa.storage_of(on)).__dict__.get("engine")
    if engine is not None:
        sqlalchemy.event.listen(engine, "commit", lambda conn: commits.append(1))
    key, listing = oa.artifact_attr("a1", "report.md", "text/plain", None)
    user = {"feasible": True, "duration_s": 1.25, "mlflow_run": None}
    system = {"record:metrics": {"NDCG@10": 0.5}, key: listing}
    oa.set_trial_attrs(trial, user=user, system=system)
    assert trial.user_attrs == user  # the running trial's own copy, as Trial.set_user_attr keeps it
    if engine is not None:
        assert len(commits) == 1  # one transaction for all of them
    oa.set_trial_attrs(trial, user={"duration_s": 2.0}, system={})  # an upsert: repeatable
    on.tell(trial, 1.0)
    frozen = on.trials[0]
    assert frozen.user_attrs == {**user, "duration_s": 2.0}
    assert {k: frozen.system_attrs[k] for k in system} == system
    [meta] = optuna.artifacts.get_all_artifact_meta(frozen, storage=oa.storage_of(on))
    assert (meta.artifact_id, meta.filename) == ("a1", "report.md")


def _many_attrs(on: optuna.Study) -> None:
    """More attributes than one multi-row upsert takes, set twice (the second time with
    other values, some new keys): every value reads back as the last one set."""
    trial = on.ask()
    user = {f"u{i}": i for i in range(450)}
    system = {f"record:s{i}": {"v": [i, None, "x"]} for i in range(230)}
    oa.set_trial_attrs(trial, user=user, system=system)
    again = {f"u{i}": -i for i in range(0, 460, 3)}
    oa.set_trial_attrs(trial, user=again, system={"record:s5": "five"})
    on.tell(trial, 1.0)
    [frozen] = [t for t in on.trials if t.number == trial.number]
    assert frozen.user_attrs == {**user, **again}
    assert {k: v for k, v in frozen.system_attrs.items() if k.startswith("record:")} == {**system, "record:s5": "five"}
    with pytest.raises(RuntimeError, match="finished"):  # Optuna's own check: a finished trial is frozen
        oa.set_trial_attrs(trial, user={"late": 1}, system={})


def test_many_trial_attrs_set_together_on_sqlite(rdb_study: optuna.Study) -> None:
    _many_attrs(rdb_study)


def test_many_trial_attrs_set_together_on_postgresql(request: pytest.FixtureRequest) -> None:
    url, name = request.getfixturevalue("pg_study")
    _many_attrs(optuna.load_study(study_name=name, storage=url))


def _draw(trial: optuna.Trial) -> dict[str, object]:
    return {
        "a": trial.suggest_float("a", 0.0, 1.0),
        "k": trial.suggest_int("k", 1, 60),
        "how": trial.suggest_categorical("how", ["rrf", "linear"]),
    }


def test_params_drawn_in_the_block_are_recorded_together_at_its_end(rdb_study: optuna.Study) -> None:
    import sqlalchemy

    storage = oa.storage_of(rdb_study)
    commits: list[int] = []
    sqlalchemy.event.listen(storage._backend.engine, "commit", lambda conn: commits.append(1))
    trial = rdb_study.ask()
    with oa.params_recorded_together(trial):
        drawn = _draw(trial)
        assert trial.params == drawn  # the running trial knows them
        assert storage._backend.get_trial(trial._trial_id).params == {}  # the database not yet
        assert _draw(trial) == drawn  # drawn once, as Optuna does
        commits.clear()
    assert trial.storage is storage and len(commits) == 1  # all three in one transaction
    rdb_study.tell(trial, 1.0)
    assert optuna.load_study(study_name="pinned-rdb", storage=storage._backend.url).trials[0].params == drawn


def test_a_seeded_sampler_draws_the_same_params_with_them_recorded_together(tmp_path: Path) -> None:
    runs = []
    for together in (False, True):
        storage = optuna.storages.RDBStorage(f"sqlite:///{tmp_path / f'{together}.db'}")
        s = optuna.create_study(storage=storage, sampler=optuna.samplers.TPESampler(seed=3, n_startup_trials=4))
        for _ in range(10):
            trial = s.ask()
            with oa.params_recorded_together(trial) if together else contextlib.nullcontext():
                drawn = _draw(trial)
            s.tell(trial, drawn["a"] * drawn["k"] + (drawn["how"] == "rrf"))
        runs.append([t.params for t in s.trials])
    assert runs[0] == runs[1]


def test_a_param_drawn_under_another_kind_still_raises_where_it_is_drawn(rdb_study: optuna.Study) -> None:
    first = rdb_study.ask()
    first.suggest_float("a", 0.0, 1.0)
    rdb_study.tell(first, 1.0)
    trial = rdb_study.ask()
    with pytest.raises(ValueError, match="different distribution kind"), oa.params_recorded_together(trial):
        trial.suggest_categorical("a", ["x", "y"])
    assert trial.storage is oa.storage_of(rdb_study)


def test_params_on_a_storage_without_the_cache_layer_are_recorded_as_optuna_does(study: optuna.Study) -> None:
    trial = study.ask()
    with oa.params_recorded_together(trial):
        drawn = _draw(trial)
        assert oa.storage_of(study).get_trial(trial._trial_id).params == drawn


PRIVATE = re.compile(
    r"\._(storage|study_id|trial_id|backend|contains|cached_trials)\b"
    r"|optuna\.[a-z_.]*\._[a-z]"
    r"|[\"'](fixed_params|failed_trial|retry_history)[\"']"
)


def test_no_other_module_uses_optunas_private_names() -> None:
    found = [
        f"{p.relative_to(REPO)}:{n}: {line.strip()}"
        for p in sorted((REPO / "tuner").rglob("*.py"))
        if p.name != "optuna_adapter.py"
        for n, line in enumerate(p.read_text().splitlines(), 1)
        if PRIVATE.search(line)
    ]
    assert found == []


def test_the_calls_safe_to_repeat_are_rdb_storage_methods_and_the_riding_storage_wraps_them() -> None:
    from tuner.optuna_adapter import RDB_CALLS_SAFE_TO_REPEAT
    from tuner.study.storage.database import riding_rdb_storage_class

    riding = riding_rdb_storage_class()
    missing = [n for n in RDB_CALLS_SAFE_TO_REPEAT if not callable(getattr(optuna.storages.RDBStorage, n, None))]
    assert missing == []
    assert all(getattr(riding, n) is not getattr(optuna.storages.RDBStorage, n) for n in RDB_CALLS_SAFE_TO_REPEAT)
    # the cache layer reads trials through _get_trials: the riding storage must be the one it wraps
    assert issubclass(riding, optuna.storages.RDBStorage)


def test_an_existing_schema_opens_without_alembic_and_still_answers_its_version(tmp_path: Path) -> None:
    import subprocess
    import sys

    from tuner.study.storage.database import rdb_storage

    url = f"sqlite:///{tmp_path / 'optuna.db'}"
    fresh = rdb_storage(url)  # Optuna's own construction: schema, version row, alembic stamp
    head = fresh.get_current_version()
    optuna.create_study(storage=fresh, study_name="s").optimize(lambda t: t.suggest_float("x", 0, 1), n_trials=2)
    opened = rdb_storage(url, existing=True)
    assert opened.get_current_version() == head and opened.get_head_version() == head  # asked: alembic answers
    assert len(optuna.load_study(study_name="s", storage=opened).trials) == 2
    assert rdb_storage(url)._version_manager.__class__.__name__ == "_VersionManager"  # put back after
    # what opening costs: no alembic import in a process that only reads the study
    code = ("import sys; from tuner.study.storage.database import rdb_storage; import optuna; "
            f"s = rdb_storage({url!r}, existing=True); optuna.load_study(study_name='s', storage=s).trials; "
            "print(sorted(m for m in sys.modules if m.startswith('alembic')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
