"""A real study with `apply: docker` and `target.reload: {signal: SIGHUP}`: every trial
patches the host config and the tuner reloads the backend's container through the
engine (the container is never restarted), confirmed by the config fingerprint; each
trial is checked through the container's GET /admin/config at its evaluation.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import optuna
import pytest
from docker_stack import build_images, write_queries
from optuna.trial import TrialState
from support.reference_experiment import DROP, write_reference_experiment
from test_docker_reload import DIR_COMPOSE, DirStack, running
from test_docker_study import ContainerProbe, _started_at

from tuner.config.experiment import load_experiment
from tuner.ops.run import run_experiment
from tuner.study.trial.attrs import ATTR_APPLIED, assignment_of

pytestmark = [pytest.mark.integration, pytest.mark.slow]
optuna.logging.set_verbosity(optuna.logging.WARNING)

SPACE = """\
params:
  fusion.rrf_k: {type: int, low: 1, high: 200}
"""


@pytest.fixture(scope="module")
def study_run(tmp_path_factory: pytest.TempPathFactory, docker_engine: None) -> Iterator[dict[str, Any]]:
    images = build_images(["backend"])
    stack = DirStack.create(tmp_path_factory.mktemp("docker-reload-study"))
    stack.compose_file = stack.root / "compose.yaml"
    stack.compose_file.write_text(DIR_COMPOSE.format(image=images["backend"], config_dir=stack.config_path.parent,
                                                     port=stack.ports["backend"]))
    write_queries(stack.root / "data")
    (stack.root / "space.yaml").write_text(SPACE)
    url = stack.backend_url
    exp_path = write_reference_experiment(
        stack.root, study="docker-reload", n_trials=4, project_root=".", state_dir=".tuner",
        sampler={"type": "tpe", "seed": 3}, timeout_s=600, constraints=[],
        failure_budget={"max_consecutive": 2, "max_total": 2},
        dataset={"dataset_id": "docker-test"},
        target={"apply": "docker", "port": DROP, "process": DROP,
                "docker": {"service": "backend", "project": stack.project, "stop_timeout_s": 5,
                           "health_deadline_s": 60},
                "reload": {"signal": "SIGHUP", "fingerprint": "config_fingerprint",
                           "restart_keys": ["data", "server", "sources.*.k1", "sources.*.b"]},
                "health": {"url": f"{url}/health", "deadline_s": 60}},
        evaluation={"request": {"url": f"{url}/search"}, "concurrency": 2,
                    "response": {"results_path": "results", "doc_id": "doc_id", "score": "score"}},
        search_space="space.yaml",
        shortlist=[{"name": "k20", "fusion.rrf_k": 20}],
    )
    original = stack.config_path.read_bytes()
    with running(stack):
        started_before = _started_at(stack)
        exp = load_experiment(exp_path)
        probe = ContainerProbe(url, stack.project)
        summary = run_experiment(exp, observer=probe)
        study = optuna.load_study(study_name="docker-reload", storage=exp.storage)
        yield {"stack": stack, "summary": summary, "study": study, "probe": probe, "original": original,
               "started_before": started_before}
        probe.client.close()


def test_every_trial_reloaded_the_running_container_on_its_own_config(study_run: dict[str, Any]) -> None:
    trials = study_run["study"].get_trials()
    assert study_run["summary"].error is None
    assert [t.state for t in trials] == [TrialState.COMPLETE] * 4
    assert [t.user_attrs[ATTR_APPLIED] for t in trials] == ["reload"] * 4
    probe = study_run["probe"]
    for t in trials:  # what the container served at the trial's evaluation is the trial's config
        assert probe.config[t.number]["fusion"]["rrf_k"] == assignment_of(t)["fusion.rrf_k"]
    assert probe.config[1]["fusion"]["rrf_k"] == 20
    # one container, never restarted by the trials
    assert set(probe.started_at.values()) == {study_run["started_before"]}


def test_the_original_config_is_back_and_served(study_run: dict[str, Any]) -> None:
    stack = study_run["stack"]
    assert stack.config_path.read_bytes() == study_run["original"]
    served = httpx.get(f"{stack.backend_url}/admin/config", timeout=10).json()
    assert served["fusion"]["rrf_k"] == 60
