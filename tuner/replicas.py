"""One worker's own backend replica: a copy of the config files, a state dir, a port,
and a watchdog that cleans up after the worker if it is killed.

    replica_of(experiment, index) -> (Experiment bound to the replica, Replica)
    PidRecordingTarget(target, pid_file)       # keeps the backend's pid on disk
    start_reaper(pid_file, journal) -> handle  # stops the backend, restores the config
                                               # when the worker dies (even by SIGKILL)

The originals are never patched by workers: each replica patches its own copy
(``config.replica-N.yaml`` next to the original, so relative paths still resolve).
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass
class Replica:
    """Where replica N keeps its own copy of the backend's config and its state."""

    index: int
    config_files: list[Path]
    state_dir: Path

    @property
    def pid_file(self) -> Path:
        return self.state_dir / "backend.pid"

    def up(self, note: Any = lambda text: None) -> None:
        """Bring up what this replica runs on before its first trial (nothing for a
        process target: the target starts the backend itself)."""

    def down(self) -> None:
        """Take down what ``up`` brought up."""


def replica_of(experiment: Any, index: int) -> tuple[Any, Replica]:
    """The experiment as replica ``index`` runs it: the config files copied next to the
    originals (``config.replica-N.yaml``, so relative paths inside them still resolve),
    its own state dir (restore journal, result cache, trial reports) and a free port.

    The copies are made from the originals at every start: the originals are never
    patched by workers, so a crashed replica cannot leak a trial's values into them.
    """
    from tuner.errors import ConfigError
    from tuner.experiment import free_port

    target = experiment.target
    if target.apply == "docker":
        raise ConfigError("tuner worker drives process targets; for docker give each worker its own compose "
                          "project (see docs/scale.md) and use target.apply: process or none per replica")
    if target.apply == "process" and "{port}" not in " ".join(target.process.command):
        raise ConfigError("target.process.command has no {port}: replicas would all bind the same port; "
                          "pass the port to the backend, e.g. --port {port}")
    copies = []
    for original in target.config_files:
        copy_path = original.with_name(f"{original.stem}.replica-{index}{original.suffix}")
        _atomic_copy(original, copy_path)
        copies.append(copy_path)
    replica = Replica(index, copies, experiment.state_dir / "replicas" / str(index))
    replica.state_dir.mkdir(parents=True, exist_ok=True)
    bound = experiment.model_copy(update={
        "target": target.model_copy(update={"config_files": copies}),
        "state_dir": replica.state_dir,
    })
    port = free_port() if target.apply == "process" else None
    return bound.bind_port(port), replica


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

    def _record(self) -> None:
        pid = getattr(self._inner, "pid", None)
        if pid is not None:
            tmp = self._pid_file.with_suffix(".tmp")
            tmp.write_text(str(pid))
            tmp.replace(self._pid_file)


def start_reaper(pid_file: Path, journal: Path) -> Any:
    """A watchdog process for this worker: it waits on a pipe the worker holds open and,
    when the worker dies (even by SIGKILL, which closes the pipe), stops the backend
    named in ``pid_file`` and restores the config from the restore ``journal``. Returns
    the write end's owner handle; closing it at a clean exit is harmless."""
    import subprocess
    import sys

    read_fd, write_fd = os.pipe()
    code = ("import sys; from tuner.replicas import reap; "
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

    from tuner.configpatch import recover

    while os.read(read_fd, 1):  # returns b"" only when every write end is closed
        pass
    path = Path(pid_file)
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
    recover(Path(journal))


def _atomic_copy(src: Path, dst: Path) -> None:
    from tuner.report.atomic import atomic_write_bytes

    atomic_write_bytes(dst, src.read_bytes())


