"""A SIGKILLed `tuner run` leaves no backend behind, and the next run is clean.

The reference backend runs as a process target on a FIXED port, so a backend that
outlived its run would hold the port: the next run's backends could not bind it and
its trials would be measured on the leftover (different params, identical scores).
Two shapes of backend: the server itself (the parent-death signal ends it with the
tuner), and a shell that forks it (the signal ends the shell only; the next start
ends the server from the record in the state dir). Everything lives in tmp dirs.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import httpx
import optuna
import pytest
from e2e.test_study_e2e import PYTHON, demo_data, make_project  # noqa: F401  (demo_data is a fixture)
from mlflow import MlflowClient
from optuna.trial import TrialState

from tuner.config.experiment import free_port, load_experiment
from tuner.report.tracking import INTERRUPTED, TAG_FAIL_REASON, TAG_ROLE, TAG_STUDY, TAG_TRIAL

pytestmark = [
    pytest.mark.slow,
    pytest.mark.integration,
    pytest.mark.skipif(not os.path.isdir("/proc"), reason="finds backend processes in /proc"),
]
optuna.logging.set_verbosity(optuna.logging.WARNING)

STUDY = "killed"
SERVE = "{python} -m fusion_backend serve --config {config} --port {port}"
COMMANDS = {
    "server": ["{python}", "-m", "fusion_backend", "serve", "--config", "{config}", "--port", "{port}"],
    # `; exit $?` keeps the shell from exec'ing the server: the server is its child.
    "shell-wrapped": ["sh", "-c", f"{SERVE}; exit $?"],
}
DEADLINE_S = 120


def backend_processes(config: Path) -> list[int]:
    """Live processes whose command line names ``config`` (the experiment's backends)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes()
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if state != "Z" and str(config).encode() in cmdline:
            found.append(int(entry.name))
    return found


def wait_until(condition: Any, what: str, deadline_s: float = DEADLINE_S) -> None:
    deadline = time.monotonic() + deadline_s
    while not condition():
        assert time.monotonic() < deadline, what
        time.sleep(0.05)


def healthy(url: str) -> bool:
    try:
        return httpx.get(url, timeout=1).status_code == 200
    except httpx.TransportError:
        return False


def tuner(*args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run([PYTHON, "-m", "tuner", *args], capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, "COLUMNS": "200"})


@pytest.fixture(scope="module", params=sorted(COMMANDS))
def killed_then_resumed(request: pytest.FixtureRequest, demo_data: Path,  # noqa: F811
                        tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """SIGKILL a `tuner run` while a trial's backend serves, then run 3 trials more."""
    shape = request.param
    root = tmp_path_factory.mktemp(f"sigkill-{shape}")
    port = free_port()
    exp_path = make_project(root, demo_data, study=STUDY, n_trials=20,
                            target={"port": port, "process": {"command": COMMANDS[shape]}})
    config = root / "backend" / "config.yaml"
    original = config.read_bytes()
    exp = load_experiment(exp_path).bind_port()
    health = exp.target.health.url
    per_backend = 2 if shape == "shell-wrapped" else 1  # the shell and its server

    first = subprocess.Popen([PYTHON, "-m", "tuner", "run", str(exp_path)], stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT, text=True, env={**os.environ, "COLUMNS": "200"})
    try:
        # A trial's config is live: patched, journaled, and its backend serves.
        wait_until(lambda: first.poll() is None and config.read_bytes() != original and exp.journal_path.exists()
                   and len(backend_processes(config)) >= per_backend and healthy(health),
                   "the first run never served a trial's config")
        at_kill = backend_processes(config)
        first.send_signal(signal.SIGKILL)
        first_output, _ = first.communicate(timeout=60)
    finally:
        if first.poll() is None:
            first.kill()
            first.wait()
    # What the killed run left (the shell dies with the tuner, its server does not).
    wait_until(lambda: len(backend_processes(config)) < len(at_kill), "no backend process ended with the tuner", 60)
    left_after_kill = backend_processes(config)
    port_held = healthy(health)
    trials = optuna.load_study(study_name=STUDY, storage=exp.storage).get_trials()
    running = {t.number for t in trials if t.state == TrialState.RUNNING}
    finished = {t.number for t in trials if t.state.is_finished()}

    second = tuner("run", str(exp_path), "--n-trials", "3")
    return {"shape": shape, "root": root, "exp": exp, "config": config, "original": original, "at_kill": at_kill,
            "first_output": first_output, "left_after_kill": left_after_kill, "port_held": port_held,
            "running_at_kill": running, "finished_at_kill": finished, "second": second, "left_at_end": backend_processes(config)}


def test_the_killed_run_left_no_backend_it_could_not_end(killed_then_resumed: dict[str, Any]) -> None:
    run = killed_then_resumed
    assert run["first_output"] is not None and run["at_kill"]
    if run["shape"] == "server":
        # The parent-death signal ended the server with the tuner.
        wait_until(lambda: not backend_processes(run["config"]), "the backend outlived the SIGKILLed tuner", 60)
        assert run["left_after_kill"] == [] and not run["port_held"]
    else:
        # The shell's server outlived the tuner and held the fixed port: the next start's job.
        assert run["left_after_kill"] and run["port_held"]


def test_the_next_run_ends_the_leftover_and_measures_its_own_backend(killed_then_resumed: dict[str, Any]) -> None:
    run = killed_then_resumed
    second = run["second"]
    assert second.returncode == 0, second.stdout + second.stderr
    assert "address already in use" not in (second.stdout + second.stderr).lower()
    assert not set(run["left_after_kill"]) & set(run["left_at_end"])
    assert run["left_at_end"] == [], "a backend outlived the second run"
    assert run["config"].read_bytes() == run["original"]
    assert not run["exp"].journal_path.exists()
    assert not (run["exp"].state_dir / "backend.pid").exists()

    trials = optuna.load_study(study_name=STUDY, storage=run["exp"].storage).get_trials()
    assert run["running_at_kill"], "the killed run left no running trial behind"
    stale = [t for t in trials if t.number in run["running_at_kill"]]
    assert all(t.state == TrialState.FAIL and t.user_attrs["fail_reason"].startswith("stale") for t in stale)
    assert not [t for t in trials if t.state == TrialState.RUNNING]
    before = run["finished_at_kill"] | run["running_at_kill"]
    after = [t for t in trials if t.state.is_finished() and t.number not in before]
    assert len(after) == 3 and all(t.state == TrialState.COMPLETE for t in after), [t.state for t in after]
    # Different params measured on the run's own backend score differently (a leftover
    # backend serving every trial would score them all the same).
    assert len({repr(t.params) for t in after}) == 3
    assert len({t.value for t in after}) > 1, [t.value for t in after]


def test_the_killed_trials_mlflow_run_is_closed_as_failed(killed_then_resumed: dict[str, Any]) -> None:
    """Needs tuner.ops.run to call tracker.close_stale_runs(study, live_trials=set()) at start."""
    run = killed_then_resumed
    client = MlflowClient(run["exp"].tracking.mlflow_uri)
    experiment = client.get_experiment_by_name(STUDY)
    runs = client.search_runs([experiment.experiment_id], f"tags.`{TAG_STUDY}` = '{STUDY}'")
    assert not [r for r in runs if r.info.status == "RUNNING"], [
        (r.data.tags.get(TAG_ROLE), r.data.tags.get(TAG_TRIAL)) for r in runs if r.info.status == "RUNNING"]
    stale = run["running_at_kill"]
    by_trial = {int(r.data.tags[TAG_TRIAL]): r for r in runs if r.data.tags.get(TAG_ROLE) == "trial"}
    # The trial being measured had its run; a pipelined next trial, begun while it was
    # measured, may have been killed before its run was started (then it has none).
    assert min(stale) in by_trial
    for number in stale & set(by_trial):
        assert by_trial[number].info.status == "FAILED"
        assert by_trial[number].data.tags[TAG_FAIL_REASON] == INTERRUPTED
    parents = [r for r in runs if r.data.tags.get(TAG_ROLE) == "study"]
    assert len(parents) == 1 and parents[0].info.status == "FINISHED"
