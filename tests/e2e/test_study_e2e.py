"""End to end: real studies against the reference backend run as a process on the demo data.

One module-scoped study (baseline + the four shortlist variants) is shared by the
checks; the SIGTERM test runs `tuner run` as a subprocess and signals it mid-study.
Everything lives in tmp dirs; the repository is only read (backend/config.yaml, the
search spaces, the shortlist).
"""

from __future__ import annotations

import json
import math
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import optuna
import pytest
from mlflow import MlflowClient
from optuna.trial import TrialState
from support.demo_data import copy_demo_subset
from support.reference_experiment import (
    DROP,
    FULL_SPACE,
    SHORTLIST,
    copy_backend_config,
    deep_merge,
    write_reference_experiment,
)

from tuner.config.configpatch import get_path
from tuner.config.experiment import load_experiment
from tuner.ops.apply import apply_plan, plan_apply
from tuner.ops.run import run_experiment
from tuner.report.tracking import TAG_ROLE, TAG_STUDY, TAG_TRIAL
from tuner.study.feasibility import best_feasible_trial
from tuner.study.loop import StudyObserver
from tuner.study.trial.attrs import assignment_of, metrics_of, reports_of

# The low ends of the post-retrieval ranges in search_space/reference_full.yaml.
GATE_LOW = {"confidence.threshold": 0.0, "citation.min_score": 0.0}
SOLVE_TOLERANCE = 0.01
PYTHON = sys.executable
N_IN_SCOPE = 100  # a subset keeps a trial around a second; every OOS query is kept

pytestmark = [pytest.mark.slow, pytest.mark.integration]
optuna.logging.set_verbosity(optuna.logging.WARNING)


# What the e2e studies run on top of the shared reference experiment: the full space
# (retrieval and post-retrieval gates) with the shortlist queued after the baseline.
E2E_EXPERIMENT: dict[str, Any] = {
    "project_root": ".",
    "state_dir": ".tuner",
    "sampler": {"type": "tpe", "seed": 3, "multivariate": True, "n_startup_trials": 4},
    "timeout_s": 600,
    "constraints": ["OOS_FP_Rate <= 0.10"],
    "failure_budget": {"max_consecutive": 3, "max_total": 5},
    "target": {"health": {"deadline_s": 60}},
    "evaluation": {"request": {"body": DROP}, "top_k": 50, "concurrency": 4},
    "search_space": FULL_SPACE,
    "shortlist": SHORTLIST,
    "tracking": {"enabled": True},
}


def make_project(root: Path, data: Path, *, study: str, n_trials: int, **overrides: Any) -> Path:
    """A project folder with its own backend config copy, experiment file and state;
    ``overrides`` are deep-merged over E2E_EXPERIMENT."""
    (root / "data").mkdir(parents=True)
    for name in ("queries.jsonl", "qrels.txt", "corpus.jsonl"):
        (root / "data" / name).write_bytes((data / name).read_bytes())
    copy_backend_config(root)
    return write_reference_experiment(root, study=study, n_trials=n_trials, **deep_merge(E2E_EXPERIMENT, overrides))


