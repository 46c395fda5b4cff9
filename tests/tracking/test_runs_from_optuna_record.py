"""After a SIGKILL, the MLflow runs of trials Optuna had finished are completed from
Optuna's record, not failed (issue 27, item 3).

A real trial runner (the fake backend of tests/study/fakes.py) runs trials into a real
SQLite Optuna study and a real MLflow SQLite store, with a tracker that dies the way a
killed process does: its runs are created, but the bookkeeping after ``tell`` never
logs them (the record it would have logged is kept to compare with). A fresh tracker
(the next start) then closes them from the Optuna trials.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import optuna
import pytest
from mlflow import MlflowClient
from optuna.trial import TrialState
from study.fakes import CONFIG_TEXT, FileBackend, FormulaEvaluator, TwoParamSpace, YamlWriter, score

from tuner.report.mlflow_values import trial_run_name
from tuner.report.tracking import (
    INTERRUPTED,
    TAG_FAIL_REASON,
    TAG_NOTE,
    TAG_ROLE,
    TAG_STATE,
    TAG_STUDY,
    TAG_TRIAL,
    MlflowTracker,
    TrialRecord,
)
from tuner.study.feasibility import best_feasible_trial
from tuner.config.objective import Constraint
from tuner.study.trial.runner import TrialRunner, compose_runner
from tuner.study.trial.tracking_record import TAG_RECOVERED, OptunaRecords, close_killed_runs

optuna.logging.set_verbosity(optuna.logging.WARNING)
STUDY = "killed"
OOS_LIMIT = 0.10
CONSTRAINTS = [Constraint(metric="OOS_FP_Rate", op="<=", bound=OOS_LIMIT)]


class DiesBeforeLogging(MlflowTracker):
    """The tracker of a process killed after ``tell``: each trial's run is created (at its
    start, as the runner does), never logged or closed; ``records`` keeps what the
    bookkeeping would have logged. Trial numbers in ``no_run`` get no run: the store
    failed when it was to be created (the trial goes on without one)."""

    def __init__(self, *args: Any, no_run: set[int] = frozenset(), **kw: Any) -> None:  # type: ignore[assignment]
        super().__init__(*args, **kw)
        self.records: dict[int, TrialRecord] = {}
        self.no_run = no_run

    def start_trial(self, number: int, params: Any, *, start_time: int | None = None) -> str:
        if number in self.no_run:
            raise OSError("database is locked")
        return super().start_trial(number, params, start_time=start_time)

    def finish_trial(self, run_id: str | None, record: TrialRecord) -> None:
        self.records[record.number] = record


def pruned_when_x_above(limit: float) -> Any:
    def factory(trial: optuna.Trial) -> Any:
        def on_result(query_id: str, row: Any) -> None:
            if trial.params.get("x", 0.0) > limit:
                raise optuna.TrialPruned(f"pruned at {query_id}: below the median")
        return on_result
    return factory


def run_and_tell(study: optuna.Study, runner: TrialRunner, params: dict[str, Any]) -> None:
    study.enqueue_trial(params)
    trial = study.ask()
    out = runner.run(trial)
    if out.state == "COMPLETE":
        study.tell(trial, out.value)
    else:
        study.tell(trial, state=TrialState[out.state])


@pytest.fixture()
def killed(tmp_path: Path, tracking_uri: str) -> dict[str, Any]:
    """Trials 0 (before the study was tracked) .. 7 of a study whose run was killed:

    0 COMPLETE, untracked; 1 COMPLETE feasible (the best); 2 COMPLETE infeasible;
    3 PRUNED; 4 FAIL (its backend crashed); 5 COMPLETE with its trial folder lost;
    6 COMPLETE, its run never created; 7 RUNNING; and a RUNNING run of trial 99,
    which Optuna does not have."""
    cfg = tmp_path / "config.yaml"
    cfg.write_text(CONFIG_TEXT)
    backend = FileBackend(cfg, crash_when=lambda c: "exit 3" if c["fusion"]["k"] == 60 else None)
    storage = f"sqlite:///{tmp_path}/optuna.db"
    study = optuna.create_study(study_name=STUDY, storage=storage, direction="maximize")
    runner = compose_runner(
        study_name=STUDY, space=TwoParamSpace(), writer=YamlWriter(cfg), target=backend,
        wait_healthy=backend.wait_healthy, evaluator=FormulaEvaluator(backend), trials_dir=tmp_path / "trials",
        constraints=CONSTRAINTS, reporter_factory=pruned_when_x_above(0.9),
    )
    run_and_tell(study, runner, {"x": 0.3, "k": 40})  # 0: tracking off
    tracker = DiesBeforeLogging(tracking_uri, "fusion-tuner", no_run={6})
    parent = tracker.start_study(STUDY, params={"sampler": "tpe"}, tags={})
    runner.recorder.tracker = tracker
    for params in ({"x": 0.45, "k": 40}, {"x": 0.7, "k": 40}, {"x": 0.95, "k": 40}, {"x": 0.2, "k": 60},
                   {"x": 0.1, "k": 10}, {"x": 0.35, "k": 30}):
        run_and_tell(study, runner, params)
    for path in (tmp_path / "trials" / "5").iterdir():  # written by the bookkeeping the kill cut short
        path.unlink()
    running = study.ask()  # 7: being measured when the process was killed
    tracker.start_trial(running.number, {"fusion.x": 0.5, "fusion.k": 20})
    tracker.start_trial(99, {"fusion.x": 0.5, "fusion.k": 20})
    return {"tmp_path": tmp_path, "uri": tracking_uri, "storage": storage, "live": tracker.records,
            "parent": parent, "runner": runner}


def trial_runs(client: MlflowClient) -> dict[int, Any]:
    experiment = client.get_experiment_by_name("fusion-tuner")
    runs = client.search_runs([experiment.experiment_id],
                              f"tags.`{TAG_STUDY}` = '{STUDY}' and tags.`{TAG_ROLE}` = 'trial'")
    return {int(r.data.tags[TAG_TRIAL]): r for r in runs}


def restart(killed: dict[str, Any]) -> tuple[str | None, list[Any]]:
    """What the next start does: close the runs from the Optuna trials."""
    study = optuna.load_study(study_name=STUDY, storage=killed["storage"])
    note = close_killed_runs(MlflowTracker(killed["uri"], "fusion-tuner"), study,
                             trials_dirs=[killed["tmp_path"] / "trials"], config_names=["config.yaml"],
                             objective="Primary_Metric_Score", constraints=CONSTRAINTS)
    return note, study.get_trials()


def test_finished_trials_get_their_runs_completed_from_the_optuna_record(killed: dict[str, Any]) -> None:
    client = MlflowClient(killed["uri"])
    before = trial_runs(client)
    assert {n: r.info.status for n, r in before.items()} == {n: "RUNNING" for n in (1, 2, 3, 4, 5, 7, 99)}

    note, trials = restart(killed)
    states = {t.number: t.state.name for t in trials}
    assert states == {0: "COMPLETE", 1: "COMPLETE", 2: "COMPLETE", 3: "PRUNED", 4: "FAIL", 5: "COMPLETE",
                      6: "COMPLETE", 7: "RUNNING"}
    runs = trial_runs(client)
    status = {n: r.info.status for n, r in runs.items()}
    assert status == {1: "FINISHED", 2: "FINISHED", 3: "KILLED", 4: "FAILED", 5: "FINISHED", 6: "FINISHED",
                      7: "FAILED", 99: "FAILED"}
    assert note == ("MLflow runs left open by a killed run: trials [1, 2, 5] COMPLETE, [3] PRUNED, [4] FAIL completed "
                    "from the Optuna record; [7, 99] FAILED as interrupted (Optuna had not finished them); "
                    "trials [6] COMPLETE had no MLflow run: made from the Optuna record")

    # The study's best trial (the holdout's) is FINISHED with its objective, not FAILED.
    best = best_feasible_trial(trials)
    assert best is not None and best.number == 1
    by_number = {t.number: t for t in trials}
    for n in (1, 2, 5, 6):
        run, trial = runs[n], by_number[n]
        assert run.data.metrics["objective"] == pytest.approx(trial.value)
        assert run.data.metrics["Primary_Metric_Score"] == pytest.approx(trial.value)
        assert run.data.metrics["violation.OOS_FP_Rate"] == pytest.approx(trial.constraints["OOS_FP_Rate <= 0.1"])
        assert run.data.tags[TAG_STATE] == "COMPLETE" and run.data.tags[TAG_RECOVERED] == "optuna-record"
        feasible = n != 2
        assert run.data.tags["tuner.feasible"] == str(feasible).lower()
        assert run.data.metrics["feasible"] == float(feasible)
        assert run.info.run_name == trial_run_name(n, "COMPLETE", trial.value, feasible)
        assert run.data.params == {"fusion.x": str(trial.params["x"]), "fusion.k": str(trial.params["k"])}
        assert TAG_FAIL_REASON not in run.data.tags
    assert runs[1].data.metrics["objective"] == pytest.approx(score(0.45, 40))

    # Their files, when the killed process had written them: reports and the config snapshot.
    for n in (1, 2, 6):
        assert {a.path for a in client.list_artifacts(runs[n].info.run_id, "reports")} == {
            "reports/report.json", "reports/report.md", "reports/per_query.csv"}
        assert [a.path for a in client.list_artifacts(runs[n].info.run_id, "config")] == ["config/config.yaml"]
        assert "were lost" not in runs[n].data.tags[TAG_NOTE]
    lost = runs[5]
    assert client.list_artifacts(lost.info.run_id) == []
    assert ("Its report files (per_query.csv, report.json, report.md) and its config snapshot were lost with that "
            "process; the params and metrics here are Optuna's record.") in lost.data.tags[TAG_NOTE]

    # Pruned and failed trials keep Optuna's verdict and their own reasons.
    assert runs[3].data.tags[TAG_STATE] == "PRUNED"
    assert runs[3].data.tags[TAG_FAIL_REASON] == by_number[3].user_attrs["fail_reason"]
    assert by_number[4].user_attrs["fail_reason"].startswith("BackendExited")
    assert runs[4].data.tags[TAG_STATE] == "FAIL"
    assert runs[4].data.tags[TAG_FAIL_REASON] == by_number[4].user_attrs["fail_reason"]
    # What Optuna never finished fails as interrupted, as before.
    for n in (7, 99):
        assert runs[n].data.tags[TAG_STATE] == "FAIL" and runs[n].data.tags[TAG_FAIL_REASON] == INTERRUPTED

    # The run made for trial 6 is a child of the study's run and starts when the trial did.
    made = runs[6]
    assert made.data.tags["mlflow.parentRunId"] == killed["parent"]
    assert made.info.start_time == round(by_number[6].datetime_start.timestamp() * 1000)
    # Trial 0 ran before the study was tracked in this experiment: no run is made for it.
    assert 0 not in runs

    # Nothing is left to do at the start after.
    again, _ = restart(killed)
    assert again is None


def test_the_record_from_optuna_is_the_one_the_live_path_logs(killed: dict[str, Any]) -> None:
    trials = optuna.load_study(study_name=STUDY, storage=killed["storage"]).get_trials()
    records = OptunaRecords(trials, trials_dirs=[killed["tmp_path"] / "trials"], config_names=["config.yaml"],
                            objective="Primary_Metric_Score", constraints=CONSTRAINTS)
    assert list(records) == [0, 1, 2, 3, 4, 5, 6]  # the RUNNING trial is not finished
    # the run id each trial recorded: none for 0 (untracked) and 6 (the store refused its run)
    runs = trial_runs(MlflowClient(killed["uri"]))
    assert {n: records[n].run_id for n in records} == {n: runs[n].info.run_id if n in runs else None for n in records}
    assert records[0].run_id is None and records[6].run_id is None
    for n, live in killed["live"].items():
        recovered = records[n]
        same = ("number", "state", "params", "metrics", "fail_reason", "value", "feasible")
        assert {f: getattr(recovered, f) for f in same} == {f: getattr(live, f) for f in same}, n
        assert recovered.duration_s == pytest.approx(live.duration_s)
        assert {**recovered.tags, TAG_RECOVERED: None} == {**live.tags, TAG_RECOVERED: None}
        assert recovered.summary is not None and live.summary is not None
        assert recovered.summary.startswith(live.summary)
        if n == 5:  # its folder was lost
            assert recovered.config_texts == {} and recovered.reports == {}
        else:
            assert recovered.config_texts == live.config_texts
            assert recovered.reports == {k: p for k, p in live.reports.items() if p.is_file()} == live.reports


def test_a_workers_trial_finds_its_config_snapshot_in_its_replicas_folder(tmp_path: Path) -> None:
    """`tuner worker` keeps trial folders per replica (replicas/N/trials/<study>/<n>/),
    with the replica's copy of the config (config.replica-2.yaml)."""
    from optuna.distributions import FloatDistribution

    from tuner.study.trial.attrs import ATTR_ASSIGNMENT, ATTR_METRICS, record_key

    trial = optuna.trial.create_trial(
        state=TrialState.COMPLETE, value=0.5, params={"x": 0.5}, distributions={"x": FloatDistribution(0, 1)},
        user_attrs={"feasible": True, "cache_hit": False},
        system_attrs={record_key(ATTR_ASSIGNMENT): {"fusion.x": 0.5},
                      record_key(ATTR_METRICS): {"Primary_Metric_Score": 0.5}})
    trial.number = 3
    replicas = [tmp_path / "replicas" / str(n) / "trials" / STUDY for n in (1, 2)]
    (replicas[1] / "3").mkdir(parents=True)
    (replicas[1] / "3" / "config.replica-2.yaml").write_text("fusion:\n  x: 0.5\n")
    records = OptunaRecords([trial], trials_dirs=replicas, config_names=["config.yaml"],
                            objective="Primary_Metric_Score", constraints=[])
    record = records[3]
    assert record.config_texts == {"config/config.replica-2.yaml": "fusion:\n  x: 0.5\n"}
    assert (record.state, record.value, record.feasible) == ("COMPLETE", 0.5, True)
    assert dict(record.params) == {"fusion.x": 0.5}
    assert record.metrics == {"Primary_Metric_Score": 0.5, "objective": 0.5, "feasible": 1.0}
    assert "were lost" not in (record.summary or "")


