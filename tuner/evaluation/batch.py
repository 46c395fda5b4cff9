"""Run one batch evaluation against a live search API.

``run_batch`` sends every query (in a shuffled order when ``order_seed`` is given,
so per-query pruning sees a fair sample early), collects a parsed response or a
``FailedQuery`` for each, enforces the failure budget (aborting as soon as it is
exceeded, so a broken config costs seconds, not a whole batch) and hands the
outcomes to the pure ``evaluate_responses``.

An optional ``abort`` check (``() -> str | None``) is asked before the first request,
every ``ABORT_POLL_S`` while the batch runs and before every retry; once it gives a
reason the batch cancels its requests in flight and raises ``BatchAborted`` with that
reason. That is how a caller that knows more than HTTP does (the backend process
died, a stop was requested) ends a batch at once instead of after the retry schedule.
``any_abort`` and ``StopAfterGrace`` build such checks.
"""

from __future__ import annotations

import asyncio
import random
import threading
import time
import uuid
from collections.abc import Callable, Coroutine, Mapping, Sequence
from typing import Any, Literal, TypeVar, overload

from tuner.data.dataset import Query, QuerySet
from tuner.errors import FailureBudgetExceeded, ResponseMappingError
from tuner.evaluation.answers import AnswerDecoder
from tuner.evaluation.client import Abort, BatchAborted, Exchange, SearchClient, one_line
from tuner.evaluation.mapping import PreparedRequest, RequestTemplates, decode_json, parse_response, prepare_request
from tuner.evaluation.outcomes import FailedQuery, QueryResponse
from tuner.evaluation.result import BatchResult, ResultBuilder, evaluate_responses, query_record
from tuner.evaluation.spec import EvalSpec

#: on_result(query_id, record): record is the query's per-query row (see query_record).
#: An exception raised by the callback (e.g. optuna.TrialPruned) stops the batch
#: and propagates.
OnResult = Callable[[str, dict[str, Any]], None]

T = TypeVar("T")
#: sees each decoded answer: (query_id, payload, the QueryResponse parsed from it)
OnPayload = Callable[[str, Any, QueryResponse], None]

#: seconds between two asks of a running batch's abort check
ABORT_POLL_S = 0.1

__all__ = [
    "ABORT_POLL_S",
    "Abort",
    "BatchAborted",
    "BatchTiming",
    "OnResult",
    "StopAfterGrace",
    "any_abort",
    "evaluate_responses",
    "run_batch",
    "run_batch_async",
]


@overload
def run_batch(
    spec: EvalSpec,
    queries: QuerySet,
    qrels: Mapping[str, Mapping[str, int]],
    *,
    order_seed: int | None = None,
    on_result: OnResult | None = None,
    metrics: Sequence[str] | None = None,
    abort: Abort | None = None,
    timing: BatchTiming | None = None,
    defer: Literal[False] = False,
    on_payload: OnPayload | None = None,
    templates: RequestTemplates | None = None,
) -> BatchResult: ...


@overload
def run_batch(
    spec: EvalSpec,
    queries: QuerySet,
    qrels: Mapping[str, Mapping[str, int]],
    *,
    order_seed: int | None = None,
    on_result: OnResult | None = None,
    metrics: Sequence[str] | None = None,
    abort: Abort | None = None,
    timing: BatchTiming | None = None,
    defer: Literal[True],
    on_payload: OnPayload | None = None,
    templates: RequestTemplates | None = None,
) -> ResultBuilder: ...


@overload
def run_batch(
    spec: EvalSpec,
    queries: QuerySet,
    qrels: Mapping[str, Mapping[str, int]],
    *,
    order_seed: int | None = None,
    on_result: OnResult | None = None,
    metrics: Sequence[str] | None = None,
    abort: Abort | None = None,
    timing: BatchTiming | None = None,
    defer: bool = False,
    on_payload: OnPayload | None = None,
    templates: RequestTemplates | None = None,
) -> BatchResult | ResultBuilder: ...


def run_batch(
    spec: EvalSpec,
    queries: QuerySet,
    qrels: Mapping[str, Mapping[str, int]],
    *,
    order_seed: int | None = None,
    on_result: OnResult | None = None,
    metrics: Sequence[str] | None = None,
    abort: Abort | None = None,
    timing: BatchTiming | None = None,
    defer: bool = False,
    on_payload: OnPayload | None = None,
    templates: RequestTemplates | None = None,
) -> BatchResult | ResultBuilder:
    """Synchronous wrapper over ``run_batch_async`` (safe to call from inside a running
    event loop: it then runs on a helper thread)."""
    return _run_sync(
        run_batch_async(
            spec,
            queries,
            qrels,
            order_seed=order_seed,
            on_result=on_result,
            metrics=metrics,
            abort=abort,
            timing=timing,
            defer=defer,
            on_payload=on_payload,
            templates=templates,
        )
    )


class BatchTiming:
    """Where a batch's time went: ``window_s`` is the search window, from the first
    request sent to the last answer read (the search calls proper); ``handling_s`` is the
    time the event loop spent on the answers inside it (decoding, mapping, scoring, the
    per-query callback): tuner time, not search time, even where it overlaps requests in
    flight."""

    __slots__ = ("handling_s", "window_s")

    def __init__(self) -> None:
        self.handling_s = 0.0
        self.window_s = 0.0


