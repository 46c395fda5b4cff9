"""Reloading a compose service without a restart: the signal sent through the engine to
every container of the service, the fingerprint confirmed, and the single-file bind
mount that would hide the new config refused at start.

The first tests use the in-memory engine of test_docker_target_logic.py; the others a
real engine (skipped without one; failed instead under TUNER_REQUIRE_INTEGRATION=1):
the reference backend with its config directory mounted (reloads), and the repository's
compose.yaml, which mounts the config file alone (refused; and the confirmation
catches the old config it would serve).
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
from docker_stack import ComposeStack, build_images
from test_docker_target_logic import FakeEngine, box

from tuner.config.configpatch import ConfigPatcher
from tuner.config.target import DockerConfig, HealthConfig, ReloadConfig
from tuner.errors import ConfigError, TargetError
from tuner.targets.docker import DockerTarget, file_mounts
from tuner.targets.docker_engine import ContainerState
from tuner.targets.health import wait_healthy
from tuner.targets.reload import ConfigApplier

CONFIG = Path("/srv/cfg/config.yaml")


def fake_target(engine: FakeEngine, *, reloads: bool) -> DockerTarget:
    return DockerTarget(DockerConfig(service="backend", project="proj"), config_files=[CONFIG], api=engine,
                        reloads=reloads)


# ---------------------------------------------------------------- in-memory engine


def test_a_signal_goes_to_every_running_container_of_the_service() -> None:
    engine = FakeEngine(("proj", box("a")), ("proj", box("b")), ("proj", box("c", status="exited")),
                        ("proj", box("m", "mlflow")))
    fake_target(engine, reloads=True).send_signal("SIGHUP")
    assert engine.calls == [("kill SIGHUP", "a"), ("kill SIGHUP", "b")]


def test_a_signal_with_no_running_container_is_an_error() -> None:
    engine = FakeEngine(("proj", box("a", status="exited")))
    with pytest.raises(TargetError, match="cannot send SIGHUP: no container of service 'backend'"):
        fake_target(engine, reloads=True).send_signal("SIGHUP")


def test_a_reload_target_refuses_a_config_mounted_as_a_single_file() -> None:
    single = box("a", mounts=((str(CONFIG), "/config/config.yaml"),))
    with pytest.raises(ConfigError) as info:
        fake_target(FakeEngine(("proj", single)), reloads=True).start()
    message = str(info.value)
    assert "is bind-mounted into container proj-backend-a as a single file (/config/config.yaml)" in message
    assert "mount its directory instead (volumes: - /srv/cfg:/config)" in message
    # a restart-only target keeps working with it (a restart re-resolves the mount) ...
    fake_target(FakeEngine(("proj", single)), reloads=False).start()
    # ... and a directory mount is fine for reloads
    fake_target(FakeEngine(("proj", box("b", mounts=(("/srv/cfg", "/config"),)))), reloads=True).start()


def test_file_mounts_names_only_mounts_of_the_file_itself(tmp_path: Path) -> None:
    config = tmp_path / "config.yaml"
    config.write_text("x: 1\n")
    link = tmp_path / "link.yaml"
    link.symlink_to(config)
    mounts = ((str(tmp_path), "/dir"), (str(link), "/config/config.yaml"), ("", "/volume"))
    assert file_mounts([config], mounts) == [(config, "/config/config.yaml")]
    assert file_mounts([config], mounts[:1]) == []


# ---------------------------------------------------------------- real engine

DIR_COMPOSE = """\
services:
  backend:
    image: {image}
    # The config's directory, not the file: the tuner replaces the file by a rename (a
    # new inode) and a reload must read the new one. Writable: the index cache is there.
    volumes:
      - {config_dir}:/config
    ports:
      - "127.0.0.1:{port}:8080"
    stop_grace_period: 5s
    healthcheck:
      test: ["CMD", "python3", "-c",
             "import urllib.request; urllib.request.urlopen('http://127.0.0.1:8080/health', timeout=2)"]
      interval: 1s
      timeout: 3s
      retries: 3
      start_period: 120s
