"""Run one batch evaluation against a live search API.

``run_batch`` sends every query (in a shuffled order when ``order_seed`` is given,
so per-query pruning sees a fair sample early), collects a parsed response or a
``FailedQuery`` for each, enforces the failure budget (aborting as soon as it is
exceeded, so a broken config costs seconds, not a whole batch) and hands the
outcomes to the pure ``evaluate_responses``.
"""

from __future__ import annotations

import asyncio
import random
import threading
import uuid
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any, TypeVar

import httpx

from tuner.dataset import Query, QuerySet
from tuner.errors import FailureBudgetExceeded, ResponseMappingError
from tuner.evaluation.client import Exchange, SearchClient
from tuner.evaluation.mapping import PreparedRequest, decode_json, parse_response, prepare_request
from tuner.evaluation.outcomes import FailedQuery, QueryResponse
from tuner.evaluation.result import BatchResult, ResultBuilder, evaluate_responses, query_record
from tuner.evaluation.spec import EvalSpec

#: on_result(query_id, record): record is the query's per-query row (see query_record).
#: An exception raised by the callback (e.g. optuna.TrialPruned) stops the batch
#: and propagates.
OnResult = Callable[[str, dict[str, Any]], None]

T = TypeVar("T")

__all__ = ["OnResult", "check_failure_budget", "evaluate_responses", "run_batch", "run_batch_async"]


def run_batch(
    spec: EvalSpec,
    queries: QuerySet,
    qrels: Mapping[str, Mapping[str, int]],
    *,
    order_seed: int | None = None,
    on_result: OnResult | None = None,
    metrics: Sequence[str] | None = None,
    transport: httpx.AsyncBaseTransport | None = None,
) -> BatchResult:
    """Synchronous wrapper over ``run_batch_async`` (safe to call from inside a running
    event loop: it then runs on a helper thread)."""
    return _run_sync(
        run_batch_async(
            spec, queries, qrels, order_seed=order_seed, on_result=on_result, metrics=metrics, transport=transport
        )
    )


async def run_batch_async(
    spec: EvalSpec,
    queries: QuerySet,
    qrels: Mapping[str, Mapping[str, int]],
    *,
    order_seed: int | None = None,
    on_result: OnResult | None = None,
    metrics: Sequence[str] | None = None,
    transport: httpx.AsyncBaseTransport | None = None,
) -> BatchResult:
    """Evaluate every query of ``queries`` against ``spec.request.url``.

    Raises FailureBudgetExceeded when more queries fail than ``spec.max_failed_queries``
    allows (the exception's ``failed`` attribute lists them), ConfigError when the body
    template does not fit a query (before anything is sent).
    """
    order = list(queries)
    if order_seed is not None:
        random.Random(order_seed).shuffle(order)
    # Build every request first: a template error is a config error, found before any traffic.
    prepared = [prepare_request(spec, q, str(uuid.uuid4())) for q in order]
    allowed = spec.allowed_failures(len(order))
    failed: list[FailedQuery] = []
    # Scores each outcome as it arrives, so little is left after the last answer.
    builder = ResultBuilder(queries, qrels, gains=spec.gains, metrics=metrics)

    async with SearchClient(spec, transport=transport) as client:
        async def one(q: Query, req: PreparedRequest) -> tuple[Query, QueryResponse | FailedQuery]:
            exchange = await client.send(req)
            # Parsing holds the event loop; yield first so the request that just got
            # this one's concurrency slot goes out before the answer is parsed.
            await asyncio.sleep(0)
            return q, _to_outcome(exchange, spec)

        tasks = [asyncio.create_task(one(q, req)) for q, req in zip(order, prepared, strict=True)]
        try:
            for next_done in asyncio.as_completed(tasks):
                query, outcome = await next_done
                if isinstance(outcome, FailedQuery):
                    failed.append(outcome)
                    if len(failed) > allowed:
                        raise budget_error(failed, len(order), spec)
                builder.add(outcome)
                if on_result is not None:
                    on_result(query.query_id, query_record(query, outcome, qrels, gains=spec.gains, metrics=metrics))
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

    return builder.finish()


def _to_outcome(exchange: Exchange, spec: EvalSpec) -> QueryResponse | FailedQuery:
    if not exchange.ok or exchange.content is None:
        return FailedQuery(exchange.query_id, exchange.request_id, exchange.error or "no response body",
                           exchange.attempts, exchange.latency_ms)
    try:
        payload = decode_json(exchange.content, exchange.query_id, exchange.content_type)
        parsed = parse_response(payload, spec.response, exchange.query_id)
    except ResponseMappingError as exc:
        return FailedQuery(exchange.query_id, exchange.request_id, str(exc), exchange.attempts, exchange.latency_ms)
    return QueryResponse(exchange.query_id, exchange.request_id, parsed, exchange.latency_ms or 0.0, exchange.attempts)


def check_failure_budget(failed: Sequence[FailedQuery], n_queries: int, spec: EvalSpec) -> None:
    """Raise FailureBudgetExceeded when ``failed`` exceeds the spec's budget."""
    if len(failed) > spec.allowed_failures(n_queries):
        raise budget_error(failed, n_queries, spec)


def budget_error(failed: Sequence[FailedQuery], n_queries: int, spec: EvalSpec) -> FailureBudgetExceeded:
    allowed = spec.allowed_failures(n_queries)
    reasons = "; ".join(f"{f.query_id}: {_clip(f.reason)}" for f in failed[:3])
    err = FailureBudgetExceeded(
        f"batch aborted: {len(failed)} of {n_queries} queries failed, the budget allows {allowed} "
        f"(max_failed_queries={spec.max_failed_queries:g}); first reasons: {reasons}; "
        "fix the backend or the response mapping, or raise max_failed_queries"
    )
    err.failed = list(failed)  # type: ignore[attr-defined]
    return err


def _clip(text: str, limit: int = 160) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _run_sync(coro: Awaitable[T]) -> T:
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(coro)  # type: ignore[arg-type]
    # Called from inside an event loop (a notebook, an async caller): a loop cannot be
    # nested, so run ours on a short-lived thread and hand back its result or error.
    box: dict[str, Any] = {}

    def target() -> None:
        try:
            box["value"] = asyncio.run(coro)  # type: ignore[arg-type]
        except BaseException as exc:  # noqa: BLE001 - re-raised in the caller's thread
            box["error"] = exc

    thread = threading.Thread(target=target, name="tuner-run-batch")
    thread.start()
    thread.join()
    if "error" in box:
        raise box["error"]
    return box["value"]
