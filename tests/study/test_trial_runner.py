"""One trial against a real Optuna study (in-memory or SQLite) and a real config file."""

from __future__ import annotations

from pathlib import Path

import optuna
import pytest
from optuna.trial import TrialState

from study.fakes import (
    CONFIG_TEXT,
    FileBackend,
    FormulaEvaluator,
    TwoParamSpace,
    YamlWriter,
    oos_constraint,
    oos_rate,
    run_one,
    score,
)
from tuner.optuna_adapter import LEGACY_CONSTRAINTS_ATTR
from tuner.study.feasibility import best_feasible_trial
from tuner.study.stop import StopFlag
from tuner.study.storage.result_cache import ResultCache
from tuner.study.trial.attrs import (
    ATTR_METRICS,
    ATTR_REPORTS,
    assignment_of,
    metrics_of,
    named_constraints,
    record_key,
    reports_of,
)
from tuner.study.trial.bookkeeping import Bookkeeper, OptunaArtifacts
from tuner.study.trial.runner import compose_runner

OOS_LIMIT = 0.10

optuna.logging.set_verbosity(optuna.logging.WARNING)


def make_runner(tmp_path: Path, *, discrete: bool = False, crash_when=None, failed_queries_when=None, **kw):
    cfg = tmp_path / "config.yaml"
    cfg.write_text(CONFIG_TEXT)
    backend = FileBackend(cfg, crash_when=crash_when or (lambda c: None))
    evaluator = FormulaEvaluator(backend, failed_queries_when=failed_queries_when or (lambda c: 0))
    runner = compose_runner(
        study_name="s",
        space=TwoParamSpace(discrete),
        writer=YamlWriter(cfg),
        target=backend,
        wait_healthy=backend.wait_healthy,
        evaluator=evaluator,
        trials_dir=tmp_path / "trials",
        cache=ResultCache(tmp_path / "cache.sqlite"),
        **{"constraints": [oos_constraint(OOS_LIMIT)], **kw},
    )
    return runner, backend, evaluator, cfg


def test_complete_trial_patches_config_restarts_and_sets_constraint_both_ways(tmp_path: Path) -> None:
    runner, backend, evaluator, cfg = make_runner(tmp_path)
    study = optuna.create_study(direction="maximize")
    outcome, frozen = run_one(study, runner, {"x": 0.25, "k": 30})

    assert outcome.state == "COMPLETE"
    # The backend really loaded the patched values, and the comment survived the patch.
    assert backend.loaded["fusion"] == {"x": 0.25, "k": 30}
    assert "# a comment that must survive" in cfg.read_text()
    assert backend.restarts == 1 and evaluator.calls == 1
    assert frozen.value == pytest.approx(score(0.25, 30))
    expected_violation = oos_rate(0.25) - OOS_LIMIT
    assert frozen.system_attrs["constraints:OOS_FP_Rate"] == pytest.approx(expected_violation)
    assert frozen.system_attrs[LEGACY_CONSTRAINTS_ATTR] == [pytest.approx(expected_violation)]
    assert named_constraints(frozen.constraints) == {"OOS_FP_Rate": pytest.approx(expected_violation)}
    attrs = frozen.user_attrs
    assert assignment_of(frozen) == {"fusion.x": 0.25, "fusion.k": 30}
    assert attrs["cache_hit"] is False
    assert attrs["judged@10"] == 0.9 and attrs["failed_queries"] == 0
    assert metrics_of(frozen)["Primary_Metric_Score"] == pytest.approx(score(0.25, 30))
    # The JSON records are system attrs (hidden from the dashboard's table); the user
    # attrs keep scalars: the feasibility and the constraint metric's value.
    assert record_key(ATTR_METRICS) in frozen.system_attrs and ATTR_METRICS not in attrs
    assert ATTR_REPORTS not in attrs and "assignment" not in attrs
    assert attrs["feasible"] is True and attrs["OOS_FP_Rate"] == pytest.approx(oos_rate(0.25))
    assert all(not isinstance(v, (dict, list)) for v in attrs.values())
    # Every applied value is an Optuna param under its config key too.
    assert frozen.params == {"x": 0.25, "k": 30, "fusion.x": 0.25, "fusion.k": 30}
    assert reports_of(frozen)
    for path in reports_of(frozen).values():
        assert Path(path).is_file()
    # The config snapshot kept with the trial is the text the backend read.
    assert (tmp_path / "trials" / "0" / "config.yaml").read_text() == cfg.read_text()
    for phase in ("suggest", "render", "cache", "patch", "restart", "health", "evaluate", "search"):
        assert phase in outcome.phase_seconds
    # Bookkeeping (report files; the trial note, and MLflow when tracked), off the critical path.
    assert set(runner.recorder.background_seconds[0]) == {"report", "track"}
    assert not {"report", "track"} & set(outcome.phase_seconds)


def test_identical_config_reuses_the_stored_result_without_restart(tmp_path: Path) -> None:
    runner, backend, evaluator, _ = make_runner(tmp_path)
    study = optuna.create_study(direction="maximize")
    first, _ = run_one(study, runner, {"x": 0.7, "k": 50})
    second, frozen = run_one(study, runner, {"x": 0.7, "k": 50})

    assert second.cache_hit and not first.cache_hit
    assert (backend.restarts, evaluator.calls) == (1, 1)
    assert frozen.value == pytest.approx(score(0.7, 50))
    # Infeasible (0.14 > 0.10) on the cached path too: the constraint is set there as well.
    assert frozen.system_attrs["constraints:OOS_FP_Rate"] == pytest.approx(oos_rate(0.7) - OOS_LIMIT)
    assert frozen.system_attrs[LEGACY_CONSTRAINTS_ATTR] == [pytest.approx(oos_rate(0.7) - OOS_LIMIT)]
    assert frozen.user_attrs["cache_hit"] is True and frozen.user_attrs["cached_from_trial"] == 0
    assert best_feasible_trial(study.trials) is None


