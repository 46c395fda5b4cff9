"""Replica N of a docker target: a compose project of its own (``workers.replica_name``,
e.g. ``fusion-tuner-r0``) brought up from ``target.docker.compose_files`` with the compose
CLI; the target then restarts its containers through the docker SDK as for a single
run. Compose gets these variables, which a compose file that supports replicas reads
(the repository's compose.yaml does; ``target.docker.replica_env`` maps them onto a
compose file's own variables)::

    TUNER_REPLICA_CONFIG   the replica's copy of the first config file (_CONFIG0, _CONFIG1, ...)
    TUNER_REPLICA_PORT     the replica's host port
    TUNER_REPLICA          N
    TUNER_REPLICA_PROJECT  the replica's compose project

Its containers carry the labels ``fusion-tuner.replica``, ``fusion-tuner.owner``
(host/pid/start time of the worker) and ``fusion-tuner.state-dir``, and the replica
state dir keeps ``compose.json`` (how to take the project down) while it is up: the
reaper (tuner.targets.reaper) takes down the project of a killed worker, and the next
start of replica N takes down what a killed worker left if the reaper could not.

    ComposeReplica(...).up(note) / .down()
    replica_project(experiment, index) -> str
    make_compose_replica(experiment, index, copies, state_dir, port) -> ComposeReplica
"""

from __future__ import annotations

import json
import math
import os
import re
import socket
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tuner.errors import ConfigError, TargetError
from tuner.targets.reaper import RECORD_NAME, read_json, wait_for_reaper, write_json
from tuner.targets.replica import Note, Replica

if TYPE_CHECKING:
    from tuner.config.experiment import Experiment
    from tuner.targets.docker_engine import DockerAPI

ENV_CONFIG = "TUNER_REPLICA_CONFIG"
ENV_PORT = "TUNER_REPLICA_PORT"
ENV_INDEX = "TUNER_REPLICA"
ENV_PROJECT = "TUNER_REPLICA_PROJECT"
OVERRIDE_NAME = "compose.replica.yaml"
_PROJECT_NAME = re.compile(r"^[a-z0-9][a-z0-9_-]*$")
# Put on a replica's containers, so a later start can tell a killed worker's leftover
# project from a live one and from a project of the user's.
LABEL_REPLICA = "fusion-tuner.replica"
LABEL_OWNER = "fusion-tuner.owner"  # host/pid/start time of the worker that brought it up
LABEL_STATE_DIR = "fusion-tuner.state-dir"


