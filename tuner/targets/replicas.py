"""One worker's own backend replica: a copy of the config files, a state dir, a port,
for docker targets its own compose project, and a watchdog that cleans up after the
worker if it is killed.

    replica_of(experiment, index) -> (Experiment bound to the replica, Replica)
    Replica.up(note) / .down()                 # a docker replica's compose project
    PidRecordingTarget(target, pid_file)       # keeps the backend's pid on disk
    start_reaper(pid_file, journal) -> handle  # stops the backend (and takes a docker
                                               # replica's project down), restores the
                                               # config when the worker dies (even by SIGKILL)

The originals are never patched by workers: each replica patches its own copy
(``config.replica-N.yaml`` next to the original, so relative paths still resolve).

A docker replica is a compose project of its own (``workers.replica_name``, e.g.
``fusion-tuner-r0``) brought up from ``target.docker.compose_files`` with the compose
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
reaper takes down the project of a killed worker, and the next start of replica N
takes down what a killed worker left if the reaper could not.
"""

from __future__ import annotations

import json
import math
import os
import re
import socket
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tuner.errors import ConfigError, TargetError

ENV_CONFIG = "TUNER_REPLICA_CONFIG"
ENV_PORT = "TUNER_REPLICA_PORT"
ENV_INDEX = "TUNER_REPLICA"
ENV_PROJECT = "TUNER_REPLICA_PROJECT"
RECORD_NAME = "compose.json"
OVERRIDE_NAME = "compose.replica.yaml"
REAPING_NAME = "reaping.pid"
_PROJECT_NAME = re.compile(r"^[a-z0-9][a-z0-9_-]*$")
_REAPER_WAIT_S = 180.0

Note = Callable[[str], None]