"""


class DirStack(ComposeStack):
    """The stack's files and ports, on a compose file that mounts the config directory."""

    compose_file: Path

    def compose(self, *args: str, timeout: float = 300) -> Any:
        import subprocess

        from tuner.targets.compose import compose_command

        cmd = [*(compose_command() or ["docker", "compose"]), "-f", str(self.compose_file), "-p", self.project, *args]
        proc = subprocess.run(cmd, env=self.env(), cwd=self.root, capture_output=True, text=True, timeout=timeout)
        if proc.returncode != 0:
            raise RuntimeError(f"{' '.join(cmd[1:])} failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
        return proc

    def down(self) -> None:
        self.compose("down", "-v", "--remove-orphans", "--timeout", "2")


@contextmanager
def running(stack: ComposeStack) -> Iterator[ComposeStack]:
    try:
        stack.up("backend")
        wait_healthy(f"{stack.backend_url}/health", deadline_s=120)
        yield stack
    finally:
        stack.down()


@pytest.fixture(scope="module")
def images(docker_engine: None) -> dict[str, str]:
    return build_images(["backend"])


@pytest.fixture(scope="module")
def dir_stack(images: dict[str, str], tmp_path_factory: pytest.TempPathFactory) -> Iterator[ComposeStack]:
    stack = DirStack.create(tmp_path_factory.mktemp("reload-dir"))
    stack.compose_file = stack.root / "compose.yaml"
    stack.compose_file.write_text(DIR_COMPOSE.format(image=images["backend"], config_dir=stack.config_path.parent,
                                                     port=stack.ports["backend"]))
    with running(stack) as s:
        yield s


@pytest.fixture(scope="module")
def file_stack(images: dict[str, str], tmp_path_factory: pytest.TempPathFactory) -> Iterator[ComposeStack]:
    """The repository's compose.yaml: the config file mounted alone."""
    with running(ComposeStack.create(tmp_path_factory.mktemp("reload-file"))) as s:
        yield s


def applier_for(stack: ComposeStack, target: DockerTarget, confirm_deadline_s: float = 60) -> ConfigApplier:
    health = HealthConfig(url=f"{stack.backend_url}/health", deadline_s=120)
    reload = ReloadConfig(signal="SIGHUP", fingerprint="config_fingerprint", confirm_deadline_s=confirm_deadline_s)
    applier = ConfigApplier(target, lambda: wait_healthy(health.url, deadline_s=120, target=target), reload, health,
                            [stack.config_path])
    applier.mark_served({stack.config_path: stack.config_path.read_text(encoding="utf-8")})
    return applier


def container(target: DockerTarget) -> ContainerState:
    (state,) = target.containers()
    return state


@pytest.mark.integration
@pytest.mark.slow
def test_sighup_through_the_engine_reloads_the_service_without_restarting_it(dir_stack: ComposeStack) -> None:
    target = DockerTarget(DockerConfig(service="backend", project=dir_stack.project),
                          config_files=[dir_stack.config_path], reloads=True)
    patcher = ConfigPatcher([dir_stack.config_path])
    with target:
        target.start()
        before = container(target)
        applier = applier_for(dir_stack, target)
        for k in (11, 29):
            texts = patcher.render({0: {"fusion.rrf_k": k, "confidence.threshold": k / 100}})
            patcher.write(texts)  # atomically: a new inode on the host
            applied = applier.apply(texts)
            assert (applied.mode, applied.reason) == ("reload", None)
            sha = hashlib.sha256(dir_stack.config_path.read_bytes()).hexdigest()
            assert applied.health["config_fingerprint"] == sha
            live = httpx.get(f"{dir_stack.backend_url}/admin/config", timeout=10).json()
            assert live["fusion"]["rrf_k"] == k
        after = container(target)
        applier.close()
    assert (after.id, after.started_at, after.restart_count) == (before.id, before.started_at, before.restart_count)


@pytest.mark.integration
@pytest.mark.slow
def test_a_single_file_mount_is_refused_and_its_stale_config_is_caught(file_stack: ComposeStack) -> None:
    config = file_stack.config_path
    with pytest.raises(ConfigError, match="as a single file .*mount its directory instead"):
        DockerTarget(DockerConfig(service="backend", project=file_stack.project), config_files=[config],
                     reloads=True).start()

    # Let through anyway, the reload reads the old inode: not confirmed, so a restart applies it.
    target = DockerTarget(DockerConfig(service="backend", project=file_stack.project), config_files=[config])
    patcher = ConfigPatcher([config])
    with target:
        target.start()
        applier = applier_for(file_stack, target, confirm_deadline_s=3)
        old = hashlib.sha256(config.read_bytes()).hexdigest()
        texts = patcher.render({0: {"fusion.rrf_k": 17}})
        patcher.write(texts)
        new = hashlib.sha256(config.read_bytes()).hexdigest()
        applied = applier.apply(texts)
        applier.close()
    assert applied.mode == "restart"
    # the last health answer within the deadline served the old file; on a busy machine the
    # last probe may instead have timed out: either way the reload was not confirmed
    assert re.fullmatch(
        rf"reload not confirmed within 3 s: (backend serves {old[:12]}|health [A-Za-z]+), wrote {new[:12]}",
        applied.reason or "",
    ), applied.reason
    assert applied.health["config_fingerprint"] == new
