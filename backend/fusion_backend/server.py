"""Running the app under uvicorn; returns the process exit code."""

from __future__ import annotations

from .app import ServiceState, create_app
from .config import Config
from .errors import LoadError


def serve(cfg: Config, *, access_log: bool = False, log_level: str = "warning") -> int:
    """Serve until SIGTERM/SIGINT (exit 0) or a failed index load (exit 1)."""
    import uvicorn

    state = ServiceState(cfg)
    holder: list[uvicorn.Server] = []

    def stop() -> None:
        holder[0].should_exit = True

    app = create_app(state, on_load_failure=stop)
    server = uvicorn.Server(uvicorn.Config(
        app, host=cfg.server.host, port=cfg.server.port, lifespan="on", log_level=log_level,
        access_log=access_log, server_header=False, timeout_graceful_shutdown=5,
    ))
    holder.append(server)
    server.run()
    if state.error is not None:
        raise LoadError(state.error)
    return 0

