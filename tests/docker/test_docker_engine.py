"""DockerTarget against a real Docker engine and the repository's compose.yaml.

The backend image is built from the local base image (no registry), brought up with
compose v2 under a throw-away project name, and restarted through the docker SDK.
Skips without an engine; fails instead under TUNER_REQUIRE_INTEGRATION=1 (CI).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from docker_stack import ComposeStack, build_images

import docker
from tuner.config.configpatch import patch_text
from tuner.config.target import DockerConfig
from tuner.errors import BackendExited, ConfigError, TargetError
from tuner.files import atomic_write
from tuner.targets.docker import DockerTarget
from tuner.targets.health import wait_healthy

pytestmark = [pytest.mark.integration, pytest.mark.slow]


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory, docker_engine: None) -> Iterator[ComposeStack]:
    build_images(["backend"])
    s = ComposeStack.create(tmp_path_factory.mktemp("compose"))
    try:
        s.up("backend")
        wait_healthy(f"{s.backend_url}/health", deadline_s=120)
        yield s
    finally:
        s.down()


@pytest.fixture
def original_config(stack: ComposeStack) -> Iterator[bytes]:
    """The test may break the config; afterwards it is put back and the backend is healthy."""
    original = stack.config_path.read_bytes()
    yield original
    if stack.config_path.read_bytes() != original:
        atomic_write(stack.config_path, original)
    with make_target(stack) as t:
        t.restart()
    wait_healthy(f"{stack.backend_url}/health", deadline_s=60)


def make_target(stack: ComposeStack, service: str = "backend", **cfg: object) -> DockerTarget:
    config = DockerConfig(service=service, project=stack.project, stop_timeout_s=5, **cfg)  # type: ignore[arg-type]
    return DockerTarget(config, config_files=[stack.config_path])


def patch_config(path: Path, values: dict[str, object]) -> None:
    """What the tuner does to the host file: a round-trip patch, written atomically
    (a new inode, which the container sees after its restart re-binds the mount)."""
    atomic_write(path, patch_text(path.read_text(), values, str(path)).encode())


def admin_config(stack: ComposeStack) -> dict:
    return httpx.get(f"{stack.backend_url}/admin/config", timeout=10).json()


def test_restart_applies_a_changed_config(stack: ComposeStack, original_config: bytes) -> None:
    before = admin_config(stack)["fusion"]["rrf_k"]
    wanted = before + 17
    patch_config(stack.config_path, {"fusion.rrf_k": wanted, "confidence.threshold": 0.25})
    with make_target(stack) as target:
        target.start()
        target.restart()
        wait_healthy(f"{stack.backend_url}/health", deadline_s=60, target=target)
        assert target.failure() is None
    seen = admin_config(stack)
    assert seen["fusion"]["rrf_k"] == wanted
    assert seen["confidence"]["threshold"] == 0.25
    # The restart is a restart: same container, new start time.
    client = docker.from_env()
    [container] = client.containers.list(filters={"label": f"com.docker.compose.project={stack.project}"})
    assert container.attrs["State"]["Health"]["Status"] == "healthy"
    client.close()


def test_config_that_makes_the_container_exit_is_reported_with_code_and_error(
    stack: ComposeStack, original_config: bytes
) -> None:
    patch_config(stack.config_path, {"fusion.rrf_k": -3})
    with make_target(stack) as target:
        t0 = time.monotonic()
        with pytest.raises(BackendExited) as err:
            target.restart()
        elapsed = time.monotonic() - t0
        reason = target.failure()
    msg = str(err.value)
    # The backend's own one-line error says which key broke; exit code 2 is its config-error code.
    assert "exited (exit code 2)" in msg and "rrf_k" in msg, msg
    assert reason is not None and "exit code 2" in reason and "rrf_k" in reason
    # Noticed when it happened, not at the health deadline.
    assert elapsed < make_target(stack).config.health_deadline_s / 4
    # Only this run's log lines: the earlier healthy runs' "ready" lines are not quoted.
    assert "ready:" not in msg


def test_crash_loop_under_a_restart_policy_is_reported(stack: ComposeStack, original_config: bytes) -> None:
    client = docker.from_env()
    [container] = client.containers.list(filters={"label": f"com.docker.compose.project={stack.project}"})
    container.update(restart_policy={"Name": "on-failure", "MaximumRetryCount": 20})
    try:
        patch_config(stack.config_path, {"fusion.weights": {"bm25": -1.0, "dense": 1.0}})
        with make_target(stack, wait_container_health=False) as target:
            target.restart()
            with pytest.raises(BackendExited) as err:
                wait_healthy(f"{stack.backend_url}/health", deadline_s=60, target=target)
        assert "restarting in a loop" in str(err.value) or "exited" in str(err.value)
        assert "exit code 2" in str(err.value) and "weights" in str(err.value)
    finally:
        container.update(restart_policy={"Name": "no", "MaximumRetryCount": 0})
        client.close()


def test_unknown_service_lists_the_services_that_exist(stack: ComposeStack) -> None:
    with pytest.raises(TargetError) as err:
        make_target(stack, service="search").restart()
    assert f"compose project '{stack.project}' has no containers for service 'search'" in str(err.value)
    assert "(its services: backend)" in str(err.value)


def test_config_file_that_is_not_mounted_is_refused(stack: ComposeStack, tmp_path: Path) -> None:
    elsewhere = tmp_path / "config.yaml"
    elsewhere.write_bytes(stack.config_path.read_bytes())
    target = DockerTarget(DockerConfig(service="backend", project=stack.project), config_files=[elsewhere])
    with pytest.raises(ConfigError, match="is not bind-mounted into container"):
        target.restart()
    target.close()


def test_start_starts_a_stopped_service_and_stop_stops_only_that(stack: ComposeStack, original_config: bytes) -> None:
    client = docker.from_env()
    [container] = client.containers.list(filters={"label": f"com.docker.compose.project={stack.project}"})
    with make_target(stack) as running:
        running.start()  # already running: nothing to stop on close
    container.reload()
    assert container.status == "running"

    container.stop(timeout=2)
    target = make_target(stack)
    target.start()
    container.reload()
    assert container.status == "running"
    target.close()
    container.reload()
    assert container.status == "exited"
    client.close()


def test_engine_endpoint_in_the_unreachable_error(monkeypatch: pytest.MonkeyPatch, stack: ComposeStack) -> None:
    monkeypatch.setenv("DOCKER_HOST", "tcp://127.0.0.1:1")
    with pytest.raises(TargetError) as err:
        make_target(stack).restart()
    assert "DOCKER_HOST=tcp://127.0.0.1:1" in str(err.value) and "`docker info`" in str(err.value)