def test_cache_key_changes_with_labels(tmp_path: Path) -> None:
    runner, backend, evaluator, _ = make_runner(tmp_path)
    study = optuna.create_study(direction="maximize")
    run_one(study, runner, {"x": 0.2, "k": 40})
    evaluator.fingerprint_parts = ("dataset-hash", "labels-fp-2", "spec")
    outcome, _ = run_one(study, runner, {"x": 0.2, "k": 40})
    assert not outcome.cache_hit and evaluator.calls == 2


@pytest.mark.parametrize(
    ("crash_when", "failed_when", "reason_start"),
    [
        (lambda c: "exit code 1: bad config" if c["fusion"]["k"] == 60 else None, None, "BackendExited: backend exited"),
        (None, lambda c: 5 if c["fusion"]["k"] == 60 else 0, "FailureBudgetExceeded: 5 of 10"),
    ],
)
def test_failures_become_fail_trials_with_reason(tmp_path: Path, crash_when, failed_when, reason_start) -> None:
    runner, _, _, _ = make_runner(tmp_path, crash_when=crash_when, failed_queries_when=failed_when)
    study = optuna.create_study(direction="maximize")
    outcome, frozen = run_one(study, runner, {"x": 0.2, "k": 60})
    assert outcome.state == "FAIL" and frozen.state == TrialState.FAIL
    assert frozen.user_attrs["fail_reason"].startswith(reason_start)
    assert "\n" not in frozen.user_attrs["fail_reason"]


def test_health_timeout_fails_the_trial(tmp_path: Path) -> None:
    runner, _, _, cfg = make_runner(tmp_path)
    cfg.write_text(CONFIG_TEXT.replace("k: 20", "k: 20\n  slow: true"))
    runner.writer = runner.measurer.writer = YamlWriter(cfg)  # renders and writes the slow config
    study = optuna.create_study(direction="maximize")
    outcome, frozen = run_one(study, runner, {"x": 0.2, "k": 40})
    assert outcome.state == "FAIL"
    assert frozen.user_attrs["fail_reason"].startswith("HealthTimeout: backend not healthy after 1.0 s")


def test_a_crash_in_a_collaborator_fails_only_the_trial(tmp_path: Path) -> None:
    runner, _, evaluator, _ = make_runner(tmp_path)

    def boom(**_kw):
        raise ZeroDivisionError("division by zero")

    evaluator.evaluate = boom
    study = optuna.create_study(direction="maximize")
    outcome, frozen = run_one(study, runner, {"x": 0.2, "k": 40})
    assert outcome.state == "FAIL"
    assert frozen.user_attrs["fail_reason"] == "crash: ZeroDivisionError: division by zero"


def test_some_failed_queries_still_complete_with_constraint(tmp_path: Path) -> None:
    runner, _, _, _ = make_runner(tmp_path, failed_queries_when=lambda c: 2)
    study = optuna.create_study(direction="maximize")
    outcome, frozen = run_one(study, runner, {"x": 0.4, "k": 40})
    assert outcome.state == "COMPLETE"
    assert frozen.user_attrs["failed_queries"] == 2
    assert frozen.system_attrs["constraints:OOS_FP_Rate"] == pytest.approx(oos_rate(0.4) - OOS_LIMIT)


def test_stop_before_patch_fails_cleanly_as_interrupted(tmp_path: Path) -> None:
    stop = StopFlag()
    runner, backend, evaluator, cfg = make_runner(tmp_path, stop=stop)
    stop.set()
    study = optuna.create_study(direction="maximize")
    outcome, frozen = run_one(study, runner, {"x": 0.4, "k": 40})
    assert outcome.interrupted and frozen.state == TrialState.FAIL
    assert frozen.user_attrs["fail_reason"].startswith("interrupted")
    assert cfg.read_text() == CONFIG_TEXT and backend.restarts == 0 and evaluator.calls == 0


def test_config_and_report_uploaded_as_optuna_artifacts(tmp_path: Path) -> None:
    from optuna.artifacts import get_all_artifact_meta

    runner, _, _, cfg = make_runner(tmp_path, artifacts=OptunaArtifacts(tmp_path / "artifacts"),
                                    bookkeeper=Bookkeeper(threaded=True))
    storage = optuna.storages.InMemoryStorage()
    study = optuna.create_study(direction="maximize", storage=storage)
    run_one(study, runner, {"x": 0.4, "k": 40})
    run_one(study, runner, {"x": 0.4, "k": 40})  # cached: uploads too
    runner.flush()  # artifact bytes are written by the bookkeeper thread
    assert runner.bookkeeper.errors == []
    for frozen in study.trials:
        names = sorted(m.filename for m in get_all_artifact_meta(frozen, storage=storage))
        assert names == ["config.yaml", "per_query.csv", "report.json", "report.md"]
    stored = list((tmp_path / "artifacts").iterdir())
    assert len(stored) == 8
    assert any(p.read_text() == cfg.read_text() for p in stored)
    # One copy on disk: each artifact is a hard link to the trial's own file.
    assert all(p.stat().st_nlink >= 2 for p in stored)
