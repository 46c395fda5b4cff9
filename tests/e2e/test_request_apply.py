"""`tuner apply` with ``target.channel: request`` and ``target.request.apply_to``: the
winning values go into the file the calling application reads (YAML, JSON), with the
file path's guarantees: the diff, the re-check (the file must hold what the declared
request sends: production as found), a backup, a re-measure with the request the
application will send (values read back from the written file) that must hold the
constraints, else the file is rolled back; --dry-run writes nothing.

One request-channel study (the baseline and three fusion variants on the reference
backend) is run once for the module; each test writes its own application file and an
experiment file naming it, on the same study.
"""

from __future__ import annotations

import http.server
import json
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import optuna
import pytest
from ruamel.yaml import YAML
from support.reference_experiment import FUSION_SPACE, deep_merge, dump_experiment, reference_experiment

from e2e.test_request_channel import demo_data, project, request_overrides  # noqa: F401  (module fixture reused)
from tuner.config.experiment import load_experiment
from tuner.ops.run import run_experiment
from tuner.study.trial.attrs import ATTR_VARIANT, assignment_of

pytestmark = [pytest.mark.slow, pytest.mark.integration]

STUDY = "request-apply"
PATHS = {  # bound config key -> its key in the application's file
    "fusion.method": "search.hybrid.method",
    "fusion.rrf_k": "search.hybrid.rrf_k",
    "fusion.weights.bm25": "search.hybrid.weights.bm25",
    "fusion.weights.dense": "search.hybrid.weights.dense",
    "fusion.normalization": "search.hybrid.normalization",
}
APP_YAML = """\
# read by the application at start-up
search:
  timeout_ms: 800          # not tuned: stays as written
  hybrid:
    method: rrf            # the fusion the application asks for
    rrf_k: 60
    weights: {bm25: 1.0, dense: 1.0}
    normalization: minmax
"""
APP_JSON = """\
{
    "search": {
        "timeout_ms": 800,
        "hybrid": {
            "method": "rrf",
            "rrf_k": 60,
            "weights": {"bm25": 1.0, "dense": 1.0},
            "normalization": "minmax"
        }
    }
}
"""


def experiment_doc(root: Path, **overrides: Any) -> dict[str, Any]:
    base = {**request_overrides(root), "constraints": ["OOS_FP_Rate <= 1.0"]}  # every variant feasible
    return reference_experiment(
        study=STUDY, n_trials=4, storage=f"sqlite:///{root / 'optuna.db'}", shortlist="shortlist.json",
        sampler={"type": "random", "seed": 1}, search_space=str(FUSION_SPACE), **deep_merge(base, overrides))


@pytest.fixture(scope="module")
def study(demo_data: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:  # noqa: F811
    root = tmp_path_factory.mktemp("request-apply")
    exp_path = project(root, demo_data, STUDY)  # data, backend config, shortlist
    exp_path.write_text(dump_experiment(experiment_doc(root)))
    summary = run_experiment(load_experiment(exp_path))
    assert summary.error is None, summary.error
    trials = optuna.load_study(study_name=STUDY, storage=f"sqlite:///{root / 'optuna.db'}").get_trials()
    variants = [t for t in trials if t.state.name == "COMPLETE" and t.user_attrs.get(ATTR_VARIANT) != "baseline"]
    assert variants, [t.user_attrs for t in trials]
    chosen = max(variants, key=lambda t: float(t.value))  # a trial other than the baseline: values to write
    return {"root": root, "chosen": chosen}


def app_project(study: dict[str, Any], name: str, text: str, **overrides: Any) -> tuple[Path, Path]:
    """An application file ``name`` holding ``text`` and an experiment file that names it."""
    root: Path = study["root"]
    app = root / "app" / name
    app.parent.mkdir(exist_ok=True)
    app.write_text(text)
    apply_to = {"file": f"app/{name}", "paths": dict(PATHS)}
    exp_path = root / f"experiment-{Path(name).stem}.yaml"
    overrides = deep_merge({"target": {"request": {"apply_to": apply_to}}}, overrides)
    exp_path.write_text(dump_experiment(experiment_doc(root, **overrides)))
    return app, exp_path


def tuner(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(Path(sys.executable).with_name("tuner")), *args], capture_output=True, text=True,
                          timeout=600, env={**os.environ, "COLUMNS": "250"})


