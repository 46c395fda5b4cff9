"""The request channel against the reference backend's Azure AI Search-shaped route
(``POST /indexes/{index}/docs/search``, docs/backend.md), end to end (issue 28).

A short study (the baseline and four random trials, fixed seed) tunes the vector
query's weight and ``k`` and the text recall size of an Azure hybrid query, each bound
to its place in the request body (search_space/azure_hybrid.yaml); the answers are
read by Azure's own keys, the score by the escaped ``@search\\.score``. Checked: every
trial completes with the values it was given in its requests; the trials score
differently (the values reached the backend: a request the route ignored would score
every trial the same); the baseline scores exactly what a plain ``tuner eval`` of the
declared request scores; the backend's config file is byte-identical, never patched.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import optuna
import pytest
from support.backend import start_backend
from support.demo_data import copy_demo_data
from support.reference_experiment import DROP, REPO, copy_backend_config, write_reference_experiment

from tuner.config.experiment import load_experiment
from tuner.ops.run import run_experiment
from tuner.study.trial.attrs import ATTR_APPLIED, ATTR_VARIANT, assignment_of

pytestmark = [pytest.mark.slow, pytest.mark.integration]
optuna.logging.set_verbosity(optuna.logging.WARNING)

N_IN_SCOPE = 40
N_TRIALS = 5
SPACE = REPO / "search_space" / "azure_hybrid.yaml"
BIND = {
    "fusion.weights.dense": "body.vectorQueries.0.weight",
    "sources.dense.k": "body.vectorQueries.0.k",
    "sources.text.max_recall": "body.hybridSearch.maxTextRecallSize",
}
# production as found: the request the application sends today
DECLARED = {"fusion.weights.dense": 1.0, "sources.dense.k": 50, "sources.text.max_recall": 1000}
BODY = {
    "search": "{query}",
    "top": "{top_k}",
    "vectorQueries": [{"kind": "text", "text": "{query}", "fields": "dense",
                       "k": DECLARED["sources.dense.k"], "weight": DECLARED["fusion.weights.dense"]}],
    "hybridSearch": {"maxTextRecallSize": DECLARED["sources.text.max_recall"]},
}


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    data = tmp_path_factory.mktemp("demo-azure") / "data"
    copy_demo_data(data)
    rows = [json.loads(line) for line in (data / "queries.jsonl").read_text().splitlines() if line.strip()]
    kept = [r for r in rows if r["scope"] == "in"][:N_IN_SCOPE]
    (data / "queries.jsonl").write_text("".join(json.dumps(r) + "\n" for r in kept))
    root = tmp_path_factory.mktemp("azure")
    (root / "data").symlink_to(data, target_is_directory=True)
    config = copy_backend_config(root)
    exp_path = write_reference_experiment(
        root, study="azure", n_trials=N_TRIALS, storage=f"sqlite:///{root / 'optuna.db'}",
        search_space=str(SPACE), sampler={"type": "random", "seed": 7}, constraints=[],
        target={"channel": "request", "config_files": [],
                "process": {"command": ["{python}", "-m", "fusion_backend", "serve", "--config", str(config),
                                        "--port", "{port}"]},
                "request": {"bind": BIND}},
        evaluation={
            "request": {"url": "http://127.0.0.1:{port}/indexes/catalog/docs/search?api-version=2024-07-01",
                        "body": BODY, "pass_extra": False},
            # Azure's keys; '@search\.score' is the one key "@search.score"
            "response": {"results_path": "value", "doc_id": "id", "score": "@search\\.score", "title": "title",
                         "confidence": DROP, "handoff": DROP, "fallback_level": DROP},
        })
    before = (config.read_bytes(), config.stat().st_mtime_ns)
    exp = load_experiment(exp_path).bind_port()
    run_experiment(exp)
    trials = optuna.load_study(study_name="azure", storage=exp.storage).get_trials()
    return {"root": root, "exp_path": exp_path, "config": config, "before": before, "trials": trials}


def test_every_trial_completes_with_its_own_values_in_the_request(run: dict[str, Any]) -> None:
    trials: list[optuna.trial.FrozenTrial] = run["trials"]
    assert len(trials) == N_TRIALS
    assert [t.state for t in trials] == [optuna.trial.TrialState.COMPLETE] * N_TRIALS
    assert [t.user_attrs.get(ATTR_APPLIED) for t in trials] == ["request"] * N_TRIALS
    baseline = trials[0]
    assert baseline.user_attrs.get(ATTR_VARIANT) == "baseline"
    assert assignment_of(baseline) == pytest.approx(DECLARED)
    assigned = [assignment_of(t) for t in trials[1:]]
    assert all(set(a) == set(BIND) for a in assigned)
    assert len({json.dumps(a, sort_keys=True) for a in assigned}) == N_TRIALS - 1


def test_the_trials_score_differently_so_the_values_took_effect(run: dict[str, Any]) -> None:
    values = [t.value for t in run["trials"]]
    assert all(v is not None and 0.0 < v <= 1.0 for v in values)
    assert len({round(v, 9) for v in values if v is not None}) >= 3


def test_the_baseline_scores_what_a_plain_eval_of_the_declared_request_scores(run: dict[str, Any]) -> None:
    root: Path = run["root"]
    with start_backend(run["config"]) as backend:
        done = subprocess.run(
            [sys.executable, "-m", "tuner", "eval", "--experiment", str(run["exp_path"]), "--port", str(backend.port),
             "--out", "eval-declared"],
            cwd=root, capture_output=True, text=True, timeout=300, env={**os.environ, "COLUMNS": "120"})
    assert done.returncode == 0, done.stdout + done.stderr
    card = json.loads((root / "eval-declared" / "report.json").read_text())["scorecard"]
    assert run["trials"][0].value == pytest.approx(card["Primary_Metric_Score"], abs=1e-12)
    assert any(t.value != pytest.approx(card["Primary_Metric_Score"], abs=1e-9) for t in run["trials"][1:])


def test_the_backend_config_file_is_untouched(run: dict[str, Any]) -> None:
    config: Path = run["config"]
    assert (config.read_bytes(), config.stat().st_mtime_ns) == run["before"]
    assert not list(config.parent.glob("*.tuner-*"))
