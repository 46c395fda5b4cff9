"""The HTTP seam of batch evaluation: send prepared requests, bounded and retried.

``SearchClient`` wraps one ``aiohttp.ClientSession`` (its C HTTP parser costs the
tuner's event loop about a third of httpx's CPU per request, which on a 2-core machine
is CPU taken from the backend being measured; ``bench/trial_overhead.py``).
Concurrency is bounded by a semaphore (and the connection pool); each query carries
its own ``X-Request-ID`` (kept across retries so the backend's logs group the
attempts). Transport errors, timeouts, 429 and 5xx are retried with exponential
backoff and jitter for a bounded number of attempts; what still fails comes back as an
``Exchange`` with ``error`` set, never as an exception, so the batch can record it and
apply its budget. Transport failures are named as users know them from httpx
(``ConnectError``, ``ReadTimeout``, ``RemoteProtocolError``, ...).

A hostile backend cannot hold or flood the tuner: ``timeout_s`` bounds each
connect and each read only, so every attempt also runs under a whole-request deadline
(``EvalSpec.request_deadline_s``: connect + send + every read of the body), and the
body is streamed through a byte counter that stops at ``max_response_bytes`` (the
query fails; an oversized answer is not retried, it would come back the same). One
query therefore takes at most ``EvalSpec.query_bound_s`` once sent. An ``abort``
check, asked before every retry, stops the client at once with ``BatchAborted``.

The client also keeps the batch's search window (``window_s``): from the first request
sent to the last answer read, the search calls proper.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import aiohttp
from aiohttp.helpers import basicauth_from_netrc, get_env_proxy_for_url, netrc_from_env
from yarl import URL

from tuner.errors import EvaluationError
from tuner.evaluation.mapping import PreparedRequest, encode_json
from tuner.evaluation.spec import EvalSpec
from tuner.tls import shared_ssl_context

#: Statuses worth another attempt: overload and server-side failures.
RETRY_STATUSES = frozenset({429, 500, 502, 503, 504}) | frozenset(range(505, 600))
#: of an error response only this much is read: enough for the reason quoted
ERROR_BODY_BYTES = 1024
#: the body is read in pieces of at most this many bytes (the byte cap is checked per piece)
READ_CHUNK = 1 << 16
#: the longest status or header line accepted (aiohttp's default, 8190, refuses answers
#: httpx took: a long trace or cookie header); the deadline still bounds the whole read
MAX_HEADER_LINE = 1 << 16

#: An abort check: None while the batch may go on, else one line saying why it stops
#: (a dead backend, a stop request). Called on the event loop, so it must be quick.
Abort = Callable[[], str | None]

#: Failures worth another attempt: the connection or the exchange broke, or a
#: connect / read timeout passed. aiohttp's own names, in the words httpx gives them
#: (and the tuner's reasons have always used), most specific first.
_TRANSPORT_NAMES: tuple[tuple[type[BaseException], str], ...] = (
    (aiohttp.ConnectionTimeoutError, "ConnectTimeout"),
    (aiohttp.ServerTimeoutError, "ReadTimeout"),
    (aiohttp.ClientConnectorError, "ConnectError"),
    (aiohttp.ServerDisconnectedError, "RemoteProtocolError"),
    (aiohttp.ClientPayloadError, "RemoteProtocolError"),
    (aiohttp.ClientOSError, "NetworkError"),
    (aiohttp.ClientConnectionError, "NetworkError"),
    (TimeoutError, "ReadTimeout"),
)
_RETRIED = tuple(cls for cls, _ in _TRANSPORT_NAMES)


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


class _Deadline(Exception):
    """The whole-request deadline passed (as opposed to one read's timeout)."""


#: failures worth another attempt: a transport failure, or the whole-request deadline
_RETRY_ON: tuple[type[BaseException], ...] = (_Deadline, *_RETRIED)


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


class SearchClient:
    """Async client for one batch; use as ``async with SearchClient(spec) as c``."""

    def __init__(self, spec: EvalSpec, *, abort: Abort | None = None) -> None:
        self._spec = spec
        self._abort = abort
        self._deadline_s = spec.request_deadline_s
        self._semaphore = asyncio.Semaphore(spec.concurrency)
        connector = aiohttp.TCPConnector(limit=spec.concurrency, limit_per_host=0, ssl=shared_ssl_context())
        # timeout_s bounds a connect and each read (httpx's meaning); the whole-request
        # deadline is ours, per attempt (_attempt)
        timeout = aiohttp.ClientTimeout(total=None, sock_connect=spec.timeout_s, sock_read=spec.timeout_s)
        # HTTP(S)_PROXY / NO_PROXY and ~/.netrc are honoured, as httpx does by default, but
        # looked up once per URL (_route), not by trust_env: that costs two thread-pool
        # hops per request, each a GIL handoff on the event loop of every query
        self._session = aiohttp.ClientSession(
            connector=connector,
            timeout=timeout,
            trust_env=False,
            max_line_size=MAX_HEADER_LINE,
            max_field_size=MAX_HEADER_LINE,
        )
        self._routes: dict[str, dict[str, Any]] = {}
        self._first_sent: float | None = None
        self._last_read: float | None = None

    async def __aenter__(self) -> SearchClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        await self._session.close()

    @property
    def window_s(self) -> float:
        """Seconds from the first request sent to the last answer read (0 before both)."""
        if self._first_sent is None or self._last_read is None:
            return 0.0
        return self._last_read - self._first_sent

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
        data, headers = _encode(request)
        route = self._route(request.url, headers)
        attempts = 0
        while True:
            if attempts:
                self.check_abort()  # a dead backend is not worth the next attempt
            attempts += 1
            started = time.perf_counter()
            if self._first_sent is None:
                self._first_sent = started
            failure: Exception | None = None
            try:
                answer = await self._attempt(request, data, headers, route)
            except (_Deadline, _TooLarge, aiohttp.ClientError, TimeoutError) as exc:
                failure = exc
            self._last_read = time.perf_counter()
            latency_ms = (self._last_read - started) * 1000.0
            if isinstance(failure, _TooLarge):
                return self._failed(request, attempts, latency_ms, failure.status, self._too_large_reason(failure))
            if isinstance(failure, _RETRY_ON):
                if attempts < max_attempts:
                    await asyncio.sleep(self._backoff(attempts))
                    continue
                return self._failed(request, attempts, latency_ms, None, self._transport_reason(failure, attempts))
            if failure is not None:  # too many redirects, a bad URL: the next attempt fares no better
                name, detail = type(failure).__name__, str(failure)
                unparsed = failure if isinstance(failure, aiohttp.ClientResponseError) else None
                if unparsed is not None and not isinstance(unparsed, aiohttp.TooManyRedirects):
                    # an answer that does not parse as HTTP (aiohttp labels it 400 itself: not the server's status)
                    name, detail = "RemoteProtocolError", unparsed.message
                return self._failed(
                    request, attempts, latency_ms, None, f"{name} (not retried): {one_line(detail or name)}"
                )
            status = answer.status
            if status in RETRY_STATUSES:
                if attempts < max_attempts:
                    await asyncio.sleep(self._backoff(attempts))
                    continue
                return self._failed(
                    request,
                    attempts,
                    latency_ms,
                    status,
                    f"HTTP {status} after {attempts} attempt(s): {_snippet(answer.body)}",
                )
            if status >= 400:
                return self._failed(
                    request, attempts, latency_ms, status, f"HTTP {status} (not retried): {_snippet(answer.body)}"
                )
            return Exchange(
                query_id=request.query_id,
                request_id=request.request_id,
                attempts=attempts,
                latency_ms=latency_ms,
                status=status,
                content=answer.body,
                content_type=answer.content_type,
            )

    async def _attempt(
        self, request: PreparedRequest, data: bytes | None, headers: dict[str, str], route: Mapping[str, Any]
    ) -> _Answer:
        """One exchange under the whole-request deadline (_Deadline when it passes),
        the body read through the byte cap (_TooLarge past it; an error body is cut)."""
        try:
            async with asyncio.timeout(self._deadline_s) as deadline:
                async with self._session.request(
                    request.method, request.url, data=data, headers=headers, params=request.params, **route
                ) as response:
                    status = response.status
                    ok = status < 400
                    limit = self._spec.max_response_bytes if ok else ERROR_BODY_BYTES
                    body = await _read_capped(response, limit, strict=ok)
                    return _Answer(status, body, response.headers.get("Content-Type"))
        except TimeoutError:
            if deadline.expired():
                raise _Deadline from None
            raise  # a connect or read timeout (aiohttp.ServerTimeoutError)

    def _route(self, url: str, headers: dict[str, str]) -> dict[str, Any]:
        """What aiohttp's ``trust_env`` would look up for ``url`` on every request: the
        proxy from HTTP(S)_PROXY / NO_PROXY (returned as ``proxy``/``proxy_auth``) and
        the host's ~/.netrc ($NETRC) login (added to ``headers`` unless the request has
        an Authorization header of its own). Looked up once per URL; a redirect goes
        through the first URL's proxy."""
        route = self._routes.get(url)
        if route is None:
            route = {}
            parsed = URL(url)
            with contextlib.suppress(LookupError):
                route["proxy"], route["proxy_auth"] = get_env_proxy_for_url(parsed)
            if parsed.host is not None:
                with contextlib.suppress(LookupError):
                    route["authorization"] = basicauth_from_netrc(netrc_from_env(), parsed.host).encode()
            self._routes[url] = route
        login = route.get("authorization")
        if login is not None and not any(k.lower() == "authorization" for k in headers):
            headers["Authorization"] = login
        return {k: v for k, v in route.items() if k != "authorization"}

    def check_abort(self) -> None:
        """Raise BatchAborted when the abort check gives a reason."""
        if self._abort is None:
            return
        reason = self._abort()
        if reason:
            raise BatchAborted(f"batch aborted: {one_line(reason)}", one_line(reason))

    def _transport_reason(self, exc: BaseException, attempts: int) -> str:
        if isinstance(exc, _Deadline):
            return (
                f"DeadlineTimeout after {attempts} attempt(s): the whole-request deadline of "
                f"{self._deadline_s:g} s (evaluation.deadline_s: connect + send + every read) passed before "
                "the answer was complete; the backend answers too slowly or drips its body: fix it or raise "
                "deadline_s"
            )
        name = next(n for cls, n in _TRANSPORT_NAMES if isinstance(exc, cls))
        if name == "ReadTimeout":
            detail = f"no data from the backend for {self._spec.timeout_s:g} s (evaluation.timeout_s)"
        elif name == "ConnectTimeout":
            detail = f"no connection within {self._spec.timeout_s:g} s (evaluation.timeout_s)"
        else:
            detail = one_line(str(exc) or type(exc).__name__)
        return f"{name} after {attempts} attempt(s): {detail}"

    def _too_large_reason(self, exc: _TooLarge) -> str:
        cap = self._spec.max_response_bytes
        seen = (
            f"Content-Length {exc.declared}"
            if exc.declared is not None and exc.read == 0
            else f"stopped reading after {exc.read} bytes"
        )
        return (
            f"ResponseTooLarge (not retried): the body is over max_response_bytes={cap} ({seen}); "
            f"make the backend honour top_k={self._spec.top_k} or raise evaluation.max_response_bytes"
        )

    def _backoff(self, attempt: int) -> float:
        """Seconds before the next attempt: ``backoff_s * 2**(attempt - 1)`` plus up to
        ``backoff_s`` of jitter (so retries of concurrent queries spread out), at most
        ``backoff_max_s``."""
        spec = self._spec
        return min(spec.backoff_s * 2 ** (attempt - 1) + random.uniform(0, spec.backoff_s), spec.backoff_max_s)

    @staticmethod
    def _failed(
        request: PreparedRequest, attempts: int, latency_ms: float | None, status: int | None, reason: str
    ) -> Exchange:
        return Exchange(request.query_id, request.request_id, attempts, latency_ms, status, error=reason)


def _encode(request: PreparedRequest) -> tuple[bytes | None, dict[str, str]]:
    """The request body as JSON bytes (once per query, not per attempt; a request from
    RequestTemplates carries them already) and its headers."""
    headers = dict(request.headers)
    if request.json is None:
        return None, headers
    if request.body is not None:
        return request.body, headers
    if not any(k.lower() == "content-type" for k in headers):
        headers["Content-Type"] = "application/json"
    return encode_json(request.json), headers


async def _read_capped(response: aiohttp.ClientResponse, cap: int, *, strict: bool) -> bytes:
    """The (decoded) body, at most ``cap`` bytes: past it, _TooLarge when ``strict``,
    else the first ``cap`` bytes. A Content-Length over the cap fails before any read.
    A body cut short closes the connection (it is not reused)."""
    declared = response.content_length
    if strict and declared is not None and declared > cap:
        response.close()
        raise _TooLarge(response.status, 0, declared)
    chunks: list[bytes] = []
    size = 0
    async for chunk in response.content.iter_chunked(READ_CHUNK):
        size += len(chunk)
        if size > cap:
            response.close()
            if strict:
                raise _TooLarge(response.status, size, declared)
            chunks.append(chunk[: len(chunk) - (size - cap)])
            break
        chunks.append(chunk)
    return b"".join(chunks)


def one_line(text: str) -> str:
    return " ".join(text.split()) or "(no reason given)"


def _snippet(body: bytes, limit: int = 120) -> str:
    text = body.decode("utf-8", "replace").strip().replace("\n", " ")
    return (text[: limit - 3] + "...") if len(text) > limit else (text or "(empty body)")
