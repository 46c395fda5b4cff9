"""A backend run as a local command that the tuner starts, restarts and stops.

The command runs in its own process group (so a restart also ends the workers it
forked, and Ctrl-C in the tuner's terminal does not reach it); stdout and stderr go
to a log file. A restart sends SIGTERM to the group, waits up to ``stop_timeout_s``,
then SIGKILLs it and starts the command again. ``failure()`` tells a health wait at
once when the command has died, with its exit code and last log lines.

The backend never outlives the run that started it, even a SIGKILLed one:

- On Linux the command gets a parent-death signal (``prctl(PR_SET_PDEATHSIG,
  SIGKILL)``): it is killed when the tuner dies. The kernel sends it when the *thread*
  that started the command exits, not the process, so it is armed only for starts from
  the main thread (where the tuner starts and restarts backends: the study loop, the
  worker loop and the preflight all run there); a start from another thread relies on
  the record below. The signal reaches the command only, not what it forks.
- Every start records the backend in ``<state_dir>/backend.pid``; the next start
  ends whatever a killed run left (tuner.targets.leftovers) and says so in
  ``.reaped`` for the caller to print. A deliberate stop removes the record.

    ProcessTarget(config: ProcessConfig, *, config_files, port=None, state_dir)
        .start() / .restart() / .stop() / .failure() / .close()
        .send_signal(signame)  # to the backend's own process (the leader), not its group
        .pid -> int | None; .log_file -> Path; .argv -> list[str]
        .reaped -> list[str]  # one line per leftover backend a start ended

Placeholders in the command, cwd and env values: ``{config}`` (first config file),
``{config0}``, ``{config1}``..., ``{port}``, ``{python}`` (this interpreter),
``{state_dir}``. Other braces are left alone.
"""

from __future__ import annotations

import ctypes
import os
import re
import signal
import subprocess
import sys
import threading
import uuid
import weakref
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from tuner.config.target import ProcessConfig
from tuner.errors import ConfigError, TargetError
from tuner.targets.base import Target
from tuner.targets.leftovers import TOKEN_ENV, reap_leftover, remove_record, write_record

_TOKEN = re.compile(r"\{(\w+)\}")
_TAIL_LINES = 5
_TAIL_BYTES = 8192
_PR_SET_PDEATHSIG = 1  # <linux/prctl.h>


def fill_placeholders(text: str, values: Mapping[str, str]) -> str:
    """Replace ``{name}`` for known names only; unknown ``{...}`` stay as written."""
    return _TOKEN.sub(lambda m: values.get(m.group(1), m.group(0)), text)