@dataclass
class Replica:
    """Where replica N keeps its own copy of the backend's config and its state."""

    index: int
    config_files: list[Path]
    state_dir: Path

    @property
    def pid_file(self) -> Path:
        # Not backend.pid: that is the process target's own record (tuner.targets.leftovers),
        # which the next start reads to end a backend a killed run left.
        return self.state_dir / "worker-backend.pid"

    def up(self, note: Note = lambda text: None) -> None:
        """Bring up what this replica runs on before its first trial (nothing for a
        process target: the target starts the backend itself)."""

    def down(self) -> None:
        """Take down what ``up`` brought up."""


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
    api: Any = None  # a tuner.targets.docker.DockerAPI; the docker SDK when None
    compose_command: list[str] | None = None  # None: found by tuner.targets.docker.compose_command
    brought_up: bool = field(default=False, repr=False)  # down() touches only what up() started

    @property
    def record_file(self) -> Path:
        return self.state_dir / RECORD_NAME

    @property
    def override_file(self) -> Path:
        return self.state_dir / OVERRIDE_NAME

    def cli(self, project: str | None = None, files: Sequence[Path] | None = None,
            env: Mapping[str, str] | None = None) -> Any:
        from tuner.targets.docker import ComposeCLI

        return ComposeCLI(files if files is not None else [*self.compose_files, self.override_file],
                          project or self.project, env=self.env if env is None else env,
                          command=self.compose_command)

    def up(self, note: Note = lambda text: None) -> None:
        """End what a killed worker left of this replica, then ``compose up`` the service
        in the replica's project and check that it mounts the config copy and publishes
        the replica's port. Anything that fails takes the project down again."""
        _wait_for_reaper(self.state_dir, note, what=f"replica {self.index}")
        self._end_leftovers(note)
        owner = _owner_label()
        service: dict[str, Any] = {"labels": {"fusion-tuner.replica": str(self.index), "fusion-tuner.owner": owner,
                                              "fusion-tuner.state-dir": str(self.state_dir)}}
        image = self._image()
        if image:
            service["image"] = image
        self.override_file.write_text(json.dumps({"services": {self.service: service}}, indent=1) + "\n")
        cli = self.cli()
        # Recorded before `up`, so a worker killed while compose still works is cleaned up too.
        self.brought_up = True
        _write_json(self.record_file, {"project": self.project, "owner": owner, "cwd": str(cli.cwd or ""),
                                       "down": cli.argv("down", "--remove-orphans", "--timeout",
                                                        str(math.ceil(self.stop_timeout_s))),
                                       "env": self.env})
        try:
            cli.up(self.service, port=self.port, build_hint=self._build_hint())
            self._check_up()
        except BaseException:
            self._down_quietly()
            raise
        note(f"replica {self.index}: compose project {self.project} up (service {self.service}, port {self.port},"
             f" config {self.config_files[0].name})")

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
            from tuner.targets.docker import DockerSDK

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
            raise TargetError(f"target.docker.service {self.service!r} is not a service of"
                              f" {', '.join(map(str, self.compose_files))} (its services: {known}); fix the service name")
        if spec.get("image") or not spec.get("build"):
            return None
        return f"{self.base_project}-{self.service}"

    def _build_hint(self) -> str:
        from tuner.targets.docker import ComposeCLI, compose_command

        command = self.compose_command or compose_command() or ["docker", "compose"]
        cli = ComposeCLI(self.compose_files, self.base_project, command=command)
        return " ".join(cli.argv("build", self.service))

    def _down_quietly(self) -> None:
        try:
            self.down()
        except Exception:  # the error that brought us here is the one worth showing
            pass

    def _end_leftovers(self, note: Note) -> None:
        """Take down this replica's project (and the one an earlier run recorded, when
        replica_name has changed since) when a killed worker left it; refuse a project
        that belongs to a live worker or to nobody we know."""
        record = _read_json(self.record_file)
        projects = [self.project]
        if record and record.get("project") and record["project"] != self.project:
            projects.append(str(record["project"]))
        for project in projects:
            containers = self._api().containers(project)
            if not containers:
                continue
            owner = next((c.label("fusion-tuner.owner") for c in containers if c.label("fusion-tuner.owner")), None)
            names = ", ".join(c.name for c in containers)
            if owner is None:
                raise TargetError(
                    f"replica {self.index}: compose project {project!r} already runs containers that no tuner worker"
                    f" started ({names}); it is not a replica: give the replicas other names (workers.replica_name)"
                    f" or take it down yourself: docker compose -p {project} down")
            host, pid, alive = _owner_state(owner)
            if alive and pid != os.getpid():
                state_dir = next((c.label("fusion-tuner.state-dir") for c in containers), None) or "?"
                raise TargetError(
                    f"replica {self.index}: compose project {project!r} belongs to a running worker (pid {pid},"
                    f" state dir {state_dir}); give this experiment its own workers.replica_name, e.g."
                    f" '{{name}}-{{replica}}-mine'")
            if host != socket.gethostname():
                raise TargetError(
                    f"replica {self.index}: compose project {project!r} was brought up by a worker on host {host}"
                    f" (pid {pid}); if that worker has stopped, take the project down: docker compose -p {project}"
                    f" down")
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
                    f" map the variable it uses in target.docker.replica_env (e.g. BACKEND_CONFIG: '{{config}}')")
            if self.port is not None and self.port not in c.host_ports:
                shown = ", ".join(map(str, c.host_ports)) or "none"
                raise TargetError(
                    f"replica {self.index}: container {c.name} publishes host ports {shown}, not the replica's port"
                    f" {self.port}; make the compose file take the host port from ${{{ENV_PORT}}}, or map the"
                    f" variable it uses in target.docker.replica_env (e.g. BACKEND_PORT: '{{port}}')")
            if c.status in ("created", "exited", "dead"):
                said = f": {c.error.strip().splitlines()[0]}" if c.error.strip() else f" (exit code {c.exit_code})"
                raise TargetError(f"replica {self.index}: container {c.name} is {c.status} after `compose up`{said};"
                                  f" look at `docker logs {c.name}`")


def replica_of(experiment: Any, index: int) -> tuple[Any, Replica]:
    """The experiment as replica ``index`` runs it: the config files copied next to the
    originals (``config.replica-N.yaml``, so relative paths inside them still resolve),
    its own state dir (restore journal, result cache, trial reports), its port
    (``workers.ports``, else a free one) and, for a docker target, its own compose
    project (``workers.replica_name``), which the returned experiment's
    ``target.docker.project`` names.

    The copies are made from the originals at every start: the originals are never
    patched by workers, so a crashed replica cannot leak a trial's values into them.
    """
    from tuner.config.experiment import free_port

    target = experiment.target
    _check_port_placeholders(experiment)
    copies = []
    for original in target.config_files:
        copy_path = original.with_name(f"{original.stem}.replica-{index}{original.suffix}")
        _atomic_copy(original, copy_path)
        copies.append(copy_path)
    state_dir = experiment.state_dir / "replicas" / str(index)
    state_dir.mkdir(parents=True, exist_ok=True)
    port = experiment.workers.port_for(index)
    if port is None and target.apply in ("process", "docker"):
        port = free_port()
    update: dict[str, Any] = {"config_files": copies}
    replica: Replica
    if target.apply == "docker":
        replica = _compose_replica(experiment, index, copies, state_dir, port)
        update["docker"] = target.docker.model_copy(update={"project": replica.project})  # type: ignore[attr-defined]
    else:
        replica = Replica(index, copies, state_dir)
    bound = experiment.model_copy(update={"target": target.model_copy(update=update), "state_dir": state_dir})
    return bound.bind_port(port), replica


