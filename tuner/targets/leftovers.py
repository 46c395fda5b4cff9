"""Backends left running by a killed run: the record a process target keeps of what it
started, and the clean-up the next start does.

A process target starts its backend in a session of its own, so a SIGKILL of the tuner
leaves it running (re-parented to init, still holding its port, still on the trial's
config). The child's parent-death signal (tuner.targets.process) ends the backend
itself, but not what it forked (a shell wrapper's children, a server's workers), and
not on systems without one. So every start writes a record, and the next start ends
what a dead run left::

    write_record(state_dir, pid=..., argv=..., token=...) -> BackendRecord
    remove_record(state_dir, pid)       # a deliberate stop: nothing is left over
    reap_leftover(state_dir) -> str | None

The record is ``<state_dir>/backend.pid`` (JSON). A process is ended only when it is
provably the recorded backend or one of its descendants: the recorded pid with the
recorded start time (a recycled pid has another), or a process whose environment
carries the record's random token (``TUNER_BACKEND_ID``, set by the target and
inherited by what the backend forks, even into another session). Identity needs
Linux's /proc; where it is absent nothing is ended (the parent-death signal is
Linux-only as well).
"""

from __future__ import annotations

import json
import os
import shlex
import signal
import socket
import time
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

from tuner.files import atomic_write_text

RECORD_NAME = "backend.pid"
TOKEN_ENV = "TUNER_BACKEND_ID"
_PROC = Path("/proc")
_POLL_S = 0.1
_KILL_WAIT_S = 5.0
_ARGV_CHARS = 160


@dataclass(frozen=True)
class BackendRecord:
    """What a process target started, and which run started it."""

    pid: int
    pgid: int
    start_time: int | None  # /proc/<pid>/stat field 22 (clock ticks after boot)
    argv: list[str]
    owner_pid: int
    owner_start_time: int | None
    host: str
    boot_id: str | None
    token: str


def record_path(state_dir: Path) -> Path:
    return Path(state_dir) / RECORD_NAME


def write_record(state_dir: Path, *, pid: int, argv: Sequence[str], token: str) -> BackendRecord:
    """Record the backend just started (atomically: a reader never sees half a record)."""
    owner = os.getpid()
    record = BackendRecord(
        pid=pid,
        pgid=pid,  # the target starts it with start_new_session: it leads its own group
        start_time=start_time(pid),
        argv=list(argv),
        owner_pid=owner,
        owner_start_time=start_time(owner),
        host=socket.gethostname(),
        boot_id=_boot_id(),
        token=token,
    )
    # 0600: the backend's command line may carry a key
    atomic_write_text(record_path(state_dir), json.dumps(asdict(record), indent=1) + "\n", mode=0o600)
    return record


def read_record(state_dir: Path) -> BackendRecord | None:
    """The record, or None when there is none or it is not one of ours (e.g. a bare pid
    another writer keeps under the same name)."""
    try:
        data = json.loads(record_path(state_dir).read_text())
        return BackendRecord(**data)
    except (OSError, ValueError, TypeError):
        return None


def remove_record(state_dir: Path, pid: int) -> None:
    """Forget the backend ``pid`` after a deliberate stop; a record of another backend
    (another target started since) is kept."""
    record = read_record(state_dir)
    if record is not None and record.pid == pid:
        record_path(state_dir).unlink(missing_ok=True)


