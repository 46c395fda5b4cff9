"""Labels changed after a study: the CLI as a user meets it (issue 26, item 1).

A study runs its baseline on the demo data; one qrels line is then edited. The next
`tuner run` and `tuner check` stop (exit 2, one line naming the file, the counts and
the `--replace` command) before any backend starts. The command from that line
re-imports the file; the study measured on the old labels then refuses to go on, and a
new study measures again instead of reading the result cache's old grades.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import optuna
import pytest
from e2e.test_study_e2e import demo_data, make_project  # noqa: F401  (module fixture reused)
from support.reference_experiment import DROP

PYTHON = sys.executable
pytestmark = [pytest.mark.slow, pytest.mark.integration]


def _tuner(cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([PYTHON, "-m", "tuner", *args], capture_output=True, text=True, timeout=300, cwd=cwd,
                          env={**os.environ, "COLUMNS": "200"})


def _error(out: subprocess.CompletedProcess[str]) -> str:
    lines = [line for line in out.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, out.stdout + out.stderr
    return lines[0]


def test_an_edited_qrels_line_stops_run_and_check_until_reimported_and_a_new_study(demo_data: Path,  # noqa: F811
                                                                                   tmp_path: Path) -> None:
    root = tmp_path / "project"
    exp_path = make_project(root, demo_data, study="before", n_trials=1, tracking={"enabled": False}, shortlist=DROP)
    first = _tuner(root, "run", "experiment.yaml")
    assert first.returncode == 0, first.stdout + first.stderr

    qrels = root / "data" / "qrels.txt"
    lines = qrels.read_text().splitlines(keepends=True)
    qid, it, doc, grade = lines[0].split()
    lines[0] = f"{qid} {it} {doc} {3 if grade != '3' else 0}\n"  # one judgment regraded
    qrels.write_text("".join(lines))

    stopped = _tuner(root, "run", "experiment.yaml")
    assert stopped.returncode == 2, stopped.stdout + stopped.stderr
    line = _error(stopped)
    assert line.startswith("error: labels: data/qrels.txt changed since it was imported into .tuner/labels.db "
                           "(dataset demo): 0 judgment(s) added, 1 changed, 0 removed; re-import it with "
                           "`tuner labels import data/qrels.txt --replace --dataset-id demo --db .tuner/labels.db "
                           "--format qrels`"), line
    checked = _tuner(root, "check", "experiment.yaml")
    assert checked.returncode == 2 and _error(checked) == line

    fix = re.search(r"`(tuner labels import [^`]+)`", line)[1]
    imported = _tuner(root, *shlex.split(fix)[1:])
    assert imported.returncode == 0, imported.stdout + imported.stderr
    assert "0 added, 1 changed, 0 removed" in imported.stdout

    resumed = _tuner(root, "run", "experiment.yaml", "--n-trials", "1")
    assert resumed.returncode == 2, resumed.stdout + resumed.stderr
    assert re.fullmatch(r"error: study 'before' has 1 trial\(s\) measured on other labels of dataset demo "
                        r"\(fingerprint \w{12}\.\.\., now \w{12}\.\.\.\): their scores are not comparable with new "
                        r"trials; start a new study: give `study:` in experiment\.yaml a new name \(the old study "
                        r"stays readable under its name\), or put the old labels back", _error(resumed))
    applied = _tuner(root, "apply", "experiment.yaml", "--dry-run")  # its best trial was picked on the old labels
    assert applied.returncode == 2 and _error(applied) == _error(resumed)

    exp_path.write_text(exp_path.read_text().replace("study: before", "study: after"))
    fresh = _tuner(root, "run", "experiment.yaml")
    assert fresh.returncode == 0, fresh.stdout + fresh.stderr
    storage = f"sqlite:///{root / '.tuner' / 'optuna.db'}"
    (trial,) = optuna.load_study(study_name="after", storage=storage).trials
    (old,) = optuna.load_study(study_name="before", storage=storage).trials
    assert trial.params == old.params  # the same config (the baseline) ...
    assert not trial.user_attrs.get("cache_hit")  # ... measured again, not read from the old grades' cache
