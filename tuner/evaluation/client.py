"""The HTTP seam of batch evaluation: send prepared requests, bounded and retried.

``SearchClient`` wraps one ``httpx.AsyncClient``. Concurrency is bounded by a
semaphore (and the connection pool); each query carries its own ``X-Request-ID``
(kept across retries so the backend's logs group the attempts). Transport errors,
timeouts, 429 and 5xx are retried with exponential backoff and jitter for a bounded
number of attempts; what still fails comes back as an ``Exchange`` with ``error``
set, never as an exception, so the batch can record it and apply its budget.

A hostile backend cannot hold or flood the tuner: httpx's ``timeout_s`` bounds each
read only, so every attempt also runs under a whole-request deadline
(``EvalSpec.request_deadline_s``: connect + send + every read of the body), and the
body is streamed through a byte counter that stops at ``max_response_bytes`` (the
query fails; an oversized answer is not retried, it would come back the same). One
query therefore takes at most ``EvalSpec.query_bound_s`` once sent. An ``abort``
check, asked before every retry, stops the client at once with ``BatchAborted``.
"""

from __future__ import annotations

import asyncio
import functools
import random
import ssl
import time
from collections.abc import Callable
from dataclasses import dataclass

import httpx

from tuner.errors import EvaluationError
from tuner.evaluation.mapping import PreparedRequest
from tuner.evaluation.spec import EvalSpec

#: Statuses worth another attempt: overload and server-side failures.
RETRY_STATUSES = frozenset({429, 500, 502, 503, 504}) | frozenset(range(505, 600))
#: of an error response only this much is read: enough for the reason quoted
ERROR_BODY_BYTES = 1024

#: An abort check: None while the batch may go on, else one line saying why it stops
#: (a dead backend, a stop request). Called on the event loop, so it must be quick.
Abort = Callable[[], str | None]


class BatchAborted(EvaluationError):
    """A batch stopped from outside: its ``abort`` check gave ``reason``."""

    def __init__(self, message: str, reason: str) -> None:
        super().__init__(message)
        self.reason = reason


class _TooLarge(Exception):
    def __init__(self, status: int, read: int, declared: int | None) -> None:
        super().__init__(status, read, declared)
        self.status = status
        self.read = read
        self.declared = declared


@dataclass(frozen=True, slots=True)
class _Answer:
    status: int
    body: bytes
    content_type: str | None


@dataclass(frozen=True, slots=True)
class Exchange:
    """The outcome of one query's HTTP exchange after retries."""

    query_id: str
    request_id: str
    attempts: int
    latency_ms: float | None
    status: int | None = None
    content: bytes | None = None
    content_type: str | None = None
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.error is None


@functools.cache
def shared_ssl_context() -> ssl.SSLContext:
    """One TLS context for every client of the process. httpx builds a fresh one per
    client or transport by default (loading the CA bundle: ~30 ms), which a study
    would pay on every batch; the context is immutable once built, so sharing it is
    safe. Pass it as ``verify=`` to ``httpx.AsyncClient`` / ``AsyncHTTPTransport``."""
    return httpx.create_ssl_context()