@overload
async def run_batch_async(
    spec: EvalSpec,
    queries: QuerySet,
    qrels: Mapping[str, Mapping[str, int]],
    *,
    order_seed: int | None = None,
    on_result: OnResult | None = None,
    metrics: Sequence[str] | None = None,
    abort: Abort | None = None,
    timing: BatchTiming | None = None,
    defer: Literal[False] = False,
    on_payload: OnPayload | None = None,
    templates: RequestTemplates | None = None,
) -> BatchResult: ...


@overload
async def run_batch_async(
    spec: EvalSpec,
    queries: QuerySet,
    qrels: Mapping[str, Mapping[str, int]],
    *,
    order_seed: int | None = None,
    on_result: OnResult | None = None,
    metrics: Sequence[str] | None = None,
    abort: Abort | None = None,
    timing: BatchTiming | None = None,
    defer: Literal[True],
    on_payload: OnPayload | None = None,
    templates: RequestTemplates | None = None,
) -> ResultBuilder: ...


@overload
async def run_batch_async(
    spec: EvalSpec,
    queries: QuerySet,
    qrels: Mapping[str, Mapping[str, int]],
    *,
    order_seed: int | None = None,
    on_result: OnResult | None = None,
    metrics: Sequence[str] | None = None,
    abort: Abort | None = None,
    timing: BatchTiming | None = None,
    defer: bool = False,
    on_payload: OnPayload | None = None,
    templates: RequestTemplates | None = None,
) -> BatchResult | ResultBuilder: ...


async def run_batch_async(
    spec: EvalSpec,
    queries: QuerySet,
    qrels: Mapping[str, Mapping[str, int]],
    *,
    order_seed: int | None = None,
    on_result: OnResult | None = None,
    metrics: Sequence[str] | None = None,
    abort: Abort | None = None,
    timing: BatchTiming | None = None,
    defer: bool = False,
    on_payload: OnPayload | None = None,
    templates: RequestTemplates | None = None,
) -> BatchResult | ResultBuilder:
    """Evaluate every query of ``queries`` against ``spec.request.url``.

    Raises FailureBudgetExceeded when more queries fail than ``spec.max_failed_queries``
    allows (the exception's ``failed`` attribute lists them), ConfigError when the body
    template does not fit a query (before anything is sent), BatchAborted when
    ``abort`` gives a reason (within ``ABORT_POLL_S`` of it; requests in flight are
    cancelled). An exception raised by ``abort`` itself propagates.

    Returns the BatchResult; with ``defer``, the ``ResultBuilder`` holding every outcome,
    whose ``finish()`` scores the batch and returns it (pure: any thread may call it later).
    ``on_payload(query_id, payload, outcome)`` sees each decoded answer before it is
    dropped (the explained retrieval of fusion replay keeps its explanation).
    ``templates``: the queries' requests built once for ``spec`` (a study's every trial).
    """
    clock = time.perf_counter
    timing = timing if timing is not None else BatchTiming()
    order = list(queries)
    if order_seed is not None:
        random.Random(order_seed).shuffle(order)
    # Build every request first: a template error is a config error, found before any traffic.
    if templates is not None and templates.spec is spec:
        prepared = templates.for_batch(order)
    else:
        prepared = [prepare_request(spec, q, str(uuid.uuid4())) for q in order]
    allowed = spec.allowed_failures(len(order))
    failed: list[FailedQuery] = []
    # Scores each outcome as it arrives, so little is left after the last answer.
    builder = ResultBuilder(queries, qrels, gains=spec.gains, metrics=metrics)
    decoder = AnswerDecoder(spec.response, spec.top_k)
    if abort is not None and (reason := abort()):
        raise _aborted(reason, 0, len(order))  # nothing is sent to a backend known to be gone

    async with SearchClient(spec, abort=abort) as client:

        async def one(q: Query, req: PreparedRequest) -> tuple[Query, QueryResponse | FailedQuery]:
            exchange = await client.send(req)
            # Parsing holds the event loop; yield first so the request that just got
            # this one's concurrency slot goes out before the answer is parsed.
            await asyncio.sleep(0)
            began = clock()
            outcome = _to_outcome(exchange, spec, decoder, on_payload)
            timing.handling_s += clock() - began
            return q, outcome

        tasks = [asyncio.create_task(one(q, req)) for q, req in zip(order, prepared, strict=True)]
        # Finished tasks queue up in the order they end (as asyncio.as_completed), and so
        # does the watcher when its abort check gives a reason: whichever comes first wins.
        arrived: asyncio.Queue[asyncio.Task[Any]] = asyncio.Queue()
        for each in tasks:
            each.add_done_callback(arrived.put_nowait)
        watcher = None if abort is None else asyncio.create_task(_watch(abort))
        if watcher is not None:
            watcher.add_done_callback(arrived.put_nowait)
        answered = 0
        try:
            while answered < len(tasks):
                task = await arrived.get()
                if task is watcher:
                    raise _aborted(task.result(), answered, len(order))
                try:
                    query, outcome = task.result()
                except BatchAborted as exc:  # the client's check before a retry
                    raise _aborted(exc.reason, answered, len(order)) from None
                answered += 1
                began = clock()
                if isinstance(outcome, FailedQuery):
                    failed.append(outcome)
                    if len(failed) > allowed:
                        raise budget_error(failed, len(order), spec)
                builder.add(outcome)
                try:
                    if on_result is not None:
                        on_result(
                            query.query_id, query_record(query, outcome, qrels, gains=spec.gains, metrics=metrics)
                        )
                finally:
                    timing.handling_s += clock() - began
        finally:
            pending: list[asyncio.Task[Any]] = [*tasks, *([watcher] if watcher is not None else [])]
            for each in pending:
                each.cancel()
            await asyncio.gather(*pending, return_exceptions=True)
            timing.window_s = client.window_s

    return builder if defer else builder.finish()


