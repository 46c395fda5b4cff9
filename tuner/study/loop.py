"""The loop over trials (ask -> runner.run -> tell) for `tuner run` and every
`tuner worker`: the failure budget, n-trials / timeout limits, the stop flag, the
study-wide total of workers, Optuna heartbeats for ask/tell and the progress hooks
(``StudyObserver``). It knows nothing about files, backends or MLflow: the runner
(tuner.study.trial.runner.TrialRunner, wired by tuner.study.wiring.build_runner) does.
"""

from __future__ import annotations

import threading
import time
import warnings
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from typing import Any, Protocol

import optuna
from optuna.trial import FrozenTrial, TrialState

from tuner.config.objective import FailureBudget
from tuner.errors import StudyError
from tuner.optuna_adapter import heartbeat_interval, set_trial_system_attr, storage_of, trial_id_of
from tuner.study.feasibility import best_feasible_trial
from tuner.study.stop import StopFlag
from tuner.study.storage.queue import count_counted, fail_stale_trials
from tuner.study.storage.retry import InfraFailure, queue_retry
from tuner.study.storage.stale import Unbeaten
from tuner.study.storage.study_storage import ATTR_REPLICA
from tuner.study.storage.transient import is_transient_storage_error, retry_transient
from tuner.study.trial.attrs import ATTR_FAIL_REASON, ATTR_VARIANT
from tuner.study.trial.failures import not_retried_reason, retried_reason
from tuner.study.trial.outcome import TrialOutcome

_FINISHED = (TrialState.COMPLETE, TrialState.FAIL, TrialState.PRUNED)


class StudyObserver:
    """Hooks for a progress display; every method is a no-op by default."""

    def study_started(self, study: optuna.Study, *, planned: int | None, timeout: float | None) -> None: ...

    def trial_started(self, number: int, variant: str | None) -> None: ...

    def phase(self, number: int, phase: str) -> None: ...

    def trial_finished(self, outcome: TrialOutcome, best: FrozenTrial | None) -> None: ...

    def note(self, text: str) -> None: ...


# ---------------------------------------------------------------- failure budget


@dataclass
class FailureTally:
    """The failed trials of this run, counted against the experiment's ``failure_budget``
    (tuner.config.objective.FailureBudget): the study stops once it is spent."""

    budget: FailureBudget = field(default_factory=FailureBudget)
    consecutive: int = 0
    total: int = 0
    last_reason: str | None = None

    def record(self, outcome: TrialOutcome) -> None:
        if outcome.state in ("COMPLETE", "PRUNED"):
            self.consecutive = 0
            return
        # an interrupted trial did not run; an infrastructure failure whose params were
        # queued again is stood for by its retry, which counts once when it ends: a database
        # blip never spends the budget (one that keeps failing does, once retries run out)
        if outcome.interrupted or outcome.retried_as is not None:
            return
        self.consecutive += 1
        self.total += 1
        self.last_reason = outcome.fail_reason

    def exceeded(self) -> str | None:
        """Why the budget is spent, or None."""
        limit = self.budget
        if self.consecutive >= limit.max_consecutive:
            return (
                f"{self.consecutive} consecutive failed trials (failure_budget.max_consecutive={limit.max_consecutive})"
            )
        if self.total >= limit.max_total:
            return f"{self.total} failed trials in this run (failure_budget.max_total={limit.max_total})"
        return None


# ---------------------------------------------------------------- the loop


@dataclass
class RunResult:
    """What one `tuner run` did."""

    study_name: str
    ran: list[TrialOutcome] = field(default_factory=list)
    stopped_by: str = "n_trials"  # n_trials | timeout | signal | failure_budget | lock_lost
    stale_failed: list[int] = field(default_factory=list)
    # trials the study's storage failed under (tuner.study.trial.failures), retried or not
    infra_failed: list[InfraFailure] = field(default_factory=list)
    elapsed_s: float = 0.0
    flush_s: float = 0.0  # waiting for the last trials' bookkeeping at the end
    ended_at: float = 0.0  # time.perf_counter() when the loop ended (for benchmarks lining up their samples)

    @property
    def counted(self) -> int:
        """Trials of this run that use up its own n_trials: not those whose retry stands for them."""
        return sum(o.retried_as is None for o in self.ran)


class Clock(Protocol):
    def __call__(self) -> float: ...


