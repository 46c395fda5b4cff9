"""optuna-dashboard on a study storage as people see it: params under config keys only.

optuna-dashboard reads a trial's params and distributions straight from the storage for
its trial table, its plots and its param importances. Served the storage itself it lists
the samplers' coordinates (``fusion.weights:bm25``) beside the config keys
(``fusion.weights.bm25``), with values that disagree. Served
`tuner.study.storage.user_view.UserView` instead it lists config keys only, while the
samplers, in the tuner's own processes, keep working on the storage itself.

The Best Trial card and badge name the best *feasible* trial: the view's
``get_best_trial`` serves it. On a study with no feasible trial the dashboard still asks
for a best trial whenever one is COMPLETE (and fails the study page if the storage
raises), so `feasible_best_only` drops an infeasible trial from the study page's
``best_trials`` answer: the card then reads "Best Trials" with nothing under it, no trial
carries the badge, and `tuner dashboard` says why when it starts.

    dashboard_app(storage_url, artifact_dir) -> WSGI app   # optuna-dashboard's own app
    listen(app, host=..., port=...).serve_forever()        # until interrupted

`tuner dashboard` runs it as ``tuner optuna-dashboard STORAGE --artifact-dir DIR``
(tuner.ops.dashboard_specs); only optuna-dashboard's public entry (``wsgi``) is used.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterable
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
    view = UserView(storage, display=True)  # numbers on its cards to 4 significant digits
    return feasible_best_only(optuna_dashboard.wsgi(view, artifact_store=store), view.is_feasible_trial)


# optuna-dashboard's study page answer (GET /api/studies/<id>, with an optional ?after=N):
# {"name", "trials": [...], "best_trials": [{"trial_id", ...}], ...}
_STUDY_DETAIL = re.compile(r"^/api/studies/\d+/?$")


def feasible_best_only(app: Any, is_feasible_trial: Callable[[int], bool]) -> Any:
    """``app`` (optuna-dashboard's WSGI app) with every trial that is not feasible left out
    of its study answers' ``best_trials``; every other answer passes as it is."""

    def filtered(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        if environ.get("REQUEST_METHOD") != "GET" or not _STUDY_DETAIL.match(environ.get("PATH_INFO", "")):
            return app(environ, start_response)
        answered: list[Any] = []

        def keep(status: str, headers: list[tuple[str, str]], exc_info: Any = None) -> Callable[[bytes], None]:
            answered[:] = [status, headers, exc_info]
            return lambda _chunk: None  # the legacy write(): optuna-dashboard's Bottle app returns its body

        result = app(environ, keep)
        try:
            body = b"".join(result)
        finally:
            getattr(result, "close", lambda: None)()
        status, headers, exc_info = answered
        ok = status.startswith("200") and not any(k.lower() == "content-encoding" for k, _ in headers)
        if ok:
            body = _drop_infeasible_best(body, is_feasible_trial)
            headers = [(k, v) for k, v in headers if k.lower() != "content-length"]
            headers.append(("Content-Length", str(len(body))))
        start_response(status, headers, exc_info)
        return [body]

    return filtered


def _drop_infeasible_best(body: bytes, is_feasible_trial: Callable[[int], bool]) -> bytes:
    try:
        detail = json.loads(body)
    except ValueError:
        return body
    best = detail.get("best_trials") if isinstance(detail, dict) else None
    if not best:
        return body
    kept = [t for t in best if is_feasible_trial(int(t["trial_id"]))]
    if len(kept) == len(best):
        return body
    detail["best_trials"] = kept
    return json.dumps(detail).encode()


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