def assert_holds_the_trial(hybrid: dict[str, Any], trial: optuna.trial.FrozenTrial) -> None:
    chosen = assignment_of(trial)
    assert hybrid["method"] == chosen["fusion.method"]
    assert hybrid["weights"] == pytest.approx(chosen["fusion.weights"])
    if chosen["fusion.method"] == "rrf":
        assert hybrid["rrf_k"] == chosen["fusion.rrf_k"]
    else:
        assert hybrid["normalization"] == chosen["fusion.normalization"]


def journal(study: dict[str, Any]) -> Path:
    return study["root"] / "state" / "restore-journal.json"


def test_apply_writes_the_winning_values_into_a_yaml_app_file(study: dict[str, Any]) -> None:
    app, exp_path = app_project(study, "search.yaml", APP_YAML)
    trial = study["chosen"]
    done = tuner("apply", str(exp_path), "--trial", str(trial.number))
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"applied trial #{trial.number} to " in done.stdout and "search.yaml" in done.stdout
    assert "+++ b/" in done.stdout  # the diff was shown
    text = app.read_text()
    doc = YAML(typ="safe").load(text)
    assert_holds_the_trial(doc["search"]["hybrid"], trial)
    # comments, order and the untuned key as written
    assert text.startswith("# read by the application at start-up\nsearch:\n  timeout_ms: 800          # not tuned")
    assert "# the fusion the application asks for" in text
    assert not journal(study).exists()
    backups = sorted((study["root"] / "state" / "backups").glob("*/0-search.yaml"))
    assert backups and backups[-1].read_text() == APP_YAML


def test_apply_writes_a_json_app_file_keeping_its_layout(study: dict[str, Any]) -> None:
    app, exp_path = app_project(study, "search.json", APP_JSON)
    trial = study["chosen"]
    done = tuner("apply", str(exp_path), "--trial", str(trial.number))
    assert done.returncode == 0, done.stdout + done.stderr
    text = app.read_text()
    assert_holds_the_trial(json.loads(text)["search"]["hybrid"], trial)
    assert text.startswith('{\n    "search": {\n        "timeout_ms": 800,\n        "hybrid": {\n')
    assert not journal(study).exists()


def test_apply_refuses_an_app_file_that_is_not_what_the_request_sends(study: dict[str, Any]) -> None:
    drifted = APP_YAML.replace("rrf_k: 60", "rrf_k: 30")
    app, exp_path = app_project(study, "drifted.yaml", drifted)
    before = (app.read_bytes(), app.stat().st_mtime_ns)
    done = tuner("apply", str(exp_path), "--trial", str(study["chosen"].number))
    assert done.returncode != 0
    error = [ln for ln in done.stderr.splitlines() if ln.startswith("error: ")]
    assert len(error) == 1, done.stderr
    assert "search.hybrid.rrf_k is 30, the request sends 60 (fusion.rrf_k)" in error[0], error[0]
    assert "--force" in error[0]
    assert (app.read_bytes(), app.stat().st_mtime_ns) == before
    assert not journal(study).exists()
    forced = tuner("apply", str(exp_path), "--trial", str(study["chosen"].number), "--force")
    assert forced.returncode == 0, forced.stdout + forced.stderr
    assert_holds_the_trial(YAML(typ="safe").load(app.read_text())["search"]["hybrid"], study["chosen"])


