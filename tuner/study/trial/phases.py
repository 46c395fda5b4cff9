"""A trial's timed phases: their names and the timer every collaborator of the trial
runner times its steps with (the seconds go into ``TrialOutcome.phase_seconds``; the
observer, the progress line, is told which phase a trial is in)."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Literal

from tuner.study.trial.outcome import TrialOutcome

Phase = Literal[
    "suggest",
    "render",
    "cache",
    "patch",
    "restart",
    "health",
    "reload",
    "confirm",
    "evaluate",
    "score",
    "solve",
    "complete",
    "record",
    "backlog",
    "explain",
    "replay",
    "verify",
]


def _nobody(number: int, phase: str) -> None:
    return None


@dataclass
class Phases:
    """Times a trial's phases; ``on_phase(number, phase)`` as each one starts. One
    instance is shared by the runner and its collaborators, so the study loop can
    swap the observer for a whole run (``TrialRunner.on_phase``)."""

    on_phase: Callable[[int, str], None] = _nobody

    @contextmanager
    def time(self, out: TrialOutcome, phase: Phase) -> Iterator[None]:
        self.on_phase(out.number, phase)
        started = time.perf_counter()
        try:
            yield
        finally:
            out.phase_seconds[phase] = out.phase_seconds.get(phase, 0.0) + time.perf_counter() - started
