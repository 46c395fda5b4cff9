"""The seam between the tuner and the backend it restarts.

A Target knows how to (re)start the backend so that it re-reads its config files,
how to send it a signal (``target.reload.signal``: reload without a restart), and how
to tell, cheaply, that it has died (so health waits fail fast instead of waiting out
their deadline). Implementations: process (a local command), docker (the containers
of a compose service), none (the backend reloads by itself).
"""

from __future__ import annotations

from abc import ABC, abstractmethod

from tuner.errors import TargetError


class Target(ABC):
    """A backend whose config the tuner patches."""

    @abstractmethod
    def start(self) -> None:
        """Make sure the backend runs (start it if it does not). Idempotent."""

    def up_before_start(self) -> list[str]:
        """What of the backend already runs before `start` (names), started by no one this
        process knows of: what it serves is unknown (a killed run's trial, a hand edit),
        so a run restarts it before it measures the config as found. Default: nothing
        (a process target's backend never outlives its run; `start` ends a leftover)."""
        return []

    @abstractmethod
    def restart(self) -> None:
        """Restart the backend so it reads its config files again. Returns at once;
        call a health wait afterwards."""

    @abstractmethod
    def stop(self) -> None:
        """Stop what this target started. Idempotent; never raises for 'already stopped'."""

    @abstractmethod
    def failure(self) -> str | None:
        """None while the backend may still come up; otherwise one line saying why it
        cannot (exit code, last log lines)."""

    def send_signal(self, signame: str) -> None:
        """Send the signal ``signame`` (e.g. ``"SIGHUP"``) to the running backend. Returns
        at once; TargetError when it cannot be delivered."""
        raise TargetError(
            f"this target ({type(self).__name__}) cannot take a signal ({signame}): "
            "use target.reload.http instead, or apply: process / docker"
        )

    def close(self) -> None:
        """Release resources (clients, handles). Default: stop."""
        self.stop()

    def __enter__(self) -> Target:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
