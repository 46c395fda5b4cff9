"""The measure stage of a trial: write the rendered config, get the backend to serve it
(reload or restart, then health), evaluate the batch. The only stage that holds the
backend (tuner.study.trial.runner orders it between ``begin`` and ``end``).

`Measurer` owns everything that stage touches: the config writer, the target, the
config applier, the evaluator, the stop flag, and `ServedBackend` -- what the running
backend serves as far as the tuner knows (whether any trial wrote a config, and the
data fingerprint of its last health answer, which the cache lookup reads). A trial
whose fusion params are replayed is measured by tuner.study.trial.replay_measure,
which uses this module's write / serve / stop steps.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, cast

import optuna

from tuner.errors import TargetError
from tuner.study.stop import StopFlag, TrialInterrupted
from tuner.study.trial.interfaces import BatchEvaluator, ConfigWriter, EvalOutcome, OnResult
from tuner.study.trial.outcome import TrialOutcome
from tuner.study.trial.phases import Phase, Phases
from tuner.targets.health import health_fingerprint


class Applier(Protocol):
    """Gets written texts served: tuner.targets.reload.ConfigApplier (reload or restart),
    or the request channel's tuner.study.trial.request_channel.RequestServe."""

    def prepare(self, texts: Mapping[Path, str]) -> None: ...

    def apply(self, texts: Mapping[Path, str], *, phase: Callable[[str], Any]) -> Any: ...

    def adopt(self, texts: Mapping[Path, str], health: Any) -> str | None:
        """Take the started backend as serving ``texts`` when it proves it; else why not."""
        ...

    def close(self) -> None: ...


class Restartable(Protocol):
    """The part of a target (tuner.targets.base.Target) a trial uses without an applier."""

    def restart(self) -> None: ...


@dataclass
class ServedBackend:
    """What the running backend serves, as far as this run knows.

    ``wait_healthy`` returns the health JSON when it has one; ``fingerprint_field`` is the
    dotted field of it holding the backend's own data fingerprint (target.health.fingerprint),
    ``fingerprint`` the value of the last answer (None: unknown), ``touched`` whether any
    trial wrote a config (the backend then needs a restart on the original)."""

    wait_healthy: Callable[[], Any]
    fingerprint_field: str | None = None
    fingerprint: str | None = None
    touched: bool = False

    def observe(self, body: object) -> None:
        """Keep the data fingerprint of a health answer (when one is declared)."""
        if self.fingerprint_field is None:
            return
        if not isinstance(body, Mapping):
            raise TargetError(
                f"target.health.fingerprint {self.fingerprint_field!r} is set, but the health wait returned"
                " no health answer to read it from (wait_healthy must return wait_target_healthy's JSON)"
            )
        self.fingerprint = health_fingerprint(body, self.fingerprint_field)

    def current(self) -> str | None:
        """What the running backend serves. Before this run's first restart the backend
        the run started is asked once (one health request); after a restart that never
        became healthy it stays unknown (the trial is measured, not looked up)."""
        if self.fingerprint_field is None:
            return None
        if self.fingerprint is None and not self.touched:
            try:
                self.observe(self.wait_healthy())
            except TargetError:
                pass  # the restart of this trial tells (and fails it with the reason)
        return self.fingerprint


def _same_order(number: int) -> int:
    return number


