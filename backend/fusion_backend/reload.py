"""What the routes serve, and swapping it for a new config without a restart.

``ServiceState.current`` is one immutable :class:`Served` snapshot: config, searcher,
index and fingerprints. A request reads it once and finishes on it, whatever a reload
does meanwhile. :meth:`ServiceState.reload` (``POST /admin/reload``, SIGHUP) re-reads
the config file the server was started with (same ``--host`` / ``--port`` overrides),
validates it with the loader, and swaps in a new snapshot with one assignment:

- keys that only change how retrieved candidates are combined and gated (``fusion.*``,
  ``confidence.*``, ``citation.*``, ``fallback.*``, ``recency.*``, a source's ``depth``
  and ``min_similarity``, the dense source's ``enabled``, a disabled source's settings)
  get a new ``Searcher`` over the same index objects;
- a change of anything ``index.index_signature`` covers (``data.*``, the dense
  source's name, ``embedder`` and (LSA) ``dims``, an enabled BM25 source's name, ``k1``
  and ``b``, which BM25 and run sources are enabled, a run file, the corpus or a run
  file rewritten on disk) loads a new index first, from the on-disk cache when it has
  the components, exactly as a fresh start would;
- ``server.host`` / ``server.port`` cannot change live (the socket is bound): 409.

Reloads are serialised by a lock (a second one waits). A refused reload leaves the old
snapshot served. ``config_fingerprint`` is the sha256 of the config file bytes parsed.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .config import Config, RunSource, config_from_json, read_config
from .errors import BackendError, ConfigError, CorpusError

if TYPE_CHECKING:
    from .index import SearchIndex
    from .search import Searcher

log = logging.getLogger("fusion_backend")

_KEPT = "the previous config stays in effect"


@dataclass(frozen=True)
class ConfigSource:
    """The config file the server was started with, its command-line overrides, and the
    config store (``serve --config-store``) where ``PUT /admin/config`` keeps its document."""

    path: Path
    host: str | None = None
    port: int | None = None
    store: Path | None = None

    def read(self) -> tuple[Config, str]:
        """Validated config and the sha256 of the bytes parsed; ``ConfigError`` if bad.
        A config store that exists is the whole config: config.yaml is then not read."""
        if self.store is not None and self.store.exists():
            return self._read_store(self.store)
        return read_config(self.path, host=self.host, port=self.port)

    def from_document(self, doc: Any) -> Config:
        """A PUT document, validated as the config file would be (same --host/--port
        overrides; relative paths resolve against config.yaml's directory)."""
        return config_from_json(doc, "PUT /admin/config", self.path.parent, host=self.host, port=self.port)

    def _read_store(self, store: Path) -> tuple[Config, str]:
        try:
            data = store.read_bytes()
            doc = json.loads(data)
        except OSError as exc:
            raise ConfigError(f"{store}: cannot read the config store: {exc.strerror}") from exc
        except ValueError as exc:
            raise ConfigError(
                f"{store}: the config store is not valid JSON ({exc}); fix it, or delete it to serve {self.path}"
            ) from exc
        cfg = config_from_json(doc, str(store), self.path.parent, host=self.host, port=self.port)
        return cfg, hashlib.sha256(data).hexdigest()


def document_bytes(cfg: Config) -> bytes:
    """The JSON a PUT config is stored as (and fingerprinted by, stored or not)."""
    return (json.dumps(cfg.to_json(), indent=2, sort_keys=True) + "\n").encode()


def write_atomically(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` so a reader (or a crash) sees the old file or the new
    one, never a part: a temporary file in the same directory, fsync, rename."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as out:
            out.write(data)
            out.flush()
            os.fsync(out.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


@dataclass(frozen=True)
class Served:
    """Everything one request needs, never mutated: a reload builds a new one."""

    cfg: Config
    config_hash: str
    config_fingerprint: str
    index: SearchIndex
    index_signature: str
    data_fingerprint: str
    searcher: Searcher


class ReloadRefused(Exception):
    """A reload that was not applied: HTTP status and a one-line reason with the fix."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(" ".join(message.split()))
        self.status = status


class ServiceState:
    """What the routes read; ``current`` appears once the loader thread finishes."""

    def __init__(self, source: ConfigSource, cfg: Config, config_fingerprint: str) -> None:
        self.source = source
        self._start = (cfg, config_fingerprint)
        self.current: Served | None = None
        self.error: str | None = None
        self.reloads = 0  # successful reloads
        self._lock = threading.Lock()

    @property
    def cfg(self) -> Config:
        """The config served (the start-up config while the index loads)."""
        served = self.current
        return served.cfg if served is not None else self._start[0]

    def load(self) -> None:
        served, _ = build_served(*self._start, previous=None)
        self.current = served
        index = served.index
        log.info(
            "ready: %d documents in %.2f s (cache hits: %s)",
            len(index.docs),
            index.load_seconds,
            ", ".join(f"{k}={v}" for k, v in index.cache_hits.items()),
        )

    def start_loading(self, on_failure: Callable[[], None]) -> None:
        def run() -> None:
            try:
                self.load()
            except BackendError as exc:
                self.error = str(exc)
            except Exception as exc:  # a crash must still stop the server
                log.exception("index load crashed")
                self.error = f"index load crashed: {type(exc).__name__}: {exc}"
            if self.error is not None:
                on_failure()

        threading.Thread(target=run, name="index-loader", daemon=True).start()

    def reload(self) -> dict[str, Any]:
        """Re-read and apply the config file; the JSON answer, or ``ReloadRefused``.
        Blocks while another reload runs and for the duration of an index load."""
        with self._lock:
            return self._reload()

    def reload_logged(self, trigger: str) -> tuple[int, dict[str, Any]]:
        """``reload`` as ``(HTTP status, JSON body)``, its outcome logged as one line;
        never raises (the SIGHUP handler and the route call it)."""
        try:
            answer = self.reload()
        except ReloadRefused as exc:
            log.warning("reload (%s) refused [%d]: %s", trigger, exc.status, exc)
            return exc.status, {"error": str(exc)}
        except Exception as exc:  # a bad reload must never take the server down
            log.exception("reload (%s) crashed; %s", trigger, _KEPT)
            return 500, {"error": f"reload crashed: {type(exc).__name__}: {exc} ({_KEPT}; see the service log)"}
        log.info(
            "reload (%s): serving config %s; changed: %s; index rebuilt: %s; %.3f s",
            trigger,
            answer["config_fingerprint"][:12],
            ", ".join(answer["changed"]) or "nothing",
            "yes" if answer["index_rebuilt"] else "no",
            answer["seconds"],
        )
        return 200, answer

    def put_config_logged(self, doc: Any, if_match: str | None) -> tuple[int, dict[str, Any]]:
        """``put_config`` as ``(HTTP status, JSON body)`` (a refusal: ``{"detail": ...}``),
        its outcome logged as one line; never raises."""
        try:
            answer = self.put_config(doc, if_match)
        except ReloadRefused as exc:
            log.warning("PUT /admin/config refused [%d]: %s", exc.status, exc)
            return exc.status, {"detail": str(exc)}
        except Exception as exc:
            log.exception("PUT /admin/config crashed; %s", _KEPT)
            return 500, {"detail": f"PUT /admin/config crashed: {type(exc).__name__}: {exc} ({_KEPT}; see the log)"}
        log.info(
            "PUT /admin/config: serving config %s; changed: %s; index rebuilt: %s; stored: %s",
            answer["config_hash"][:12],
            ", ".join(answer["changed"]) or "nothing",
            "yes" if answer["index_rebuilt"] else "no",
            "yes" if answer["stored"] else "no (until restart or reload)",
        )
        return 200, answer

    def _reload(self) -> dict[str, Any]:
        started = time.perf_counter()
        old = self._served_or_refuse("reload")
        try:
            cfg, fingerprint = self.source.read()
        except ConfigError as exc:
            raise ReloadRefused(400, f"config not reloaded: {exc}; fix the file and reload again ({_KEPT})") from exc
        served, rebuilt = self._build(old, cfg, fingerprint, "reloaded", "reload")
        self.current = served  # the swap: one reference assignment
        self.reloads += 1
        return {
            "status": "reloaded",
            "config_fingerprint": fingerprint,
            "index_rebuilt": rebuilt,
            "changed": changed_keys(old.cfg.to_json(), cfg.to_json()),
            "seconds": round(time.perf_counter() - started, 4),
        }

    def put_config(self, doc: Any, if_match: str | None) -> dict[str, Any]:
        """Serve the JSON config ``doc`` (``PUT /admin/config``) as a reload would: same
        validation, same index reuse or rebuild, the same one-assignment swap; with a
        config store, the document is written there (atomically) before the swap.
        ``ReloadRefused`` (422 invalid, 412 If-Match, 409 server, 400 index) leaves
        everything as it was."""
        with self._lock:
            started = time.perf_counter()
            old = self._served_or_refuse("PUT")
            if if_match is not None and not etag_matches(if_match, old.config_hash):
                raise ReloadRefused(
                    412,
                    f'If-Match {if_match} is not the served config\'s ETag (now "{old.config_hash}"): '
                    f"the config changed since you read it; GET /admin/config again and reapply your change ({_KEPT})",
                )
            try:
                cfg = self.source.from_document(doc)
            except ConfigError as exc:
                raise ReloadRefused(422, f"config not applied: {exc} ({_KEPT})") from exc
            data = document_bytes(cfg)
            served, rebuilt = self._build(old, cfg, hashlib.sha256(data).hexdigest(), "applied", "PUT")
            store = self.source.store
            if store is not None:
                try:
                    write_atomically(store, data)
                except OSError as exc:
                    raise ReloadRefused(
                        500, f"config not applied: cannot write the config store {store}: {exc.strerror} ({_KEPT})"
                    ) from exc
            self.current = served
            self.reloads += 1
            return {
                "config_hash": served.config_hash,
                "changed": changed_keys(old.cfg.to_json(), cfg.to_json()),
                "index_rebuilt": rebuilt,
                "stored": store is not None,
                "config_fingerprint": served.config_fingerprint,
                "seconds": round(time.perf_counter() - started, 4),
            }

    def _served_or_refuse(self, what: str) -> Served:
        old = self.current
        if old is not None:
            return old
        if self.error is not None:
            raise ReloadRefused(
                503,
                f"the initial index load failed ({self.error}); the server is stopping: "
                "fix it and start the service again",
            )
        raise ReloadRefused(503, f"the index is still loading: retry the {what} when GET /health answers 200")

    def _build(self, old: Served, cfg: Config, fingerprint: str, done: str, again: str) -> tuple[Served, bool]:
        """The snapshot for ``cfg`` (not yet swapped in), or ``ReloadRefused``."""
        moved = [k for k in ("host", "port") if getattr(cfg.server, k) != getattr(old.cfg.server, k)]
        if moved:
            keys = ", ".join(f"server.{k}" for k in moved)
            was = ", ".join(f"{getattr(old.cfg.server, k)} -> {getattr(cfg.server, k)}" for k in moved)
            back = ", ".join(f"server.{k} back to {getattr(old.cfg.server, k)}" for k in moved)
            raise ReloadRefused(
                409,
                f"restart needed: {keys} changed ({was}); restart the service to apply it, "
                f"or set {back} to {again} the other keys ({_KEPT})",
            )
        try:
            return build_served(cfg, fingerprint, previous=old)
        except BackendError as exc:
            raise ReloadRefused(
                400,
                f"config not {done}: its index could not be loaded: {exc}; fix the data or "
                f"the config and {again} again ({_KEPT})",
            ) from exc
        except Exception as exc:
            log.exception("index load for a %s crashed", again)
            raise ReloadRefused(
                500,
                f"config not {done}: index load crashed: {type(exc).__name__}: {exc} ({_KEPT}; see the service log)",
            ) from exc


def etag_matches(if_match: str, config_hash: str) -> bool:
    """RFC 9110 If-Match: ``*`` or a list of (strong or weak, quoted or bare) tags."""
    tags = [t.strip().removeprefix("W/").strip('"') for t in if_match.split(",")]
    return "*" in tags or config_hash in tags


def build_served(cfg: Config, config_fingerprint: str, *, previous: Served | None) -> tuple[Served, bool]:
    """The snapshot for ``cfg``; reuses ``previous``'s index when its signature is the
    same. Returns ``(served, index_rebuilt)``; raises BackendError when loading fails."""
    from .index import index_signature, load_index
    from .search import Searcher

    signature = index_signature(cfg)  # before loading: a file written meanwhile reloads next time
    if previous is not None and previous.index_signature == signature:
        index, data_fp, rebuilt = previous.index, previous.data_fingerprint, False
    else:
        index = load_index(cfg)
        data_fp, rebuilt = data_fingerprint(cfg, index.docs.content_hash), True
    searcher = Searcher(index, cfg)
    return Served(cfg, cfg.hash(), config_fingerprint, index, signature, data_fp, searcher), rebuilt


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


def changed_keys(old: Any, new: Any, prefix: str = "") -> list[str]:
    """Dotted keys whose values differ (a key present on one side only is named once)."""
    if not (isinstance(old, dict) and isinstance(new, dict)):
        return [prefix] if old != new else []
    out: list[str] = []
    for key in sorted(set(old) | set(new)):
        dotted = f"{prefix}.{key}" if prefix else str(key)
        if key in old and key in new:
            out.extend(changed_keys(old[key], new[key], dotted))
        else:
            out.append(dotted)
    return out