@dataclass
class ComposeReplica(Replica):
    """Replica N of a docker target: a compose project of its own (see the module docstring)."""

    project: str = ""
    service: str = ""
    base_project: str = ""  # the user's own project, whose images the replicas run
    compose_files: list[Path] = field(default_factory=list)
    port: int | None = None
    env: dict[str, str] = field(default_factory=dict)  # what compose gets besides this process's environment
    stop_timeout_s: float = 10.0
    api: DockerAPI | None = None  # None: the docker SDK
    compose_command: list[str] | None = None  # None: found by tuner.targets.compose.compose_command
    brought_up: bool = field(default=False, repr=False)  # down() touches only what up() started

    @property
    def record_file(self) -> Path:
        return self.state_dir / RECORD_NAME

    @property
    def override_file(self) -> Path:
        return self.state_dir / OVERRIDE_NAME

    def cli(
        self, project: str | None = None, files: Sequence[Path] | None = None, env: Mapping[str, str] | None = None
    ) -> Any:
        from tuner.targets.compose import ComposeCLI

        return ComposeCLI(
            files if files is not None else [*self.compose_files, self.override_file],
            project or self.project,
            env=self.env if env is None else env,
            command=self.compose_command,
        )

    def up(self, note: Note = lambda text: None) -> None:
        """End what a killed worker left of this replica, then ``compose up`` the service
        in the replica's project and check that it mounts the config copy and publishes
        the replica's port. Anything that fails takes the project down again."""
        wait_for_reaper(self.state_dir, note, what=f"replica {self.index}")
        self._end_leftovers(note)
        owner = _owner_label()
        service: dict[str, Any] = {
            "labels": {LABEL_REPLICA: str(self.index), LABEL_OWNER: owner, LABEL_STATE_DIR: str(self.state_dir)}
        }
        image = self._image()
        if image:
            service["image"] = image
        self.override_file.write_text(json.dumps({"services": {self.service: service}}, indent=1) + "\n")
        cli = self.cli()
        # Recorded before `up`, so a worker killed while compose still works is cleaned up too.
        self.brought_up = True
        write_json(
            self.record_file,
            {
                "project": self.project,
                "owner": owner,
                "cwd": str(cli.cwd or ""),
                "down": cli.argv("down", "--remove-orphans", "--timeout", str(math.ceil(self.stop_timeout_s))),
                "env": self.env,
            },
        )
        try:
            cli.up(self.service, port=self.port, build_hint=self._build_hint())
            self._check_up()
        except BaseException:
            self._down_quietly()
            raise
        note(
            f"replica {self.index}: compose project {self.project} up (service {self.service}, port {self.port},"
            f" config {self.config_files[0].name})"
        )

    def down(self) -> None:
        """``compose down`` of the project ``up`` brought up (never the user's; nothing
        when ``up`` did not run: a project of that name may be another worker's)."""
        try:
            if self.brought_up:
                self.cli().down(self.stop_timeout_s)
                self.record_file.unlink(missing_ok=True)
                self.brought_up = False
        finally:
            if self.api is not None:
                self.api.close()
                self.api = None

    # -- internals

    def _api(self) -> Any:
        if self.api is None:
            from tuner.targets.docker_engine import DockerSDK

            self.api = DockerSDK()
        return self.api

    def _image(self) -> str | None:
        """The image to pin when the service only has ``build:``: compose would name it
        after the replica's project (``<project>-<service>``), which was never built;
        the replicas run the user's project's build instead."""
        model = self.cli(files=self.compose_files).config()
        spec = (model.get("services") or {}).get(self.service)
        if spec is None:
            known = ", ".join(sorted(model.get("services") or {})) or "none"
            raise TargetError(
                f"target.docker.service {self.service!r} is not a service of"
                f" {', '.join(map(str, self.compose_files))} (its services: {known}); "
                "fix the service name"
            )
        if spec.get("image") or not spec.get("build"):
            return None
        return f"{self.base_project}-{self.service}"

    def _build_hint(self) -> str:
        from tuner.targets.compose import ComposeCLI, compose_command

        command = self.compose_command or compose_command() or ["docker", "compose"]
        cli = ComposeCLI(self.compose_files, self.base_project, command=command)
        return " ".join(cli.argv("build", self.service))

    def _down_quietly(self) -> None:
        try:
            self.down()
        except Exception:  # noqa: BLE001 - the error that brought us here is the one worth showing
            pass

    def _end_leftovers(self, note: Note) -> None:
        """Take down this replica's project (and the one an earlier run recorded, when
        replica_name has changed since) when a killed worker left it; refuse a project
        that belongs to a live worker or to nobody we know."""
        record = read_json(self.record_file)
        projects = [self.project]
        if record and record.get("project") and record["project"] != self.project:
            projects.append(str(record["project"]))
        for project in projects:
            containers = self._api().containers(project)
            if not containers:
                continue
            owner = next((c.label(LABEL_OWNER) for c in containers if c.label(LABEL_OWNER)), None)
            names = ", ".join(c.name for c in containers)
            if owner is None:
                raise TargetError(
                    f"replica {self.index}: compose project {project!r} already runs containers that no tuner worker"
                    f" started ({names}); it is not a replica: give the replicas other names (workers.replica_name)"
                    f" or take it down yourself: docker compose -p {project} down"
                )
            host, pid, alive = _owner_state(owner)
            if alive and pid != os.getpid():
                state_dir = next((c.label(LABEL_STATE_DIR) for c in containers), None) or "?"
                raise TargetError(
                    f"replica {self.index}: compose project {project!r} belongs to a running worker (pid {pid},"
                    f" state dir {state_dir}); give this experiment its own workers.replica_name, e.g."
                    f" '{{name}}-{{replica}}-mine'"
                )
            if host != socket.gethostname():
                raise TargetError(
                    f"replica {self.index}: compose project {project!r} was brought up by a worker on host {host}"
                    f" (pid {pid}); if that worker has stopped, take the project down: docker compose -p {project}"
                    f" down"
                )
            if record and project == record.get("project"):
                files = _files_of(record.get("down") or [])
                self.cli(project, files or None, {**self.env, **(record.get("env") or {})}).down(self.stop_timeout_s)
            else:
                self.cli(project).down(self.stop_timeout_s)
            whose = "this worker" if pid == os.getpid() else f"a killed worker (pid {pid})"
            note(f"replica {self.index}: took down compose project {project} ({names}) left by {whose}")
        self.record_file.unlink(missing_ok=True)

    def _check_up(self) -> None:
        """The containers compose started mount the replica's config copy and publish
        its port: else the compose file ignores the replica's variables."""
        from tuner.targets.docker import missing_service_message, unmounted_configs

        api = self._api()
        found = api.containers(self.project, self.service)
        if not found:
            services = [c.service for c in api.containers(self.project)]
            raise TargetError(missing_service_message(self.project, self.service, services, api.projects()))
        for c in found:
            missing = unmounted_configs(self.config_files, c.mounts)
            if missing:
                shown = ", ".join(src for src, _ in c.mounts) or "none"
                raise TargetError(
                    f"replica {self.index}: container {c.name} does not mount the replica's config copy {missing[0]}"
                    f" (its mounts: {shown}); make the compose file take the config path from ${{{ENV_CONFIG}}}, or"
                    f" map the variable it uses in target.docker.replica_env (e.g. BACKEND_CONFIG: '{{config}}')"
                )
            if self.port is not None and self.port not in c.host_ports:
                shown = ", ".join(map(str, c.host_ports)) or "none"
                raise TargetError(
                    f"replica {self.index}: container {c.name} publishes host ports {shown}, not the replica's port"
                    f" {self.port}; make the compose file take the host port from ${{{ENV_PORT}}}, or map the"
                    f" variable it uses in target.docker.replica_env (e.g. BACKEND_PORT: '{{port}}')"
                )
            if c.status in ("created", "exited", "dead"):
                said = f": {c.error.strip().splitlines()[0]}" if c.error.strip() else f" (exit code {c.exit_code})"
                raise TargetError(
                    f"replica {self.index}: container {c.name} is {c.status} after `compose up`{said};"
                    f" look at `docker logs {c.name}`"
                )


