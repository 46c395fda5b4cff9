"""One request, its raw answer as text: the evidence an error message quotes.

When most queries come back empty, the preflight shows what the backend actually
said next to the mapping paths it tried; parsed hits cannot show that.
"""

from __future__ import annotations

import time
import uuid

import httpx

from tuner.data.dataset import Query
from tuner.evaluation.mapping import prepare_request
from tuner.evaluation.spec import EvalSpec
from tuner.tls import shared_ssl_context

_LIMIT = 4096  # enough for the shape of an answer; the message clips it further


def fetch_raw(spec: EvalSpec, query: Query) -> str:
    """``HTTP <status> <body>`` for ``query`` (the body cut at a few KB), or what went wrong."""
    req = prepare_request(spec, query, f"preflight-{uuid.uuid4()}")
    deadline = time.monotonic() + spec.request_deadline_s  # a dripping body must not hold the preflight
    try:
        with (
            httpx.Client(timeout=spec.timeout_s, verify=shared_ssl_context()) as client,
            client.stream(req.method, req.url, headers=dict(req.headers), json=req.json, params=req.params) as response,
        ):
            body = b""
            for chunk in response.iter_bytes():
                body += chunk
                if len(body) >= _LIMIT or time.monotonic() > deadline:
                    break
        return f"HTTP {response.status_code} {body[:_LIMIT].decode('utf-8', 'replace')}"
    except httpx.HTTPError as exc:
        return f"no response ({type(exc).__name__}: {exc})"
