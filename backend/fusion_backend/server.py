"""Running the app under uvicorn; returns the process exit code."""

from __future__ import annotations

import signal
import threading

from .app import create_app
from .config import Config
from .errors import LoadError
from .reload import ConfigSource, ServiceState


def serve(
    source: ConfigSource, cfg: Config, config_fingerprint: str, *, access_log: bool = False, log_level: str = "warning"
) -> int:
    """Serve ``cfg`` (read from ``source``, whose bytes hash to ``config_fingerprint``)
    until SIGTERM/SIGINT (exit 0) or a failed index load (exit 1); SIGHUP reloads."""
    import uvicorn

    state = ServiceState(source, cfg, config_fingerprint)
    holder: list[uvicorn.Server] = []

    def stop() -> None:
        holder[0].should_exit = True

    app = create_app(state, on_load_failure=stop)
    server = uvicorn.Server(
        uvicorn.Config(
            app,
            host=cfg.server.host,
            port=cfg.server.port,
            lifespan="on",
            ws="none",  # no WebSocket route: skips importing a WebSocket stack at every start
            log_level=log_level,
            access_log=access_log,
            server_header=False,
            timeout_graceful_shutdown=5,
        )
    )
    holder.append(server)
    _reload_on_sighup(state)
    server.run()
    if state.error is not None:
        raise LoadError(state.error)
    return 0


def _reload_on_sighup(state: ServiceState) -> None:
    """SIGHUP -> ``state.reload_logged`` in a thread of its own: the handler returns at
    once, so the event loop keeps serving during an index rebuild. uvicorn leaves SIGHUP
    alone (it captures SIGINT and SIGTERM only). Python signal handlers can only be set
    in the main thread; elsewhere (an embedded server) SIGHUP keeps its default."""
    if threading.current_thread() is not threading.main_thread():
        return

    def on_sighup(signum: int, frame: object) -> None:
        threading.Thread(target=state.reload_logged, args=("SIGHUP",), name="sighup-reload", daemon=True).start()

    signal.signal(signal.SIGHUP, on_sighup)
