"""The two UIs of a study, run side by side: optuna-dashboard on the study storage
(with the Optuna artifact store) and the MLflow tracking server on the tracking store.

    ui_specs(experiment, *, optuna_port=8081, mlflow_port=5000, host="127.0.0.1") -> list[UiSpec]
    with Dashboards(specs, log_dir) as d:      # starts both, each in its own process group
        d.wait_ready(deadline_s=60)            # both answer their health URL (or TargetError)
        d.failure()                            # None while both run, else which died and why
    # leaving the block stops both: SIGTERM to each group, SIGKILL after a grace period

`ui_specs` is pure (argv, URLs, environment); `Dashboards` owns the processes. Only
tuner/cli/dashboard_cmd.py prints.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import weakref
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import httpx

from tuner.errors import ConfigError, TargetError

DEFAULT_OPTUNA_PORT = 8081
DEFAULT_MLFLOW_PORT = 5000
_TAIL_LINES = 5


@dataclass(frozen=True)
class UiSpec:
    """One UI process: how to start it and where it answers."""

    name: str
    argv: list[str]
    host: str
    port: int
    port_flag: str  # the `tuner dashboard` option that sets ``port``
    page: str = "/"  # what a person opens
    health_path: str = "/health"  # 200 once it serves
    env: dict[str, str] = field(default_factory=dict)

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}{self.page}"

    @property
    def health_url(self) -> str:
        return f"http://{self.host}:{self.port}{self.health_path}"


def console_script(name: str) -> str:
    """A console script of this environment (beside the interpreter), else from PATH.
    Printed commands use it too, so they run as pasted without activating the venv."""
    beside = Path(sys.executable).parent / name
    return str(beside) if beside.exists() else name


def dashboard_commands(experiment: Any) -> dict[str, str]:
    """Shell commands that open the two UIs on this experiment's stores (printed by
    `tuner run` and `tuner demo`)."""
    from tuner.study import StudyPaths

    paths = StudyPaths(experiment.state_dir, experiment.study)
    out = {"optuna": f"{console_script('optuna-dashboard')} {experiment.storage} --artifact-dir {paths.artifact_dir}"}
    if experiment.tracking.enabled:
        out["mlflow"] = f"{console_script('mlflow')} ui --backend-store-uri {experiment.tracking.mlflow_uri}"
    out["both"] = f"{console_script('tuner')} dashboard {experiment.source}"
    return out


def ui_specs(
    experiment: Any,
    *,
    optuna_port: int = DEFAULT_OPTUNA_PORT,
    mlflow_port: int = DEFAULT_MLFLOW_PORT,
    host: str = "127.0.0.1",
) -> list[UiSpec]:
    """The UIs for ``experiment`` (a `tuner.experiment.Experiment`): optuna-dashboard
    always, MLflow when tracking is enabled."""
    from tuner.study import StudyPaths

    storage = experiment.storage
    _require_storage(storage, experiment.source)
    artifact_dir = StudyPaths(experiment.state_dir, experiment.study).artifact_dir
    specs = [
        UiSpec(
            name="optuna-dashboard",
            argv=[console_script("optuna-dashboard"), storage, "--artifact-dir", str(artifact_dir),
                  "--host", host, "--port", str(optuna_port)],
            host=host,
            port=optuna_port,
            port_flag="--optuna-port",
            page="/dashboard/",
            health_path="/api/studies",
        )
    ]
    if experiment.tracking.enabled:
        specs.append(
            UiSpec(
                name="mlflow",
                argv=[console_script("mlflow"), "server", "--backend-store-uri", experiment.tracking.mlflow_uri,
                      "--host", host, "--port", str(mlflow_port), "--workers", "1"],
                host=host,
                port=mlflow_port,
                port_flag="--mlflow-port",
                # The job runner is a third process the UI does not need.
                env={"MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"},
            )
        )
    return specs


def _require_storage(storage: str, source: Path) -> None:
    prefix = "sqlite:///"
    if storage.startswith(prefix) and not Path(storage[len(prefix):]).exists():
        raise ConfigError(
            f"{source}: no study storage at {storage[len(prefix):]} yet; run `tuner run {source}` first"
        )


def port_in_use(host: str, port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind((host, port))
        except OSError:
            return True
    return False


class Dashboards:
    """Runs the UI processes; see the module docstring."""

    def __init__(self, specs: Sequence[UiSpec], log_dir: Path, *, stop_timeout_s: float = 10.0) -> None:
        self.specs = list(specs)
        self.log_dir = Path(log_dir)
        self.stop_timeout_s = stop_timeout_s
        self._procs: dict[str, subprocess.Popen[bytes]] = {}
        self._logs: dict[str, IO[bytes]] = {}
        # Even if the caller forgets to stop (or dies of an exception), the UIs go too.
        self._finalizer = weakref.finalize(self, _kill_groups, self._procs)

    def log_file(self, name: str) -> Path:
        return self.log_dir / f"{name}.log"

    @property
    def pids(self) -> dict[str, int]:
        return {name: p.pid for name, p in self._procs.items()}

    def start(self) -> None:
        for spec in self.specs:
            if port_in_use(spec.host, spec.port):
                raise TargetError(f"{spec.name}: port {spec.port} on {spec.host} is in use; pick another with {spec.port_flag}")
        self.log_dir.mkdir(parents=True, exist_ok=True)
        for spec in self.specs:
            log = open(self.log_file(spec.name), "wb")  # noqa: SIM115 - closed in stop()
            self._logs[spec.name] = log
            try:
                # A new session: Ctrl-C in the terminal reaches only the tuner, which then
                # stops each UI's whole group (mlflow server runs uvicorn as a child).
                self._procs[spec.name] = subprocess.Popen(
                    spec.argv, env={**os.environ, **spec.env}, stdin=subprocess.DEVNULL,
                    stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                )
            except OSError as exc:
                self.stop()
                raise TargetError(f"cannot start {spec.name} ({spec.argv[0]}): {exc.strerror or exc}") from exc

    def wait_ready(self, deadline_s: float = 90.0, *, interval_s: float = 0.25) -> None:
        """Block until every UI answers 200 on its health URL; fail fast when one dies."""
        end = time.monotonic() + deadline_s
        pending = {s.name: s for s in self.specs}
        with httpx.Client(timeout=2.0) as http:
            while pending:
                reason = self.failure()
                if reason is not None:
                    raise TargetError(reason)
                for name, spec in list(pending.items()):
                    try:
                        if http.get(spec.health_url).status_code == 200:
                            del pending[name]
                    except httpx.TransportError:
                        pass
                if not pending:
                    return
                if time.monotonic() > end:
                    name = next(iter(pending))
                    raise TargetError(
                        f"{name} did not answer {pending[name].health_url} within {deadline_s:g} s;"
                        f" its log: {self.log_file(name)}"
                    )
                time.sleep(interval_s)

    def failure(self) -> str | None:
        """None while every UI runs; else which one exited, its code and last log lines."""
        for name, proc in self._procs.items():
            code = proc.poll()
            if code is not None:
                tail = _tail(self.log_file(name))
                return f"{name} exited with code {code}" + (f": {tail}" if tail else "")
        return None

    def stop(self) -> None:
        """SIGTERM each UI's process group, SIGKILL what is left after the grace period."""
        for proc in self._procs.values():
            _signal_group(proc.pid, signal.SIGTERM)
        end = time.monotonic() + self.stop_timeout_s
        for proc in self._procs.values():
            try:
                proc.wait(timeout=max(end - time.monotonic(), 0.01))
            except subprocess.TimeoutExpired:
                pass
        # Children that outlived their leader (or ignored SIGTERM) go too.
        _kill_groups(self._procs)
        for proc in self._procs.values():
            proc.wait()
        for log in self._logs.values():
            log.close()
        self._logs.clear()
        self._finalizer.detach()

    def __enter__(self) -> "Dashboards":
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _signal_group(pid: int, sig: signal.Signals) -> None:
    try:
        os.killpg(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def _kill_groups(procs: dict[str, subprocess.Popen[bytes]]) -> None:
    for proc in procs.values():
        _signal_group(proc.pid, signal.SIGKILL)


def _tail(path: Path, lines: int = _TAIL_LINES) -> str:
    try:
        data = path.read_bytes()[-8192:]
    except OSError:
        return ""
    kept = [ln.strip() for ln in data.decode("utf-8", errors="replace").splitlines() if ln.strip()]
    return " | ".join(kept[-lines:])