@pytest.fixture(scope="module")
def demo_data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The generated demo data, with the query set cut to N_IN_SCOPE in-scope queries."""
    return copy_demo_subset(tmp_path_factory.mktemp("demo-full") / "data", N_IN_SCOPE)


class AdminConfigProbe(StudyObserver):
    """Reads GET /admin/config when a trial starts evaluating: what the backend runs on."""

    def __init__(self, base_url: str) -> None:
        self.base_url = base_url
        self.seen: dict[int, dict[str, Any]] = {}

    def phase(self, number: int, phase: str) -> None:
        if phase == "evaluate":
            self.seen[number] = httpx.get(f"{self.base_url}/admin/config", timeout=10).json()


@pytest.fixture(scope="module")
def study_run(demo_data: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    root = tmp_path_factory.mktemp("project")
    exp_path = make_project(root, demo_data, study="e2e", n_trials=5)
    config = root / "backend" / "config.yaml"
    original = config.read_bytes()
    exp = load_experiment(exp_path).bind_port()
    probe = AdminConfigProbe(exp.target.health.url.removesuffix("/health"))
    summary = run_experiment(exp, observer=probe)
    study = optuna.load_study(study_name="e2e", storage=exp.storage)
    return {"root": root, "exp": exp, "exp_path": exp_path, "config": config, "original": original,
            "probe": probe, "summary": summary, "study": study}


def _same(config_value: Any, wanted: Any) -> bool:
    if isinstance(wanted, dict):
        return all(_same(config_value[k], v) for k, v in wanted.items())
    if isinstance(wanted, list):
        return len(config_value) == len(wanted) and all(_same(a, b) for a, b in zip(config_value, wanted))
    if isinstance(wanted, float) or isinstance(config_value, float):
        return math.isclose(float(config_value), float(wanted), rel_tol=1e-9, abs_tol=1e-9)
    return config_value == wanted


def test_every_trial_config_took_effect_in_the_backend(study_run: dict[str, Any]) -> None:
    trials = study_run["study"].get_trials()
    assert len(trials) == 5 and {t.state for t in trials} <= {TrialState.COMPLETE, TrialState.PRUNED}
    assert [t.user_attrs["variant"] for t in trials][:2] == ["baseline", "rrf-k20-bm25-heavy"]
    seen = study_run["probe"].seen
    assert sorted(seen) == [0, 1, 2, 3, 4]
    solved_trials = set()
    for t in trials:
        assignment = assignment_of(t)
        for path, wanted in assignment.items():
            if (solved := metrics_of(t).get(f"solved.{path}")) is not None:
                # A solved gate: the retrieval ran at the low end of its range, the trial
                # records the value the solver picked.
                solved_trials.add(t.number)
                assert wanted == solved and _same(get_path(seen[t.number], path), GATE_LOW[path]), (t.number, path)
            else:
                assert _same(get_path(seen[t.number], path), wanted), (t.number, path, wanted)
    # The baseline and the strict-gate variant were queued with their gate values (measured
    # as given); the three fusion-only variants leave the gates to the solver.
    assert solved_trials == {1, 2, 3}
    # Trial 1 really changed the backend (not only the file): RRF k 20 instead of 60.
    assert seen[0]["fusion"]["rrf_k"] == 60 and seen[1]["fusion"]["rrf_k"] == 20


def test_original_config_is_back_byte_for_byte(study_run: dict[str, Any]) -> None:
    assert study_run["config"].read_bytes() == study_run["original"]
    assert not study_run["exp"].journal_path.exists()


def test_best_trial_is_feasible_and_constraints_are_recorded_both_ways(study_run: dict[str, Any]) -> None:
    trials = study_run["study"].get_trials()
    best = best_feasible_trial(trials)
    assert best is not None and study_run["summary"].best.number == best.number
    complete = [t for t in trials if t.state == TrialState.COMPLETE]
    for t in complete:
        rate = metrics_of(t)["OOS_FP_Rate"]
        assert t.system_attrs["constraints:OOS_FP_Rate <= 0.1"] == pytest.approx(rate - 0.10)
        assert t.system_attrs["constraints"] == [pytest.approx(rate - 0.10)]
    # The space solves citation.min_score, which can empty a result list after the fact,
    # so the per-query OOS early stop is off (it could stop a trial a higher minimum
    # makes feasible): nothing is pruned, and the dense-heavy variant that answers most
    # OOS queries at the retrieval's gates is made feasible by its solved threshold.
    assert not [t for t in trials if t.state == TrialState.PRUNED]
    dense = next(t for t in trials if t.user_attrs["variant"] == "rrf-k60-dense-heavy")
    assert dense.state == TrialState.COMPLETE and "solved.confidence.threshold" in metrics_of(dense)
    assert metrics_of(best)["OOS_FP_Rate"] <= 0.10
    feasible_values = [t.value for t in complete if metrics_of(t)["OOS_FP_Rate"] <= 0.10]
    assert best.value == max(feasible_values)
    # Full report files for the baseline and the best feasible trial, slim ones for the others.
    details = {t.number: json.loads(Path(reports_of(t)["json"]).read_text())["detail"] for t in complete}
    assert details == {t.number: "full" if t.number in (0, best.number) else "slim" for t in complete}
    # A PR-curve PNG for the trials drawn full: the baseline and each trial that was the best feasible one
    # when it ran (a superseded best keeps its curve, referenced by its slim report); none for the others.
    drawn, running = {0}, None
    for t in sorted(complete, key=lambda t: t.number):
        if metrics_of(t)["OOS_FP_Rate"] <= 0.10 and (running is None or t.value > running):
            drawn.add(t.number)
            running = t.value
    assert len(drawn) >= 2 and len(drawn) < len(complete)
    for t in complete:
        png = reports_of(t).get("pr_curve_png")
        listed = json.loads(Path(reports_of(t)["json"]).read_text())["files"]["pr_curve_png"]
        if t.number in drawn:
            assert png is not None and Path(png).read_bytes().startswith(b"\x89PNG") and listed == Path(png).name
        else:
            assert png is None and listed is None
            assert not (Path(reports_of(t)["json"]).parent / "report_pr_curve.png").exists()


def test_solved_trials_score_the_best_feasible_row_of_their_threshold_sweep(study_run: dict[str, Any]) -> None:
    import numpy as np
    import pandas as pd

    exp, study = study_run["exp"], study_run["study"]
    n_t, n_m = 91, 51  # the grids of [0, 0.9] and [0, 0.5] at step 0.01
    solved = [t for t in study.get_trials(states=(TrialState.COMPLETE,))
              if "solved.confidence.threshold" in metrics_of(t)]
    assert solved
    for t in solved:
        sweep = pd.read_csv(exp.state_dir / "trials" / "e2e" / str(t.number) / "threshold_sweep.csv")
        assert reports_of(t)["threshold_sweep_csv"].endswith("threshold_sweep.csv")
        # Slim (tracking.report_detail is not full): each value of one gate with its best row, and
        # the cross through the solution; 10 significant digits.
        assert max(n_t, n_m) <= len(sweep) < n_t + n_m
        assert int(sweep["chosen"].sum()) == 1
        tol = 1e-9
        assert np.isclose(sweep["confidence.threshold"].max(), 0.9)
        feasible = sweep[sweep["OOS_FP_Rate"] <= 0.10]
        assert len(feasible), t.number
        assert t.value == pytest.approx(feasible["Primary_Metric_Score"].max(), abs=tol)
        a = assignment_of(t)
        row = sweep[np.isclose(sweep["confidence.threshold"], a["confidence.threshold"])
                    & np.isclose(sweep["citation.min_score"], a["citation.min_score"])]
        assert len(row) == 1 and row["Primary_Metric_Score"].iloc[0] == pytest.approx(t.value, abs=tol)
        assert row["OOS_FP_Rate"].iloc[0] == pytest.approx(metrics_of(t)["OOS_FP_Rate"], abs=tol)
        assert bool(row["chosen"].iloc[0])
        # The snapshot of the trial's config holds the solved values (what `tuner apply` writes).
        written = (exp.state_dir / "trials" / "e2e" / str(t.number) / "config.yaml").read_text()
        from ruamel.yaml import YAML

        doc = YAML(typ="safe").load(written)
        assert _same(get_path(doc, "confidence.threshold"), a["confidence.threshold"])


def test_mlflow_holds_parent_and_child_runs_with_artifacts(study_run: dict[str, Any], tmp_path: Path) -> None:
    exp = study_run["exp"]
    client = MlflowClient(exp.tracking.mlflow_uri)
    experiment = client.get_experiment_by_name("e2e")
    assert Path(experiment.artifact_location.removeprefix("file://")) == study_run["root"] / "mlruns" / "e2e"
    parents = client.search_runs([experiment.experiment_id], f"tags.`{TAG_ROLE}` = 'study'")
    assert len(parents) == 1 and parents[0].data.tags[TAG_STUDY] == "e2e"
    children = client.search_runs([experiment.experiment_id], f"tags.mlflow.parentRunId = '{parents[0].info.run_id}'")
    by_trial = {int(r.data.tags[TAG_TRIAL]): r for r in children}
    trials = study_run["study"].get_trials()
    assert sorted(by_trial) == [t.number for t in trials]
    for t in trials:
        run = by_trial[t.number]
        assert run.info.run_id == t.user_attrs["mlflow_run_id"]
        if t.state == TrialState.PRUNED:
            assert run.info.status == "KILLED" and run.data.tags["tuner.state"] == "PRUNED"
            continue
        assert run.data.metrics["Primary_Metric_Score"] == pytest.approx(t.value)
        reports = {a.path for a in client.list_artifacts(run.info.run_id, "reports")}
        assert {"reports/report.json", "reports/report.md", "reports/report_per_query.csv"} <= reports
        local = client.download_artifacts(run.info.run_id, "config/config.yaml", str(tmp_path / str(t.number)))
        written = exp.state_dir / "trials" / "e2e" / str(t.number) / "config.yaml"
        assert Path(local).read_bytes() == written.read_bytes()


def test_optuna_artifacts_are_listed_for_the_dashboard(study_run: dict[str, Any]) -> None:
    from optuna.artifacts import get_all_artifact_meta

    study = study_run["study"]
    artifact_dir = Path(study.user_attrs["tuner.artifact_dir"])
    for t in study.get_trials(states=(TrialState.COMPLETE,)):
        metas = get_all_artifact_meta(t, storage=study._storage)
        solved = "solved.confidence.threshold" in metrics_of(t)
        # the config snapshot and every report file of the trial
        expected = ["config.yaml"] + [Path(p).name for p in reports_of(t).values()]
        assert sorted(m.filename for m in metas) == sorted(expected)
        assert {"config.yaml", "report.json", "report.md", "report_per_query.csv"} <= set(expected)
        assert ("threshold_sweep.csv" in expected) == solved
        for m in metas:
            assert (artifact_dir / m.artifact_id).is_file()


def test_best_report_and_apply_commands(study_run: dict[str, Any], tmp_path: Path) -> None:
    exp_path, config = study_run["exp_path"], study_run["config"]
    best = study_run["summary"].best
    out = _cli("best", str(exp_path), "--top", "3")
    assert out.exit_code == 0, out.output
    listed = [int(m.group(1)) for line in out.stdout.splitlines() if (m := re.match(r"^│\s+#(\d+) │", line))]
    # the baseline first, then the feasible trials, best first
    baseline = study_run["summary"].baseline.number
    assert listed and listed[0] == baseline
    assert best.number == baseline or next(n for n in listed if n != baseline) == best.number

    out = _cli("report", str(exp_path), "--out", str(tmp_path / "rep"))
    assert out.exit_code == 0, out.output
    frame_csv = (tmp_path / "rep" / "trials.csv").read_text().splitlines()
    assert len(frame_csv) == 1 + 5
    for png in ("optimization_history.png", "param_importances.png", "score_vs_oos_fp_rate.png"):
        assert (tmp_path / "rep" / png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

    out = _cli("apply", str(exp_path), "--dry-run")
    assert out.exit_code == 0, out.output
    assert f"trial #{best.number}" in out.stdout and "+++ b/" in out.stdout
    assert config.read_bytes() == study_run["original"]


def test_every_trial_records_its_per_query_scores_and_best_shows_the_cross_validated_estimate(
    study_run: dict[str, Any],
) -> None:
    """The compact per-query record reproduces each trial's value and OOS rate, and `tuner
    best` prints the cross-validated estimate computed from those records."""
    from tuner.study.query_scores import ATTR_PER_QUERY, study_crossval
    from tuner.study.trial.attrs import trial_attr

    exp, study = study_run["exp"], study_run["study"]
    measured = [t for t in study.get_trials(states=(TrialState.COMPLETE,)) if not t.user_attrs.get("cache_hit")]
    assert measured
    for t in measured:
        record = trial_attr(t, ATTR_PER_QUERY)
        assert len(record["objective"]) == N_IN_SCOPE
        assert sum(record["objective"]) / N_IN_SCOPE == pytest.approx(t.value, abs=1e-5)
        answered = record["oos_answered"]
        assert answered.count("1") / len(answered) == pytest.approx(metrics_of(t)["OOS_FP_Rate"], abs=1e-12)
    cv = study_crossval(study, exp.objective, exp.constraints, exp.cv)
    assert cv is not None and cv.n_queries == N_IN_SCOPE and cv.folds == 5
    best = study_run["summary"].best
    assert cv.in_sample == pytest.approx(best.value, abs=1e-5) and cv.in_sample_label == f"#{best.number}"
    assert study_run["summary"].crossval is not None  # the run summary has it too
    client = MlflowClient(exp.tracking.mlflow_uri)
    experiment = client.get_experiment_by_name("e2e")
    parent = client.search_runs([experiment.experiment_id], f"tags.`{TAG_ROLE}` = 'study'")[0]
    assert parent.data.metrics["cv_score"] == pytest.approx(cv.cv_score)
    assert parent.data.metrics["cv_optimism"] == pytest.approx(cv.optimism)
    assert parent.data.tags["tuner.cv_verdict"] == cv.verdict
    assert "Cross-validated: " in parent.data.tags["mlflow.note.content"]

    out = _cli("best", str(study_run["exp_path"]))
    assert out.exit_code == 0, out.output
    text = " ".join(out.stdout.split())
    assert "cross-validated" in text and f"{cv.cv_score:.4f} cross-validated (5 folds, {N_IN_SCOPE} queries)" in text
    assert f"gain over the baseline {cv.gain:+.4f}" in text and f"optimism {cv.optimism:+.4f}" in text
    assert cv.verdict in text.lower()


def test_a_30_query_study_says_when_the_gain_is_not_established(tmp_path: Path) -> None:
    """30 in-scope queries and a space of nothing but the RRF constant near the baseline's 60
    (small effects, mostly noise): the cross-validated gain's interval holds 0, and the run
    summary and `tuner best` say plainly there is no evidence of a gain on new queries."""
    space = tmp_path / "rrf_k_only.yaml"
    space.write_text("params:\n  fusion.rrf_k: {type: int, low: 40, high: 90}\n")
    data = copy_demo_subset(tmp_path / "data30", 30)
    exp_path = make_project(
        tmp_path / "p", data, study="cv30", n_trials=8, search_space=str(space), shortlist=DROP, constraints=[]
    )
    exp = load_experiment(exp_path).bind_port()
    summary = run_experiment(exp)
    assert summary.error is None
    cv = summary.crossval
    assert cv is not None and cv.n_queries == 30 and cv.ci_low is not None and cv.ci_high is not None
    assert cv.ci_low <= 0.0 <= cv.ci_high, cv.summary_line()
    out = _cli("best", str(exp_path))
    assert out.exit_code == 0, out.output
    assert "no evidence the winner beats the baseline on new queries" in " ".join(out.stdout.split()).lower()


def test_apply_keeps_a_reproduced_trial_and_rolls_back_otherwise(study_run: dict[str, Any]) -> None:
    exp, config, original = study_run["exp"], study_run["config"], study_run["original"]
    best = study_run["summary"].best
    try:
        plan = plan_apply(exp)
        assert plan.trial_number == best.number and plan.feasible
        expected_text = plan.texts[config]
        wrong = plan_apply(exp)
        wrong.expected += 0.5  # the re-measured score cannot match: must roll back
        result = apply_plan(wrong, tolerance=0.01)
        assert result.rolled_back and not result.applied
        assert "tolerance 0.01" in result.message and "rolled back" in result.message
        assert config.read_bytes() == original and not exp.journal_path.exists()

        result = apply_plan(plan, tolerance=1e-9)  # deterministic backend: same score again
        assert result.applied, result.message
        assert result.measured == pytest.approx(best.value, abs=1e-9)
        assert config.read_text() == expected_text and not exp.journal_path.exists()
        assert all(p.read_bytes() == original for p in result.backups)
    finally:
        config.write_bytes(original)


def test_apply_of_a_solved_trial_writes_the_solved_gates_and_reproduces_its_score(study_run: dict[str, Any]) -> None:
    exp, config, original = study_run["exp"], study_run["config"], study_run["original"]
    solved = [t for t in study_run["study"].get_trials(states=(TrialState.COMPLETE,))
              if "solved.confidence.threshold" in metrics_of(t)]
    trial = max(solved, key=lambda t: t.value)
    try:
        plan = plan_apply(exp, trial_number=trial.number)
        from ruamel.yaml import YAML

        doc = YAML(typ="safe").load(plan.texts[config])
        for path in GATE_LOW:
            assert _same(get_path(doc, path), assignment_of(trial)[path]), path
        # The solver models the backend's gates exactly but for the fallback window of an
        # emptied list and top_m over filtered hits (tuner.study.gates.threshold); SOLVE_TOLERANCE bounds both here.
        result = apply_plan(plan, tolerance=SOLVE_TOLERANCE)
        assert result.applied, result.message
        assert result.measured == pytest.approx(trial.value, abs=SOLVE_TOLERANCE)
    finally:
        config.write_bytes(original)


def _cli(*args: str) -> Any:
    """The CLI in-process (CliRunner): same commands, no interpreter start-up."""
    from typer.testing import CliRunner

    from tuner.cli import app

    return CliRunner().invoke(app, list(args), env={"COLUMNS": "200"})


def _tuner(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run([PYTHON, "-m", "tuner", *args], capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, "COLUMNS": "200"})


def test_sigterm_mid_study_restores_config_and_the_study_resumes(demo_data: Path, tmp_path: Path) -> None:
    exp_path = make_project(tmp_path, demo_data, study="sig", n_trials=8)
    config = tmp_path / "backend" / "config.yaml"
    original = config.read_bytes()
    exp = load_experiment(exp_path)
    proc = subprocess.Popen([PYTHON, "-m", "tuner", "run", str(exp_path)], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, env={**os.environ, "COLUMNS": "200"})
    try:
        deadline = time.monotonic() + 120
        # Wait until trial 1 patched the config (mid-study: a trial's config is live).
        while config.read_bytes() == original or not exp.journal_path.exists():
            assert proc.poll() is None, proc.stdout.read() if proc.stdout else ""
            assert time.monotonic() < deadline, "the study never patched the config"
            time.sleep(0.05)
        proc.send_signal(signal.SIGTERM)
        output, _ = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 143, output
    assert "SIGTERM" in output and "original config restored" in output
    assert config.read_bytes() == original
    assert not exp.journal_path.exists()
    study = optuna.load_study(study_name="sig", storage=exp.storage)
    first = study.get_trials()
    assert not [t for t in first if t.state == TrialState.RUNNING]
    done_before = max(t.number for t in first if t.state.is_finished())

    again = _tuner("run", str(exp_path), "--n-trials", "1", timeout=180)
    assert again.returncode == 0, again.stdout + again.stderr
    numbers = [t.number for t in study.get_trials() if t.state.is_finished()]
    assert max(numbers) > done_before and len(set(numbers)) == len(numbers)
    # The queued baseline / shortlist were not queued a second time.
    variants = [t.user_attrs.get("variant") for t in study.get_trials() if t.user_attrs.get("variant")]
    assert variants.count("baseline") == 1
    assert config.read_bytes() == original


@pytest.mark.parametrize(
    ("overrides", "expected"),
    [
        ({"evaluation": {"concurrency": DROP, "concurency": 4}},
         "evaluation.concurency: unknown key (did you mean concurrency?)"),
        ({"n_trials": -3}, "n_trials: Input should be greater than 0"),
        ({"objective": {"direction": "minimize"}},
         "objective.direction: minimize, but post_retrieval gates (citation.min_score, confidence.threshold)"),
    ],
)
def test_bad_experiment_files_are_refused_with_one_line(demo_data: Path, tmp_path: Path, overrides, expected) -> None:
    exp_path = make_project(tmp_path, demo_data, study="bad", **{"n_trials": 8, **overrides})
    out = _tuner("run", str(exp_path))
    assert out.returncode == 2
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and expected in lines[0], out.stderr
    assert not (tmp_path / ".tuner" / "optuna.db").exists()


@pytest.mark.parametrize(
    ("space", "expected"),
    [
        ("params:\n  fusion.rrf_kk: {type: int, low: 1, high: 100}\n", "fusion.rrf_kk: no such key"),
        ("params:\n  fusion.rrf_k: {type: int, low: 100, high: 1}\n", "inverted bounds low=100 > high=1"),
        ("params:\n  fusion.method: {type: float, low: 0, high: 1}\n", "type mismatch"),
        ("params:\n  confidence.top_m: {type: int, low: 1, high: 10, post_retrieval: true}\n",
         "confidence.top_m: post_retrieval/gate needs a float"),
    ],
)
def test_bad_search_spaces_are_refused_with_one_line(demo_data: Path, tmp_path: Path, space: str, expected: str) -> None:
    bad = tmp_path / "space.yaml"
    bad.write_text(space)
    exp_path = make_project(tmp_path, demo_data, study="bad", n_trials=8, search_space=bad, shortlist=DROP)
    out = _tuner("run", str(exp_path))
    assert out.returncode == 2
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and expected in lines[0], out.stderr
    assert "space.yaml" in lines[0]
    assert (tmp_path / "backend" / "config.yaml").read_text().count("rrf_k: 60") == 1


def test_a_backend_that_refuses_every_config_spends_the_failure_budget(demo_data: Path, tmp_path: Path) -> None:
    space = tmp_path / "space.yaml"
    space.write_text("params:\n  confidence.top_m: {type: int, low: 0, high: 0}   # the backend wants >= 1\n")
    exp_path = make_project(tmp_path, demo_data, study="broken", n_trials=8, search_space=space, shortlist=DROP,
                            baseline=False, failure_budget={"max_consecutive": 2})
    config = tmp_path / "backend" / "config.yaml"
    original = config.read_bytes()

    exp = load_experiment(exp_path)
    summary = run_experiment(exp)

    assert summary.error is not None
    assert "2 consecutive failed trials (failure_budget.max_consecutive=2)" in summary.error
    assert "\n" not in summary.error
    study = optuna.load_study(study_name="broken", storage=exp.storage)
    trials = [t for t in study.get_trials() if t.state != TrialState.WAITING]
    # the pipelined loop had begun one more trial when the budget stopped it: told FAIL, not
    # run, its params queued again (WAITING) for the next run
    ahead = [t for t in trials if "begun ahead" in t.user_attrs.get("fail_reason", "")]
    assert len(ahead) <= 1 and all(t.number == len(trials) - 1 for t in ahead)
    trials = [t for t in trials if t not in ahead]
    assert [t.state for t in trials] == [TrialState.FAIL, TrialState.FAIL]
    for t in trials:
        reason = t.user_attrs["fail_reason"]  # a trial-table column: the start of the reason
        assert reason.startswith("BackendExited: ") and "\n" not in reason
    assert config.read_bytes() == original
    client = MlflowClient(exp.tracking.mlflow_uri)
    runs = client.search_runs([client.get_experiment_by_name("broken").experiment_id], "tags.`tuner.role` = 'trial'")
    assert all("begun ahead" in r.data.tags["tuner.fail_reason"] for r in runs
               if r.data.tags.get("tuner.trial") in {str(t.number) for t in ahead})
    runs = [r for r in runs if "begun ahead" not in r.data.tags["tuner.fail_reason"]]
    assert sorted(r.info.status for r in runs) == ["FAILED", "FAILED"]
    assert all(r.data.tags["tuner.fail_reason"].startswith("BackendExited") for r in runs)
    # the whole reason (the trial column holds its start) names the exit code and the key the backend refused
    whole = [r.data.tags["tuner.fail_reason"] for r in runs]
    assert all("exited with code 2" in w and "top_m" in w for w in whole)
    assert all(any(w.startswith(t.user_attrs["fail_reason"]) for w in whole) for t in trials)


def test_a_study_with_a_holdout_tunes_without_it_and_validates_at_the_end(demo_data: Path, tmp_path: Path) -> None:
    from tuner.data.dataset import load_queryset
    from tuner.evaluation.holdout import split_queries

    exp_path = make_project(tmp_path, demo_data, study="held", n_trials=2, holdout={"fraction": 0.3, "seed": 5})
    exp = load_experiment(exp_path).bind_port()
    summary = run_experiment(exp)
    assert summary.error is None and summary.best is not None
    queries = load_queryset(exp.dataset.queries, "demo")
    split = split_queries(queries, exp.holdout)
    study = optuna.load_study(study_name="held", storage=exp.storage)
    recorded = study.user_attrs["tuner.holdout"]
    assert (recorded["seed"], recorded["n_holdout"], recorded["n_tune"]) == (5, len(split.holdout), len(split.tune))
    assert len(split.holdout) == round(0.3 * len(queries.queries))
    # Trials saw the tune queries only.
    for t in study.get_trials(states=(TrialState.COMPLETE,)):
        per_query = (exp.state_dir / "trials" / "held" / str(t.number) / "report_per_query.csv").read_text()
        ids = {line.split(",")[0] for line in per_query.splitlines()[1:]}
        assert ids == set(split.tune), t.number
    # The end-of-run validation compared baseline and best on the holdout queries.
    run = summary.holdout
    assert run is not None and run.markdown_path.is_file()
    data = json.loads(run.json_path.read_text())
    assert set(data["holdout_query_ids"]) == set(split.holdout)
    assert (data["baseline_trial"], data["best_trial"]) == (summary.baseline.number, summary.best.number)
    primary = next(m for m in data["metrics"] if m["metric"] == "Primary_Metric_Score")
    assert primary["delta"] == pytest.approx(primary["candidate"] - primary["baseline"], abs=1e-12)
    # validation left out with a holdout: both. The cross-validated estimate is on the tune part,
    # and its gain and the holdout's agree within their intervals.
    cv = summary.crossval
    tuned_in_scope = [q for q in queries.queries if q.query_id in set(split.tune) and q.scope != "oos"]
    assert cv is not None and cv.n_queries == len(tuned_in_scope)
    assert cv.ci_low is not None and cv.ci_high is not None
    assert cv.ci_low <= primary["ci_high"] and primary["ci_low"] <= cv.ci_high, (cv.summary_line(), primary)
    out = _cli("report", str(exp_path), "--out", str(tmp_path / "rep"))
    assert out.exit_code == 0, out.output
    assert "Holdout validation" in out.stdout and str(run.markdown_path) in out.stdout.replace("\n", "")
    # The MLflow study run holds the study's summary, its plots and the holdout comparison,
    # and its description (the study note) names where holdout.md is (issue 31).
    client = MlflowClient(exp.tracking.mlflow_uri)
    [parent] = client.search_runs([client.get_experiment_by_name("held").experiment_id],
                                  f"tags.`{TAG_ROLE}` = 'study'")
    listed = {a.path for folder in ("study", "holdout") for a in client.list_artifacts(parent.info.run_id, folder)}
    assert listed == {"study/report.md", "study/trials.csv", "study/optimization_history.png",
                      "study/param_importances.png", "study/score_vs_oos_fp_rate.png",
                      "holdout/holdout.md", "holdout/holdout.json"}
    shown = client.download_artifacts(parent.info.run_id, "holdout/holdout.md", str(tmp_path / "parent"))
    assert Path(shown).read_text() == run.markdown_path.read_text()
    note = parent.data.tags["mlflow.note.content"]
    assert f"the whole comparison: `{run.markdown_path}` (and the MLflow study run's artifacts, holdout/holdout.md)" \
        in note


def test_tuner_check_passes_on_the_demo(demo_data: Path, tmp_path: Path) -> None:
    exp_path = make_project(tmp_path, demo_data, study="check", n_trials=2)
    out = _tuner("check", str(exp_path))
    assert out.returncode == 0, out.stdout + out.stderr
    assert "preflight passed" in out.stdout and "handoff:" in out.stdout  # the share is always said
