"""What the two UIs of a study run as, and the commands that open them: optuna-dashboard
on the study storage (with the Optuna artifact store), served by `tuner optuna-dashboard`
so it lists every param under its config key (tuner.ops.dashboard_server), and the
MLflow tracking server on the tracking store.

    ui_specs(experiment, *, optuna_port=8081, mlflow_port=5000, host="127.0.0.1") -> list[UiSpec]
    dashboard_commands(experiment) -> {"optuna": ..., "mlflow": ..., "both": ...}  # to print

All of it is pure (argv, URLs, environment); `tuner.ops.dashboard_procs.Dashboards` runs
the specs. Only tuner/cli/ prints.

Store URLs reach the UIs as `ui_store` makes them: ``postgresql://`` names the installed
driver (tuner.study.storage.database.sqlalchemy_url; SQLAlchemy's default, psycopg 3, is often not
installed), and a PostgreSQL password moves from the URL into the UI's environment as
``PGPASSWORD``, which libpq (psycopg2 and psycopg alike) reads when the URL has none. A
process's command line is world-readable (``ps``, /proc/PID/cmdline), its environment
only to its owner; the printed commands (`dashboard_commands`) hold no password either.
"""

from __future__ import annotations

import shlex
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import unquote, urlsplit, urlunsplit

from tuner.dburl import redact, sqlalchemy_url
from tuner.errors import ConfigError, StudyError
from tuner.secrets import env_name_of, redact_text

if TYPE_CHECKING:
    from tuner.config.experiment import Experiment

DEFAULT_OPTUNA_PORT = 8081
DEFAULT_MLFLOW_PORT = 5000


@dataclass(frozen=True)
class UiSpec:
    """One UI process: how to start it and where it answers."""

    name: str
    argv: list[str]
    host: str
    port: int
    port_flag: str  # the `tuner dashboard` option that sets ``port``
    page: str = "/"  # what a person opens
    health_path: str = "/health"  # 200 once it serves
    env: dict[str, str] = field(default_factory=dict)

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}{self.page}"

    @property
    def health_url(self) -> str:
        return f"http://{self.host}:{self.port}{self.health_path}"


def console_script(name: str) -> str:
    """A console script of this environment (beside the interpreter), else from PATH.
    Printed commands use it too, so they run as pasted without activating the venv."""
    beside = Path(sys.executable).parent / name
    return str(beside) if beside.exists() else name


def ui_store(url: str) -> tuple[str, dict[str, str]]:
    """``(url, env)`` to start a UI on the store at ``url`` with: a PostgreSQL URL names
    its installed driver and loses its password to ``env["PGPASSWORD"]``; any other URL
    comes back as it is, with no environment."""
    scheme, sep, _ = url.partition("://")
    if not sep or scheme.split("+", 1)[0].lower() not in ("postgresql", "postgres"):
        return url, {}
    parts = urlsplit(sqlalchemy_url(url))
    if parts.password is None:
        return urlunsplit(parts), {}
    creds, _, host = parts.netloc.rpartition("@")
    user = creds.partition(":")[0]
    bare = urlunsplit(parts._replace(netloc=f"{user}@{host}" if user else host))
    return bare, {"PGPASSWORD": unquote(parts.password)}


def _shell_command(argv: Sequence[str], env: dict[str, str]) -> str:
    """``argv`` as a line to paste. A password in ``env`` is never printed: when it came
    from an environment variable of the experiment file (``${PG_PASSWORD}``) the line
    refers to that variable; else it relies on PGPASSWORD or ~/.pgpass being set up."""
    prefix = ""
    if "PGPASSWORD" in env:
        origin = env_name_of(env["PGPASSWORD"])
        prefix = f'PGPASSWORD="${origin}" ' if origin else ""
    return prefix + " ".join(shlex.quote(redact_text(a)) for a in argv)


def dashboard_commands(experiment: Any) -> dict[str, str]:
    """Shell commands that open the two UIs on this experiment's stores (printed by
    `tuner run` and `tuner demo`). They hold no password (see `ui_store`)."""
    from tuner.study.storage.paths import StudyPaths

    paths = StudyPaths(experiment.state_dir, experiment.study)
    storage, storage_env = _printable_store(experiment.storage)
    out = {
        "optuna": _shell_command(
            [console_script("tuner"), "optuna-dashboard", storage, "--artifact-dir", str(paths.artifact_dir)],
            storage_env,
        )
    }
    if experiment.tracking.enabled:
        uri, uri_env = _printable_store(experiment.tracking.mlflow_uri)
        out["mlflow"] = _shell_command([console_script("mlflow"), "ui", "--backend-store-uri", uri], uri_env)
    out["both"] = f"{console_script('tuner')} dashboard {shlex.quote(str(experiment.source))}"
    return out


def _printable_store(url: str) -> tuple[str, dict[str, str]]:
    """`ui_store`, except that a store whose driver is not installed here is still
    printed (redacted): the command may be meant for another machine."""
    try:
        return ui_store(url)
    except StudyError:
        return redact(url), {}


def ui_specs(
    experiment: Experiment,
    *,
    optuna_port: int = DEFAULT_OPTUNA_PORT,
    mlflow_port: int = DEFAULT_MLFLOW_PORT,
    host: str = "127.0.0.1",
) -> list[UiSpec]:
    """The UIs for ``experiment`` (a `tuner.config.experiment.Experiment`): optuna-dashboard
    always, MLflow when tracking is enabled."""
    from tuner.study.storage.paths import StudyPaths

    _require_storage(experiment.storage, experiment.source)
    storage, storage_env = ui_store(experiment.storage)
    artifact_dir = StudyPaths(experiment.state_dir, experiment.study).artifact_dir
    specs = [
        UiSpec(
            name="optuna-dashboard",
            # the tuner's own server: optuna-dashboard on the study as people see it
            # (params under their config keys; tuner.ops.dashboard_server)
            argv=[
                console_script("tuner"),
                "optuna-dashboard",
                storage,
                "--artifact-dir",
                str(artifact_dir),
                "--host",
                host,
                "--port",
                str(optuna_port),
            ],
            host=host,
            port=optuna_port,
            port_flag="--optuna-port",
            page="/dashboard/",
            health_path="/api/studies",
            env=storage_env,
        )
    ]
    if experiment.tracking.enabled:
        uri, uri_env = ui_store(experiment.tracking.store_uri)
        specs.append(
            UiSpec(
                name="mlflow",
                argv=[
                    console_script("mlflow"),
                    "server",
                    "--backend-store-uri",
                    uri,
                    "--host",
                    host,
                    "--port",
                    str(mlflow_port),
                    "--workers",
                    "1",
                ],
                host=host,
                port=mlflow_port,
                port_flag="--mlflow-port",
                # The job runner is a third process the UI does not need.
                env={"MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false", **uri_env},
            )
        )
    return specs


def _require_storage(storage: str, source: Path) -> None:
    prefix = "sqlite:///"
    if storage.startswith(prefix) and not Path(storage[len(prefix) :]).exists():
        raise ConfigError(f"{source}: no study storage at {storage[len(prefix) :]} yet; run `tuner run {source}` first")
