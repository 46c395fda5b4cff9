"""The clean-up after a killed worker: a watchdog process (the reaper) that stops the
worker's backend, takes down its docker replica's compose project and restores the
config when the worker dies, even by SIGKILL.

    PidRecordingTarget(target, pid_file)       # keeps the backend's pid on disk
    start_reaper(pid_file, journal) -> handle  # the watchdog of this worker
    wait_for_reaper(state_dir, note, what=...) # a new start waits for a reaper still at work

What the reaper reads sits in the replica's state dir: the backend's pid
(``Replica.pid_file``) and ``compose.json``, how to take a docker replica's project down
(written by tuner.targets.compose_replica while the project is up). While it cleans up,
``reaping.pid`` names it.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tuner.targets.replica import Note

if TYPE_CHECKING:
    import subprocess

RECORD_NAME = "compose.json"
REAPING_NAME = "reaping.pid"
_REAPER_WAIT_S = 180.0


def wait_for_reaper(state_dir: Path, note: Note, *, what: str) -> None:
    """A killed worker's reaper may still be taking its project down: wait for it, so
    its ``down`` cannot hit the containers this start brings up."""
    from tuner.targets.leftovers import start_time

    marker = read_json(state_dir / REAPING_NAME)
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


def write_json(path: Path, data: Mapping[str, Any]) -> None:
    from tuner.files import atomic_write_text

    atomic_write_text(path, json.dumps(data, indent=1) + "\n", mode=0o600)  # compose env may hold secrets


def read_json(path: Path) -> dict[str, Any] | None:
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
    code = (
        "import sys; from tuner.targets.reaper import reap; "
        f"reap(int(sys.argv[1]), {str(pid_file)!r}, {str(journal)!r})"
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", code, str(read_fd)],
        pass_fds=(read_fd,),
        start_new_session=True,
        stdin=subprocess.DEVNULL,
    )
    os.close(read_fd)
    return _ReaperHandle(proc, write_fd)


@dataclass
class _ReaperHandle:
    proc: subprocess.Popen[bytes]
    write_fd: int

    def close(self) -> None:
        os.close(self.write_fd)
        try:
            self.proc.wait(timeout=30)
        except Exception:  # noqa: BLE001 - the reaper is best effort; it never holds the worker up
            pass


def reap(read_fd: int, pid_file: str, journal: str) -> None:
    """The reaper's body (runs in its own process; see start_reaper)."""
    import signal

    from tuner.config.journal import recover
    from tuner.targets.leftovers import start_time

    while os.read(read_fd, 1):  # returns b"" only when every write end is closed
        pass
    state_dir = Path(pid_file).parent
    marker = state_dir / REAPING_NAME
    record = state_dir / RECORD_NAME
    path = Path(pid_file)
    busy = path.exists() or record.exists()
    if busy:  # a new worker of this replica waits until the clean-up is done
        write_json(marker, {"pid": os.getpid(), "start_time": start_time(os.getpid())})
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

    record = read_json(record_file)
    if not record or not record.get("down"):
        return
    try:
        proc = subprocess.run(
            list(record["down"]),
            env={**os.environ, **(record.get("env") or {})},
            cwd=record.get("cwd") or None,
            capture_output=True,
            timeout=300,
        )
    except (OSError, subprocess.TimeoutExpired):
        return
    if proc.returncode == 0:
        record_file.unlink(missing_ok=True)