@dataclass
class StudyLoop:
    """The one loop over trials, for `tuner run` and for every `tuner worker`.

    A worker is this loop with a ``replica`` number: each trial runs under an Optuna
    heartbeat (a trial whose worker dies goes stale and is failed and retried by a
    live worker, which looks before each trial), records its replica, and the loop
    stops once the study as a whole has ``study_total`` trials counted (finished
    ones plus those running elsewhere, so parallel workers overshoot by at most the
    trials already running). ``lease`` (tuner.study.storage.locks.StudyLease) is checked before
    each trial: a study lock lost to another process stops the loop.
    """

    study: optuna.Study
    runner: Any  # TrialRunner, or anything with run(trial) -> TrialOutcome and flush()
    budget: FailureBudget = field(default_factory=FailureBudget)
    stop: StopFlag = field(default_factory=StopFlag)
    observer: StudyObserver = field(default_factory=StudyObserver)
    maximize: bool = True
    clock: Clock = time.monotonic
    study_total: int | None = None
    replica: int | None = None
    lease: Any = None
    #: overlap trials (tuner.study.pipeline): the next trial begins and the last one ends
    #: while one is measured; needs a runner with begin / measure / end / abort
    pipeline: bool = False
    #: trials measured at once on one backend (tuner.study.parallel; channel: request): more
    #: than 1 runs that many lanes instead of the pipeline; needs a runner as ``pipeline`` does
    parallel: int = 1
    #: what the last ``run`` did so far (kept when it raises, for the summary)
    result: RunResult | None = None
    #: retries of one trial the study's storage failed under (workers.max_retry; shared with
    #: the heartbeat retry of a dead worker's trial); None: no bound
    max_retry: int | None = 2
    #: the failed trials counted against ``budget`` (kept from one ``run`` to the next)
    failures: FailureTally = field(init=False)
    #: trial ids this loop asked and has not ended (alive by definition: never failed as stale here)
    _open: set[int] = field(default_factory=set, init=False, repr=False)
    #: one ask at a time (the pipeline's and the lanes' threads ask too): a retried ask's
    #: sweep must see every trial asked so far in ``_open``
    _asking: threading.Lock = field(default_factory=threading.Lock, init=False, repr=False)
    _unbeaten: Unbeaten = field(init=False, repr=False)
    #: numbers of the trials whose infrastructure failure was handled (retry queued or refused)
    _retried: set[int] = field(default_factory=set, init=False, repr=False)

    def __post_init__(self) -> None:
        self.failures = FailureTally(self.budget)
        self._unbeaten = Unbeaten(max_retry=self.max_retry, clock=self.clock)

    def run(self, *, n_trials: int | None, timeout: float | None) -> RunResult:
        """Run up to ``n_trials`` trials (None: until stopped) for at most ``timeout`` s.

        Raises StudyError when the failure budget is spent (after the failing trial is
        recorded); the caller restores the config in a ``finally``.
        """
        result = self.result = RunResult(self.study.study_name)
        started = self.clock()
        self.observer.study_started(self.study, planned=n_trials, timeout=timeout)
        hooked = hasattr(self.runner, "on_infrastructure_failure")
        if hooked:  # the retry is queued before the runner records the trial: every record names it
            self.runner.on_infrastructure_failure = self._retry
        try:
            while True:
                if (self.pipeline or self.parallel > 1) and hasattr(self.runner, "begin"):
                    self._loop_pipelined(result, started, n_trials=n_trials, timeout=timeout)
                else:
                    self._loop(result, started, n_trials=n_trials, timeout=timeout)
                # a worker that reached the study-wide count with nothing of its own in flight
                # waits for the other workers' last trials: a killed worker's are failed when
                # their heartbeat goes stale, and their retries are run here
                own_limit = n_trials is not None and result.counted >= n_trials
                if (
                    result.stopped_by != "n_trials"
                    or own_limit
                    or self.replica is None
                    or self.study_total is None
                    or not self._await_other_replicas(result)
                ):
                    break
        finally:
            if hooked:
                self.runner.on_infrastructure_failure = None
            flush_started = self.clock()
            self.runner.flush()  # the last trial's reports and MLflow run
            result.flush_s = self.clock() - flush_started
            result.elapsed_s = self.clock() - started
            result.ended_at = time.perf_counter()
        return result

    def _loop(self, result: RunResult, started: float, *, n_trials: int | None, timeout: float | None) -> None:
        while True:
            why = self._why_stop(result, started, n_trials=n_trials, timeout=timeout, in_flight=0)
            if why is not None:
                result.stopped_by = why
                break
            outcome = self._one_trial()
            result.ran.append(outcome)
            self.failures.record(outcome)
            self._raise_if_budget_spent(result)

    def _why_stop(
        self, result: RunResult, started: float, *, n_trials: int | None, timeout: float | None, in_flight: int
    ) -> str | None:
        """Why not to begin another trial (a ``RunResult.stopped_by`` value), with
        ``in_flight`` trials of this run asked and not yet ended; None: go on. Raises
        StudyError when the study lock is lost."""
        if self.stop.is_set():
            return "signal"
        if n_trials is not None and result.counted + in_flight >= n_trials:
            return "n_trials"
        if timeout is not None and self.clock() - started >= timeout:
            return "timeout"
        lost = self.lease.lost() if self.lease is not None else None
        if lost is not None:
            result.stopped_by = "lock_lost"
            raise StudyError(f"study {self.study.study_name!r} stopped: {lost}; check for another process on it")
        # read between trials, on the pipeline's helper thread too: a database restart is
        # ridden through as by ask and tell, not raised out of the loop
        if self.replica is not None:
            result.stale_failed.extend(retry_transient(self._fail_stale))
        if self.study_total is not None and retry_transient(lambda: count_counted(self.study)) >= self.study_total:
            return "n_trials"
        return None

    def _await_other_replicas(self, result: RunResult) -> bool:
        """The study-wide count is reached (this worker has no trial in flight), but it
        counts trials still RUNNING: another worker's, or a killed one's (of any replica,
        this one's included: a restarted worker is the same replica). Wait until they end,
        or go stale (failed here, and their retries queued). True when some went stale:
        the count dropped, so go on. Without the wait the last live worker left a killed
        one's trials RUNNING, never retried. Two live workers cannot wait on each other:
        each waits only once its own trials have ended."""
        interval = _heartbeat_interval(self.study)
        if interval is None:  # no heartbeats: a dead worker's trials can never be told apart
            return False
        told = False
        while not self.stop.is_set():
            others = retry_transient(
                lambda: [
                    t.number
                    for t in self.study.get_trials(deepcopy=False, states=(TrialState.RUNNING,))
                    if trial_id_of(t) not in self._open
                ]
            )
            if not others:
                return False
            failed = retry_transient(self._fail_stale)
            if failed:
                result.stale_failed.extend(failed)
                return True
            if not told:
                self.observer.note(
                    f"study-wide trial count reached; waiting for trial(s) "
                    f"{', '.join(f'#{n}' for n in others)} of other workers (a killed worker's are "
                    "failed and retried once its heartbeat is stale)"
                )
                told = True
            self.stop.wait(min(interval, 5.0))
        return False

    def _fail_stale(self) -> list[int]:
        """Fail the trials a dead worker left RUNNING (their params queued again): those
        whose heartbeat went stale (Optuna's rule), and those that never had one
        (tuner.study.storage.stale: killed between its ask and its first beat)."""
        failed = fail_stale_heartbeats(self.study)
        return failed + self._unbeaten.fail_overdue(self.study, own=frozenset(self._open))

    def _raise_if_budget_spent(self, result: RunResult) -> None:
        why = self.failures.exceeded()
        if why is not None:
            result.stopped_by = "failure_budget"
            raise StudyError(
                f"study {self.study.study_name!r} stopped: {why}; last failure: {self.failures.last_reason};"
                " fix the backend or the search space, then `tuner run` resumes the study"
            )

    def _loop_pipelined(
        self, result: RunResult, started: float, *, n_trials: int | None, timeout: float | None
    ) -> None:
        """The pipelined loop (tuner.study.pipeline), or with ``parallel`` > 1 the parallel
        one (tuner.study.parallel): the same hooks into this loop's checks, ask and tell."""
        from tuner.study.parallel import ParallelLoop
        from tuner.study.pipeline import PipelinedLoop

        measuring: list[int | None] = [None]
        forward = self.runner.on_phase

        def on_phase(number: int, phase: str) -> None:  # the progress shows the trial being measured
            if number == measuring[0]:
                forward(number, phase)

        def on_start(number: int, trial: optuna.Trial) -> None:
            measuring[0] = number
            self.observer.trial_started(number, trial.user_attrs.get(ATTR_VARIANT))

        def on_end(outcome: TrialOutcome) -> str | None:
            result.ran.append(outcome)
            self.failures.record(outcome)
            best = best_feasible_trial(self.study.get_trials(deepcopy=False), maximize=self.maximize)
            self.observer.trial_finished(outcome, best)
            return "failure_budget" if self.failures.exceeded() else None

        def why_stop(in_flight: int) -> str | None:
            return self._why_stop(result, started, n_trials=n_trials, timeout=timeout, in_flight=in_flight)

        def tell(slot: Any, outcome: TrialOutcome) -> None:
            self._tell(slot.trial, outcome)

        self.runner.on_phase = on_phase
        try:
            if self.parallel > 1:
                why = ParallelLoop(
                    self.runner,
                    self.parallel,
                    ask=self._ask,
                    tell=tell,
                    why_stop=why_stop,
                    on_end=on_end,
                    on_start=on_start,
                    requeue=self._requeue,
                ).run()
            else:
                why = PipelinedLoop(
                    self.runner,
                    ask=self._ask,
                    tell=tell,
                    why_stop=why_stop,
                    on_end=on_end,
                    on_start=on_start,
                    requeue=self._requeue,
                    halted=lambda: "signal" if self.stop.is_set() else None,
                ).run()
        finally:
            self.runner.on_phase = forward
        result.stopped_by = why
        self._raise_if_budget_spent(result)

    def _ask(self) -> tuple[optuna.Trial, float, ExitStack]:
        """A new trial, the seconds the ask took, and its heartbeat (running until closed)."""
        asked = time.perf_counter()
        with warnings.catch_warnings():
            # optuna warns that heartbeats are meant for study.optimize; `heartbeat`
            # below does for ask/tell what optimize does.
            warnings.filterwarnings("ignore", message="Heartbeat of storage", category=UserWarning)
            # a connection lost mid-ask (a database restart) is retried: the pipelined loop
            # asks while a trial is measured, when a blip used to meet no query at all
            with self._asking:
                tries = 0

                def ask() -> optuna.Trial:
                    nonlocal tries
                    tries += 1
                    return self.study.ask()

                trial = retry_transient(ask)
                self._open.add(trial_id_of(trial))
                if tries > 1 and self.replica is None:
                    self._fail_cut_asks()
        if self.replica is not None:
            retry_transient(lambda: set_trial_system_attr(trial, ATTR_REPLICA, self.replica))
        beats = ExitStack()
        beats.callback(self._open.discard, trial_id_of(trial))  # runs after the heartbeat below stops
        beats.enter_context(heartbeat(storage_of(self.study), trial_id_of(trial)))
        return trial, time.perf_counter() - asked, beats

    def _fail_cut_asks(self) -> None:
        """After an ask that was retried: an ask whose commit went through as the connection
        was lost left a trial RUNNING that this process never received (a popped queued
        variant among them). Without workers the run holds the study alone, so every RUNNING
        trial it did not ask is such a one: failed now as ``stale`` (not counted), a variant
        queued again, as a killed run's are at the next start. Left RUNNING, it outlived the
        run (the fault suite's postgres restart mid-trial saw it under load). Workers leave
        this to the heartbeat rules (tuner.study.storage.stale)."""
        failed = retry_transient(
            lambda: fail_stale_trials(
                self.study, keep=frozenset(self._open), why="asked by a call whose connection was lost (asked again)"
            )
        )
        if failed and self.result is not None:
            self.result.stale_failed.extend(failed)

    def _tell_once(self, trial: optuna.Trial, outcome: TrialOutcome) -> None:
        if outcome.state == "COMPLETE":
            assert outcome.value is not None
            if outcome.secondary_value is None:
                self.study.tell(trial, outcome.value)
            else:  # a multi-objective study (secondary_objective)
                self.study.tell(trial, [outcome.value, outcome.secondary_value])
        elif outcome.state == "PRUNED":
            self.study.tell(trial, state=TrialState.PRUNED)
        else:
            self.study.tell(trial, state=TrialState.FAIL)

    def _requeue(self, slot: Any) -> None:
        """Queue a trial's suggested params again (a trial begun ahead that never ran)."""
        variant = slot.trial.user_attrs.get(ATTR_VARIANT)
        params = slot.job.suggested or {}
        if params:
            self.study.enqueue_trial(
                dict(params), user_attrs={ATTR_VARIANT: variant} if variant else None, skip_if_exists=False
            )

    def _tell(self, trial: optuna.Trial, outcome: TrialOutcome) -> None:
        told = time.perf_counter()
        if outcome.infrastructure and outcome.state == "FAIL":
            self._retry(trial, outcome)  # before the tell: a finished trial's reason cannot change

        def tell() -> None:
            if trial.number not in {t.number for t in self.study.get_trials(deepcopy=False, states=_FINISHED)}:
                self._tell_once(trial, outcome)  # else a retried tell whose first commit went through

        try:
            self._tell_once(trial, outcome)
        except Exception as exc:
            if not is_transient_storage_error(exc):
                raise
            retry_transient(tell)
        # Loop-side costs, kept on the outcome only (the trial is finished by now).
        outcome.phase_seconds["tell"] = time.perf_counter() - told

    def _retry(self, trial: optuna.Trial, outcome: TrialOutcome) -> None:
        """A trial the study's storage failed under: queue its params again (the same
        variant), and say so in its fail_reason; when it cannot be, say so out loud. Once
        per trial: called by the runner before it records the trial, else by ``_tell``."""
        if trial.number in self._retried:
            return
        self._retried.add(trial.number)
        try:
            failure = retry_transient(
                lambda: queue_retry(self.study, trial_id_of(trial), outcome.suggested, max_retry=self.max_retry)
            )
        except Exception as exc:  # noqa: BLE001 - the database is still away: said, never raised here
            failure = InfraFailure(
                trial.number,
                None,
                why_not=(f"the retry could not be queued: {type(exc).__name__}: {str(exc).strip()}".splitlines()[0]),
            )
        reason = outcome.fail_reason or "infrastructure"
        if failure.retried_as is not None:
            outcome.fail_reason = retried_reason(reason, failure.retried_as)
            outcome.retried_as = failure.retried_as
        else:
            outcome.fail_reason = not_retried_reason(reason, failure.why_not or "unknown")
            what = f"trial #{trial.number}" + (f" (variant {failure.variant})" if failure.variant else "")
            self.observer.note(
                f"warning: {what} failed because the study's storage failed, and was NOT retried: "
                f"{failure.why_not}; it counts as a failed trial"
            )
        try:
            retry_transient(lambda: trial.set_user_attr(ATTR_FAIL_REASON, outcome.fail_reason))
        except Exception:  # noqa: BLE001 - the tell below meets the same error and reports it
            pass
        if self.result is not None:
            self.result.infra_failed.append(failure)

    def _one_trial(self) -> TrialOutcome:
        trial, ask_s, beats = self._ask()
        with beats:
            self.observer.trial_started(trial.number, trial.user_attrs.get(ATTR_VARIANT))
            try:
                outcome = self.runner.run(trial)
            except KeyboardInterrupt:
                self.study.tell(trial, state=TrialState.FAIL)
                raise
            self._tell(trial, outcome)
        outcome.phase_seconds["ask"] = ask_s
        best = best_feasible_trial(self.study.get_trials(deepcopy=False), maximize=self.maximize)
        self.observer.trial_finished(outcome, best)
        return outcome


