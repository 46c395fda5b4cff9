"""The HTTP seam of batch evaluation: send prepared requests, bounded and retried.

``SearchClient`` wraps one ``httpx.AsyncClient``. Concurrency is bounded by a
semaphore (and the connection pool); each query carries its own ``X-Request-ID``
(kept across retries so the backend's logs group the attempts). Transport errors,
timeouts, 429 and 5xx are retried with exponential backoff and jitter for a bounded
number of attempts; what still fails comes back as an ``Exchange`` with ``error``
set, never as an exception, so the batch can record it and apply its budget.
"""

from __future__ import annotations

import asyncio
import functools
import random
import ssl
import time
from dataclasses import dataclass

import httpx

from tuner.evaluation.mapping import PreparedRequest
from tuner.evaluation.spec import EvalSpec

#: Statuses worth another attempt: overload and server-side failures.
RETRY_STATUSES = frozenset({429, 500, 502, 503, 504}) | frozenset(range(505, 600))


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

    def __init__(self, spec: EvalSpec, *, transport: httpx.AsyncBaseTransport | None = None) -> None:
        self._spec = spec
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
        """Send with retries; never raises for HTTP or transport failures."""
        async with self._semaphore:
            return await self._send_with_retries(request)

    async def _send_with_retries(self, request: PreparedRequest) -> Exchange:
        # A plain loop rather than tenacity.AsyncRetrying: the same policy (retry
        # transport errors and RETRY_STATUSES, exponential backoff with jitter) without
        # ~40 us of retry-state objects per request, which is per query of every batch.
        max_attempts = self._spec.retries + 1
        attempts = 0
        while True:
            attempts += 1
            started = time.perf_counter()
            try:
                response = await self._client.request(
                    request.method, request.url, headers=request.headers, json=request.json, params=request.params
                )
            except httpx.TransportError as exc:
                latency_ms = (time.perf_counter() - started) * 1000.0
                if attempts < max_attempts:
                    await asyncio.sleep(self._backoff(attempts))
                    continue
                detail = str(exc) or type(exc).__name__
                return self._failed(request, attempts, latency_ms, None,
                                    f"{type(exc).__name__} after {attempts} attempt(s): {detail}")
            latency_ms = (time.perf_counter() - started) * 1000.0
            status = response.status_code
            if status in RETRY_STATUSES:
                if attempts < max_attempts:
                    await asyncio.sleep(self._backoff(attempts))
                    continue
                return self._failed(request, attempts, latency_ms, status,
                                    f"HTTP {status} after {attempts} attempt(s): {_snippet(response)}")
            if status >= 400:
                return self._failed(request, attempts, latency_ms, status,
                                    f"HTTP {status} (not retried): {_snippet(response)}")
            return Exchange(
                query_id=request.query_id,
                request_id=request.request_id,
                attempts=attempts,
                latency_ms=latency_ms,
                status=status,
                content=response.content,
                content_type=response.headers.get("content-type"),
            )

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


def _snippet(response: httpx.Response, limit: int = 120) -> str:
    text = response.text.strip().replace("\n", " ")
    return (text[: limit - 3] + "...") if len(text) > limit else (text or "(empty body)")
