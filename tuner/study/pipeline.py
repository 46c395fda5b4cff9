"""The pipelined trial loop: the backend measures one trial while the tuner ends the
trial before it and begins the next.

A trial has three stages (tuner.study.trial.runner.TrialRunner): ``begin`` (ask, suggest,
render, cache lookup), ``measure`` (patch, reload or restart, the search calls) and
``end`` (scoring, solved gates, the record, ``tell``). Only ``measure`` needs the
backend, so it runs back to back on the loop's thread, and one helper thread does the
rest in between::

    loop thread    | measure N-1 | measure N         | measure N+1 ...
    helper thread  |             | end N-1, begin N+1| end N, begin N+2 ...

(the helper starts on a trial once its measure has written the config: see
``TrialRunner.measure``'s ``written``).

What that changes, and why it is sound:

- The sampler proposes trial N+1 knowing every trial up to N-1; N is RUNNING then (as
  with two workers). The order of asks and tells is fixed, so a seeded study is still
  reproducible.
- A trial measured right after an identical one cannot hit the result cache (the
  earlier one is stored while the later one runs); any other repeat still does.
- A stop (Ctrl-C, timeout, the failure budget, n_trials reached) can leave one trial
  begun ahead and not measured: it is told FAIL with ``fail_reason`` saying it did not
  run (``interrupted``: it counts against neither n_trials nor the failure budget), and
  its params are queued again (with its variant name), so a resumed study measures them
  first and no queued baseline or shortlist variant is lost.
- A trial whose measure failed ends at once (it has nothing to score), so the failure
  budget stops the study after the same trial as one trial at a time would; the trial
  begun ahead meanwhile is told FAIL as not run. A trial that fails while it is
  scored (rare: a missing objective metric) is seen one trial later.

`PipelinedLoop.run` is called by `tuner.study.loop.StudyLoop` (``pipeline=True``) with
the loop's own hooks for the checks between trials, ``ask`` and ``tell``.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import ExitStack
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import optuna

from tuner.study.trial.outcome import TrialOutcome

if TYPE_CHECKING:
    from tuner.study.trial.runner import TrialJob, TrialRunner

SWITCH_INTERVAL_S = 0.0005
# starts with "interrupted" (tuner.study.storage.queue.INTERRUPTED): it never uses up one of n_trials
NOT_RUN = (
    "interrupted: the study stopped ({why}) before this trial, begun ahead, was measured; it did not run "
    "and its params are queued again for the next run"
)


@dataclass
class Slot:
    """A trial between ``ask`` and ``tell``: the runner's job and its heartbeat."""

    trial: optuna.Trial
    job: TrialJob
    ask_s: float
    beats: ExitStack
    measured: bool = False  # its measure stage has started


@dataclass
class TrialSteps:
    """A trial's steps between ``ask`` and ``tell``, the same in the pipelined and the
    parallel loop (tuner.study.parallel): begin (ask, the runner's begin), end (the
    runner's end, tell, the failure budget's verdict), abort; each asked trial is told
    exactly once, and its heartbeat closed. ``open`` holds the asked, not told yet."""

    runner: TrialRunner
    ask: Callable[[], tuple[optuna.Trial, float, ExitStack]]
    tell: Callable[[Slot, TrialOutcome], None]
    on_end: Callable[[TrialOutcome], str | None]
    requeue: Callable[[Slot], None]
    open: list[Slot] = field(default_factory=list)

    def begin(self) -> Slot:
        trial, ask_s, beats = self.ask()
        try:
            job = self.runner.begin(trial)
        except BaseException:
            beats.close()
            raise
        slot = Slot(trial, job, ask_s, beats)
        self.open.append(slot)
        return slot

    def end(self, slot: Slot) -> str | None:
        outcome = self.runner.end(slot.job)
        self._tell(slot, outcome)
        return self.on_end(outcome)

    def abort(self, slot: Slot, reason: str) -> None:
        outcome = self.runner.abort(slot.job, reason, ran=slot.measured)
        self._tell(slot, outcome)
        if not slot.measured:
            self.requeue(slot)

    def abort_open(self, reason: str) -> None:
        for slot in list(self.open):
            self.abort(slot, reason)

    def _tell(self, slot: Slot, outcome: TrialOutcome) -> None:
        if slot not in self.open:
            return  # told already
        self.open.remove(slot)
        try:
            outcome.phase_seconds["ask"] = slot.ask_s
            self.tell(slot, outcome)
        finally:
            slot.beats.close()


