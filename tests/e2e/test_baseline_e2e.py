"""The baseline is the config as found (issue 26, item 4), end to end against the
reference backend set not to divide fused scores by the weight sum
(``fusion.normalize_weights: false``), where weights 1.0/1.0 and the simplex's 0.5/0.5
are different configs: with ``citation.min_score: 0.6`` the second cuts more.

One module-scoped study: trial #0 the baseline, trial #1 a shortlist variant that keeps
the file's weights and changes RRF k. Checked: trial #0 writes nothing and the backend
serves the file's bytes while it is measured; its score equals a plain `tuner eval` of
the untouched file (and differs from the 0.5/0.5 config, so the check can fail); its
recorded values and the study's ``tuner.config_seen`` are the file's; `tuner apply` of
trial #1 leaves the weights line alone; `tuner best` marks only RRF k as changed.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import optuna
import pytest
from support.backend import start_backend
from support.demo_data import copy_demo_data
from support.reference_experiment import DROP, copy_backend_config, write_reference_experiment

from tuner.config.experiment import load_experiment
from tuner.ops.apply import plan_apply
from tuner.ops.run import run_experiment
from tuner.study.loop import StudyObserver
from tuner.study.storage.study_storage import ATTR_CONFIG_SEEN
from tuner.study.trial.attrs import assignment_of

PYTHON = sys.executable
N_IN_SCOPE = 60

pytestmark = [pytest.mark.slow, pytest.mark.integration]
optuna.logging.set_verbosity(optuna.logging.WARNING)

SPACE = """\
params:
  fusion.rrf_k: {type: int, low: 5, high: 200}
  fusion.weights: {type: simplex, components: [bm25, dense]}
"""
SHORTLIST = """\
- name: same-weights-k30
  fusion.rrf_k: 30
  fusion.weights: {bm25: 1.0, dense: 1.0}
"""
WEIGHTS_LINE = "  weights: {bm25: 1.0, dense: 1.0} # per-source weights >= 0 (keys = source names; missing = 1.0)\n"


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


class ServedProbe(StudyObserver):
    """While a trial is evaluated: the config file's sha256 and inode, and what the
    backend's /health says it serves (the sha256 of the config bytes it parsed)."""

    def __init__(self, base_url: str, config: Path) -> None:
        self.base_url, self.config = base_url, config
        self.seen: dict[int, dict[str, Any]] = {}

    def phase(self, number: int, phase: str) -> None:
        if phase == "evaluate":
            stat = self.config.stat()
            health = httpx.get(f"{self.base_url}/health", timeout=10).json()
            self.seen[number] = {"sha": _sha(self.config), "inode": stat.st_ino, "mtime_ns": stat.st_mtime_ns,
                                 "served": health["config_fingerprint"]}


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    data = tmp_path_factory.mktemp("demo") / "data"
    copy_demo_data(data)
    rows = [json.loads(line) for line in (data / "queries.jsonl").read_text().splitlines() if line.strip()]
    kept = [r for r in rows if r["scope"] == "in"][:N_IN_SCOPE] + [r for r in rows if r["scope"] == "oos"]
    (data / "queries.jsonl").write_text("".join(json.dumps(r) + "\n" for r in kept))
    root = tmp_path_factory.mktemp("project")
    (root / "data").mkdir()
    for name in ("queries.jsonl", "qrels.txt", "corpus.jsonl"):
        (root / "data" / name).write_bytes((data / name).read_bytes())
    config = copy_backend_config(root)
    text = config.read_text()
    assert WEIGHTS_LINE in text and "  min_score: 0.0 " in text
    text = text.replace(WEIGHTS_LINE, WEIGHTS_LINE + "  normalize_weights: false       # fused scores not divided by sum(w)\n")
    config.write_text(text.replace("  min_score: 0.0 ", "  min_score: 0.6 "))
    (root / "space.yaml").write_text(SPACE)
    (root / "shortlist.yaml").write_text(SHORTLIST)
    exp_path = write_reference_experiment(
        root, study="asfound", n_trials=2, project_root=".", state_dir=".tuner", search_space="space.yaml",
        shortlist="shortlist.yaml", sampler={"type": "tpe", "seed": 1}, constraints=[],
        evaluation={"request": {"body": DROP}, "top_k": 50, "concurrency": 4})
    original = config.read_bytes()
    exp = load_experiment(exp_path).bind_port()
    probe = ServedProbe(exp.target.health.url.removesuffix("/health"), config)
    run_experiment(exp, observer=probe)
    study = optuna.load_study(study_name="asfound", storage=exp.storage)
    return {"root": root, "exp_path": exp_path, "exp": exp, "config": config, "original": original,
            "probe": probe, "study": study}


