"""Stopping a study run between trial phases: the `StopFlag` a signal handler sets and
the `TrialInterrupted` a trial ends with when the stop came before its evaluation."""

from __future__ import annotations

import threading

from tuner.errors import TunerError


class StopFlag:
    """Set by a signal handler; checked between phases. Thread-safe."""

    def __init__(self) -> None:
        self._event = threading.Event()
        self.reason = "interrupted"

    def set(self, reason: str = "interrupted") -> None:
        self.reason = reason
        self._event.set()

    def is_set(self) -> bool:
        return self._event.is_set()

    def wait(self, timeout: float) -> bool:
        """Sleep up to ``timeout`` seconds, waking at once when the flag is set."""
        return self._event.wait(timeout)


class TrialInterrupted(TunerError):
    """A stop was requested before the trial reached its evaluation."""