def test_runs_an_older_tuner_failed_as_interrupted_are_completed_at_the_next_start(killed: dict[str, Any]) -> None:
    """The study of the issue: the tuner before this fix failed every run left open
    (trials 46-48 FAILED although Optuna had them COMPLETE); the next start repairs them."""
    client = MlflowClient(killed["uri"])
    MlflowTracker(killed["uri"], "fusion-tuner").close_stale_runs(STUDY, live_trials=set())  # no records: as before
    assert {n: r.info.status for n, r in trial_runs(client).items()} == {n: "FAILED" for n in (1, 2, 3, 4, 5, 7, 99)}

    note, trials = restart(killed)
    runs = trial_runs(client)
    assert {n: r.info.status for n, r in runs.items()} == {1: "FINISHED", 2: "FINISHED", 3: "KILLED", 4: "FAILED",
                                                           5: "FINISHED", 6: "FINISHED", 7: "FAILED", 99: "FAILED"}
    assert note == ("MLflow runs left open by a killed run: trials [1, 2, 5] COMPLETE, [3] PRUNED, [4] FAIL completed "
                    "from the Optuna record; trials [6] COMPLETE had no MLflow run: made from the Optuna record")
    best = best_feasible_trial(trials)
    assert best is not None and runs[best.number].data.metrics["objective"] == pytest.approx(best.value)
    assert runs[4].data.tags[TAG_FAIL_REASON].startswith("BackendExited")
    assert runs[7].data.tags[TAG_FAIL_REASON] == INTERRUPTED
    for n in (1, 2, 5, 6):
        assert runs[n].data.tags[TAG_STATE] == "COMPLETE" and TAG_FAIL_REASON not in runs[n].data.tags
