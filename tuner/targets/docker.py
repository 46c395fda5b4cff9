"""The containers of a Docker Compose service as a restartable backend.

The service's containers are found through the engine (tuner.targets.docker_engine)
and restarted one by one. After a restart the target waits for each container's own
healthcheck when it has one (the HTTP health wait that follows proves only that *some*
replica answers). ``failure()`` reports at once a container that exited, was
restarted by its restart policy (a crash loop) or turned unhealthy, with its exit code
and last log lines. ``send_signal`` sends a signal (``target.reload.signal``) to every
running container of the service through the engine.

A target made for reloads (``reloads=True``) refuses at start a config file bind-mounted
as a single file: the tuner replaces the file atomically (a new inode) and a single-file
bind mount keeps showing the old inode, so a reload would read the old config (a
restart re-resolves the mount). A directory mount shows the new file.

    DockerTarget(config: DockerConfig, *, config_files=(), state_dir=None, api=None, reloads=False)
        .start() / .restart() / .stop() / .failure() / .close() / .send_signal(signame)
        .project -> str; .service -> str; .containers() -> list[ContainerState]

The decisions (why a container cannot come up, what to say when a service has no
containers or a config file is not mounted) are plain functions of container states.
"""

from __future__ import annotations

import dataclasses
import math
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from tuner.config.target import DockerConfig
from tuner.errors import BackendExited, ConfigError, HealthTimeout, TargetError
from tuner.targets.base import Target
from tuner.targets.compose import compose_project_name
from tuner.targets.docker_engine import (
    ANSI,
    ContainerState,
    DockerAPI,
    DockerSDK,
    first_line,
)

_TAIL_LINES = 5
_FAILURE_POLL_S = 0.2  # health waits call failure() every ~50 ms; inspect less often
_HEALTH_POLL_S = 0.1


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
        how += f", engine error: {first_line(state.error)}"
    if state.status in ("exited", "dead"):
        return f"container {state.name} exited ({how})"
    if state.status == "restarting" or state.restart_count > restarts_before:
        restarts = state.restart_count - restarts_before
        return f"container {state.name} is restarting in a loop ({how}; {restarts} restarts by its restart policy)"
    if state.status in ("paused", "removing"):
        return f"container {state.name} is {state.status}"
    if state.health == "unhealthy":
        said = f": {first_line(state.health_output)}" if state.health_output else ""
        return f"container {state.name} is unhealthy (its healthcheck keeps failing{said})"
    return None


def log_tail(text: str, lines: int = _TAIL_LINES) -> str:
    """The last ``lines`` non-empty lines, colour codes removed, joined with ' | '."""
    kept = [ln.strip() for ln in ANSI.sub("", text).splitlines() if ln.strip()]
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


def file_mounts(config_files: Sequence[Path], mounts: Sequence[tuple[str, str]]) -> list[tuple[Path, str]]:
    """(config file, container path) of the config files bind-mounted as a single file
    (the mount's source is the file itself, not a directory holding it)."""
    out: list[tuple[Path, str]] = []
    for f in config_files:
        real = Path(os.path.realpath(f))
        out.extend((Path(f), dst) for src, dst in mounts if src and Path(os.path.realpath(src)) == real)
    return out


def single_file_mount_message(config_file: Path, container: str, destination: str) -> str:
    """The error for a reload target whose config file is mounted as a single file."""
    return (
        f"target.reload: {config_file} is bind-mounted into container {container} as a single file"
        f" ({destination}): the tuner replaces it atomically (a new inode) and a single-file mount keeps the old"
        f" one, so a reload would read the old config; mount its directory instead"
        f" (volumes: - {config_file.parent}:{Path(destination).parent}), or remove target.reload"
    )


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
        reloads: bool = False,
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
        self.reloads = reloads
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
            single = file_mounts(self.config_files, c.mounts) if self.reloads else []
            if single:
                raise ConfigError(single_file_mount_message(single[0][0], c.name, single[0][1]))

    # -- Target

    def up_before_start(self) -> list[str]:
        """The service's containers already running: `start` leaves them as they are."""
        return [c.name for c in self.containers() if c.status == "running" and c.id not in self._started_by_us]

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

    def send_signal(self, signame: str) -> None:
        """``signame`` to the main process of every running container of the service."""
        running = [c for c in self.containers() if c.status == "running"]
        if not running:
            raise TargetError(
                f"cannot send {signame}: no container of service {self.service!r}"
                f" (compose project {self.project!r}) is running"
            )
        for c in running:
            self.api.kill(c.id, signame)

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
                said = (
                    f"; its last health check said: {first_line(last.health_output)}"
                    if last and last.health_output
                    else ""
                )
                raise HealthTimeout(
                    f"container {name} not healthy {self.config.health_deadline_s:g} s after its restart"
                    f" (health: {health}){said}; look at `docker logs {name}` or raise"
                    " target.docker.health_deadline_s"
                )
            self._sleep(_HEALTH_POLL_S)
