"""End to end: a two-objective study (secondary_objective: Latency_P95_ms, minimised)
against the reference backend run as a process on the demo data, over its rerank depth
(docs/backend.md: the backend's time grows with it). The front `tuner best --pareto`
prints, the report's and MLflow's pareto.csv are the feasible non-dominated trials,
computed here again from the values the study recorded; `tuner apply --trial N` deploys
a point of it."""

from __future__ import annotations

import csv
from pathlib import Path
from typing import Any

import optuna
import pytest
from mlflow import MlflowClient
from ruamel.yaml import YAML
from support.demo_data import copy_demo_subset
from support.reference_experiment import DROP, REPO, copy_backend_config, write_reference_experiment

from tuner.config.configpatch import get_path
from tuner.config.experiment import load_experiment
from tuner.ops.run import run_experiment
from tuner.report.tracking import TAG_ROLE
from tuner.study.feasibility import is_feasible
from tuner.study.trial.attrs import assignment_of, metrics_of

pytestmark = [pytest.mark.slow, pytest.mark.integration]
optuna.logging.set_verbosity(optuna.logging.WARNING)

N_IN_SCOPE = 60  # with every OOS query: about a second a trial
N_TRIALS = 8
PARETO_SPACE = REPO / "search_space" / "reference_pareto.yaml"


@pytest.fixture(scope="module")
def study_run(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    root = tmp_path_factory.mktemp("pareto")
    data = copy_demo_subset(root / "data", N_IN_SCOPE)
    assert (data / "corpus.jsonl").is_file()
    copy_backend_config(root)
    path = write_reference_experiment(
        root,
        study="pareto",
        n_trials=N_TRIALS,
        project_root=".",
        state_dir=".tuner",
        sampler={"type": "tpe", "seed": 5, "multivariate": True, "n_startup_trials": 6},
        timeout_s=600,
        secondary_objective={"metric": "Latency_P95_ms", "direction": "minimize"},
        constraints=["OOS_FP_Rate <= 0.10"],
        evaluation={"request": {"body": DROP}, "top_k": 50, "concurrency": 1},
        search_space=PARETO_SPACE,
        validation="cv",
        tracking={"enabled": True},
    )
    exp = load_experiment(path).bind_port()
    summary = run_experiment(exp)
    study = optuna.load_study(study_name="pareto", storage=exp.storage)
    return {"root": root, "path": path, "exp": exp, "summary": summary, "study": study}


def _front(trials: list[Any]) -> set[int]:
    """The oracle: feasible COMPLETE trials with finite values no other such trial beats
    on both (quality up, latency down), written without tuner.study.pareto."""
    points = {
        t.number: (t.values[0], t.values[1])
        for t in trials
        if t.state.name == "COMPLETE" and is_feasible(t) and all(abs(v) < float("inf") for v in t.values)
    }

    def beaten(q: float, ms: float) -> bool:
        return any((q2 >= q and ms2 <= ms) and (q2 > q or ms2 < ms) for q2, ms2 in points.values())

    return {n for n, (q, ms) in points.items() if not beaten(q, ms)}


def _cli(*args: str) -> Any:
    from typer.testing import CliRunner

    from tuner.cli import app

    return CliRunner().invoke(app, list(args), env={"COLUMNS": "200"})


def test_every_trial_records_quality_and_its_measured_latency(study_run: dict[str, Any]) -> None:
    study = study_run["study"]
    assert [d.name for d in study.directions] == ["MAXIMIZE", "MINIMIZE"]
    assert study.metric_names == ["Primary_Metric_Score", "Latency_P95_ms"]
    trials = study.get_trials()
    assert len(trials) == N_TRIALS and all(t.state.name == "COMPLETE" for t in trials)
    for t in trials:
        metrics = metrics_of(t)
        assert t.values == [metrics["Primary_Metric_Score"], metrics["Latency_P95_ms"]]
        assert metrics["Latency_P95_ms"] > 0
    assert len({assignment_of(t)["rerank.depth"] for t in trials}) > 2  # the depth was searched


def test_best_pareto_prints_the_feasible_non_dominated_trials(study_run: dict[str, Any]) -> None:
    trials = study_run["study"].get_trials()
    expected = _front(trials)
    assert expected
    out = _cli("best", str(study_run["path"]), "--pareto")
    assert out.exit_code == 0, out.output
    points = [line for line in out.stdout.splitlines() if line.startswith("#")]
    printed = [int(line.split()[0].removeprefix("#")) for line in points]
    assert set(printed) == expected and len(printed) == len(expected)
    by_number = {t.number: t for t in trials}
    quality = [by_number[n].values[0] for n in printed]
    assert quality == sorted(quality, reverse=True)  # best quality first, marked so
    assert points[0].endswith("quality-best") or "quality-best" in points[0]
    assert sum("quality-best" in line for line in points) == 1
    assert f"tuner apply {study_run['path']} --trial N" in out.stdout.replace("\n", "")


def test_the_report_and_the_mlflow_parent_run_hold_the_same_front(study_run: dict[str, Any], tmp_path: Path) -> None:
    expected = _front(study_run["study"].get_trials())
    out = _cli("report", str(study_run["path"]), "--out", str(tmp_path / "rep"))
    assert out.exit_code == 0, out.output
    markdown = (tmp_path / "rep" / "report.md").read_text()
    assert "## Pareto front (quality against Latency_P95_ms)" in markdown
    with (tmp_path / "rep" / "pareto.csv").open() as fh:
        assert {int(row["trial"]) for row in csv.DictReader(fh)} == expected
    exp = study_run["exp"]
    client = MlflowClient(exp.tracking.mlflow_uri)
    [parent] = client.search_runs(
        [client.get_experiment_by_name("pareto").experiment_id], f"tags.`{TAG_ROLE}` = 'study'"
    )
    assert "study/pareto.csv" in {a.path for a in client.list_artifacts(parent.info.run_id, "study")}
    local = Path(client.download_artifacts(parent.info.run_id, "study/pareto.csv", str(tmp_path)))
    with local.open() as fh:
        assert {int(row["trial"]) for row in csv.DictReader(fh)} == expected


def test_apply_deploys_a_point_of_the_front(study_run: dict[str, Any]) -> None:
    trials = {t.number: t for t in study_run["study"].get_trials()}
    front = _front(list(trials.values()))
    # the fastest point that is not the baseline (the baseline's values are the config already)
    moved = [n for n in front if trials[n].user_attrs.get("variant") != "baseline"]
    assert moved, f"the front is the baseline alone: {front}"
    fastest = min(moved, key=lambda n: trials[n].values[1])
    out = _cli("apply", str(study_run["path"]), "--trial", str(fastest), "--dry-run")
    assert out.exit_code == 0, out.output
    assert "--dry-run: nothing written" in out.stdout
    out = _cli("apply", str(study_run["path"]), "--trial", str(fastest))
    assert out.exit_code == 0, out.output
    written = YAML(typ="safe").load((study_run["root"] / "backend" / "config.yaml").read_text())
    assert get_path(written, "rerank.depth") == assignment_of(trials[fastest])["rerank.depth"]