def reap_leftover(state_dir: Path, *, timeout_s: float = 10.0) -> str | None:
    """End the backend a killed run left behind; one line saying what was ended, or None.

    Left alone: no record, a record of another host, a record whose owner still runs (a
    live run's backend; that includes this process). A record whose backend is already
    gone is removed. Otherwise the recorded backend gets SIGTERM, up to ``timeout_s``
    to exit, then SIGKILL.
    """
    record = read_record(state_dir)
    if record is None or record.host != socket.gethostname() or not _PROC.is_dir():
        return None
    if record.boot_id is not None and record.boot_id != _boot_id():
        record_path(state_dir).unlink(missing_ok=True)  # rebooted since: nothing of it runs
        return None
    if _owner_alive(record):
        return None
    leader = _is(record.pid, record.start_time)
    members = _members(record)
    if members:
        _end(record, leader=leader, members=members, timeout_s=timeout_s)
    record_path(state_dir).unlink(missing_ok=True)
    if not members:
        return None
    argv = shlex.join(record.argv)
    if len(argv) > _ARGV_CHARS:
        argv = argv[: _ARGV_CHARS - 3] + "..."
    what = (
        f"backend pid {record.pid}"
        if leader
        else (f"processes {', '.join(map(str, sorted(members)))} of backend pid {record.pid}")
    )
    return f"ended {what} ({argv}) left by a killed run (pid {record.owner_pid})"


def start_time(pid: int) -> int | None:
    """Field 22 of /proc/<pid>/stat: when the process started, in clock ticks after boot.
    None when the process is gone or there is no /proc."""
    stat = _stat(pid)
    return stat[3] if stat is not None else None


def _stat(pid: int) -> tuple[str, int, int, int] | None:
    """(state, pgid, session id, start time) of ``pid``, from /proc/<pid>/stat."""
    try:
        text = (_PROC / str(pid) / "stat").read_text()
    except OSError:
        return None
    # The command name (field 2) may hold spaces and parentheses: split after the last ')'.
    fields = text.rsplit(")", 1)[1].split()
    return fields[0], int(fields[2]), int(fields[3]), int(fields[19])


def _is(pid: int, started: int | None) -> bool:
    """``pid`` runs (not a zombie) and is the process that started at ``started``."""
    stat = _stat(pid)
    return stat is not None and stat[0] != "Z" and started is not None and stat[3] == started


def _owner_alive(record: BackendRecord) -> bool:
    if record.owner_start_time is not None:
        return _is(record.owner_pid, record.owner_start_time)
    try:
        os.kill(record.owner_pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # someone's process holds the pid: cannot tell, so assume alive
    return True


def _members(record: BackendRecord) -> dict[int, int]:
    """pid -> start time of the live processes that are provably the recorded backend or
    its descendants (see the module docstring)."""
    found: dict[int, int] = {}
    for entry in _PROC.iterdir():
        if not entry.name.isdigit():
            continue
        pid = int(entry.name)
        stat = _stat(pid)
        if stat is None or stat[0] == "Z":
            continue
        if (pid == record.pid and stat[3] == record.start_time) or _carries(pid, record.token):
            found[pid] = stat[3]
    return found


def _carries(pid: int, token: str) -> bool:
    try:
        environ = (_PROC / str(pid) / "environ").read_bytes()
    except OSError:
        return False
    return f"{TOKEN_ENV}={token}".encode() in environ.split(b"\0")


def _end(record: BackendRecord, *, leader: bool, members: dict[int, int], timeout_s: float) -> None:
    """SIGTERM, wait, SIGKILL, to each proven member. With the leader verified its
    whole group is signalled too (the group is its own: a group id is not reused while
    a member lives), which reaches descendants that cleared their environment."""
    for sig, wait_s in ((signal.SIGTERM, timeout_s), (signal.SIGKILL, _KILL_WAIT_S)):
        alive = _still(members)
        if not alive:
            return
        if leader:
            _signal_group(record.pgid, sig)
        _signal_each(alive, sig)
        deadline = time.monotonic() + wait_s
        while _still(members) and time.monotonic() < deadline:
            time.sleep(_POLL_S)


def _still(members: dict[int, int]) -> list[int]:
    return [pid for pid, started in members.items() if _is(pid, started)]


def _signal_group(pgid: int, sig: signal.Signals) -> None:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def _signal_each(pids: Iterable[int], sig: signal.Signals) -> None:
    for pid in pids:
        try:
            os.kill(pid, sig)
        except (ProcessLookupError, PermissionError):
            pass


def _boot_id() -> str | None:
    try:
        return (_PROC / "sys" / "kernel" / "random" / "boot_id").read_text().strip()
    except OSError:
        return None
