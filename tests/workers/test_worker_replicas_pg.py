"""`tuner worker` processes on one PostgreSQL study, each driving its own reference
backend replica (process target, own config copy and port): the real trial loop.

One scenario covers the clean and the crash path: two workers start; replica 0 is
SIGKILLed while its backend runs on a trial's config. Its trial is retried (same
params) by replica 1, which completes the study and exits cleanly; the killed
worker's reaper stops its backend and restores its config; afterwards both replica
configs equal the original byte for byte and no backend process is left.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import optuna
import pytest
from optuna.trial import TrialState
from support.workers import retries_of

from tuner.ops.demo import write_backend_config
from tuner.study.storage.study_storage import ATTR_REPLICA
from tuner.study.trial.attrs import assignment_of
from workers.replica_setup import write_experiment

REPO = Path(__file__).resolve().parents[2]

@pytest.fixture(scope="module")
def demo_data(tmp_path_factory):
    from support.demo_data import copy_demo_data

    data = tmp_path_factory.mktemp("demo") / "data"
    copy_demo_data(data)
    return data


@pytest.fixture
def experiment(pg_dsn, demo_data, tmp_path, request):
    from tuner.dburl import sqlalchemy_url

    n_trials = getattr(request, "param", 5)
    (tmp_path / "data").symlink_to(demo_data)
    config = tmp_path / "backend" / "config.yaml"
    write_backend_config(REPO / "backend" / "config.yaml", config, tmp_path / "data" / "corpus.jsonl")
    name = f"replicas-{uuid.uuid4().hex[:10]}"
    path = write_experiment(tmp_path, study=name, storage=sqlalchemy_url(pg_dsn), n_trials=n_trials)
    yield path, name, sqlalchemy_url(pg_dsn), config
    try:
        optuna.delete_study(study_name=name, storage=sqlalchemy_url(pg_dsn))
    except KeyError:
        pass


def start(exp: Path, replica: int) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "tuner", "worker", str(exp), "--replica", str(replica),
           "--heartbeat", "1", "--grace", "3"]
    return subprocess.Popen(cmd, cwd=exp.parent, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def finish(proc: subprocess.Popen, timeout: float = 300) -> str:
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate()
        pytest.fail(f"worker did not finish; stderr:\n{err[-3000:]}")
    assert proc.returncode == 0, f"worker exited {proc.returncode}:\n{err[-3000:]}"
    return err


def backends_running(root: Path) -> list[str]:
    """Command lines of live processes that serve a config under ``root``."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmd = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        if "fusion_backend" in cmd and str(root) in cmd:
            found.append(cmd)
    return found


def replica_config(config: Path, n: int) -> Path:
    return config.with_name(f"{config.stem}.replica-{n}{config.suffix}")


@pytest.mark.parametrize("experiment", [5], indirect=True)
@pytest.mark.slow
def test_sigkilled_worker_trial_is_retried_and_its_backend_reaped(experiment):
    exp, name, storage, config = experiment
    original = config.read_bytes()
    victim, survivor = start(exp, 0), start(exp, 1)
    study = None
    deadline = time.monotonic() + 180
    killed = None
    while time.monotonic() < deadline:
        patched = replica_config(config, 0).exists() and replica_config(config, 0).read_bytes() != original
        if patched:
            study = study or optuna.load_study(study_name=name, storage=storage)
            running = [t for t in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,))
                       if t.system_attrs.get(ATTR_REPLICA) == 0]
            if running:
                os.kill(victim.pid, signal.SIGKILL)
                killed = running[0].number
                break
        time.sleep(0.1)
    assert killed is not None, "replica 0 never got a trial on a patched config"
    victim.wait(timeout=10)
    finish(survivor)

    trials = {t.number: t for t in optuna.load_study(study_name=name, storage=storage).get_trials(deepcopy=False)}
    assert trials[killed].state == TrialState.FAIL
    (retry,) = retries_of(list(trials.values()))[killed]
    assert trials[retry].state == TrialState.COMPLETE and trials[retry].system_attrs[ATTR_REPLICA] == 1
    # The retry ran the killed trial's draw (its params, plus the applied values recorded as
    # params when it completed) and the same assignment.
    drawn = trials[killed].params
    assert drawn and {k: trials[retry].params[k] for k in drawn} == drawn
    killed_assignment = assignment_of(trials[killed])
    assert killed_assignment and all(assignment_of(trials[retry])[k] == v for k, v in killed_assignment.items())
    assert sum(t.state == TrialState.COMPLETE for t in trials.values()) >= 5
    assert [t.number for t in trials.values() if t.state not in (TrialState.COMPLETE, TrialState.FAIL)] == []
    # Queued once (a retry of a killed baseline trial carries its variant too).
    assert sum(t.user_attrs.get("variant") == "baseline" for t in trials.values()
               if "failed_trial" not in t.system_attrs) == 1
    assert config.read_bytes() == original  # workers never patch the original
    # The reaper of the killed worker stopped its backend and restored its config.
    deadline = time.monotonic() + 30
    while backends_running(exp.parent) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert backends_running(exp.parent) == []
    assert replica_config(config, 0).read_bytes() == original
    assert replica_config(config, 1).read_bytes() == original


@pytest.mark.parametrize("experiment", [6], indirect=True)
@pytest.mark.slow
def test_tuner_workers_starts_count_replicas_that_share_one_study_total(experiment):
    """`tuner workers --count 2`: both replicas run trials of one study through the one
    loop (MLflow child runs included), n_trials is a study total overshot by at most
    the trials running when it was reached, no backend is left and no config patched."""
    from mlflow import MlflowClient

    from tuner.config.experiment import load_experiment
    from tuner.report.tracking import TAG_STUDY

    exp, name, storage, config = experiment
    original = config.read_bytes()
    text = exp.read_text()
    assert text.count("enabled: false") == 1  # tracking off in the shared shape; on here
    exp.write_text(text.replace("enabled: false", "enabled: true"))
    proc = subprocess.run([sys.executable, "-m", "tuner", "workers", str(exp), "--count", "2"], cwd=exp.parent,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "exit codes [0, 0]" in proc.stderr
    trials = optuna.load_study(study_name=name, storage=storage).get_trials(deepcopy=False)
    finished = [t for t in trials if t.state.is_finished()]
    assert 6 <= len(finished) <= 6 + 1 and not [t for t in trials if t.state == TrialState.RUNNING]
    assert {t.system_attrs.get(ATTR_REPLICA) for t in finished} == {0, 1}
    assert sum(t.user_attrs.get("variant") == "baseline" for t in trials) == 1
    # a parallel sweep is visible in MLflow: one parent, a finished child run per trial
    loaded = load_experiment(exp)
    client = MlflowClient(loaded.tracking.mlflow_uri)
    mlexp = client.get_experiment_by_name(loaded.tracking.experiment_name)
    runs = client.search_runs([mlexp.experiment_id], filter_string=f"tags.`{TAG_STUDY}` = '{name}'")
    children = [r for r in runs if r.data.tags.get("tuner.role") != "study"]
    assert len(children) == len(finished) and all(r.info.status == "FINISHED" for r in children)
    assert backends_running(exp.parent) == []
    assert config.read_bytes() == original
    assert replica_config(config, 0).read_bytes() == original
    assert replica_config(config, 1).read_bytes() == original
