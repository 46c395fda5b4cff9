"""The whole compose stack of docs/docker.md on a real engine: backend, the MLflow
tracking server and optuna-dashboard read the stores a study wrote on the host, and
the `distributed` profile's PostgreSQL serves an Optuna study to the dashboard.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import optuna
import pytest
from docker_stack import ComposeStack, build_images

from tuner.report.tracking import MlflowTracker, TrialRecord
from tuner.targets.health import wait_healthy

pytestmark = [pytest.mark.integration, pytest.mark.slow]
optuna.logging.set_verbosity(optuna.logging.WARNING)

STUDY = "stack-study"


def write_host_stores(root: Path) -> dict[str, str]:
    """What `tuner run` leaves on the host: an Optuna study in .tuner/optuna.db and
    MLflow runs in mlruns/ (SQLite + file artifacts at absolute host paths)."""
    study = optuna.create_study(study_name=STUDY, storage=f"sqlite:///{root / '.tuner' / 'optuna.db'}",
                                direction="maximize")
    for x in (0.2, 0.5):
        study.enqueue_trial({"x": x})
        t = study.ask()
        study.tell(t, t.suggest_float("x", 0, 1) * 2)
    tracker = MlflowTracker(f"sqlite:///{root / 'mlruns' / 'mlflow.db'}", STUDY)
    parent = tracker.start_study(STUDY, params={"sampler": "tpe"}, tags={})
    child = tracker.start_trial(0, {"x": 0.2})
    tracker.finish_trial(child, TrialRecord(number=0, state="COMPLETE", params={"x": 0.2}, metrics={"score": 0.4},
                                            config_texts={"config/config.yaml": "fusion:\n  rrf_k: 20\n"}))
    tracker.end_study(status="FINISHED", summary={"best": 0.4})
    return {"parent": parent, "child": child, "experiment_id": tracker.experiment_id}


def wait_http(url: str, deadline_s: float = 120) -> httpx.Response:
    end = time.monotonic() + deadline_s
    last: object = None
    while time.monotonic() < end:
        try:
            r = httpx.get(url, timeout=5)
            if r.status_code == 200:
                return r
            last = r.status_code
        except httpx.TransportError as exc:  # the port proxy resets connections during warm-up
            last = exc
        time.sleep(0.5)
    raise AssertionError(f"{url} did not answer 200 within {deadline_s} s (last: {last!r})")


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory, docker_engine: None) -> Iterator[tuple[ComposeStack, dict[str, str]]]:
    build_images(["backend", "tools", "postgres"])
    s = ComposeStack.create(tmp_path_factory.mktemp("stack"))
    ids = write_host_stores(s.root)
    try:
        s.up()  # the default services: backend, mlflow, optuna-dashboard
        yield s, ids
    finally:
        s.down()


def test_backend_service_is_healthy_on_its_loopback_port(stack: tuple[ComposeStack, dict[str, str]]) -> None:
    s, _ = stack
    body = wait_healthy(f"{s.backend_url}/health", deadline_s=120)
    assert body["corpus_size"] == 60
    ps = s.compose("ps", "--format", "{{.Service}} {{.Ports}}").stdout
    assert f"127.0.0.1:{s.ports['backend']}->8080/tcp" in ps


def test_mlflow_server_shows_the_host_study_runs_and_their_artifacts(stack: tuple[ComposeStack, dict[str, str]]) -> None:
    s, ids = stack
    base = f"http://127.0.0.1:{s.ports['mlflow']}"
    wait_http(f"{base}/health")
    runs = httpx.post(f"{base}/api/2.0/mlflow/runs/search", json={"experiment_ids": [ids["experiment_id"]]},
                      timeout=10).json()["runs"]
    by_id = {r["info"]["run_id"]: r for r in runs}
    assert set(by_id) == {ids["parent"], ids["child"]}
    child_tags = {t["key"]: t["value"] for t in by_id[ids["child"]]["data"]["tags"]}
    assert child_tags["mlflow.parentRunId"] == ids["parent"]
    # The artifact lives at an absolute host path; the server reads it through the
    # second mount of mlruns/ at that path.
    listed = httpx.get(f"{base}/api/2.0/mlflow/artifacts/list", params={"run_id": ids["child"], "path": "config"},
                       timeout=10).json()
    assert [f["path"] for f in listed["files"]] == ["config/config.yaml"]
    text = httpx.get(f"{base}/get-artifact", params={"run_id": ids["child"], "path": "config/config.yaml"}, timeout=10)
    assert text.text == "fusion:\n  rrf_k: 20\n"


def test_optuna_dashboard_lists_the_host_study(stack: tuple[ComposeStack, dict[str, str]]) -> None:
    s, _ = stack
    studies = wait_http(f"http://127.0.0.1:{s.ports['optuna']}/api/studies").json()["study_summaries"]
    [summary] = [st for st in studies if st["study_name"] == STUDY]
    detail = httpx.get(f"http://127.0.0.1:{s.ports['optuna']}/api/studies/{summary['study_id']}", params={"after": 0},
                       timeout=10).json()
    assert [t["values"] for t in detail["trials"]] == [[pytest.approx(2 * 0.2)], [pytest.approx(2 * 0.5)]]


def test_distributed_profile_postgres_serves_a_study_to_the_dashboard(
    stack: tuple[ComposeStack, dict[str, str]],
) -> None:
    s, _ = stack
    s.up("postgres", profiles=["distributed"])
    url = f"postgresql+psycopg2://tuner:tuner@127.0.0.1:{s.ports['postgres']}/optuna"
    end = time.monotonic() + 60
    while True:
        try:
            study = optuna.create_study(study_name="shared", storage=url, load_if_exists=True)
            break
        except Exception:  # noqa: BLE001 - refused / starting up: retry until the deadline
            if time.monotonic() > end:
                raise
            time.sleep(0.5)
    study.optimize(lambda t: t.suggest_float("x", 0, 1), n_trials=3)
    # The dashboard container reaches postgres by its service name on the compose network.
    s.extra_env["OPTUNA_STORAGE"] = "postgresql+psycopg2://tuner:tuner@postgres:5432/optuna"
    s.up("optuna-dashboard")
    end = time.monotonic() + 60
    names: list[str] = []
    while time.monotonic() < end and "shared" not in names:
        try:
            body = httpx.get(f"http://127.0.0.1:{s.ports['optuna']}/api/studies", timeout=5).json()
            names = [st["study_name"] for st in body["study_summaries"]]
        except (httpx.TransportError, ValueError):
            pass
        time.sleep(0.5)
    assert names == ["shared"]
