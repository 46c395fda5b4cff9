"""The Docker engine as the docker target sees it: `DockerAPI`, the few engine calls the
target makes, implemented on the docker SDK by `DockerSDK`, and `ContainerState`, the
slice of `docker inspect` its decisions read. Behind this seam the target's decisions
can be tested against a fake engine.

    DockerSDK(client=None).containers(project, service) / .projects() / .inspect(id)
        .restart(id, timeout_s) / .start(id) / .stop(id, timeout_s) / .kill(id, signal)
        .logs(...) / .exit_codes(...)
    state_from_inspect(attrs) -> ContainerState
    unreachable(reason) -> TargetError     # "Docker engine unreachable at ...; start Docker"

Containers are found by the labels compose puts on them (``com.docker.compose.project``
/ ``com.docker.compose.service``): the SDK has no compose logic.
"""

from __future__ import annotations

import os
import re
import time
from abc import ABC, abstractmethod
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from tuner.errors import TargetError

LABEL_PROJECT = "com.docker.compose.project"
LABEL_SERVICE = "com.docker.compose.service"
ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")  # colour codes in container logs and compose output


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
    def kill(self, container_id: str, signal: str) -> None:
        """Send ``signal`` (a name such as ``"SIGHUP"``) to the container's main process."""

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
        f"Docker engine unreachable at {docker_endpoint()}: {first_line(reason)};"
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
        self._client: Any = client  # a docker.DockerClient: the SDK has no type information

    @contextmanager
    def _call(self, what: str) -> Iterator[None]:
        try:
            yield
        except self._transport_errors as exc:
            raise unreachable(exc) from exc
        except self._errors.APIError as exc:
            raise TargetError(f"docker {what} failed: {first_line(exc.explanation or exc)}") from exc
        except self._errors.DockerException as exc:
            raise unreachable(exc) from exc

    def containers(self, project: str, service: str | None = None) -> list[ContainerState]:
        labels = [f"{LABEL_PROJECT}={project}"] + ([f"{LABEL_SERVICE}={service}"] if service else [])
        with self._call(f"listing containers of compose project {project!r}"):
            found = self._client.containers.list(all=True, filters={"label": labels})
        return sorted((state_from_inspect(c.attrs) for c in found), key=lambda s: s.name)

    def projects(self) -> list[str]:
        with self._call("listing compose projects"):
            found = self._client.containers.list(all=True, filters={"label": [LABEL_PROJECT]})
        return sorted({c.labels.get(LABEL_PROJECT, "") for c in found} - {""})

    def inspect(self, container_id: str) -> ContainerState | None:
        try:
            with self._call(f"inspect of container {container_id[:12]}"):
                return state_from_inspect(self._client.api.inspect_container(container_id))
        except TargetError as exc:
            if isinstance(exc.__cause__, self._errors.NotFound):
                return None
            raise

    def restart(self, container_id: str, timeout_s: int) -> None:
        with self._call(f"restart of container {container_id[:12]}"):
            self._client.api.restart(container_id, timeout=timeout_s)

    def start(self, container_id: str) -> None:
        with self._call(f"start of container {container_id[:12]}"):
            self._client.api.start(container_id)

    def stop(self, container_id: str, timeout_s: int) -> None:
        with self._call(f"stop of container {container_id[:12]}"):
            self._client.api.stop(container_id, timeout=timeout_s)

    def kill(self, container_id: str, signal: str) -> None:
        with self._call(f"{signal} to container {container_id[:12]}"):
            self._client.api.kill(container_id, signal=signal)

    def logs(self, container_id: str, tail: int, since: float | None = None, until: float | None = None) -> str:
        with self._call(f"logs of container {container_id[:12]}"):
            raw = self._client.api.logs(
                container_id, stdout=True, stderr=True, tail=tail, since=since or None, until=until or None
            )
        return raw.decode("utf-8", errors="replace") if isinstance(raw, bytes) else str(raw)

    def exit_codes(self, container_id: str, since: float) -> list[int]:
        with self._call(f"events of container {container_id[:12]}"):
            # With `until` the engine closes the stream after replaying past events.
            events = self._client.api.events(
                since=since, until=time.time(), filters={"container": container_id, "event": "die"}, decode=True
            )
            codes = [int(e.get("Actor", {}).get("Attributes", {}).get("exitCode", -1)) for e in events]
        return codes

    def close(self) -> None:
        self._client.close()


def state_from_inspect(attrs: dict[str, Any]) -> ContainerState:
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


def _host_ports(bindings: Mapping[str, Sequence[Mapping[str, Any] | None] | None]) -> tuple[int, ...]:
    """Host ports of ``HostConfig.PortBindings`` (what the container is configured to
    publish, known before it runs)."""
    out = set()
    for binds in bindings.values():
        for b in binds or []:
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


def first_line(value: object) -> str:
    text = str(value).strip()
    return text.splitlines()[0] if text else ""