def test_apply_rolls_the_file_back_when_the_re_measure_breaks_a_constraint(study: dict[str, Any]) -> None:
    trial = study["chosen"]
    # a bound the trial's own score cannot reach: its re-measure breaks it
    app, exp_path = app_project(study, "rollback.yaml", APP_YAML,
                                constraints=["OOS_FP_Rate <= 1.0", f"Primary_Metric_Score >= {trial.value + 0.05:.6f}"])
    done = tuner("apply", str(exp_path), "--trial", str(trial.number), "--tolerance", "1")
    assert done.returncode == 1, done.stdout + done.stderr
    out = " ".join(done.stdout.split())
    assert "rolled back: constraint violated on the re-measured batch: Primary_Metric_Score = " in out
    assert "rollback.yaml restored as found" in out
    assert app.read_text() == APP_YAML
    assert not journal(study).exists()


def test_dry_run_shows_the_diff_and_leaves_the_file_byte_identical(study: dict[str, Any]) -> None:
    app, exp_path = app_project(study, "dry.yaml", APP_YAML)
    before = (app.read_bytes(), app.stat().st_mtime_ns)
    backups = set((study["root"] / "state" / "backups").glob("*/*"))
    done = tuner("apply", str(exp_path), "--trial", str(study["chosen"].number), "--dry-run")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "--- a/" in done.stdout and "+++ b/" in done.stdout and "--dry-run: nothing written" in done.stdout
    assert (app.read_bytes(), app.stat().st_mtime_ns) == before
    assert set((study["root"] / "state" / "backups").glob("*/*")) == backups
    assert not journal(study).exists()


class _Holding(http.server.ThreadingHTTPServer):
    """An engine that is healthy and holds every search until released: an apply that
    searches is inside its window (written, not yet judged) for as long as the test wants."""

    daemon_threads = True

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _HoldingHandler)
        self.searched = threading.Event()
        self.release = threading.Event()

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}{path}"


class _HoldingHandler(http.server.BaseHTTPRequestHandler):
    server: _Holding

    def do_GET(self) -> None:
        self._answer(200, {"status": "ok"})

    def do_POST(self) -> None:
        self.server.searched.set()
        self.server.release.wait(timeout=300)
        self._answer(503, {"error": "released"})

    def _answer(self, status: int, body: dict[str, Any]) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args: object) -> None:
        return None


def test_a_sigkill_mid_apply_leaves_a_journal_that_recover_replays(study: dict[str, Any]) -> None:
    engine = _Holding()
    threading.Thread(target=engine.serve_forever, daemon=True).start()
    trial = study["chosen"]
    try:
        app, exp_path = app_project(
            study, "killed.yaml", APP_YAML,
            target={"apply": "none", "health": {"url": engine.url("/health")}},
            evaluation={"request": {"url": engine.url("/search")}})
        running = subprocess.Popen([str(Path(sys.executable).with_name("tuner")), "apply", str(exp_path), "--trial",
                                    str(trial.number)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        try:
            assert engine.searched.wait(timeout=300), "the apply never re-measured"
            # inside the window: the file holds the trial's values, the journal its original
            assert journal(study).exists()
            assert_holds_the_trial(YAML(typ="safe").load(app.read_text())["search"]["hybrid"], trial)
            running.send_signal(signal.SIGKILL)
        finally:
            running.wait(timeout=60)
        assert running.returncode == -signal.SIGKILL
        assert journal(study).exists()
        dry = tuner("apply", str(exp_path), "--dry-run")  # every reader says so, in one line
        pending = [ln for ln in (dry.stdout + dry.stderr).splitlines() if "restore journal pending: " in ln]
        assert len(pending) == 1 and f"tuner apply of trial #{trial.number}" in pending[0], dry.stdout + dry.stderr
        assert "killed.yaml" in pending[0] and "--recover" in pending[0]
        recovered = tuner("apply", str(exp_path), "--recover")
        assert recovered.returncode == 0, recovered.stdout + recovered.stderr
        said = " ".join(recovered.stdout.split())
        assert "killed.yaml" in said and "the engine serves nothing from it" in said
        assert app.read_text() == APP_YAML  # byte for byte as found
        assert not journal(study).exists()
    finally:
        engine.release.set()
        engine.shutdown()
        engine.server_close()
