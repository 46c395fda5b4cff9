"""Who holds a lock: `Holder` (pid, host, command, since when, mode), recorded beside a
file lock or in a database lock row, and `LockHeld`, the one-line refusal naming it."""

from __future__ import annotations

import json
import os
import socket
import time
from dataclasses import dataclass

from tuner.errors import StudyError
from tuner.pids import pid_alive


class LockHeld(StudyError):
    """Another live process holds the lock (the message names it and the fix)."""


@dataclass(frozen=True)
class Holder:
    """Who holds a lock, as recorded beside it."""

    pid: int
    host: str
    command: str
    since: float  # epoch seconds
    mode: str = "exclusive"

    @classmethod
    def me(cls, command: str, mode: str = "exclusive") -> Holder:
        return cls(os.getpid(), socket.gethostname(), command, time.time(), mode)

    def describe(self) -> str:
        since = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(self.since))
        return f"{self.command} (pid {self.pid} on {self.host}, since {since})"

    def alive_here(self) -> bool | None:
        """Whether the holder process still exists (None: it runs on another host)."""
        if self.host != socket.gethostname():
            return None
        return pid_alive(self.pid)

    def to_json(self) -> str:
        return json.dumps(self.__dict__)

    @classmethod
    def from_text(cls, text: str) -> Holder | None:
        try:
            data = json.loads(text)
            return cls(
                int(data["pid"]),
                str(data["host"]),
                str(data["command"]),
                float(data["since"]),
                str(data.get("mode", "exclusive")),
            )
        except (ValueError, KeyError, TypeError):
            return None
