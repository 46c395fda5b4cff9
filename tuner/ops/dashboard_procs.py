"""Supervising the UI processes of `tuner dashboard`: each UI in its own process group,
a clean stop, and a watchdog for when the tuner dies.

    with Dashboards(specs, log_dir) as d:      # starts every UiSpec, each in its own session
        d.wait_ready(deadline_s=60)            # all answer their health URL (or TargetError); False if told to stop
        d.failure()                            # None while all run, else which died and why
    # leaving the block stops them: SIGTERM to each group, SIGKILL after a grace period;
    # if the tuner dies instead (even by SIGKILL), a death signal and a watchdog end them

What to start comes from `tuner.ops.dashboard_specs.ui_specs`. Only
tuner/cli/dashboard_cmd.py prints.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
import weakref
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import IO

import httpx

from tuner.errors import TargetError
from tuner.ops.dashboard_specs import UiSpec
from tuner.secrets import redact_text
from tuner.tls import shared_ssl_context

_TAIL_LINES = 5
_POLL_S = 0.1
_REAP_TIMEOUT_S = 10.0
_PR_SET_PDEATHSIG = 1  # <linux/prctl.h>
_WATCHDOG_CODE = "import sys; from tuner.ops.dashboard_procs import watchdog_main; watchdog_main(sys.argv[1:])"


def port_in_use(host: str, port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind((host, port))
        except OSError:
            return True
    return False


class Dashboards:
    """Runs the UI processes; see the module docstring.

    Every UI leads its own session, so its whole tree (mlflow's uvicorn, optuna-dashboard's
    gunicorn workers) is one process group that `stop` ends as a unit, and Ctrl-C in a
    terminal reaches only the tuner. Three layers make sure no UI outlives the tuner:
    `stop` (SIGTERM, bounded wait, SIGKILL, reap); PR_SET_PDEATHSIG, which kills each UI's
    first process when the tuner dies, even by SIGKILL; and a watchdog process that ends
    the whole groups then, since the kernel signals only the direct children. The death
    signal follows the thread that started the UIs: call `start` from one that outlives them.
    """

    def __init__(self, specs: Sequence[UiSpec], log_dir: Path, *, stop_timeout_s: float = 10.0) -> None:
        self.specs = list(specs)
        self.log_dir = Path(log_dir)
        self.stop_timeout_s = stop_timeout_s
        self._procs: dict[str, subprocess.Popen[bytes]] = {}
        self._logs: dict[str, IO[bytes]] = {}
        self._watchdog = _Watchdog(stop_timeout_s)
        self._stopped = False
        # Even if the caller forgets to stop (or dies of an exception), the UIs go too.
        self._finalizer = weakref.finalize(self, _abandon, self._procs, self._watchdog)

    def log_file(self, name: str) -> Path:
        return self.log_dir / f"{name}.log"

    @property
    def pids(self) -> dict[str, int]:
        """The first process of each UI; it leads the UI's process group (pgid == pid)."""
        return {name: p.pid for name, p in self._procs.items()}

    def start(self) -> None:
        for spec in self.specs:
            if port_in_use(spec.host, spec.port):
                raise TargetError(
                    f"{spec.name}: port {spec.port} on {spec.host} is in use; pick another with {spec.port_flag}"
                )
        self.log_dir.mkdir(parents=True, exist_ok=True)
        try:
            self._watchdog.start(self.log_file("watchdog"))
            for spec in self.specs:
                self._spawn(spec)
        except BaseException:
            self.stop()
            raise

    def _spawn(self, spec: UiSpec) -> None:
        log = open(self.log_file(spec.name), "wb")  # noqa: SIM115 - closed in stop()
        self._logs[spec.name] = log
        # SIGINT/SIGTERM wait until the child is on record: an interrupt inside Popen
        # would otherwise leave a running UI that nothing knows about.
        with _signals_held() as mask:
            try:
                proc = subprocess.Popen(
                    spec.argv,
                    env={**os.environ, **spec.env},
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                    preexec_fn=_child_setup(mask),
                )
            except OSError as exc:
                raise TargetError(f"cannot start {spec.name} ({spec.argv[0]}): {exc.strerror or exc}") from exc
            self._procs[spec.name] = proc
            self._watchdog.watch(proc.pid)

    def wait_ready(
        self,
        deadline_s: float = 90.0,
        *,
        interval_s: float = 0.25,
        stop_requested: Callable[[], bool] = lambda: False,
    ) -> bool:
        """Block until every UI answers 200 on its health URL (True), or until
        ``stop_requested()`` says to give up (False); TargetError when one dies first or
        the deadline passes."""
        end = time.monotonic() + deadline_s
        pending = {s.name: s for s in self.specs}
        with httpx.Client(timeout=2.0, verify=shared_ssl_context()) as http:
            while pending:
                if stop_requested():
                    return False
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
                    return True
                if time.monotonic() > end:
                    name = next(iter(pending))
                    raise TargetError(
                        f"{name} did not answer {pending[name].health_url} within {deadline_s:g} s;"
                        f" its log: {self.log_file(name)}"
                    )
                time.sleep(interval_s)
        return True

    def failure(self) -> str | None:
        """None while every UI runs; else which one exited, its code and last log lines."""
        for name, proc in self._procs.items():
            code = proc.poll()
            if code is not None:
                tail = redact_text(_tail(self.log_file(name)))
                return f"{name} exited with code {code}" + (f": {tail}" if tail else "")
        return None

    def stop(self) -> None:
        """End every UI's process group and reap the UIs; safe to call more than once.

        SIGTERM to each group, up to ``stop_timeout_s`` for the groups to empty, then
        SIGKILL to what is left. SIGINT/SIGTERM that arrive meanwhile are delivered after
        it, so a second Ctrl-C cannot cut the stop short.
        """
        if self._stopped:
            return
        self._stopped = True
        with _signals_held():
            procs = list(self._procs.values())
            _end_groups([p.pid for p in procs], self.stop_timeout_s, reap=lambda: [p.poll() for p in procs])
            for proc in procs:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    proc.wait(timeout=_REAP_TIMEOUT_S)  # SIGKILLed: only a process stuck in the kernel takes longer
            self._watchdog.stand_down()
            for log in self._logs.values():
                log.close()
            self._logs.clear()
            self._finalizer.detach()

    def __enter__(self) -> Dashboards:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


