"""Parallel trials on one backend (`tuner run --parallel N`, ``target.channel: request``):
N trials measured at once, each sending only its own values in its requests.

With the values in the requests nothing on the backend changes between trials, so N
lanes (threads) each run trials one after the other -- ``begin`` (ask, suggest, render,
cache lookup), ``measure`` (the batch), ``end`` (scoring, records, ``tell``) -- and only
the measure stages overlap::

    lane 1  | begin 1 | measure 1         | end 1 | begin 5 | measure 5 ...
    lane 2  | begin 2 | measure 2     | end 2 | begin 6 | measure 6 ...
    ...

What that keeps, and why it is sound:

- The study's own work is one at a time: ``begin`` and ``end`` + ``tell`` of every lane
  run under one lock, so the Optuna study (ask, tell, the trial's attrs), the result
  cache, the MLflow bookkeeping queue and the failure tally see one caller at a time,
  as they do in the pipelined loop. Only the batches run side by side; each one's
  request is its own trial's (tuner.study.trial.request_channel), its timing is its own
  thread's (tuner.study.trial.live), and it sends ``evaluation.concurrency // N`` queries
  at once (at least 1), so N trials share the budget one trial had.
- The sampler proposes a trial knowing every trial told so far; up to N-1 are RUNNING
  then (as with N workers). The ask order follows the lanes' timing, so a seeded
  parallel study is not reproducible trial for trial (a sequential one is).
- n_trials is exact: a lane begins a trial only while the trials counted plus those in
  flight are fewer (the check and the ask are under the lock).
- A stop (SIGTERM, Ctrl-C, the timeout, the failure budget, a lost study lock) begins no
  new trial; the trials under way finish their batch (within the stop grace) and are
  recorded. A trial the failure budget stops on is followed by the others in flight
  only, as N workers would be.
- A killed run leaves up to N trials RUNNING: the next `tuner run` fails them as stale and
  queues a queued variant among them again (tuner.study.storage.queue.fail_stale_trials),
  as for one.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import optuna

from tuner.study.pipeline import Slot, TrialSteps
from tuner.study.trial.outcome import TrialOutcome

if TYPE_CHECKING:
    from tuner.study.trial.runner import TrialRunner


@dataclass
class ParallelLoop:
    """One run of ``lanes`` trials at a time; see the module docstring. The hooks are
    those of tuner.study.pipeline.PipelinedLoop (called under the loop's lock)."""

    runner: TrialRunner  # begin / measure / end / abort
    lanes: int
    ask: Callable[[], tuple[optuna.Trial, float, ExitStack]]
    tell: Callable[[Slot, TrialOutcome], None]
    why_stop: Callable[[int], str | None]  # with this many trials in flight: why not begin another
    on_end: Callable[[TrialOutcome], str | None]  # an ended trial: records it; the failure budget's verdict
    on_start: Callable[[int, Any], None]  # a trial about to be measured (number, the Optuna trial)
    requeue: Callable[[Slot], None] = lambda slot: None  # queue a trial's params again (it never ran)
    _lock: threading.Lock = field(default_factory=threading.Lock, init=False, repr=False)
    _steps: TrialSteps = field(init=False, repr=False)  # begin / end / abort, shared with the pipelined loop
    _in_flight: int = field(default=0, init=False, repr=False)  # begun, not ended
    _stopped: str | None = field(default=None, init=False, repr=False)
    _error: BaseException | None = field(default=None, init=False, repr=False)

    def __post_init__(self) -> None:
        self._steps = TrialSteps(self.runner, self.ask, self.tell, self.on_end, self.requeue)

    def run(self) -> str:
        """Run until a stop; returns why it stopped (a ``RunResult.stopped_by`` value, or
        ``failure_budget``). Raises the first error a lane met (``why_stop``'s StudyError,
        a stage's), after every lane has ended; every trial it asked is told by then.

        A KeyboardInterrupt (a second Ctrl-C) begins no new trial and waits for the lanes:
        their batches end within the stop grace (the stop flag is set by then)."""
        threads = [
            threading.Thread(target=self._lane, name=f"tuner-parallel-{i + 1}", daemon=True) for i in range(self.lanes)
        ]
        interrupted = False
        try:
            for thread in threads:
                thread.start()
            for thread in threads:
                while thread.is_alive():
                    try:
                        thread.join()
                    except KeyboardInterrupt:
                        interrupted = True
                        self._halt("signal")
        finally:
            for thread in threads:  # a thread that could not start leaves nothing to wait for
                if thread.ident is not None:
                    thread.join()
            # an error ended a lane mid-trial: nothing stays RUNNING
            self._steps.abort_open("the study loop stopped on an error before this trial ended")
        if interrupted:
            raise KeyboardInterrupt
        if self._error is not None:
            raise self._error
        return self._stopped or "n_trials"

    # ------------------------------------------------------------------ a lane

    def _lane(self) -> None:
        while True:
            with self._lock:
                try:
                    if self._stopped is None:
                        self._stopped = self.why_stop(self._in_flight)
                    if self._stopped is not None:
                        return
                    slot = self._steps.begin()
                    self._in_flight += 1
                    self.on_start(slot.job.out.number, slot.trial)
                    slot.measured = True  # an abort from here records it as run
                except BaseException as exc:  # noqa: BLE001 - raised by run() once every lane has ended
                    self._fail(exc)
                    return
            try:
                self.runner.measure(slot.job)
            except BaseException as exc:  # noqa: BLE001 - as above (measure keeps a trial's own errors)
                with self._lock:
                    self._fail(exc)
                return
            with self._lock:
                try:
                    self._in_flight -= 1
                    verdict = self._steps.end(slot)
                    if verdict is not None and self._stopped is None:
                        self._stopped = verdict
                except BaseException as exc:  # noqa: BLE001 - as above
                    self._fail(exc)
                    return

    def _fail(self, exc: BaseException) -> None:
        """An error in a lane (under the lock, before any other lane may begin a trial):
        the first one is raised by ``run``; no lane begins another trial."""
        self._error = self._error or exc
        self._stopped = self._stopped or "error"

    def _halt(self, why: str) -> None:
        with self._lock:
            self._stopped = self._stopped or why
