"""The HTTP layer: request parsing and the four routes (state and reloads: reload.py).

The port is bound before the index is ready: ``/health`` answers 503 while a daemon
thread loads (so orchestrators see a live process, and SIGTERM is never blocked by a
build), then 200. A load failure stops the server; the process exits with code 1.

``/health``'s ``data_fingerprint`` is a sha256 over the data the index was loaded
from (the corpus bytes and every enabled run file's bytes): a client caching results
per config (the tuner's ``target.health.fingerprint``) sees regenerated data. Its
``config_fingerprint`` is the sha256 of the config file bytes being served, so a client
that wrote the file and reloaded (``POST /admin/reload``) can tell it took effect.

Every route reads ``state.current`` once: a request finishes on the snapshot it started
with, whatever a concurrent reload swaps in.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import os
import threading
import uuid
from collections import OrderedDict
from collections.abc import AsyncIterator, Callable
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator
from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from .config import with_overrides
from .errors import ConfigError
from .extra_cost import costed, cpu_ms_from_env
from .reload import Served, ServiceState

if TYPE_CHECKING:
    from .search import SearchOutcome

REQUEST_ID_HEADER = "X-Request-ID"


class SearchBody(BaseModel):
    """``POST /search`` body. Unknown fields (query-set extras) are ignored."""

    model_config = ConfigDict(extra="ignore")

    query: str = Field(min_length=1, max_length=10_000)
    top_k: int = Field(10, ge=1, le=10_000)
    date_from: dt.date | None = None
    date_to: dt.date | None = None
    date_hint_days: int | None = Field(None, ge=0, le=100_000)
    now: dt.date | None = None
    query_id: str | None = None
    #: true: the response carries ``explain``, every date tier's per-source candidate
    #: lists with raw scores (what a client needs to replay another fusion setting)
    explain: bool = False
    #: a partial config (config.yaml's keys) merged over the served one for this request
    #: only (config.with_overrides); the answer's ``config_hash`` is the merged config's
    overrides: dict[str, Any] | None = None

    @field_validator("date_from", "date_to", "now", mode="before")
    @classmethod
    def _date_part(cls, value: Any) -> Any:
        # A timestamp ("2024-05-01T10:00:00Z") means its day: the corpus has day dates.
        if isinstance(value, str) and len(value) > 10 and value[10] in "T ":
            return value[:10]
        return value

    @field_validator("query_id", mode="before")
    @classmethod
    def _id_as_text(cls, value: Any) -> Any:
        return str(value) if isinstance(value, int) and not isinstance(value, bool) else value

    @field_validator("query")
    @classmethod
    def _not_blank(cls, value: str) -> str:
        if not value.strip():
            raise ValueError("must not be blank")
        return value

    @model_validator(mode="after")
    def _ordered_range(self) -> SearchBody:
        if self.date_from and self.date_to and self.date_from > self.date_to:
            raise ValueError(f"date_from {self.date_from} is after date_to {self.date_to}")
        return self


def create_app(state: ServiceState, on_load_failure: Callable[[], None]) -> Starlette:
    extra_cpu_ms = cpu_ms_from_env()  # benchmarks only (extra_cost.py); 0 in real use
    search_with = costed(_search_with, extra_cpu_ms)

    @contextlib.asynccontextmanager
    async def lifespan(_: Starlette) -> AsyncIterator[None]:
        state.start_loading(on_load_failure)
        yield

    async def health(_: Request) -> JSONResponse:
        served = state.current
        if served is None:
            return JSONResponse({"status": "loading" if state.error is None else "failed"}, status_code=503)
        return JSONResponse(
            {
                "status": "ok",
                "corpus_size": len(served.index.docs),
                "config_hash": served.config_hash,
                "config_fingerprint": served.config_fingerprint,
                "reloads": state.reloads,
                "corpus_hash": served.index.docs.content_hash,
                "data_fingerprint": served.data_fingerprint,
                "index_cache_hits": served.index.cache_hits,
                "load_seconds": round(served.index.load_seconds, 4),
            }
        )

    async def admin_config(_: Request) -> JSONResponse:
        served = state.current
        cfg = served.cfg if served is not None else state.cfg
        # The ETag is the config hash (/health's config_hash), quoted as RFC 9110 wants.
        return JSONResponse(cfg.to_json(), headers={"ETag": f'"{cfg.hash()}"'})

    async def put_config(request: Request) -> JSONResponse:
        try:
            doc = await request.json()
        except ValueError:
            return JSONResponse(
                {"detail": "body is not valid JSON: send the whole config, as GET /admin/config returns it"},
                status_code=422,
            )
        keep = os.environ.get(FAULT_KEEP_ON_PUT)
        if keep and isinstance(doc, dict):  # test-only fault: the PUT "takes" without this key's new value
            served = state.current
            doc = _keep_value(doc, (served.cfg if served is not None else state.cfg).to_json(), keep)
        # In a worker thread, as a reload: a rebuild must not hold up the event loop.
        status, body = await run_in_threadpool(state.put_config_logged, doc, request.headers.get("If-Match"))
        headers = {"ETag": f'"{body["config_hash"]}"'} if status == 200 else None
        return JSONResponse(body, status_code=status, headers=headers)

    async def admin_reload(_: Request) -> JSONResponse:
        # In a worker thread: an index rebuild (or a reload waiting for the lock) must
        # not hold up the event loop; searches keep running on the old snapshot.
        status, body = await run_in_threadpool(state.reload_logged, "POST /admin/reload")
        return JSONResponse(body, status_code=status)

    async def search(request: Request) -> JSONResponse:
        request_id = request.headers.get(REQUEST_ID_HEADER) or uuid.uuid4().hex
        headers = {REQUEST_ID_HEADER: request_id}
        body = await _parse_body(request)
        if not isinstance(body, SearchBody):  # the problem, as JSON
            return JSONResponse({**body, "request_id": request_id}, status_code=422, headers=headers)
        served = state.current  # once: this request runs on this snapshot to the end
        if served is None:
            return JSONResponse(
                {"detail": "index is loading; retry when /health is 200", "request_id": request_id},
                status_code=503,
                headers={**headers, "Retry-After": "1"},
            )
        try:
            outcome, config_hash = await run_in_threadpool(search_with, served, body)
        except ConfigError as exc:
            return JSONResponse({"detail": str(exc), "request_id": request_id}, status_code=422, headers=headers)
        answer = {
            "results": [h.to_json() for h in outcome.hits],
            "confidence": outcome.confidence,
            "handoff": outcome.handoff,
            "handoff_reason": outcome.handoff_reason,
            "fallback_level": outcome.fallback_level,
            "request_id": request_id,
            "config_hash": config_hash,
        }
        if outcome.explain is not None:
            answer["explain"] = outcome.explain
        return JSONResponse(answer, headers=headers)

    async def azure_search(request: Request) -> JSONResponse:
        # numpy and the route's models load on first use, after the port is bound
        from .azure import AzureError, hybrid_search, parse_body

        try:
            try:
                payload = await request.json()
            except ValueError as exc:
                raise AzureError("The request body is not valid JSON") from exc
            body = parse_body(payload)
            served = state.current  # once, as /search
            if served is None:
                raise AzureError("The index is loading; retry when GET /health answers 200", "ServiceUnavailable", 503)
            answer = await run_in_threadpool(costed(hybrid_search, extra_cpu_ms), served.index, served.cfg, body)
        except AzureError as exc:
            return JSONResponse(exc.to_json(), status_code=exc.status)
        return JSONResponse(answer)

    return Starlette(
        routes=[
            Route("/health", health, methods=["GET"]),
            Route("/admin/config", admin_config, methods=["GET"]),
            Route("/admin/config", put_config, methods=["PUT"]),
            Route("/admin/reload", admin_reload, methods=["POST"]),
            Route("/search", search, methods=["POST"]),
            # Azure AI Search's hybrid query shape (azure.py); api-version is accepted and ignored
            Route("/indexes/{index}/docs/search", azure_search, methods=["POST"]),
        ],
        lifespan=lifespan,
    )


#: Test-only fault (tests/faults/test_http_config_faults.py): a dotted config key whose
#: value an accepted PUT /admin/config silently keeps as it was, so the tuner's read-back
#: of the document it sent differs. Unset in every real use.
FAULT_KEEP_ON_PUT = "FUSION_BACKEND_TEST_FAULT_KEEP_ON_PUT"


def _keep_value(doc: dict[str, Any], served: dict[str, Any], dotted: str) -> dict[str, Any]:
    """``doc`` with the value at ``dotted`` taken from ``served`` (when both have it)."""
    import copy

    out = copy.deepcopy(doc)
    node, old = out, served
    *parents, last = dotted.split(".")
    for part in parents:
        if not isinstance(node, dict) or not isinstance(old, dict) or part not in node or part not in old:
            return doc
        node, old = node[part], old[part]
    if isinstance(node, dict) and isinstance(old, dict) and last in node and last in old:
        node[last] = old[last]
    return out


async def _parse_body(request: Request) -> SearchBody | dict[str, Any]:
    """The request's body, or what is wrong with it (the 422 answer's fields)."""
    try:
        payload = await request.json()
    except ValueError:
        return {"detail": 'body is not valid JSON: send {"query": ..., "top_k": ...}'}
    if not isinstance(payload, dict):
        return {"detail": 'body must be a JSON object {"query": ..., "top_k": ...}'}
    try:
        return SearchBody.model_validate(payload)
    except ValidationError as exc:
        errors = [_describe(e) for e in exc.errors()]
        return {"detail": errors[0], "errors": errors}


def _describe(err: Any) -> str:
    where = ".".join(str(p) for p in err["loc"]) or "body"
    msg = err["msg"].removeprefix("Value error, ")
    if err["type"] not in ("value_error", "missing"):
        msg += f" (got {err.get('input')!r})"
    return f"{where}: {msg}"


def _search_with(served: Served, body: SearchBody) -> tuple[SearchOutcome, str]:
    """The search on ``served``, or on ``served``'s index with the body's overrides
    merged over its config: a new Searcher (a few dicts), never a new index. Returns
    the outcome and the hash of the config it ran with; ConfigError for bad overrides."""
    from .search import Searcher, SearchRequest  # numpy: after the port is bound

    request = SearchRequest(**body.model_dump(exclude={"overrides"}))
    if not body.overrides:
        return served.searcher.search(request), served.config_hash
    key = json.dumps(body.overrides, sort_keys=True, separators=(",", ":"))
    with _OVERRIDDEN_LOCK:
        hit = _OVERRIDDEN.get((served.config_hash, key))
        if hit is not None and hit[0] is served:
            _OVERRIDDEN.move_to_end((served.config_hash, key))
            return hit[1].search(request), hit[2]
    cfg = with_overrides(served.cfg, body.overrides)
    searcher = Searcher(served.index, cfg)
    with _OVERRIDDEN_LOCK:
        _OVERRIDDEN[(served.config_hash, key)] = (served, searcher, cfg.hash())
        while len(_OVERRIDDEN) > _OVERRIDDEN_MAX:
            _OVERRIDDEN.popitem(last=False)
    return searcher.search(request), cfg.hash()


# The searchers of recent overrides, per served config: a tuner sends one trial's
# overrides with every query of its batch, and merging, validating and hashing them
# cost more than the search (bench/trial_overhead.py, request mode). Keyed by the served
# config's hash and the overrides' canonical JSON; an entry keeps its Served, so a reload
# (a new Served) never meets a searcher of the old index.
_OVERRIDDEN: OrderedDict[tuple[str, str], tuple[Any, Any, str]] = OrderedDict()
_OVERRIDDEN_LOCK = threading.Lock()
_OVERRIDDEN_MAX = 32