@dataclass
class PipelinedLoop:
    """One run of the pipelined loop; see the module docstring."""

    runner: TrialRunner  # begin / measure / end / abort
    ask: Callable[[], tuple[optuna.Trial, float, ExitStack]]  # a new trial, the ask's seconds, its heartbeat
    tell: Callable[[Slot, TrialOutcome], None]
    why_stop: Callable[[int], str | None]  # with this many trials in flight: why not begin another
    on_end: Callable[[TrialOutcome], str | None]  # an ended trial: records it; the failure budget's verdict
    on_start: Callable[[int, Any], None]  # a trial about to be measured (number, the Optuna trial)
    requeue: Callable[[Slot], None] = lambda slot: None  # queue a trial's params again (it never ran)
    halted: Callable[[], str | None] = lambda: None  # a stop requested (cheap; asked before each measure)

    def run(self) -> str:
        """Run until a stop; returns why it stopped (a ``RunResult.stopped_by`` value, or
        ``failure_budget:<why>``). Raises what ``why_stop`` or the stages raise; every
        trial it asked is told by then."""
        self._steps = TrialSteps(self.runner, self.ask, self.tell, self.on_end, self.requeue)
        pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="tuner-pipeline")
        # The measured trial's event loop shares the GIL with the helper and bookkeeping
        # threads; a short switch interval hands it back within 0.5 ms instead of 5 ms,
        # so answers are read (and the next requests sent) while Python work runs beside.
        switch = sys.getswitchinterval()
        sys.setswitchinterval(min(switch, SWITCH_INTERVAL_S))
        stopped: str | None = None
        try:
            stopped = self.why_stop(0)
            ahead = self._steps.begin() if stopped is None else None
            behind: Slot | None = None
            while ahead is not None:
                current = ahead
                between: list[Future[tuple[str | None, Slot | None]]] = []

                def start_between(behind: Slot | None = behind, between: list[Any] = between) -> None:
                    if not between:
                        between.append(pool.submit(self._between, behind))

                self.on_start(current.job.out.number, current.trial)
                current.measured = True  # from here its config may be written: an abort records it
                try:
                    # The helper starts once the config is written: the patch's file work
                    # does not wait on the GIL behind the helper's Python, and a restart
                    # and its health wait still hide the helper's work.
                    self.runner.measure(current.job, written=start_between)
                finally:
                    start_between()  # a measure that wrote nothing (cached, failed early, stopped)
                    # joined even on a second Ctrl-C, so a tell or ask under way completes
                    stop, ahead = between[0].result()
                stop = stop or self.halted()  # a stop that came after the helper looked
                behind = current
                if current.job.error is not None:
                    # a failed (or stopped) measure ends at once, before the next trial is
                    # measured, so the failure budget stops the study exactly where it
                    # would stop one trial at a time; it has nothing to score
                    behind = None
                    stop = self._steps.end(current) or stop
                if stop is not None:
                    stopped = stopped or stop
                    if ahead is not None:  # begun before the stop was known
                        self._discard(ahead, stop)
                        ahead = None
            if behind is not None:
                stopped = self._steps.end(behind) or stopped
            return stopped or "n_trials"
        except KeyboardInterrupt:
            pool.shutdown(wait=True)  # the helper's tell or ask under way completes first
            self._steps.abort_open("interrupted (second interrupt: trial aborted)")
            raise
        finally:
            sys.setswitchinterval(switch)
            pool.shutdown(wait=True)
            # an error escaped: nothing stays RUNNING
            self._steps.abort_open("the study loop stopped on an error before this trial ended")

    # ------------------------------------------------------------------ steps

    def _between(self, behind: Slot | None) -> tuple[str | None, Slot | None]:
        """On the helper thread while a trial is measured: end the one before it, then
        begin the next unless the study should stop (one trial is in flight)."""
        if behind is not None:
            verdict = self._steps.end(behind)
            if verdict is not None:
                return verdict, None
        why = self.why_stop(1)
        if why is not None:
            return why, None
        return None, self._steps.begin()

    def _discard(self, slot: Slot, why: str) -> None:
        self._steps.abort(slot, NOT_RUN.format(why=why.split(":")[0]))
