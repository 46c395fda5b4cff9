"""optuna-dashboard on a study storage as people see it: params under config keys only.

optuna-dashboard reads a trial's params and distributions straight from the storage for
its trial table, its plots and its param importances. Served the storage itself it lists
the samplers' coordinates (``fusion.weights:bm25``) beside the config keys
(``fusion.weights.bm25``), with values that disagree. Served
`tuner.study.storage.user_view.UserView` instead it lists config keys only, while the
samplers, in the tuner's own processes, keep working on the storage itself.

    dashboard_app(storage_url, artifact_dir) -> WSGI app   # optuna-dashboard's own app
    listen(app, host=..., port=...).serve_forever()        # until interrupted

`tuner dashboard` runs it as ``tuner optuna-dashboard STORAGE --artifact-dir DIR``
(tuner.ops.dashboard_specs); only optuna-dashboard's public entry (``wsgi``) is used.
"""

from __future__ import annotations

from pathlib import Path
from socketserver import ThreadingMixIn
from typing import Any
from wsgiref.simple_server import WSGIServer, make_server


class _ThreadedWSGIServer(ThreadingMixIn, WSGIServer):
    """One thread per request, as optuna-dashboard's own wsgiref server (the page asks
    for several API answers at once)."""

    daemon_threads = True


def dashboard_app(storage_url: str, artifact_dir: Path | None = None) -> Any:
    """optuna-dashboard's WSGI app on a `UserView` of the RDB storage at ``storage_url``,
    with the Optuna artifact store in ``artifact_dir`` when given."""
    import optuna_dashboard
    from optuna.artifacts import FileSystemArtifactStore

    from tuner.dburl import redact
    from tuner.errors import StudyError
    from tuner.study.storage.database import rdb_storage
    from tuner.study.storage.user_view import UserView

    store = FileSystemArtifactStore(str(artifact_dir)) if artifact_dir is not None else None
    try:
        storage = rdb_storage(storage_url)
    except StudyError:
        raise
    except Exception as exc:  # sqlalchemy / driver errors: refused, bad credentials, bad URL
        raise StudyError(
            f"storage {redact(storage_url)}: cannot open it ({type(exc).__name__}: {exc})".splitlines()[0]
            + "; check the URL and that the database server runs"
        ) from exc
    return optuna_dashboard.wsgi(UserView(storage), artifact_store=store)


def listen(app: Any, *, host: str, port: int) -> WSGIServer:
    """A server of ``app`` (a `dashboard_app`) bound to ``host:port``; its ``serve_forever``
    serves until the process is interrupted. ConfigError when it cannot bind."""
    from tuner.errors import ConfigError

    try:
        return make_server(host, port, app, server_class=_ThreadedWSGIServer)
    except OSError as exc:  # the port in use, an address not on this machine
        raise ConfigError(
            f"optuna-dashboard cannot listen on {host}:{port} ({exc.strerror or exc}); pick another --port"
        ) from exc
