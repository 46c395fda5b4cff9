"""Tracking that never holds up a trial or a stop: `ResilientTracker` wraps a tracker
(the MlflowTracker) and makes every call an operation on one background thread.

Why: MLflow's client retries each HTTP request for minutes (7 retries, backoff factor
2, 120 s timeout), so a tracking server that died mid-run made every trial wait about
four minutes for its run id and held a SIGTERM until every queued call had given up.

How it behaves:

- Calls are queued in order and run by the ``tuner-tracking`` daemon thread. A trial
  waits for nothing but its run id, at most ``RUN_ID_WAIT_S`` (none while the store is
  down): without it the trial goes on, and its run is made when its record is logged.
- Circuit breaker: the first call that fails while the store does not answer (or that
  has not returned after ``STUCK_S``) puts tracking *behind*: calls stay queued, the
  thread probes the store every ``PROBE_EVERY_S`` (``/health`` of an HTTP server, a
  cheap client call otherwise) and, once it answers, replays the queue in order. One
  note says tracking is behind, one that it caught up. A call that fails while the
  store answers is tried ``ATTEMPTS`` times, then dropped with a warning (its trial is
  listed at the end).
- The queue is bounded: at ``MAX_QUEUED_TRIALS`` trials waiting, a later trial's
  calls are not kept (one warning; its number is listed at the end). Every trial is
  in the Optuna study all the same.
- `close` gives the queue ``DRAIN_S`` to drain, then gives up and returns one line
  naming the trials MLflow did not get. The thread is a daemon: a call stuck in
  MLflow's client never keeps the process alive.

The four waits are an experiment's ``tracking.waits`` (the constants below are their defaults).
"""

from __future__ import annotations

import os
import threading
import time
from collections import deque
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tuner.config.tracking import TrackingWaits
from tuner.report.tracker import StaleRuns, Tracker, TrialRecord

# The waits' defaults are the experiment's (tracking.waits: tuner.config.tracking.TrackingWaits)
_WAITS = TrackingWaits()
#: what a stop (or the end of a run) gives queued tracking calls before it lists what
#: was not logged and goes on
DRAIN_S = _WAITS.drain_s
#: the longest a trial waits for its MLflow run id (it goes on without it)
RUN_ID_WAIT_S = _WAITS.run_id_s
#: a call that has not returned after this long puts tracking behind, seen from the caller
STUCK_S = _WAITS.stuck_s
#: between two probes of a store that does not answer
PROBE_EVERY_S = _WAITS.probe_every_s
#: tries of a call that fails while the store answers, before it is dropped with a warning
ATTEMPTS = 3
#: trials whose calls are kept queued while the store is down
MAX_QUEUED_TRIALS = 500
#: MLflow's own HTTP retry policy for the tracker's client when the user set none: the
#: breaker and the background retry replace it (MLflow's defaults: 7 retries, 120 s)
FAIL_FAST_HTTP = {"MLFLOW_HTTP_REQUEST_MAX_RETRIES": "0", "MLFLOW_HTTP_REQUEST_TIMEOUT": "20"}


def fail_fast_http() -> dict[str, str]:
    """Set `FAIL_FAST_HTTP` in this process's environment where the user has not set
    the variable (MLflow reads them at each request); returns what was set."""
    chosen = {name: value for name, value in FAIL_FAST_HTTP.items() if name not in os.environ}
    os.environ.update(chosen)
    return chosen


def is_server(uri: str) -> bool:
    """Whether ``uri`` names an MLflow tracking server (HTTP), not a database."""
    return uri.startswith(("http://", "https://"))


def server_health(uri: str, timeout_s: float = 5.0) -> None:
    """GET the tracking server's ``/health``; raises httpx.HTTPError when it does not answer OK."""
    import httpx

    httpx.get(uri.rstrip("/") + "/health", timeout=timeout_s).raise_for_status()


def store_probe(uri: str, inner: Any, timeout_s: float = 5.0) -> Callable[[], None]:
    """A cheap check that the tracking store answers (raises when it does not):
    ``/health`` of an HTTP server, else one small client read."""
    if is_server(uri):
        return lambda: server_health(uri, timeout_s)

    def read() -> None:
        inner.client.search_experiments(max_results=1)

    return read


@dataclass
class _Op:
    """One queued tracker call."""

    kind: str  # the Tracker method's name
    fn: Callable[[], Any]
    trial: int | None = None
    done: threading.Event = field(default_factory=threading.Event)
    result: Any = None
    attempts: int = 0  # failures while the store answered (reset after an outage)
    tried: bool = False  # run before and failed: a retry


