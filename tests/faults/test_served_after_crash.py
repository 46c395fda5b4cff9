"""What the backend serves after a SIGKILLed run: the next start's preflight must be
answered on the config file as found (the restored original), by the config
fingerprint the backend reports.

- sigkill-runner-served: `tuner run` (process target, the fault backend) is killed
  mid-trial; the backend life that answers the next run's first search serves the file.
- sigkill-docker-runner-served (tests/docker's compose stack and the reference backend):
  the same with ``apply: docker``, where the container outlives the killed run on the
  trial's config; the next run's preflight batch must not be answered on it.
"""

from __future__ import annotations

import signal
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest

from faults.faultlib import Calibration, Damage, FaultLog, Project, assert_survived, assess, judge, wait_until
from faults.test_apply_crash import searched, served_damage, sha, starts

pytestmark = [pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]


# ---------------------------------------------------------------- sigkill-runner-served


def test_the_next_run_s_preflight_is_served_the_file_after_a_killed_run(
        tmp_path: Path, calibration: Calibration, fault_log: FaultLog) -> None:
    project = Project.create(tmp_path / "served", study="served", n_trials=20)
    journal = project.root / "state" / "restore-journal.json"
    first = project.start("run", "--no-cache")
    try:
        # A trial's config is live: patched, journaled, and a life serving it has searched.
        def trial_served() -> bool:
            lives = {e["life"] for e in starts(project) if e["depth"] != 4}
            return project.config.read_bytes() != project.original and journal.exists() and any(
                searched(project, life) for life in lives)

        wait_until(lambda: trial_served() or not first.alive(), "the run served a trial's config")
        assert first.alive(), first.wait().output
        first.send_signal(signal.SIGKILL)
        first.wait()
    finally:
        first.kill_quietly()
    patched_at_kill = project.config.read_bytes() != project.original
    lives_before = project.lives()
    second = project.tuner("run", "--no-cache", "--n-trials", "1")
    after = [e for e in project.events() if e["life"] > lives_before]
    first_search = next((e for e in after if e["event"] == "search"), None)
    preflight_life = next((e for e in after if e["event"] == "start" and first_search
                           and e["life"] == first_search["life"]), None)
    damage = assess(project, calibration)
    damage.served += served_damage("the next run's preflight",
                                   preflight_life.get("config_fingerprint") if preflight_life else None,
                                   project.original)
    record = fault_log.add(judge("sigkill-runner-served", damage, {
        "the kill left a trial's config": patched_at_kill,
        "the next run exit 0": second.returncode == 0,
        "it said what it replayed": "replayed the restore journal " in second.stdout
        and "left by tuner run of study 'served'" in second.stdout,
    }))
    assert_survived(record)


# ---------------------------------------------------------------- sigkill-docker-runner-served


def _docker_stack() -> Any:
    sys.path.insert(0, str(REPO / "tests" / "docker"))
    import docker_stack

    return docker_stack


def test_the_next_docker_run_s_preflight_is_served_the_file_after_a_killed_run(
        tmp_path: Path, fault_log: FaultLog, monkeypatch: pytest.MonkeyPatch, docker_engine: None) -> None:
    """The container outlives the SIGKILLed run, serving the trial's config; the next
    run's preflight batch must be answered on the restored original."""
    import subprocess

    from support.reference_experiment import DROP, write_reference_experiment

    import tuner.evaluation
    from tuner.config.experiment import load_experiment
    from tuner.ops.run import run_experiment
    from tuner.study.loop import StudyObserver
    from tuner.targets.health import wait_healthy

    ds = _docker_stack()
    ds.build_images(["backend"])
    stack = ds.ComposeStack.create(tmp_path / "stack")
    ds.write_queries(stack.root / "data")
    (stack.root / "space.yaml").write_text("params:\n  fusion.rrf_k: {type: int, low: 1, high: 200}\n")
    url = stack.backend_url
    exp_path = write_reference_experiment(
        stack.root, study="docker-served", n_trials=30, project_root=".", state_dir=".tuner",
        sampler={"type": "random", "seed": 3}, timeout_s=600, constraints=[],
        dataset={"dataset_id": "docker-test"},
        target={"apply": "docker", "port": DROP, "process": DROP,
                "docker": {"service": "backend", "project": stack.project, "stop_timeout_s": 5,
                           "health_deadline_s": 60},
                "health": {"url": f"{url}/health", "deadline_s": 60}},
        evaluation={"request": {"url": f"{url}/search"}, "concurrency": 2,
                    "response": {"results_path": "results", "doc_id": "doc_id", "score": "score"}},
        search_space="space.yaml", tracking={"enabled": False},
    )
    config = stack.config_path
    original = config.read_bytes()
    exp = load_experiment(exp_path)

    def served() -> str | None:
        try:
            return str(httpx.get(f"{url}/health", timeout=5).json().get("config_fingerprint"))
        except (httpx.HTTPError, ValueError):
            return None

    try:
        stack.up("backend")
        wait_healthy(f"{url}/health", deadline_s=120)
        first = subprocess.Popen([sys.executable, "-m", "tuner", "run", str(exp_path), "--no-cache"],
                                 cwd=stack.root, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            # The container serves a trial's config (patched file, journal, its fingerprint).
            wait_until(lambda: first.poll() is not None or (
                exp.journal_path.exists() and config.read_bytes() != original
                and served() == sha(config.read_bytes())), "the run served a trial's config", 300)
            assert first.poll() is None, "the first run ended before it served a trial's config"
            first.send_signal(signal.SIGKILL)
            first.wait(timeout=60)
        finally:
            if first.poll() is None:
                first.kill()
                first.wait()
        left_serving = served()
        kill_left_trial = left_serving is not None and left_serving != sha(original)

        # What the next run's preflight batch is answered on: the fingerprint served as it begins.
        seen: list[str | None] = []
        real = tuner.evaluation.run_batch

        def probed(*args: Any, **kwargs: Any) -> Any:
            if not seen:
                seen.append(served())
            return real(*args, **kwargs)

        monkeypatch.setattr(tuner.evaluation, "run_batch", probed)
        monkeypatch.chdir(stack.root)
        notes: list[str] = []

        class Notes(StudyObserver):
            def note(self, text: str) -> None:
                notes.append(text)
                print(text)

        summary = run_experiment(load_experiment(exp_path), n_trials=1, use_cache=False, observer=Notes())
        restarted = [n for n in notes if n.startswith("restarting the backend (") and "before the preflight" in n]
        damage = Damage(patched=[str(config)] if config.read_bytes() != original else [],
                        served=served_damage("the next run's preflight", seen[0] if seen else None, original))
        damage.served += served_damage("after the next run", served(), config.read_bytes())
        record = fault_log.add(judge("sigkill-docker-runner-served", damage, {
            "the killed run left the container serving a trial's config": kill_left_trial,
            "the next run replayed the journal": bool(summary.recovered) and not exp.journal_path.exists(),
            "the next run ended cleanly": summary.error is None,
            "it said why it restarted the container first": len(restarted) == 1
            and "a restore journal was replayed" in restarted[0],
        }))
        assert_survived(record)
    finally:
        stack.down()