def _tuner(*args: Any, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "COLUMNS": "120"}
    return subprocess.run([PYTHON, "-m", "tuner", *map(str, args)], cwd=cwd, capture_output=True, text=True,
                          env=env, timeout=300)


def _eval(run: dict[str, Any], config: Path, out: str) -> dict[str, Any]:
    """A plain `tuner eval` of the experiment's queries against the backend serving ``config``."""
    with start_backend(config) as backend:
        done = _tuner("eval", "--experiment", run["exp_path"], "--port", backend.port, "--out", out,
                      cwd=run["root"])
    assert done.returncode == 0, done.stdout + done.stderr
    return json.loads((run["root"] / out / "report.json").read_text())["scorecard"]


def test_trial_zero_writes_nothing_and_the_backend_serves_the_file_as_found(run: dict[str, Any]) -> None:
    trials = run["study"].get_trials()
    assert [t.user_attrs["variant"] for t in trials] == ["baseline", "same-weights-k30"]
    before = hashlib.sha256(run["original"]).hexdigest()
    seen = run["probe"].seen[0]
    assert seen["sha"] == before and seen["served"] == before
    # trial #1 (RRF k 30) did write: the probe sees it, so it would see trial #0's write too
    assert run["probe"].seen[1]["sha"] != before and run["probe"].seen[1]["served"] == run["probe"].seen[1]["sha"]
    assert run["config"].read_bytes() == run["original"]  # and the run restored the file


def test_trial_zero_records_the_files_values(run: dict[str, Any]) -> None:
    study = run["study"]
    baseline = study.get_trials()[0]
    assert assignment_of(baseline) == {"fusion.rrf_k": 60, "fusion.weights": {"bm25": 1.0, "dense": 1.0}}
    assert baseline.params["fusion.weights.bm25"] == 1.0 and baseline.params["fusion.weights.dense"] == 1.0
    assert study.user_attrs[ATTR_CONFIG_SEEN]["fusion.weights"] == {"bm25": 1.0, "dense": 1.0}
    # the variant kept the weights: it carries the file's values too
    assert assignment_of(study.get_trials()[1])["fusion.weights"] == {"bm25": 1.0, "dense": 1.0}


def test_the_baseline_scores_what_tuner_eval_of_the_untouched_file_scores(run: dict[str, Any]) -> None:
    baseline = run["study"].get_trials()[0]
    card = _eval(run, run["config"], "eval-as-found")
    assert baseline.value == pytest.approx(card["Primary_Metric_Score"], abs=1e-12)
    # On this backend the simplex's rendering is another config: the check above can fail.
    halved = run["config"].with_name("config-halved.yaml")  # beside it: the same relative paths
    halved.write_text(run["original"].decode().replace("{bm25: 1.0, dense: 1.0}", "{bm25: 0.5, dense: 0.5}"))
    assert _eval(run, halved, "eval-halved")["Primary_Metric_Score"] != pytest.approx(baseline.value, abs=1e-6)


def test_apply_of_a_trial_that_keeps_the_weights_leaves_their_line(run: dict[str, Any]) -> None:
    plan = plan_apply(load_experiment(run["exp_path"]), trial_number=1, recover_journal=False)
    changed = [line for line in plan.diff.splitlines() if line.startswith(("-", "+")) and not line.startswith(("---", "+++"))]
    assert changed == ["-  rrf_k: 60                        # RRF: score = sum over sources of w_s / (k + rank_s)",
                       "+  rrf_k: 30                        # RRF: score = sum over sources of w_s / (k + rank_s)"]
    assert plan.drift == []
    written = next(iter(plan.texts.values()))
    assert WEIGHTS_LINE in written


def test_best_marks_only_the_key_the_file_would_change(run: dict[str, Any]) -> None:
    done = _tuner("best", run["exp_path"], cwd=run["root"])
    assert done.returncode == 0, done.stdout + done.stderr
    rows = {line.split("│")[1].strip(): line for line in done.stdout.splitlines()
            if line.count("│") >= 3 and line.split("│")[1].strip().startswith("fusion.")}
    assert set(rows) == {"fusion.rrf_k", "fusion.weights.bm25", "fusion.weights.dense"}, done.stdout
    values = [c.strip() for c in rows["fusion.weights.bm25"].split("│")[2:-1]]  # baseline, best: the weight itself
    assert values and all(float(v.rstrip("*")) == 1.0 for v in values), rows["fusion.weights.bm25"]
    assert "*" not in rows["fusion.weights.bm25"] and "*" not in rows["fusion.weights.dense"]
    assert "30*" in rows["fusion.rrf_k"]