class SearchClient:
    """Async client for one batch; use as ``async with SearchClient(spec) as c``."""

    def __init__(self, spec: EvalSpec, *, transport: httpx.AsyncBaseTransport | None = None,
                 abort: Abort | None = None) -> None:
        self._spec = spec
        self._abort = abort
        self._deadline_s = spec.request_deadline_s
        self._semaphore = asyncio.Semaphore(spec.concurrency)
        limits = httpx.Limits(max_connections=spec.concurrency, max_keepalive_connections=spec.concurrency)
        self._client = httpx.AsyncClient(
            timeout=httpx.Timeout(spec.timeout_s), limits=limits, transport=transport, follow_redirects=True,
            verify=shared_ssl_context(),
        )

    async def __aenter__(self) -> SearchClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        await self._client.aclose()

    async def send(self, request: PreparedRequest) -> Exchange:
        """Send with retries; never raises for HTTP or transport failures (BatchAborted
        when the abort check gives a reason before a retry)."""
        async with self._semaphore:
            return await self._send_with_retries(request)

    async def _send_with_retries(self, request: PreparedRequest) -> Exchange:
        # A plain loop rather than tenacity.AsyncRetrying: the same policy (retry
        # transport errors, deadlines and RETRY_STATUSES, exponential backoff with jitter)
        # without ~40 us of retry-state objects per request, which is per query of every batch.
        max_attempts = self._spec.retries + 1
        attempts = 0
        while True:
            if attempts:
                self.check_abort()  # a dead backend is not worth the next attempt
            attempts += 1
            started = time.perf_counter()
            try:
                answer = await self._attempt(request)
            except (httpx.TransportError, TimeoutError) as exc:
                latency_ms = (time.perf_counter() - started) * 1000.0
                if attempts < max_attempts:
                    await asyncio.sleep(self._backoff(attempts))
                    continue
                return self._failed(request, attempts, latency_ms, None, self._transport_reason(exc, attempts))
            except _TooLarge as exc:
                latency_ms = (time.perf_counter() - started) * 1000.0
                return self._failed(request, attempts, latency_ms, exc.status, self._too_large_reason(exc))
            latency_ms = (time.perf_counter() - started) * 1000.0
            status = answer.status
            if status in RETRY_STATUSES:
                if attempts < max_attempts:
                    await asyncio.sleep(self._backoff(attempts))
                    continue
                return self._failed(request, attempts, latency_ms, status,
                                    f"HTTP {status} after {attempts} attempt(s): {_snippet(answer.body)}")
            if status >= 400:
                return self._failed(request, attempts, latency_ms, status,
                                    f"HTTP {status} (not retried): {_snippet(answer.body)}")
            return Exchange(
                query_id=request.query_id,
                request_id=request.request_id,
                attempts=attempts,
                latency_ms=latency_ms,
                status=status,
                content=answer.body,
                content_type=answer.content_type,
            )

    async def _attempt(self, request: PreparedRequest) -> _Answer:
        """One exchange under the whole-request deadline (TimeoutError when it passes),
        the body read through the byte cap (_TooLarge past it; an error body is cut)."""
        async with asyncio.timeout(self._deadline_s):
            async with self._client.stream(
                request.method, request.url, headers=request.headers, json=request.json, params=request.params
            ) as response:
                ok = response.status_code < 400
                limit = self._spec.max_response_bytes if ok else ERROR_BODY_BYTES
                body = await _read_capped(response, limit, strict=ok)
                return _Answer(response.status_code, body, response.headers.get("content-type"))

    def check_abort(self) -> None:
        """Raise BatchAborted when the abort check gives a reason."""
        if self._abort is None:
            return
        reason = self._abort()
        if reason:
            raise BatchAborted(f"batch aborted: {one_line(reason)}", one_line(reason))

    def _transport_reason(self, exc: Exception, attempts: int) -> str:
        if isinstance(exc, httpx.TransportError):
            detail = str(exc) or type(exc).__name__
            return f"{type(exc).__name__} after {attempts} attempt(s): {detail}"
        return (f"DeadlineTimeout after {attempts} attempt(s): the whole-request deadline of "
                f"{self._deadline_s:g} s (evaluation.deadline_s: connect + send + every read) passed before "
                "the answer was complete; the backend answers too slowly or drips its body: fix it or raise deadline_s")

    def _too_large_reason(self, exc: _TooLarge) -> str:
        cap = self._spec.max_response_bytes
        seen = (f"Content-Length {exc.declared}" if exc.declared is not None and exc.read == 0
                else f"stopped reading after {exc.read} bytes")
        return (f"ResponseTooLarge (not retried): the body is over max_response_bytes={cap} ({seen}); "
                f"make the backend honour top_k={self._spec.top_k} or raise evaluation.max_response_bytes")

    def _backoff(self, attempt: int) -> float:
        """Seconds before the next attempt: ``backoff_s * 2**(attempt - 1)`` plus up to
        ``backoff_s`` of jitter (so retries of concurrent queries spread out), at most
        ``backoff_max_s``."""
        spec = self._spec
        return min(spec.backoff_s * 2 ** (attempt - 1) + random.uniform(0, spec.backoff_s), spec.backoff_max_s)

    @staticmethod
    def _failed(request: PreparedRequest, attempts: int, latency_ms: float | None, status: int | None,
                reason: str) -> Exchange:
        return Exchange(request.query_id, request.request_id, attempts, latency_ms, status, error=reason)


async def _read_capped(response: httpx.Response, cap: int, *, strict: bool) -> bytes:
    """The (decoded) body, at most ``cap`` bytes: past it, _TooLarge when ``strict``,
    else the first ``cap`` bytes. A Content-Length over the cap fails before any read."""
    declared = response.headers.get("content-length", "")
    declared_n = int(declared) if declared.isdigit() else None
    if strict and declared_n is not None and declared_n > cap:
        raise _TooLarge(response.status_code, 0, declared_n)
    chunks: list[bytes] = []
    size = 0
    async for chunk in response.aiter_bytes():
        size += len(chunk)
        if size > cap:
            if strict:
                raise _TooLarge(response.status_code, size, declared_n)
            chunks.append(chunk[: len(chunk) - (size - cap)])
            break
        chunks.append(chunk)
    return b"".join(chunks)


def one_line(text: str) -> str:
    return " ".join(text.split()) or "(no reason given)"


def _snippet(body: bytes, limit: int = 120) -> str:
    text = body.decode("utf-8", "replace").strip().replace("\n", " ")
    return (text[: limit - 3] + "...") if len(text) > limit else (text or "(empty body)")