class _Watchdog:
    """A process of its own (own session, so a signal to the tuner's group spares it) that
    reads process-group ids from a pipe and, at end of file, ends those groups.

    End of file comes when the tuner closes the pipe or dies in any way, SIGKILL included;
    that is what makes it outlive the tuner. After a clean stop it is killed instead: the
    groups are gone, and their ids must not be signalled once the kernel may reuse them.
    """

    def __init__(self, grace_s: float) -> None:
        self.grace_s = grace_s
        self.proc: subprocess.Popen[bytes] | None = None
        self.fd: int | None = None

    def start(self, log_path: Path) -> None:
        read_fd, self.fd = os.pipe()
        # Its output goes to a file, not the tuner's stdout: a reader of that (a pipe, `tee`)
        # would otherwise wait for the watchdog too after the tuner is gone.
        try:
            with open(log_path, "wb") as log:
                self.proc = subprocess.Popen(
                    [sys.executable, "-c", _WATCHDOG_CODE, str(read_fd), str(self.grace_s)],
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    pass_fds=(read_fd,),
                    start_new_session=True,
                )
        except OSError as exc:
            raise TargetError(f"cannot start the dashboard watchdog ({sys.executable}): {exc.strerror or exc}") from exc
        finally:
            os.close(read_fd)

    def watch(self, pgid: int) -> None:
        if self.fd is not None:
            os.write(self.fd, f"{pgid}\n".encode())

    def stand_down(self) -> None:
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait()
            self.proc = None
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None


def watchdog_main(argv: Sequence[str]) -> None:
    """Body of the watchdog process (see `_Watchdog`): ``argv`` = [pipe fd, grace seconds]."""
    fd, grace_s = int(argv[0]), float(argv[1])
    groups: list[int] = []
    pending = b""
    while chunk := os.read(fd, 4096):
        pending += chunk
        *lines, pending = pending.split(b"\n")
        groups += [int(line) for line in lines if line]
    _end_groups(groups, grace_s)


def _end_groups(pgids: Sequence[int], grace_s: float, *, reap: Callable[[], object] = lambda: None) -> None:
    """SIGTERM each group, wait until all are empty or ``grace_s`` passed, SIGKILL the rest.

    ``reap`` collects exited leaders: an unreaped zombie still counts as a group member.
    """
    for pgid in pgids:
        _signal_group(pgid, signal.SIGTERM)
    end = time.monotonic() + grace_s
    while True:
        reap()
        left = [pgid for pgid in pgids if _group_exists(pgid)]
        if not left or time.monotonic() > end:
            break
        time.sleep(_POLL_S)
    for pgid in left:
        _signal_group(pgid, signal.SIGKILL)


def _child_setup(mask: set[int | signal.Signals]) -> Callable[[], None]:
    """preexec_fn of a UI: the parent's signal mask back (it is held while spawning, and
    exec keeps masks) and, on Linux, SIGKILL when the tuner dies."""
    prctl = _libc_prctl()
    parent = os.getpid()

    def setup() -> None:
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)
        if prctl is not None and prctl(_PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0) == 0 and os.getppid() != parent:
            os._exit(1)  # the tuner died before the death signal was armed

    return setup


def _libc_prctl() -> Callable[..., int] | None:
    """libc's prctl, looked up before fork (no dlopen between fork and exec); None off Linux."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        import ctypes

        return ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None


@contextlib.contextmanager
def _signals_held() -> Iterator[set[int | signal.Signals]]:
    """Defer SIGINT and SIGTERM in this thread; yields the mask to restore."""
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM})
    try:
        yield previous
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)


def _group_exists(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # the id now belongs to someone else's group: ours is gone
        return False
    return True


def _signal_group(pid: int, sig: signal.Signals) -> None:
    try:
        os.killpg(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def _abandon(procs: dict[str, subprocess.Popen[bytes]], watchdog: _Watchdog) -> None:
    """Finalizer of a Dashboards never stopped: no grace, just SIGKILL every group."""
    for proc in procs.values():
        _signal_group(proc.pid, signal.SIGKILL)
    watchdog.stand_down()


def _tail(path: Path, lines: int = _TAIL_LINES) -> str:
    try:
        data = path.read_bytes()[-8192:]
    except OSError:
        return ""
    kept = [ln.strip() for ln in data.decode("utf-8", errors="replace").splitlines() if ln.strip()]
    return " | ".join(kept[-lines:])