@dataclass
class Measurer:
    """One trial's batch against the backend serving its config (module doc)."""

    writer: ConfigWriter
    target: Restartable
    served: ServedBackend
    evaluator: BatchEvaluator
    phases: Phases = field(default_factory=Phases)
    stop: StopFlag = field(default_factory=StopFlag)
    # Gets a written config served (reload when the experiment declares how, else
    # restart); None: ``target.restart()`` + ``served.wait_healthy()``.
    applier: Applier | None = None
    # Builds the per-query callback that reports intermediate values to the pruner
    # (tuner.study.trial.pruning.QueryReporter); it raises optuna.TrialPruned to stop the batch.
    reporter_factory: Callable[[optuna.Trial], OnResult] | None = None
    # Query order of a trial's batch (shuffled per trial so early queries are a fair sample).
    order_seed: Callable[[int], int] = _same_order
    # Return a callable that finishes the batch's scoring (``end`` calls it, off the
    # backend's path) rather than the scored batch.
    defer_scoring: bool = False

    def prepare(self, texts: Mapping[Path, str]) -> None:
        """Parse ``texts`` for the applier's restart-key comparison, off the backend's path."""
        if self.applier is not None:
            self.applier.prepare(texts)

    def batch(
        self, trial: optuna.Trial, out: TrialOutcome, texts: Mapping[Path, str], written: Callable[[], None] | None
    ) -> EvalOutcome | Callable[[], EvalOutcome]:
        """Patch, serve, evaluate: the batch result (or, deferred, what finishes it).
        ``written()`` is called once the config is written, before it is served."""
        self.check_stop()
        self.write(out, texts)
        if written is not None:
            written()
        self.check_stop()
        self.serve(out, texts)
        self.check_stop()
        # Without a pruner no per-query callback is passed: building each query's row
        # costs about a millisecond of the event loop's time per query.
        on_result = self.reporter_factory(trial) if self.reporter_factory is not None else None
        extra: dict[str, Any] = {"defer": True} if self.defer_scoring else {}
        request_of = getattr(self.writer, "request_of", None)
        if request_of is not None:  # channel: request: the trial's own request goes with its batch
            extra["request"] = request_of(texts)
        with self.phases.time(out, "evaluate"):
            try:
                result: EvalOutcome | Callable[[], EvalOutcome] = self.evaluator.evaluate(
                    order_seed=self.order_seed(trial.number), on_result=on_result, **extra
                )
            finally:  # also for a batch stopped early (pruned, failure budget)
                handling, window = self._search_window()
                # strict: the tuner's own handling of the answers inside the window is not search
                out.phase_seconds["search"] = max(window - handling, 0.0)
                out.phase_seconds["handle"] = handling
        return result

    def write(self, out: TrialOutcome, texts: Mapping[Path, str]) -> None:
        with self.phases.time(out, "patch"):
            # the request channel's writer changes the requests, not the backend
            self.served.touched = self.served.touched or getattr(self.writer, "touches_backend", True)
            self.writer.write(texts)

    def serve(self, out: TrialOutcome, texts: Mapping[Path, str]) -> None:
        """Get the backend to serve ``texts`` (just written): through the applier (reload
        when declared and allowed, else restart), or a restart and a health wait."""
        if getattr(self.writer, "touches_backend", True):
            # unknown until the backend answers on the new config; the request channel changes
            # nothing it serves (and a parallel trial's cache lookup may be reading it now)
            self.served.fingerprint = None
        if self.applier is not None:
            # the applier names its phases (reload, confirm, restart, health) as str: all are Phase names
            applied = self.applier.apply(texts, phase=lambda name: self.phases.time(out, cast(Phase, name)))
            out.applied = applied.mode if not applied.reason else f"{applied.mode}: {applied.reason}"
            self._observe(out, applied.health)
            return
        with self.phases.time(out, "restart"):
            self.target.restart()
        with self.phases.time(out, "health"):
            self._observe(out, self.served.wait_healthy())
        out.applied = "restart"

    def _observe(self, out: TrialOutcome, health: Any) -> None:
        """Keep the data fingerprint of this trial's health answer, also on ``out``: in the
        pipelined loop the trial ends (and its result is stored under that fingerprint) while
        the next trial is being served, when ``served.fingerprint`` is already the next one's
        (None while it reloads)."""
        self.served.observe(health)
        if self.served.fingerprint_field is not None:
            out.backend_fingerprint = self.served.fingerprint

    def check_stop(self) -> None:
        if self.stop.is_set():
            raise TrialInterrupted(f"{self.stop.reason} before evaluation; the trial did not run")

    def add_search_time(self, out: TrialOutcome) -> None:
        """Add the last batch's search window (less the tuner's handling) to ``out``."""
        handling, window = self._search_window()
        out.phase_seconds["search"] = out.phase_seconds.get("search", 0.0) + max(window - handling, 0.0)
        out.phase_seconds["handle"] = out.phase_seconds.get("handle", 0.0) + handling

    def _search_window(self) -> tuple[float, float]:
        handling = float(getattr(self.evaluator, "last_handling_seconds", 0.0) or 0.0)
        window = float(getattr(self.evaluator, "last_search_seconds", 0.0) or 0.0)
        return handling, window