def _to_outcome(
    exchange: Exchange, spec: EvalSpec, decoder: AnswerDecoder, on_payload: OnPayload | None = None
) -> QueryResponse | FailedQuery:
    if not exchange.ok or exchange.content is None:
        return FailedQuery(
            exchange.query_id,
            exchange.request_id,
            exchange.error or "no response body",
            exchange.attempts,
            exchange.latency_ms,
        )
    payload = None
    try:
        if on_payload is None:  # only the mapped fields are read (hits past top_k are counted, not kept)
            parsed = decoder.parse(exchange.content, exchange.query_id, exchange.content_type)
        else:  # the whole answer is wanted (an explained retrieval keeps its explanation)
            payload = decode_json(exchange.content, exchange.query_id, exchange.content_type)
            parsed = parse_response(payload, spec.response, exchange.query_id, top_k=spec.top_k)
    except ResponseMappingError as exc:
        return FailedQuery(exchange.query_id, exchange.request_id, str(exc), exchange.attempts, exchange.latency_ms)
    outcome = QueryResponse(
        exchange.query_id, exchange.request_id, parsed, exchange.latency_ms or 0.0, exchange.attempts
    )
    if on_payload is not None:
        on_payload(exchange.query_id, payload, outcome)
    return outcome


async def _watch(abort: Abort) -> str:
    """Ask ``abort`` every ABORT_POLL_S; return its first reason."""
    while True:
        await asyncio.sleep(ABORT_POLL_S)
        reason = abort()
        if reason:
            return reason


def _aborted(reason: str, answered: int, n_queries: int) -> BatchAborted:
    reason = one_line(reason)
    return BatchAborted(
        f"batch aborted after {answered} of {n_queries} queries (requests in flight cancelled): {reason}", reason
    )


def any_abort(*checks: Abort | None) -> Abort | None:
    """One abort check out of several (None entries skipped): the first reason given."""
    active = [c for c in checks if c is not None]
    if not active:
        return None

    def check() -> str | None:
        for c in active:
            reason = c()
            if reason:
                return reason
        return None

    return check


class StopAfterGrace:
    """An abort check for a stop request that lets a batch under way finish if it can:
    ``None`` until ``stop_reason()`` has given a reason for ``grace_s`` seconds, then
    that reason. ``grace_s`` 0 aborts at once."""

    def __init__(
        self, stop_reason: Callable[[], str | None], grace_s: float, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self._stop_reason = stop_reason
        self.grace_s = grace_s
        self._clock = clock
        self._since: float | None = None

    def __call__(self) -> str | None:
        reason = self._stop_reason()
        if not reason:
            return None
        now = self._clock()
        if self._since is None:
            self._since = now
        if now - self._since < self.grace_s:
            return None
        return f"{reason}; the batch under way did not finish within {self.grace_s:g} s of it"


def budget_error(failed: Sequence[FailedQuery], n_queries: int, spec: EvalSpec) -> FailureBudgetExceeded:
    allowed = spec.allowed_failures(n_queries)
    reasons = "; ".join(f"{f.query_id}: {_clip(f.reason)}" for f in failed[:3])
    err = FailureBudgetExceeded(
        f"batch aborted: {len(failed)} of {n_queries} queries failed, the budget allows {allowed} "
        f"(max_failed_queries={spec.max_failed_queries:g}); first reasons: {reasons}; "
        "fix the backend or the response mapping, or raise max_failed_queries"
    )
    err.failed = list(failed)
    return err


def _clip(text: str, limit: int = 160) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _run_sync(coro: Coroutine[Any, Any, T]) -> T:
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(coro)
    # Called from inside an event loop (a notebook, an async caller): a loop cannot be
    # nested, so run ours on a short-lived thread and hand back its result or error.
    box: dict[str, Any] = {}

    def target() -> None:
        try:
            box["value"] = asyncio.run(coro)
        except BaseException as exc:  # noqa: BLE001 - re-raised in the caller's thread
            box["error"] = exc

    thread = threading.Thread(target=target, name="tuner-run-batch")
    thread.start()
    thread.join()
    if "error" in box:
        raise box["error"]
    return box["value"]
