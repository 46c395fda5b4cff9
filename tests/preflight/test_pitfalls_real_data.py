"""The first-night pitfalls of issue 9, reproduced on real data (Cranfield with CACM
queries as out-of-scope ones, imported with the `files` importer; CACM with its own
importer): each now gets the right result or a stop with one line and exit 2.

Skips without ../shared/datasets; fails instead under TUNER_REQUIRE_INTEGRATION=1.
Pitfalls 4, 6 and 8 (one import, full-precision runs, dataset names) are covered by
tests/backend_data/test_data_files_cranfield.py, pitfall 7 (`tuner score -l`, JSON
runs) by tests/cli/test_score_cmd.py against trec_eval's own reference output.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import optuna
import pytest
from ruamel.yaml import YAML
from support.backend import start_backend
from support.cranfield_files import files_argv

pytestmark = [pytest.mark.integration, pytest.mark.slow]

TUNER = Path(sys.executable).parent / "tuner"
N_IN = 225  # Cranfield's queries, every one judged


def tuner(*args: Any, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(TUNER), *map(str, args)], capture_output=True, text=True, timeout=timeout)


def one_line_error(proc: subprocess.CompletedProcess[str]) -> str:
    """The error a user sees: exit 2 and one `error:` line on stderr."""
    assert proc.returncode == 2, proc.stdout[-2000:] + proc.stderr[-2000:]
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), proc.stderr
    return lines[0]


def copy_bundle(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst, ignore=shutil.ignore_patterns(".tuner", "mlruns"))
    return dst


def edit_yaml(path: Path, change: Any) -> None:
    """Round-trip edit (comments kept), as a user edits the file by hand."""
    yaml = YAML()
    doc = yaml.load(path.read_text())
    change(doc)
    with path.open("w") as fh:
        yaml.dump(doc, fh)


def study_trials(bundle: Path, name: str = "cran") -> list[optuna.trial.FrozenTrial]:
    storage = f"sqlite:///{bundle / '.tuner' / 'optuna.db'}"
    try:
        return optuna.load_study(study_name=name, storage=storage).get_trials()
    except KeyError:  # the study was never created
        return []


@pytest.fixture
def cran(cran_bundle: tuple[Path, str], tmp_path: Path) -> Path:
    return copy_bundle(cran_bundle[0], tmp_path / "cran")


def test_the_files_import_passes_the_preflight(cran: Path) -> None:
    proc = tuner("check", cran / "experiment.yaml")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "preflight passed" in proc.stdout
    assert f"hands off 0 of {N_IN} in-scope queries" in proc.stdout  # the shipped threshold 0.0


# ---------------------------------------------------------------- 1: no query_id in the body


def _without_query_id(cran: Path) -> Path:
    exp = cran / "experiment.yaml"
    edit_yaml(exp, lambda d: d["evaluation"]["request"].__setitem__("body", {"query": "{query}", "top_k": "{top_k}"}))
    return exp


def test_1_request_without_query_id_stops_check_and_run_before_any_trial(cran: Path) -> None:
    exp = _without_query_id(cran)
    original = (cran / "config.yaml").read_bytes()
    check = one_line_error(tuner("check", exp))
    assert re.search(rf"(\d+) of {N_IN} in-scope queries came back with no results", check), check
    assert "does not send query_id" in check and "results_path='results'" in check
    assert "raw response to" in check and '"results":[]' in check.replace(" ", "")  # what the backend said
    run = one_line_error(tuner("run", exp, "--n-trials", 2))
    assert "came back with no results" in run and "--skip-checks" in run
    assert study_trials(cran) == [] or all(t.state != optuna.trial.TrialState.COMPLETE for t in study_trials(cran))
    assert (cran / "config.yaml").read_bytes() == original


def test_1_with_checks_skipped_every_trial_fails_instead_of_scoring_zero(cran: Path) -> None:
    exp = _without_query_id(cran)
    proc = tuner("run", exp, "--n-trials", 4, "--skip-checks")
    assert proc.returncode == 2, proc.stdout[-3000:]
    assert "3 consecutive failed trials" in proc.stdout  # the failure budget stopped it
    trials = study_trials(cran)
    # the pipelined loop had begun a 4th trial: told FAIL unmeasured ("begun ahead"), its params queued again
    ahead = [t for t in trials if "begun ahead" in t.user_attrs.get("fail_reason", "")]
    assert len(ahead) <= 1
    trials = [t for t in trials if t not in ahead and t.state != optuna.trial.TrialState.WAITING]
    assert len(trials) == 3 and all(t.state == optuna.trial.TrialState.FAIL for t in trials)
    assert all("came back with no results" in t.user_attrs["fail_reason"] for t in trials)
    study = optuna.load_study(study_name="cran", storage=f"sqlite:///{cran / '.tuner' / 'optuna.db'}")
    assert study.user_attrs["tuner.preflight"]["skipped"] is True
    assert study.user_attrs["tuner.preflight"]["passed"] is False


def test_1_tuner_eval_stops_and_says_judged_is_undefined_when_nothing_came_back(cran: Path, tmp_path: Path) -> None:
    exp = _without_query_id(cran)
    with start_backend(cran / "config.yaml", timeout=300) as backend:
        stopped = tuner("eval", "--experiment", exp, "--port", backend.port, "--out", tmp_path / "rep")
        assert "came back with no results" in one_line_error(stopped)
        report = json.loads((tmp_path / "rep" / "report.json").read_text())  # written for diagnosis
        assert report["context"]["preflight"]["verdict"] == "stopped"
        skipped = tuner("eval", "--experiment", exp, "--port", backend.port, "--out", tmp_path / "rep2",
                        "--skip-checks")
    assert skipped.returncode == 0, skipped.stderr
    assert re.search(r"Judged@10\W+n/a", skipped.stdout) and re.search(rf"Empty_Queries\W+{N_IN}\b", skipped.stdout)


# ---------------------------------------------------------------- 2: a threshold that hands off


def test_2_the_handoff_share_of_the_config_as_found_is_named_with_its_key(cran: Path) -> None:
    edit_yaml(cran / "config.yaml", lambda d: d["confidence"].__setitem__("threshold", 0.6))
    proc = tuner("check", cran / "experiment.yaml")
    assert proc.returncode == 0, proc.stdout + proc.stderr  # the study solves the gate per trial: a warning
    text = " ".join(proc.stdout.split())
    m = re.search(rf"hands off (\d+) of {N_IN} in-scope queries \((\d+\.\d)%\)", text)
    assert m and int(m.group(1)) > 0.2 * N_IN, text
    assert re.search(r"\d+ by confidence\.threshold \(e\.g\. confidence 0\.\d+ < confidence\.threshold 0\.60\)", text), text


def test_2_a_baseline_handing_off_most_queries_stops_when_the_gate_is_not_solved(cran: Path) -> None:
    edit_yaml(cran / "config.yaml", lambda d: d["confidence"].__setitem__("threshold", 0.9))
    edit_yaml(cran / "space.yaml", lambda d: d["params"].pop("confidence.threshold"))
    err = one_line_error(tuner("check", cran / "experiment.yaml"))
    assert re.search(rf"hands off (\d+) of {N_IN} in-scope queries", err) and "confidence.threshold 0.90" in err
    assert "by confidence.threshold" in err


def test_doc_ids_in_another_format_stop_and_show_both(cran: Path) -> None:
    edit_yaml(cran / "experiment.yaml", lambda d: d["evaluation"]["response"].__setitem__("doc_id", "title"))
    err = one_line_error(tuner("check", cran / "experiment.yaml"))
    assert "matches a labelled doc id" in err and re.search(r"labelled: '\d+', '\d+', '\d+'", err), err


# ---------------------------------------------------------------- 3: unjudged queries


@pytest.fixture(scope="module")
def cacm(datasets_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("cacm") / "cacm"
    proc = subprocess.run([sys.executable, "-m", "fusion_backend.importers", "cacm", "--src",
                           str(datasets_dir / "cacm"), "--out", str(out)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    return out


def test_3_unjudged_queries_are_dropped_and_counted_or_refused(cacm: Path, tmp_path: Path) -> None:
    bundle = copy_bundle(cacm, tmp_path / "cacm")
    queries = [json.loads(line) for line in (bundle / "cacm.queries.jsonl").open()]
    judged = {line.split()[0] for line in (bundle / "cacm.qrels.txt").read_text().splitlines()}
    unjudged = [q["query_id"] for q in queries if q["scope"] == "in" and q["query_id"] not in judged]
    assert unjudged  # CACM has queries nobody judged
    n_in = sum(q["scope"] == "in" for q in queries)
    proc = tuner("check", bundle / "experiment.yaml")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"dropped {len(unjudged)} of {n_in} in-scope queries that have no judgments" in " ".join(proc.stdout.split())
    edit_yaml(bundle / "experiment.yaml", lambda d: d["dataset"].__setitem__("unjudged_queries", "error"))
    err = one_line_error(tuner("check", bundle / "experiment.yaml"))
    assert f"{len(unjudged)} of {n_in} in-scope queries have no judgments" in err


# ---------------------------------------------------------------- 5: an OOS constraint with no OOS queries


def test_5_an_oos_constraint_without_oos_queries_stops(cran_inputs: dict[str, Path], tmp_path: Path) -> None:
    argv = files_argv(cran_inputs, tmp_path / "in-only")
    i = argv.index("--oos")
    del argv[i:i + 2]
    bundle, _ = import_bundle_argv(argv)
    yaml = YAML()
    assert list(yaml.load((bundle / "experiment.yaml").read_text())["constraints"]) == []  # the importer's choice
    edit_yaml(bundle / "experiment.yaml", lambda d: d.__setitem__("constraints", ["OOS_FP_Rate <= 0.10"]))
    err = one_line_error(tuner("check", bundle / "experiment.yaml"))
    assert "no out-of-scope queries" in err and "OOS_FP_Rate <= 0.1" in err
    run = tuner("run", bundle / "experiment.yaml")
    assert "no out-of-scope queries" in one_line_error(run)
    assert "preflight: evaluating" not in run.stdout  # stopped before the backend was started
    assert study_trials(bundle) == []


def import_bundle_argv(argv: list[str]) -> tuple[Path, str]:
    proc = subprocess.run([sys.executable, "-m", "fusion_backend.importers", *argv], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    return Path(argv[argv.index("--out") + 1]), proc.stdout

