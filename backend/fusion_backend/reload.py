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

import hashlib
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .config import Config, RunSource, read_config
from .errors import BackendError, ConfigError, CorpusError

if TYPE_CHECKING:
    from .index import SearchIndex
    from .search import Searcher

log = logging.getLogger("fusion_backend")

_KEPT = "the previous config stays in effect"


@dataclass(frozen=True)
class ConfigSource:
    """The config file the server was started with, and its command-line overrides."""

    path: Path
    host: str | None = None
    port: int | None = None

    def read(self) -> tuple[Config, str]:
        """Validated config and the sha256 of the bytes parsed; ``ConfigError`` if bad."""
        return read_config(self.path, host=self.host, port=self.port)


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

    def _reload(self) -> dict[str, Any]:
        started = time.perf_counter()
        old = self.current
        if old is None:
            if self.error is not None:
                raise ReloadRefused(
                    503,
                    f"the initial index load failed ({self.error}); the server is stopping: "
                    "fix it and start the service again",
                )
            raise ReloadRefused(503, "the index is still loading: retry the reload when GET /health answers 200")
        try:
            cfg, fingerprint = self.source.read()
        except ConfigError as exc:
            raise ReloadRefused(400, f"config not reloaded: {exc}; fix the file and reload again ({_KEPT})") from exc
        moved = [k for k in ("host", "port") if getattr(cfg.server, k) != getattr(old.cfg.server, k)]
        if moved:
            keys = ", ".join(f"server.{k}" for k in moved)
            was = ", ".join(f"{getattr(old.cfg.server, k)} -> {getattr(cfg.server, k)}" for k in moved)
            back = ", ".join(f"server.{k} back to {getattr(old.cfg.server, k)}" for k in moved)
            raise ReloadRefused(
                409,
                f"restart needed: {keys} changed ({was}); restart the service to apply it, "
                f"or set {back} to reload the other keys ({_KEPT})",
            )
        try:
            served, rebuilt = build_served(cfg, fingerprint, previous=old)
        except BackendError as exc:
            raise ReloadRefused(
                400,
                f"config not reloaded: its index could not be loaded: {exc}; fix the data or "
                f"the config and reload again ({_KEPT})",
            ) from exc
        except Exception as exc:
            log.exception("index load for a reload crashed")
            raise ReloadRefused(
                500,
                f"config not reloaded: index load crashed: {type(exc).__name__}: {exc} ({_KEPT}; see the service log)",
            ) from exc
        self.current = served  # the swap: one reference assignment
        self.reloads += 1
        return {
            "status": "reloaded",
            "config_fingerprint": fingerprint,
            "index_rebuilt": rebuilt,
            "changed": changed_keys(old.cfg.to_json(), cfg.to_json()),
            "seconds": round(time.perf_counter() - started, 4),
        }


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