class ProcessTarget(Target):
    """A local command; see the module docstring."""

    def __init__(
        self,
        config: ProcessConfig,
        *,
        config_files: Sequence[Path],
        port: int | None = None,
        state_dir: Path,
    ) -> None:
        self.config = config
        self.state_dir = Path(state_dir)
        values = {"python": sys.executable, "state_dir": str(self.state_dir)}
        for i, f in enumerate(config_files):
            values[f"config{i}"] = str(f)
        if config_files:
            values["config"] = str(config_files[0])
        if port is not None:
            values["port"] = str(port)
        self.argv = [fill_placeholders(a, values) for a in config.command]
        unfilled = [a for a in self.argv if "{port}" in a]
        if unfilled:
            raise ConfigError(
                "target.process.command uses {port} but no port is set (set target.port or call bind_port): "
                f"{unfilled[0]}"
            )
        self.cwd = Path(fill_placeholders(str(config.cwd), values)) if config.cwd else None
        self.env = {k: fill_placeholders(v, values) for k, v in config.env.items()}
        self.log_file = Path(config.log_file) if config.log_file else self.state_dir / "backend.log"
        self._proc: subprocess.Popen[bytes] | None = None
        self._log_offset = 0
        self._stopped_on_purpose = False
        self.reaped: list[str] = []
        # An interpreter that exits without stop() (crash, unhandled error) must not leave
        # the backend running: finalize objects also run at exit.
        self._finalizer = weakref.finalize(self, _kill_group_quietly, None, self.state_dir)

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def start(self) -> None:
        if self.running():
            return
        leftover = reap_leftover(self.state_dir, timeout_s=self.config.stop_timeout_s)
        if leftover is not None:
            self.reaped.append(leftover)
        self.log_file.parent.mkdir(parents=True, exist_ok=True)
        token = uuid.uuid4().hex
        with open(self.log_file, "ab") as log:
            self._log_offset = log.tell()
            try:
                self._proc = subprocess.Popen(
                    self.argv,
                    cwd=self.cwd,
                    env={**os.environ, **self.env, TOKEN_ENV: token},
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                    preexec_fn=_die_with_parent(),
                )
            except OSError as exc:
                raise TargetError(
                    f"cannot start {self.argv[0]!r} (target.process.command): {exc.strerror or exc}"
                ) from exc
        self._stopped_on_purpose = False
        self._finalizer.detach()
        self._finalizer = weakref.finalize(self, _kill_group_quietly, self._proc.pid, self.state_dir)
        try:
            write_record(self.state_dir, pid=self._proc.pid, argv=self.argv, token=token)
        except OSError as exc:
            self.stop()
            raise TargetError(
                f"cannot record the backend in {self.state_dir} (state_dir must be writable): {exc.strerror or exc}"
            ) from exc

    def restart(self) -> None:
        self.stop()
        self.start()

    def send_signal(self, signame: str) -> None:
        """``signame`` to the backend process itself (not its group: forked workers are the
        backend's to tell). TargetError when it is not running."""
        sig = signal.Signals[signame]
        proc = self._proc
        if proc is None or proc.poll() is not None:
            raise TargetError(
                f"cannot send {signame}: the backend process is not running ({self.failure() or 'not started'})"
            )
        try:
            os.kill(proc.pid, sig)
        except ProcessLookupError as exc:
            raise TargetError(f"cannot send {signame}: backend process {proc.pid} is gone") from exc

    def stop(self) -> None:
        proc = self._proc
        if proc is None:
            return
        self._stopped_on_purpose = True
        if proc.poll() is None:
            _signal_group(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=self.config.stop_timeout_s)
            except subprocess.TimeoutExpired:
                _signal_group(proc.pid, signal.SIGKILL)
                proc.wait()
        # Children that outlived the leader (or ignored SIGTERM) go too.
        _signal_group(proc.pid, signal.SIGKILL)
        self._finalizer.detach()
        remove_record(self.state_dir, proc.pid)

    def failure(self) -> str | None:
        proc = self._proc
        if proc is None:
            return "the backend process was never started"
        code = proc.poll()
        if code is None:
            return None
        if self._stopped_on_purpose:
            return "the backend process was stopped by the tuner"
        how = f"killed by {signal.Signals(-code).name}" if code < 0 else f"exited with code {code}"
        tail = self.log_tail()
        name = Path(self.argv[0]).name
        return f"{name} {how}: {tail}" if tail else f"{name} {how} (log {self.log_file} is empty)"

    def log_tail(self, lines: int = _TAIL_LINES) -> str:
        """The last ``lines`` non-empty lines the current run wrote, joined with ' | '."""
        try:
            with open(self.log_file, "rb") as fh:
                fh.seek(0, os.SEEK_END)
                end = fh.tell()
                start = max(self._log_offset, end - _TAIL_BYTES)
                fh.seek(start)
                data = fh.read()
        except OSError:
            return ""
        text = data.decode("utf-8", errors="replace")
        kept = [ln.strip() for ln in text.splitlines() if ln.strip()][-lines:]
        return " | ".join(kept)

    def close(self) -> None:
        self.stop()


def _die_with_parent() -> Callable[[], None] | None:
    """A preexec_fn that makes the child get SIGKILL when this thread ends (see the module
    docstring); None off Linux, off the main thread, or without a usable libc."""
    prctl = _prctl()
    if prctl is None or threading.current_thread() is not threading.main_thread():
        return None
    parent = os.getpid()
    kill = int(signal.SIGKILL)

    # Runs in the forked child before exec: no imports, no locks, nothing but syscalls.
    def arm() -> None:
        prctl(_PR_SET_PDEATHSIG, kill, 0, 0, 0)
        if os.getppid() != parent:  # the tuner died before prctl: the signal will not come
            os.kill(os.getpid(), kill)

    return arm


_PRCTL: list[Callable[..., int] | None] = []


def _prctl() -> Callable[..., int] | None:
    """libc's prctl, looked up once (never in a forked child)."""
    if not _PRCTL:
        fn = None
        if sys.platform.startswith("linux"):
            try:
                fn = ctypes.CDLL(None, use_errno=True).prctl
                fn.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong]
                fn.restype = ctypes.c_int
            except (OSError, AttributeError):
                fn = None
        _PRCTL.append(fn)
    return _PRCTL[0]


def _signal_group(pid: int, sig: signal.Signals) -> None:
    try:
        os.killpg(pid, sig)  # start_new_session made the pid the group id
    except (ProcessLookupError, PermissionError):
        pass


def _kill_group_quietly(pid: int | None, state_dir: Path) -> None:
    if pid is not None:
        _signal_group(pid, signal.SIGKILL)
        remove_record(state_dir, pid)
