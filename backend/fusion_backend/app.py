"""The HTTP layer: request parsing, the three routes, the background index load.

The port is bound before the index is ready: ``/health`` answers 503 while a daemon
thread loads (so orchestrators see a live process, and SIGTERM is never blocked by a
build), then 200. A load failure stops the server; the process exits with code 1.

``/health``'s ``data_fingerprint`` is a sha256 over the data the index was loaded
from (the corpus bytes and every enabled run file's bytes): a client caching results
per config (the tuner's ``target.health.fingerprint``) sees regenerated data.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import hashlib
import logging
import threading
import uuid
from collections.abc import AsyncIterator, Callable
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator
from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from .config import Config, RunSource
from .errors import BackendError, CorpusError

log = logging.getLogger("fusion_backend")

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


class ServiceState:
    """What the routes read; ``searcher`` appears once the loader thread finishes."""

    def __init__(self, cfg: Config) -> None:
        self.cfg = cfg
        self.config_hash = cfg.hash()
        self.searcher: Any = None
        self.index: Any = None
        self.data_fingerprint: str | None = None
        self.error: str | None = None

    def load(self) -> None:
        from .index import load_index
        from .search import Searcher

        index = load_index(self.cfg)
        self.data_fingerprint = data_fingerprint(self.cfg, index.docs.content_hash)
        self.searcher, self.index = Searcher(index, self.cfg), index
        log.info("ready: %d documents in %.2f s (cache hits: %s)", len(index.docs), index.load_seconds,
                 ", ".join(f"{k}={v}" for k, v in index.cache_hits.items()))

    def start_loading(self, on_failure: Callable[[], None]) -> None:
        def run() -> None:
            try:
                self.load()
            except BackendError as exc:
                self.error = str(exc)
            except Exception as exc:  # noqa: BLE001  (a crash must still stop the server)
                log.exception("index load crashed")
                self.error = f"index load crashed: {type(exc).__name__}: {exc}"
            if self.error is not None:
                on_failure()

        threading.Thread(target=run, name="index-loader", daemon=True).start()


def data_fingerprint(cfg: Config, corpus_hash: str) -> str:
    """sha256 over the corpus content hash and the bytes of each enabled run file (by
    source name): what the loaded index serves, apart from the config."""
    digest = hashlib.sha256(f"corpus:{corpus_hash}\n".encode())
    for name, src in sorted(cfg.sources.items()):
        if isinstance(src, RunSource) and src.enabled:
            path = cfg.run_path(name)
            try:
                run_hash = hashlib.sha256(path.read_bytes()).hexdigest()
            except OSError as exc:
                raise CorpusError(f"{path}: cannot read run file: {exc.strerror}") from exc
            digest.update(f"run:{name}:{run_hash}\n".encode())
    return digest.hexdigest()


def create_app(state: ServiceState, on_load_failure: Callable[[], None]) -> Starlette:
    @contextlib.asynccontextmanager
    async def lifespan(_: Starlette) -> AsyncIterator[None]:
        state.start_loading(on_load_failure)
        yield

    async def health(_: Request) -> JSONResponse:
        if state.searcher is None:
            return JSONResponse({"status": "loading" if state.error is None else "failed"}, status_code=503)
        return JSONResponse({
            "status": "ok",
            "corpus_size": len(state.index.docs),
            "config_hash": state.config_hash,
            "corpus_hash": state.index.docs.content_hash,
            "data_fingerprint": state.data_fingerprint,
            "index_cache_hits": state.index.cache_hits,
            "load_seconds": round(state.index.load_seconds, 4),
        })

    async def admin_config(_: Request) -> JSONResponse:
        return JSONResponse(state.cfg.to_json())

    async def search(request: Request) -> JSONResponse:
        request_id = request.headers.get(REQUEST_ID_HEADER) or uuid.uuid4().hex
        headers = {REQUEST_ID_HEADER: request_id}
        body, problem = await _parse_body(request)
        if problem is not None:
            return JSONResponse({**problem, "request_id": request_id}, status_code=422, headers=headers)
        if state.searcher is None:
            return JSONResponse({"detail": "index is loading; retry when /health is 200", "request_id": request_id},
                                status_code=503, headers={**headers, "Retry-After": "1"})
        outcome = await run_in_threadpool(state.searcher.search, _to_request(body))
        return JSONResponse({
            "results": [h.to_json() for h in outcome.hits],
            "confidence": outcome.confidence,
            "handoff": outcome.handoff,
            "handoff_reason": outcome.handoff_reason,
            "fallback_level": outcome.fallback_level,
            "request_id": request_id,
        }, headers=headers)

    return Starlette(
        routes=[
            Route("/health", health, methods=["GET"]),
            Route("/admin/config", admin_config, methods=["GET"]),
            Route("/search", search, methods=["POST"]),
        ],
        lifespan=lifespan,
    )


async def _parse_body(request: Request) -> tuple[SearchBody | None, dict[str, Any] | None]:
    try:
        payload = await request.json()
    except ValueError:
        return None, {"detail": "body is not valid JSON: send {\"query\": ..., \"top_k\": ...}"}
    if not isinstance(payload, dict):
        return None, {"detail": "body must be a JSON object {\"query\": ..., \"top_k\": ...}"}
    try:
        return SearchBody.model_validate(payload), None
    except ValidationError as exc:
        errors = [_describe(e) for e in exc.errors()]
        return None, {"detail": errors[0], "errors": errors}


def _describe(err: Any) -> str:
    where = ".".join(str(p) for p in err["loc"]) or "body"
    msg = err["msg"].removeprefix("Value error, ")
    if err["type"] not in ("value_error", "missing"):
        msg += f" (got {err.get('input')!r})"
    return f"{where}: {msg}"


def _to_request(body: SearchBody) -> Any:
    from .search import SearchRequest

    return SearchRequest(**body.model_dump())
