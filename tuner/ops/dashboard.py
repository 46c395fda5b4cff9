"""The two UIs of a study, run side by side: optuna-dashboard on the study storage
(with the Optuna artifact store) and the MLflow tracking server on the tracking store.

    ui_specs(experiment, *, optuna_port=8081, mlflow_port=5000, host="127.0.0.1") -> list[UiSpec]
    with Dashboards(specs, log_dir) as d:      # starts both, each in its own session
        d.wait_ready(deadline_s=60)            # both answer their health URL (or TargetError)
        d.failure()                            # None while both run, else which died and why
    # leaving the block stops both: SIGTERM to each group, SIGKILL after a grace period;
    # if the tuner dies instead (even by SIGKILL), a death signal and a watchdog end them

`ui_specs` is pure (argv, URLs, environment); `Dashboards` owns the processes. Only
tuner/cli/dashboard_cmd.py prints.

Store URLs reach the UIs as `ui_store` makes them: ``postgresql://`` names the installed
driver (tuner.study.database.sqlalchemy_url; SQLAlchemy's default, psycopg 3, is often not
installed), and a PostgreSQL password moves from the URL into the UI's environment as
``PGPASSWORD``, which libpq (psycopg2 and psycopg alike) reads when the URL has none. A
process's command line is world-readable (``ps``, /proc/PID/cmdline), its environment
only to its owner; the printed commands (`dashboard_commands`) hold no password either.
"""

from __future__ import annotations

import contextlib
import os
import shlex
import signal
import socket
import subprocess
import sys
import time
import weakref
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any
from urllib.parse import unquote, urlsplit, urlunsplit

import httpx

from tuner.dburl import redact, sqlalchemy_url
from tuner.errors import ConfigError, StudyError, TargetError
from tuner.secrets import env_name_of, redact_text

DEFAULT_OPTUNA_PORT = 8081
DEFAULT_MLFLOW_PORT = 5000
_TAIL_LINES = 5
_POLL_S = 0.1
_REAP_TIMEOUT_S = 10.0
_PR_SET_PDEATHSIG = 1  # <linux/prctl.h>
_WATCHDOG_CODE = "import sys; from tuner.ops.dashboard import watchdog_main; watchdog_main(sys.argv[1:])"


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


def ui_store(url: str) -> tuple[str, dict[str, str]]:
    """``(url, env)`` to start a UI on the store at ``url`` with: a PostgreSQL URL names
    its installed driver and loses its password to ``env["PGPASSWORD"]``; any other URL
    comes back as it is, with no environment."""
    scheme, sep, _ = url.partition("://")
    if not sep or scheme.split("+", 1)[0].lower() not in ("postgresql", "postgres"):
        return url, {}
    parts = urlsplit(sqlalchemy_url(url))
    if parts.password is None:
        return urlunsplit(parts), {}
    creds, _, host = parts.netloc.rpartition("@")
    user = creds.partition(":")[0]
    bare = urlunsplit(parts._replace(netloc=f"{user}@{host}" if user else host))
    return bare, {"PGPASSWORD": unquote(parts.password)}


def _shell_command(argv: Sequence[str], env: dict[str, str]) -> str:
    """``argv`` as a line to paste. A password in ``env`` is never printed: when it came
    from an environment variable of the experiment file (``${PG_PASSWORD}``) the line
    refers to that variable; else it relies on PGPASSWORD or ~/.pgpass being set up."""
    prefix = ""
    if "PGPASSWORD" in env:
        origin = env_name_of(env["PGPASSWORD"])
        prefix = f'PGPASSWORD="${origin}" ' if origin else ""
    return prefix + " ".join(shlex.quote(redact_text(a)) for a in argv)


def dashboard_commands(experiment: Any) -> dict[str, str]:
    """Shell commands that open the two UIs on this experiment's stores (printed by
    `tuner run` and `tuner demo`). They hold no password (see `ui_store`)."""
    from tuner.study.core import StudyPaths

    paths = StudyPaths(experiment.state_dir, experiment.study)
    storage, storage_env = _printable_store(experiment.storage)
    out = {"optuna": _shell_command([console_script("optuna-dashboard"), storage, "--artifact-dir",
                                      str(paths.artifact_dir)], storage_env)}
    if experiment.tracking.enabled:
        uri, uri_env = _printable_store(experiment.tracking.mlflow_uri)
        out["mlflow"] = _shell_command([console_script("mlflow"), "ui", "--backend-store-uri", uri], uri_env)
    out["both"] = f"{console_script('tuner')} dashboard {shlex.quote(str(experiment.source))}"
    return out


def _printable_store(url: str) -> tuple[str, dict[str, str]]:
    """`ui_store`, except that a store whose driver is not installed here is still
    printed (redacted): the command may be meant for another machine."""
    try:
        return ui_store(url)
    except StudyError:
        return redact(url), {}


def ui_specs(
    experiment: Any,
    *,
    optuna_port: int = DEFAULT_OPTUNA_PORT,
    mlflow_port: int = DEFAULT_MLFLOW_PORT,
    host: str = "127.0.0.1",
) -> list[UiSpec]:
    """The UIs for ``experiment`` (a `tuner.config.experiment.Experiment`): optuna-dashboard
    always, MLflow when tracking is enabled."""
    from tuner.study.core import StudyPaths

    _require_storage(experiment.storage, experiment.source)
    storage, storage_env = ui_store(experiment.storage)
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
            env=storage_env,
        )
    ]
    if experiment.tracking.enabled:
        uri, uri_env = ui_store(experiment.tracking.mlflow_uri)
        specs.append(
            UiSpec(
                name="mlflow",
                argv=[console_script("mlflow"), "server", "--backend-store-uri", uri,
                      "--host", host, "--port", str(mlflow_port), "--workers", "1"],
                host=host,
                port=mlflow_port,
                port_flag="--mlflow-port",
                # The job runner is a third process the UI does not need.
                env={"MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false", **uri_env},
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
                raise TargetError(f"{spec.name}: port {spec.port} on {spec.host} is in use; pick another with {spec.port_flag}")
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
                    spec.argv, env={**os.environ, **spec.env}, stdin=subprocess.DEVNULL, stdout=log,
                    stderr=subprocess.STDOUT, start_new_session=True, preexec_fn=_child_setup(mask),
                )
            except OSError as exc:
                raise TargetError(f"cannot start {spec.name} ({spec.argv[0]}): {exc.strerror or exc}") from exc
            self._procs[spec.name] = proc
            self._watchdog.watch(proc.pid)

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

    def __enter__(self) -> "Dashboards":
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
                    stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, pass_fds=(read_fd,),
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


def _child_setup(mask: set[signal.Signals]) -> Callable[[], None]:
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
def _signals_held() -> Iterator[set[signal.Signals]]:
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