@contextmanager
def heartbeat(storage: optuna.storages.BaseStorage, trial_id: int) -> Iterator[None]:
    """Record an Optuna heartbeat for ``trial_id`` every interval while the block runs
    (nothing when the storage has no heartbeat configured). Optuna starts its own
    heartbeat thread only inside ``study.optimize``; the tuner's loop is ask/tell."""
    beat: Any = storage if hasattr(storage, "record_heartbeat") else None
    interval = beat.get_heartbeat_interval() if beat is not None else None
    if beat is None or interval is None:
        yield
        return
    stop = threading.Event()

    def loop() -> None:
        while True:
            try:
                beat.record_heartbeat(trial_id)
            except Exception:  # noqa: BLE001 - a blip of the database must not kill the trial; the next beat retries
                pass
            if stop.wait(interval):
                return

    thread = threading.Thread(target=loop, name=f"heartbeat-{trial_id}", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()


def _heartbeat_interval(study: optuna.Study) -> float | None:
    return heartbeat_interval(study)


def fail_stale_heartbeats(study: optuna.Study) -> list[int]:
    """Fail the trials whose worker stopped beating (Optuna's retry callback queues a
    copy); returns their numbers."""
    before = {t.number for t in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,))}
    if not before:
        return []
    with warnings.catch_warnings():  # experimental since 2.9, the documented way all the same
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        optuna.storages.fail_stale_trials(study)
    after = {t.number for t in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,))}
    return sorted(before - after)