def replica_project(experiment: Any, index: int) -> str:
    """Replica ``index``'s compose project: ``workers.replica_name`` with ``{name}`` = the
    target's compose project and ``{replica}`` = ``index``."""
    from tuner.targets.docker import compose_project_name

    docker = experiment.target.docker
    name = docker.project or compose_project_name(docker.compose_files)
    if not name:
        raise ConfigError("target.docker: no compose project to name the replicas after: set target.docker.project")
    template = experiment.workers.replica_name
    project = template.replace("{name}", name).replace("{replica}", str(index))
    if not _PROJECT_NAME.match(project):
        raise ConfigError(
            f"workers.replica_name {template!r} gives {project!r} for replica {index}, which is not a compose project"
            " name (lower-case letters, digits, '-' and '_', starting with a letter or digit); fix workers.replica_name")
    if project == name:
        raise ConfigError(f"workers.replica_name {template!r} gives the target's own project {name!r}: replicas"
                          " must never take over the user's stack; keep {replica} in it, e.g. '{name}-r{replica}'")
    return project


def _compose_replica(experiment: Any, index: int, copies: list[Path], state_dir: Path,
                     port: int | None) -> ComposeReplica:
    from tuner.targets.docker import compose_project_name
    from tuner.targets.process import fill_placeholders

    docker = experiment.target.docker
    if not docker.compose_files:
        raise ConfigError(
            "target.docker.compose_files is empty: `tuner worker` brings up one compose project per replica from the"
            " compose file; list it, e.g. compose_files: [compose.yaml]")
    project = replica_project(experiment, index)
    values = {"replica": str(index), "project": project, "port": str(port), "state_dir": str(state_dir),
              "config": str(copies[0])}
    values.update({f"config{i}": str(c) for i, c in enumerate(copies)})
    env = {ENV_INDEX: str(index), ENV_PROJECT: project, ENV_PORT: str(port), ENV_CONFIG: str(copies[0])}
    env.update({f"{ENV_CONFIG}{i}": str(c) for i, c in enumerate(copies)})
    # target.docker.replica_env: the compose file's own variables, from the values above
    for key, template in (getattr(docker, "replica_env", None) or {}).items():
        env[str(key)] = fill_placeholders(str(template), values)
    base = docker.project or compose_project_name(docker.compose_files) or ""
    return ComposeReplica(index, copies, state_dir, project=project, service=docker.service, base_project=base,
                          compose_files=list(docker.compose_files), port=port, env=env,
                          stop_timeout_s=docker.stop_timeout_s)


def _check_port_placeholders(experiment: Any) -> None:
    target = experiment.target
    if target.apply == "process" and "{port}" not in " ".join(target.process.command):
        raise ConfigError("target.process.command has no {port}: replicas would all bind the same port; "
                          "pass the port to the backend, e.g. --port {port}")
    if target.apply not in ("process", "docker"):
        return
    for where, url in (("target.health.url", target.health.url), ("evaluation.request.url",
                                                                  experiment.evaluation.request.url)):
        if "{port}" not in url:
            raise ConfigError(f"{where} {url!r} has no {{port}}: every replica would be measured on the same"
                              " backend; write the port as {port}, e.g. http://127.0.0.1:{port}/health")


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


def _wait_for_reaper(state_dir: Path, note: Note, *, what: str) -> None:
    """A killed worker's reaper may still be taking its project down: wait for it, so
    its ``down`` cannot hit the containers this start brings up."""
    from tuner.targets.leftovers import start_time

    marker = _read_json(state_dir / REAPING_NAME)
    if not marker:
        return
    pid, started = int(marker.get("pid", -1)), marker.get("start_time")
    said = False
    deadline = time.monotonic() + _REAPER_WAIT_S
    while start_time(pid) is not None and start_time(pid) == started and time.monotonic() < deadline:
        if not said:
            note(f"{what}: waiting for the reaper of a killed worker (pid {pid}) to finish cleaning up")
            said = True
        time.sleep(0.2)


def _write_json(path: Path, data: Mapping[str, Any]) -> None:
    from tuner.files import atomic_write_text

    atomic_write_text(path, json.dumps(data, indent=1) + "\n", mode=0o600)  # compose env may hold secrets


