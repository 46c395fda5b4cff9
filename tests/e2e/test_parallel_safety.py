"""Two processes on one study or one config file: the second is refused before it
touches anything, read-only commands leave a live run's journal and config alone, and
the live run ends exactly as if it had been alone (n_trials kept, config restored)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import optuna
import pytest
from optuna.trial import TrialState
from support.reference_experiment import dump_experiment, reference_experiment

from e2e.test_study_e2e import demo_data, make_project  # noqa: F401  (module fixture reused)
from tuner.config.experiment import load_experiment

PYTHON = sys.executable
pytestmark = [pytest.mark.slow, pytest.mark.integration]


def _tuner(*args: str, timeout: float = 180) -> subprocess.CompletedProcess[str]:
    return subprocess.run([PYTHON, "-m", "tuner", *args], capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, "COLUMNS": "200"})


def test_a_second_run_apply_or_other_experiment_is_refused_while_a_run_patches(demo_data: Path,  # noqa: F811
                                                                               tmp_path: Path) -> None:
    exp_path = make_project(tmp_path, demo_data, study="live", n_trials=200)  # stopped by SIGTERM below
    config = tmp_path / "backend" / "config.yaml"
    original = config.read_bytes()
    exp = load_experiment(exp_path)
    # Another experiment (own study, own state dir) patching the same config file.
    other = tmp_path / "other.yaml"
    other.write_text(dump_experiment(reference_experiment(study="other", n_trials=2, state_dir=".tuner-other")))
    run = subprocess.Popen([PYTHON, "-m", "tuner", "run", str(exp_path)], stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT, text=True, env={**os.environ, "COLUMNS": "200"})
    try:
        deadline = time.monotonic() + 180
        while config.read_bytes() == original or not exp.journal_path.exists():
            assert run.poll() is None, run.stdout.read() if run.stdout else ""
            assert time.monotonic() < deadline, "the study never patched the config"
            time.sleep(0.05)
        journal = exp.journal_path.read_bytes()

        second = _tuner("run", str(exp_path))
        assert second.returncode == 2, second.stdout + second.stderr
        line = second.stderr.strip()
        assert "\n" not in line and f"study 'live' is locked by tuner run (pid {run.pid} on" in line, line
        assert "tuner worker" in line

        elsewhere = _tuner("run", str(other))
        assert elsewhere.returncode == 2, elsewhere.stdout + elsewhere.stderr
        assert f"config file {config} is locked by tuner run (pid {run.pid}" in elsewhere.stderr

        applied = _tuner("apply", str(exp_path))
        assert applied.returncode == 2 and "is locked by tuner run" in applied.stderr, applied.stderr

        # `tuner check` would start a backend on the trial's config: refused, naming the run
        checked = _tuner("check", str(exp_path))
        assert checked.returncode == 2 and f"is locked by tuner run (pid {run.pid}" in checked.stderr, checked.stderr

        # read-only: whatever it prints, it must not replay the live journal
        _tuner("apply", str(exp_path), "--dry-run")
        _tuner("best", str(exp_path))
        assert run.poll() is None, "the live run ended before the checks were done"
        assert exp.journal_path.exists() and exp.journal_path.read_bytes() == journal
        run.send_signal(signal.SIGTERM)
        output, _ = run.communicate(timeout=600)
    finally:
        if run.poll() is None:
            run.kill()
            run.wait()
    assert run.returncode == 143, output
    assert config.read_bytes() == original and not exp.journal_path.exists()
    study = optuna.load_study(study_name="live", storage=exp.storage)
    trials = study.get_trials()
    assert trials and all(t.state != TrialState.RUNNING for t in trials)
    # every finished trial was measured by the one run: no duplicate of a parameter set
    # from a second sampler, no trial failed by someone else's restore
    assert not [t for t in trials if "stale" in str(t.user_attrs.get("fail_reason", ""))]
    assert [t.user_attrs.get("variant") for t in trials].count("baseline") == 1
    # the refused run created nothing: no second study, no journal of its own
    assert optuna.get_all_study_names(exp.storage) == ["live"]
    assert not (tmp_path / ".tuner-other" / "restore-journal.json").exists()
