"""Wait until a (re)started backend answers its health URL.

    wait_healthy(url, *, deadline_s, target=None, interval_s=0.2, max_interval_s=2.0,
                 client=None, headers=None) -> dict

Polls ``url`` with exponential backoff (``interval_s`` doubling, capped at
``max_interval_s``), retrying on transport errors (connection refused or reset while
the backend or a container port proxy warms up) and on any non-200 status. Returns the
JSON body of the first 200 answer (``{}`` when it is not JSON). ``headers`` go with every
GET (``target.health.headers``: an engine that answers health only with a key); they are
never part of a message.

While it waits it asks ``target.failure()`` every few tens of milliseconds, so a
backend that died raises ``BackendExited`` with the target's reason at once instead of
after the deadline. At the deadline it raises ``HealthTimeout`` naming the URL, the
deadline and the last status or exception seen.

    health_fingerprint(body, field) -> str

The data fingerprint a backend reports in that body (``target.health.fingerprint``,
a dotted field such as ``data_fingerprint`` or ``index.sha``), for the result-cache
key: the data the backend loaded at its last (re)start.
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping
from typing import Any, Protocol

import httpx
from tenacity import (
    RetryCallState,
    RetryError,
    Retrying,
    retry_if_exception_type,
    stop_after_delay,
    wait_exponential,
)

from tuner.errors import BackendExited, HealthTimeout, TargetError
from tuner.tls import shared_ssl_context

_POLL_S = 0.05
_MAX_REQUEST_TIMEOUT_S = 5.0


class _NotHealthy(Exception):
    def __init__(self, status: int, body: str) -> None:
        super().__init__(f"HTTP {status}" + (f" {body}" if body else ""))
        self.status = status


class Watched(Protocol):
    """What a health wait asks of the backend it waits for (a Target, or a wrapper of one)."""

    def failure(self) -> str | None:
        """Why the backend cannot come up (it exited, ...), or None while it may."""


def wait_healthy(
    url: str,
    *,
    deadline_s: float,
    target: Watched | None = None,
    interval_s: float = 0.2,
    max_interval_s: float = 2.0,
    client: httpx.Client | None = None,
    headers: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    start = time.monotonic()
    last: list[str] = ["no answer yet"]
    own_client = client is None
    http = client or httpx.Client(verify=shared_ssl_context())

    def check_target() -> None:
        reason = target.failure() if target is not None else None
        if reason is not None:
            raise BackendExited(f"backend exited while waiting for {url}: {reason}")

    def sleep(seconds: float) -> None:
        # Sleep in small slices so a dead backend is noticed within _POLL_S.
        end = time.monotonic() + seconds
        while True:
            check_target()
            left = end - time.monotonic()
            if left <= 0:
                return
            time.sleep(min(_POLL_S, left))

    def attempt() -> dict[str, Any]:
        check_target()
        remaining = max(deadline_s - (time.monotonic() - start), 0.05)
        try:
            resp = http.get(url, headers=dict(headers or {}), timeout=min(remaining, _MAX_REQUEST_TIMEOUT_S))
        except httpx.TransportError as exc:
            last[0] = f"{type(exc).__name__}: {exc}".rstrip(": ")
            raise
        if resp.status_code != 200:
            last[0] = f"HTTP {resp.status_code} {resp.text[:120].strip()}".strip()
            raise _NotHealthy(resp.status_code, resp.text[:120])
        try:
            body = resp.json()
        except ValueError:
            return {}
        return body if isinstance(body, dict) else {"body": body}

    backoff = wait_exponential(multiplier=interval_s, min=interval_s, max=max_interval_s)

    def wait(state: RetryCallState) -> float:
        # Never sleep past the deadline: the last attempt happens right at it.
        return min(backoff(state), max(deadline_s - (time.monotonic() - start), 0.0))

    retrying = Retrying(
        retry=retry_if_exception_type((httpx.TransportError, _NotHealthy)),
        wait=wait,
        stop=stop_after_delay(deadline_s),
        sleep=sleep,
        reraise=False,
    )
    try:
        return retrying(attempt)
    except RetryError as exc:
        waited = time.monotonic() - start
        raise HealthTimeout(
            f"{url} not healthy after {waited:.1f} s (deadline_s={deadline_s:g}); last seen: {last[0]} "
            "(check the backend log, or raise target.health.deadline_s)"
        ) from exc.last_attempt.exception()
    finally:
        if own_client:
            http.close()


def wait_target_healthy(health: Any, target: Watched | None) -> dict[str, Any]:
    """``wait_healthy`` with an experiment's ``target.health`` settings (url, headers,
    deadline, interval): the one health wait of run, worker, check, apply and validate. Backs off
    to at most 0.25 s between polls (or the configured interval when longer)."""
    return wait_healthy(
        health.url,
        headers=health.headers,
        deadline_s=health.deadline_s,
        target=target,
        interval_s=health.interval_s,
        max_interval_s=max(health.interval_s, 0.25),
    )


def health_fingerprint(body: Mapping[str, Any] | None, field: str) -> str:
    """The value at dotted ``field`` of a health body, as text (a nested value as its
    canonical JSON); TargetError naming the keys present when it is missing or empty."""
    node: Any = body if isinstance(body, Mapping) else {}
    for i, part in enumerate(field.split(".")):
        if not isinstance(node, Mapping) or part not in node:
            where = ".".join(field.split(".")[:i]) or "the body"
            keys = ", ".join(sorted(map(str, node))) if isinstance(node, Mapping) else type(node).__name__
            raise TargetError(
                f"target.health.fingerprint {field!r}: the health answer has no {part!r} in {where}"
                f" (keys: {keys or 'none'}); name a field the backend reports, or remove target.health.fingerprint"
            )
        node = node[part]
    if node is None or node == "":
        raise TargetError(
            f"target.health.fingerprint {field!r} is empty in the health answer; "
            "the backend must report a fingerprint of the data it loaded"
        )
    return node if isinstance(node, str) else json.dumps(node, sort_keys=True)