def _read_json(path: Path) -> dict[str, Any] | None:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


# ---------------------------------------------------------------- pid record and reaper


class PidRecordingTarget:
    """A Target wrapper that keeps the backend's process id in a file, so the reaper can
    stop a backend whose worker was killed (process targets start it in its own session,
    where it would outlive a SIGKILLed worker)."""

    def __init__(self, inner: Any, pid_file: Path) -> None:
        self._inner = inner
        self._pid_file = pid_file

    def start(self) -> None:
        self._inner.start()
        self._record()

    def restart(self) -> None:
        self._inner.restart()
        self._record()

    def stop(self) -> None:
        self._inner.stop()
        self._pid_file.unlink(missing_ok=True)

    def failure(self) -> str | None:
        return self._inner.failure()

    def close(self) -> None:
        self._inner.close()
        self._pid_file.unlink(missing_ok=True)

    def __getattr__(self, name: str) -> Any:  # .reaped, .pid, .project, ... of the inner target
        return getattr(self._inner, name)

    def _record(self) -> None:
        pid = getattr(self._inner, "pid", None)
        if pid is not None:
            tmp = self._pid_file.with_suffix(".tmp")
            tmp.write_text(str(pid))
            tmp.replace(self._pid_file)


def start_reaper(pid_file: Path, journal: Path) -> Any:
    """A watchdog process for this worker: it waits on a pipe the worker holds open and,
    when the worker dies (even by SIGKILL, which closes the pipe), stops the backend
    named in ``pid_file``, takes down the compose project recorded beside it
    (``compose.json``, a docker replica) and restores the config from the restore
    ``journal``. Returns the write end's owner handle; closing it at a clean exit is
    harmless (by then nothing is recorded)."""
    import subprocess
    import sys

    read_fd, write_fd = os.pipe()
    code = ("import sys; from tuner.targets.replicas import reap; "
            f"reap(int(sys.argv[1]), {str(pid_file)!r}, {str(journal)!r})")
    proc = subprocess.Popen([sys.executable, "-c", code, str(read_fd)], pass_fds=(read_fd,),
                            start_new_session=True, stdin=subprocess.DEVNULL)
    os.close(read_fd)
    return _ReaperHandle(proc, write_fd)


@dataclass
class _ReaperHandle:
    proc: Any
    write_fd: int

    def close(self) -> None:
        os.close(self.write_fd)
        try:
            self.proc.wait(timeout=30)
        except Exception:  # the reaper is best effort; it never holds the worker up
            pass


def reap(read_fd: int, pid_file: str, journal: str) -> None:
    """The reaper's body (runs in its own process; see start_reaper)."""
    import signal

    from tuner.config.configpatch import recover
    from tuner.targets.leftovers import start_time

    while os.read(read_fd, 1):  # returns b"" only when every write end is closed
        pass
    state_dir = Path(pid_file).parent
    marker = state_dir / REAPING_NAME
    record = state_dir / RECORD_NAME
    path = Path(pid_file)
    busy = path.exists() or record.exists()
    if busy:  # a new worker of this replica waits until the clean-up is done
        _write_json(marker, {"pid": os.getpid(), "start_time": start_time(os.getpid())})
    try:
        if path.exists():
            try:
                pid = int(path.read_text().strip())
                os.killpg(pid, signal.SIGTERM)
                deadline = time.monotonic() + 10
                while time.monotonic() < deadline:
                    os.killpg(pid, 0)
                    time.sleep(0.1)
                os.killpg(pid, signal.SIGKILL)
            except (ProcessLookupError, ValueError, PermissionError):
                pass
            path.unlink(missing_ok=True)
        _reap_compose(record)
        recover(Path(journal))
    finally:
        if busy:
            marker.unlink(missing_ok=True)


def _reap_compose(record_file: Path) -> None:
    """``compose down`` as the record says; the record stays when that fails, for the
    next start of the replica to try again."""
    import subprocess

    record = _read_json(record_file)
    if not record or not record.get("down"):
        return
    try:
        proc = subprocess.run(list(record["down"]), env={**os.environ, **(record.get("env") or {})},
                              cwd=record.get("cwd") or None, capture_output=True, timeout=300)
    except (OSError, subprocess.TimeoutExpired):
        return
    if proc.returncode == 0:
        record_file.unlink(missing_ok=True)


def _atomic_copy(src: Path, dst: Path) -> None:
    from tuner.files import copy_preserving

    copy_preserving(src, dst)  # the original's mode and owner: the replica's backend reads it as the service would