class ResilientTracker(Tracker):
    """``inner``'s calls on a background thread behind a circuit breaker (module doc).

    ``probe`` raises when the store does not answer; ``on_note`` gets the one-line
    notes (from the background thread: it must be thread-safe, as observer.note is);
    ``where`` names the store in them.
    """

    def __init__(
        self,
        inner: Tracker,
        *,
        probe: Callable[[], None],
        on_note: Callable[[str], None],
        where: str,
        drain_s: float = DRAIN_S,
        run_id_wait_s: float = RUN_ID_WAIT_S,
        stuck_s: float = STUCK_S,
        probe_every_s: float = PROBE_EVERY_S,
        max_queued_trials: int = MAX_QUEUED_TRIALS,
    ) -> None:
        self.inner = inner
        self.where = where
        self.drain_s, self.run_id_wait_s, self.stuck_s = drain_s, run_id_wait_s, stuck_s
        self.probe_every_s, self.max_queued_trials = probe_every_s, max_queued_trials
        self._probe = probe
        self._on_note = on_note
        self._ops: deque[_Op] = deque()
        self._cond = threading.Condition()
        self._wake = threading.Event()  # ends a probe pause early (close)
        self._running_since: float | None = None  # when the call under way started
        self._behind_since: float | None = None  # the breaker is open since then
        self._retrying = False  # the call under way was tried before (worker thread)
        self._abandoned = False  # close gave up: the thread runs nothing more
        self._run_ids: dict[int, str] = {}  # trial number -> run id its start made (worker thread)
        self._not_logged: set[int] = set()  # trials whose calls were dropped (bound, or their own error)
        self._study_not_logged = False
        self._full_noted = False
        self.replayed = 0  # calls that ran after the store came back
        self._replayed_now = 0  # the same, in this outage
        self._thread = threading.Thread(target=self._work, name="tuner-tracking", daemon=True)
        self._thread.start()

    # ------------------------------------------------------------ the Tracker calls

    def start_study(self, study_name: str, *, params: Mapping[str, Any], tags: Mapping[str, str]) -> str | None:
        op = self._submit("start_study", lambda: self.inner.start_study(study_name, params=params, tags=tags))
        return self._result(op, self.run_id_wait_s)

    def start_trial(self, number: int, params: Mapping[str, Any], *, start_time: int | None = None) -> str | None:
        """The trial's run id when the store gives it within ``run_id_wait_s``; else None
        (the run is made in the background all the same, and its record goes into it).
        The run starts at ``start_time``, by default now: not when a store that was down
        takes the call."""
        if self._full():
            self._drop(number)
            return None
        began = start_time if start_time is not None else round(time.time() * 1000)

        def start() -> str | None:
            find = getattr(self.inner, "find_trial_run", None)
            # tried before: the store may have made the run and lost only its answer
            run_id = find(number) if self._retrying and find is not None else None
            run_id = run_id or self.inner.start_trial(number, params, start_time=began)
            if run_id is not None:
                self._run_ids[number] = run_id
            return run_id

        return self._result(self._submit("start_trial", start, trial=number), self.run_id_wait_s)

    def finish_trial(self, run_id: str | None, record: TrialRecord) -> None:
        if self._full():
            self._drop(record.number)
            return
        number = record.number
        # the run its own start made, when the caller did not get the id in time
        self._submit(
            "finish_trial",
            lambda: self.inner.finish_trial(self._run_ids.pop(number, None) or run_id, record),
            trial=number,
        )

    def summarize_study(
        self, *, note: str, metrics: Mapping[str, float], tags: Mapping[str, str], step: int | None = None
    ) -> None:
        # only the latest summary matters: one queued (not yet running) is replaced
        with self._cond:
            for op in list(self._ops)[1:]:
                if op.kind == "summarize_study":
                    self._ops.remove(op)
                    op.done.set()
        self._submit(
            "summarize_study", lambda: self.inner.summarize_study(note=note, metrics=metrics, tags=tags, step=step)
        )

    def end_study(self, *, status: str, summary: Mapping[str, float]) -> None:
        self._submit("end_study", lambda: self.inner.end_study(status=status, summary=summary))

    def log_study_files(self, folder: str, files: Sequence[Path]) -> None:
        self._submit("log_study_files", lambda: self.inner.log_study_files(folder, files))

    def close_stale_runs(self, *args: Any, **kwargs: Any) -> StaleRuns:
        """``inner.close_stale_runs`` (its arguments passed as given), waited for up to
        ``stuck_s``; an empty StaleRuns when it has not returned by then (it still runs,
        in order, before this run's own calls)."""
        op = self._submit("close_stale_runs", lambda: self.inner.close_stale_runs(*args, **kwargs))
        closed = self._result(op, self.stuck_s)
        return closed if isinstance(closed, StaleRuns) else StaleRuns()

    def run_url(self, run_id: str, base_url: str) -> str | None:
        return self.inner.run_url(run_id, base_url)

    def experiment_url(self, base_url: str) -> str | None:
        return self.inner.experiment_url(base_url)

    def __getattr__(self, name: str) -> Any:
        # the inner tracker's own attributes (experiment_id, report_files, client, ...)
        if name == "inner":
            raise AttributeError(name)
        return getattr(self.inner, name)

    @property
    def behind(self) -> bool:
        """Whether the breaker is open: the store failed, or a call is stuck."""
        self._check_stuck()
        return self._behind_since is not None

    def close(self) -> str | None:
        """Give the queued calls up to ``drain_s`` (the store may come back meanwhile),
        then stop; one line naming the trials MLflow did not get (a warning, without
        the ``warning:`` prefix), or None."""
        deadline = time.monotonic() + self.drain_s
        while True:
            self._check_stuck()  # a call hung in the store: said once, as any time
            with self._cond:
                if not self._ops or time.monotonic() >= deadline:
                    break
                self._wake.set()  # a probe pause ends at once: retry now
                self._cond.wait(min(0.5, max(0.0, deadline - time.monotonic())))
        with self._cond:
            self._abandoned = True
            left = list(self._ops)
            self._ops.clear()
            self._cond.notify_all()
        self._wake.set()
        for op in left:
            op.done.set()
        trials = self._not_logged | {op.trial for op in left if op.trial is not None}
        study = self._study_not_logged or any(op.trial is None for op in left)
        self._on_note = lambda message: None  # the run is over: nothing more is said
        if not trials and not study:
            return None
        what = []
        if trials:
            what.append(f"trial{'s' if len(trials) > 1 else ''} {number_ranges(trials)}")
        if study:
            what.append("the study's summary")
        return (
            f"MLflow at {self.where} is missing {' and '.join(what)}: the store did not take them within the "
            f"{self.drain_s:g} s the end of a run gives tracking; every trial is in the Optuna study "
            "(optuna-dashboard, `tuner best`), and the next `tuner run` of the study logs them in MLflow from its "
            "record"
        )

    # ------------------------------------------------------------ the queue

    def _submit(self, kind: str, fn: Callable[[], Any], *, trial: int | None = None) -> _Op:
        op = _Op(kind, fn, trial)
        with self._cond:
            if self._abandoned:  # after close: nothing runs any more
                op.done.set()
                if trial is not None:
                    self._not_logged.add(trial)
                return op
            self._ops.append(op)
            self._cond.notify_all()
        return op

    def _result(self, op: _Op, wait_s: float) -> Any:
        """``op``'s result when it is done within ``wait_s`` (no wait while behind)."""
        if not self.behind:
            deadline = time.monotonic() + wait_s
            while not op.done.is_set() and not self.behind and time.monotonic() < deadline:
                op.done.wait(min(0.2, max(0.0, deadline - time.monotonic())))
        return op.result if op.done.is_set() else None

    def _full(self) -> bool:
        with self._cond:
            waiting = len({op.trial for op in self._ops if op.trial is not None})
        return waiting >= self.max_queued_trials

    def _drop(self, number: int) -> None:
        """Keep no call of trial ``number`` (the queue is full): its start, if queued, goes too."""
        with self._cond:
            for op in [op for op in list(self._ops)[1:] if op.trial == number]:
                self._ops.remove(op)
                op.done.set()
            self._not_logged.add(number)
            first = not self._full_noted
            self._full_noted = True
        if first:
            self._note(
                f"warning: MLflow tracking is {self.max_queued_trials} trials behind, as many as it keeps "
                f"queued: from trial #{number} on, trials are not kept for MLflow (listed at the end; the "
                "Optuna study has them)"
            )

    def _check_stuck(self) -> None:
        since = self._running_since
        if since is not None and self._behind_since is None and time.monotonic() - since > self.stuck_s:
            self._go_behind(f"a call has not returned in {self.stuck_s:g} s", since)

    def _go_behind(self, reason: str, since: float) -> None:
        """Open the breaker (said once per outage); ``since``: when the call that failed started."""
        with self._cond:
            if self._behind_since is not None:
                return
            self._behind_since, self._replayed_now = since, 0
            queued = len(self._ops)
        self._note(
            f"warning: MLflow tracking is behind: {self.where} does not answer ({reason}); trials go on, "
            f"their MLflow calls are queued ({queued} so far) and replayed in order when it answers (checked "
            f"every {self.probe_every_s:g} s)"
        )

    def _caught_up(self) -> None:
        with self._cond:
            since, self._behind_since = self._behind_since, None
        if since is not None:
            self._note(
                f"MLflow tracking caught up: {self.where} answers again after {time.monotonic() - since:.0f} s; "
                f"the {self._replayed_now} calls queued meanwhile are logged"
            )

    def _note(self, message: str) -> None:
        try:
            self._on_note(message)
        except Exception:  # noqa: BLE001 - a note is never worth the tracking thread
            pass

    def _work(self) -> None:
        """The tracking thread: run the head of the queue; on failure probe the store
        and, while it does not answer, wait and probe again (the call stays at the head)."""
        while True:
            with self._cond:
                while not self._ops and not self._abandoned:
                    self._cond.wait()
                if self._abandoned:
                    return
                op = self._ops[0]
                self._running_since = time.monotonic()
                self._retrying = op.tried
            failure: Exception | None = None
            try:
                result = op.fn()
            except Exception as exc:  # noqa: BLE001 - a tracking failure never reaches the study
                failure = exc
            with self._cond:
                started, self._running_since = self._running_since, None
                if self._abandoned:
                    return
            if failure is None:
                self._done(op, result)
                continue
            op.attempts += 1
            op.tried = True
            if self._answers():
                if op.attempts >= ATTEMPTS:
                    self._give_up(op, failure)
                elif not self._pause():
                    return
                continue
            self._go_behind(one_line(failure), started if started is not None else time.monotonic())
            while not self._answers():
                if not self._pause():
                    return
            op.attempts = 0  # that failure was the store's, not the call's

    def _done(self, op: _Op, result: Any) -> None:
        with self._cond:
            op.result = result
            if op.kind == "finish_trial" and op.trial is not None:
                # logged after all: a start given up on leaves its run to the record (made then)
                self._not_logged.discard(op.trial)
            if self._ops and self._ops[0] is op:
                self._ops.popleft()
            if self._behind_since is not None:
                self.replayed += 1
                self._replayed_now += 1
            empty = not self._ops
            self._cond.notify_all()
        op.done.set()
        if empty:
            self._caught_up()

    def _give_up(self, op: _Op, failure: Exception) -> None:
        """A call the store refuses although it answers: dropped, said, listed at the end."""
        with self._cond:
            if self._ops and self._ops[0] is op:
                self._ops.popleft()
            if op.trial is not None:
                self._not_logged.add(op.trial)
            else:
                self._study_not_logged = True
            self._cond.notify_all()
        op.done.set()
        whose = f"trial #{op.trial}" if op.trial is not None else "the study"
        self._note(f"warning: MLflow did not take {op.kind} of {whose} ({op.attempts} tries): {one_line(failure)}")

    def _answers(self) -> bool:
        try:
            self._probe()
            return True
        except Exception:  # noqa: BLE001 - any failure means: not now
            return False

    def _pause(self) -> bool:
        """Wait ``probe_every_s`` (less when close asks); False once close gave up."""
        self._wake.wait(self.probe_every_s)
        self._wake.clear()
        with self._cond:
            return not self._abandoned


def one_line(exc: BaseException) -> str:
    from tuner.secrets import redact_text

    text = redact_text(f"{type(exc).__name__}: {exc}".splitlines()[0])
    return text if len(text) <= 240 else text[:237] + "..."


def number_ranges(numbers: Collection[int]) -> str:
    """``[1, 2, 3, 7]`` -> ``"#1-3, #7"``."""
    out: list[str] = []
    ordered = sorted(numbers)
    start = prev = ordered[0]
    for n in [*ordered[1:], None]:
        if n is not None and n == prev + 1:
            prev = n
            continue
        out.append(f"#{start}" if start == prev else f"#{start}-{prev}")
        if n is not None:
            start = prev = n
    return ", ".join(out)
