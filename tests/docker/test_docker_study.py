"""A real study with `apply: docker`: every trial patches the host config, restarts the
backend container of a compose project on a real engine, and is checked through the
container's GET /admin/config. One queued trial writes a config the backend refuses:
the container exits, the trial fails with the container's reason, the study goes on,
and the original config is back (and live) at the end.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import optuna
import pytest
from docker_stack import ComposeStack, build_images, write_queries
from optuna.trial import TrialState
from support.reference_experiment import DROP, write_reference_experiment

import docker
from tuner.config.experiment import load_experiment
from tuner.ops.run import run_experiment
from tuner.study.loop import StudyObserver
from tuner.study.trial.attrs import ATTR_FAIL_REASON, ATTR_VARIANT
from tuner.targets.health import wait_healthy

pytestmark = [pytest.mark.integration, pytest.mark.slow]
optuna.logging.set_verbosity(optuna.logging.WARNING)

BROKEN_K = -3  # the backend's config model requires fusion.rrf_k >= 0: it exits with code 2

SPACE = """\
params:
  fusion.rrf_k: {type: int, low: -5, high: 200}
"""


class ContainerProbe(StudyObserver):
    """At each trial's evaluation: what the backend runs on, and since when the container runs."""

    def __init__(self, url: str, project: str) -> None:
        self.url = url
        self.project = project
        self.config: dict[int, dict[str, Any]] = {}
        self.started_at: dict[int, str] = {}
        self.client = docker.from_env()

    def phase(self, number: int, phase: str) -> None:
        if phase == "evaluate":
            self.config[number] = httpx.get(f"{self.url}/admin/config", timeout=10).json()
            [c] = self.client.containers.list(filters={"label": f"com.docker.compose.project={self.project}"})
            self.started_at[number] = c.attrs["State"]["StartedAt"]


def write_experiment(root: Path, project: str, url: str) -> Path:
    return write_reference_experiment(
        root, study="docker-study", n_trials=3, project_root=".", state_dir=".tuner",
        sampler={"type": "tpe", "seed": 1}, timeout_s=600,
        constraints=[],  # this test is about restarts; the OOS early stop would end trials early
        failure_budget={"max_consecutive": 2, "max_total": 2},
        dataset={"dataset_id": "docker-test"},
        target={"apply": "docker", "port": DROP, "process": DROP,
                "docker": {"service": "backend", "project": project, "stop_timeout_s": 5, "health_deadline_s": 60},
                "health": {"url": f"{url}/health", "deadline_s": 60}},
        evaluation={"request": {"url": f"{url}/search"}, "concurrency": 2,
                    "response": {"results_path": "results", "doc_id": "doc_id", "score": "score"}},
        search_space="space.yaml",
        shortlist=[{"name": "k20", "fusion.rrf_k": 20}, {"name": "broken", "fusion.rrf_k": BROKEN_K}],
    )


@pytest.fixture(scope="module")
def study_run(tmp_path_factory: pytest.TempPathFactory, docker_engine: None) -> Iterator[dict[str, Any]]:
    build_images(["backend"])
    stack = ComposeStack.create(tmp_path_factory.mktemp("docker-study"))
    write_queries(stack.root / "data")
    (stack.root / "space.yaml").write_text(SPACE)
    exp_path = write_experiment(stack.root, stack.project, stack.backend_url)
    original = stack.config_path.read_bytes()
    try:
        stack.up("backend")
        wait_healthy(f"{stack.backend_url}/health", deadline_s=120)
        started_before = _started_at(stack)
        exp = load_experiment(exp_path)
        probe = ContainerProbe(stack.backend_url, stack.project)
        summary = run_experiment(exp, observer=probe)
        study = optuna.load_study(study_name="docker-study", storage=exp.storage)
        yield {"stack": stack, "exp": exp, "summary": summary, "study": study, "probe": probe,
               "original": original, "started_before": started_before}
        probe.client.close()
    finally:
        stack.down()


def _started_at(stack: ComposeStack) -> str:
    client = docker.from_env()
    [c] = client.containers.list(filters={"label": f"com.docker.compose.project={stack.project}"})
    client.close()
    return str(c.attrs["State"]["StartedAt"])


def test_each_good_trial_ran_on_its_config_in_a_freshly_restarted_container(study_run: dict[str, Any]) -> None:
    trials = study_run["study"].get_trials()
    assert [t.user_attrs.get(ATTR_VARIANT) for t in trials] == ["baseline", "k20", "broken"]
    assert [t.state for t in trials[:2]] == [TrialState.COMPLETE, TrialState.COMPLETE]
    probe = study_run["probe"]
    assert sorted(probe.config) == [0, 1]  # the broken trial never reached its evaluation
    assert probe.config[0]["fusion"]["rrf_k"] == 60  # baseline = backend/config.yaml's value
    assert probe.config[1]["fusion"]["rrf_k"] == 20
    # Every evaluated trial ran in a container started after the previous one.
    starts = [study_run["started_before"], probe.started_at[0], probe.started_at[1]]
    assert starts == sorted(starts) and len(set(starts)) == 3


def test_the_trial_whose_config_kills_the_container_fails_with_its_reason(study_run: dict[str, Any]) -> None:
    broken = study_run["study"].get_trials()[2]
    assert broken.state == TrialState.FAIL
    reason = broken.user_attrs[ATTR_FAIL_REASON]
    assert "exited (exit code 2)" in reason and "rrf_k" in reason and str(BROKEN_K) in reason
    assert study_run["summary"].error is None  # within the failure budget: the study went on


def test_original_config_is_back_and_live(study_run: dict[str, Any]) -> None:
    stack = study_run["stack"]
    assert stack.config_path.read_bytes() == study_run["original"]
    health = httpx.get(f"{stack.backend_url}/health", timeout=10)
    assert health.status_code == 200
    assert httpx.get(f"{stack.backend_url}/admin/config", timeout=10).json()["fusion"]["rrf_k"] == 60
    # The restore restarted the container after the broken trial left it exited.
    assert _started_at(stack) > study_run["probe"].started_at[1]
    assert not study_run["exp"].journal_path.exists()