def replica_project(experiment: Any, index: int) -> str:
    """Replica ``index``'s compose project: ``workers.replica_name`` with ``{name}`` = the
    target's compose project and ``{replica}`` = ``index``."""
    from tuner.targets.compose import compose_project_name

    docker = experiment.target.docker
    name = docker.project or compose_project_name(docker.compose_files)
    if not name:
        raise ConfigError("target.docker: no compose project to name the replicas after: set target.docker.project")
    template = experiment.workers.replica_name
    project = template.replace("{name}", name).replace("{replica}", str(index))
    if not _PROJECT_NAME.match(project):
        raise ConfigError(
            f"workers.replica_name {template!r} gives {project!r} for replica {index}, which is not a compose project"
            " name (lower-case letters, digits, '-' and '_', starting with a letter or digit); "
            "fix workers.replica_name"
        )
    if project == name:
        raise ConfigError(
            f"workers.replica_name {template!r} gives the target's own project {name!r}: replicas"
            " must never take over the user's stack; keep {replica} in it, e.g. '{name}-r{replica}'"
        )
    return project


def make_compose_replica(
    experiment: Experiment, index: int, copies: list[Path], state_dir: Path, port: int | None
) -> ComposeReplica:
    from tuner.targets.compose import compose_project_name
    from tuner.targets.process import fill_placeholders

    docker = experiment.target.docker
    if docker is None or not docker.compose_files:
        raise ConfigError(
            "target.docker.compose_files is empty: `tuner worker` brings up one compose project per replica from the"
            " compose file; list it, e.g. compose_files: [compose.yaml]"
        )
    project = replica_project(experiment, index)
    values = {
        "replica": str(index),
        "project": project,
        "port": str(port),
        "state_dir": str(state_dir),
        "config": str(copies[0]),
    }
    values.update({f"config{i}": str(c) for i, c in enumerate(copies)})
    env = {ENV_INDEX: str(index), ENV_PROJECT: project, ENV_PORT: str(port), ENV_CONFIG: str(copies[0])}
    env.update({f"{ENV_CONFIG}{i}": str(c) for i, c in enumerate(copies)})
    # target.docker.replica_env: the compose file's own variables, from the values above
    for key, template in (getattr(docker, "replica_env", None) or {}).items():
        env[str(key)] = fill_placeholders(str(template), values)
    base = docker.project or compose_project_name(docker.compose_files) or ""
    return ComposeReplica(
        index,
        copies,
        state_dir,
        project=project,
        service=docker.service,
        base_project=base,
        compose_files=list(docker.compose_files),
        port=port,
        env=env,
        stop_timeout_s=docker.stop_timeout_s,
    )


# ---------------------------------------------------------------- who owns a replica project


def _owner_label() -> str:
    from tuner.targets.leftovers import start_time

    return f"{socket.gethostname()}/{os.getpid()}/{start_time(os.getpid())}"


def _owner_state(label: str) -> tuple[str, int, bool]:
    """(host, pid, alive) of a ``fusion-tuner.owner`` label; alive only for a process of
    this host that is provably that worker (same pid and start time)."""
    from tuner.targets.leftovers import start_time

    try:
        host, pid_text, started = label.rsplit("/", 2)
        pid = int(pid_text)
    except ValueError:
        return "?", -1, False
    if host != socket.gethostname():
        return host, pid, False
    now = start_time(pid)
    return host, pid, now is not None and str(now) == started


def _files_of(argv: Sequence[str]) -> list[Path]:
    return [Path(argv[i + 1]) for i, a in enumerate(argv[:-1]) if a == "-f"]
