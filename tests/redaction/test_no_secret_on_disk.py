"""End to end: secrets planted through environment variables reach the backend and
nothing else.

One `tuner run` (the reference backend as a process, MLflow tracking on, the Optuna
study on PostgreSQL with its password from the environment) sends a bearer token, an
API key, a secret query parameter and a secret body field on every request. Afterwards
no byte of the project (state dir, mlruns/ with its SQLite database, the reports and
their Optuna artifact copies), of the printed output, or of the Optuna study's
attributes holds any of them or the storage password; `tuner dashboard` then serves the
PostgreSQL study without the password on a command line or in its output.
"""

from __future__ import annotations

import json
import os
import secrets as stdlib_secrets
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import optuna
import pytest
import sqlalchemy as sa
from support.demo_data import copy_demo_data
from support.reference_experiment import copy_backend_config, write_reference_experiment
from workers.conftest import pg_dsn  # noqa: F401  (the PostgreSQL the worker tests use)

from tuner.config.experiment import free_port
from tuner.dburl import sqlalchemy_url

pytestmark = [pytest.mark.slow, pytest.mark.integration]
optuna.logging.set_verbosity(optuna.logging.WARNING)

PYTHON = sys.executable
N_IN_SCOPE = 30  # a few queries keep a trial short; every OOS query is kept
PG_PASSWORD_VAR = "TUNER_TEST_PG_PASSWORD"


def planted_values() -> dict[str, str]:
    """Environment variable -> a value that cannot turn up by chance."""
    return {name: f"planted-{stdlib_secrets.token_hex(12)}"
            for name in ("TUNER_TEST_BEARER", "TUNER_TEST_API_KEY", "TUNER_TEST_QUERY_TOKEN", "TUNER_TEST_BODY_SECRET")}


def experiment_overrides(pg_url: sa.engine.URL, study: str) -> dict[str, Any]:
    storage = (f"postgresql://{pg_url.username}:${{{PG_PASSWORD_VAR}}}@{pg_url.host}:{pg_url.port or 5432}"
               f"/{pg_url.database}")
    return {
        "study": study,
        "project_root": ".",
        "state_dir": ".tuner",
        "storage": storage,
        "sampler": {"type": "random", "seed": 1},
        "evaluation": {"request": {
            "url": "http://127.0.0.1:{port}/search?access_token=${TUNER_TEST_QUERY_TOKEN}",
            "headers": {"Authorization": "Bearer ${TUNER_TEST_BEARER}", "X-Api-Key": "${TUNER_TEST_API_KEY}"},
            "body": {"query": "{query}", "top_k": "{top_k}", "client_secret": "${TUNER_TEST_BODY_SECRET}"},
        }},
        "tracking": {"enabled": True},
    }


def make_project(root: Path, data: Path, overrides: dict[str, Any]) -> Path:
    (root / "data").mkdir(parents=True)
    for name in ("queries.jsonl", "qrels.txt", "corpus.jsonl"):
        (root / "data" / name).write_bytes((data / name).read_bytes())
    copy_backend_config(root)
    return write_reference_experiment(root, n_trials=2, **overrides)


def files_holding(root: Path, needle: bytes) -> list[str]:
    """Every file below ``root`` whose bytes contain ``needle`` (databases, WAL files,
    artifacts, logs alike)."""
    out = []
    for path in root.rglob("*"):
        if path.is_file() and not path.is_symlink():
            try:
                if needle in path.read_bytes():
                    out.append(str(path.relative_to(root)))
            except OSError:
                continue
    return out


@pytest.fixture(scope="module")
def demo_data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    full = tmp_path_factory.mktemp("demo-full") / "data"
    copy_demo_data(full)
    rows = [json.loads(line) for line in (full / "queries.jsonl").read_text().splitlines() if line.strip()]
    kept = [r for r in rows if r["scope"] == "in"][:N_IN_SCOPE] + [r for r in rows if r["scope"] == "oos"]
    (full / "queries.jsonl").write_text("".join(json.dumps(r) + "\n" for r in kept))
    return full


@pytest.fixture(scope="module")
def secret_run(demo_data: Path, pg_dsn: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:  # noqa: F811
    pg_url = sa.engine.make_url(sqlalchemy_url(pg_dsn))
    assert pg_url.password, f"the test DSN {pg_url} has no password to keep secret"
    study = f"secrets-{uuid.uuid4().hex[:10]}"
    root = tmp_path_factory.mktemp("secret-project")
    exp_path = make_project(root, demo_data, experiment_overrides(pg_url, study))
    planted = planted_values()
    env = {**os.environ, **planted, PG_PASSWORD_VAR: pg_url.password, "COLUMNS": "200"}
    proc = subprocess.run([PYTHON, "-m", "tuner", "run", str(exp_path)], cwd=root, env=env,
                          capture_output=True, timeout=900)
    try:
        yield {"root": root, "exp_path": exp_path, "env": env, "planted": planted, "pg_url": pg_url,
               "study": study, "proc": proc}
    finally:
        try:
            optuna.delete_study(study_name=study, storage=sqlalchemy_url(pg_dsn))
        except KeyError:
            pass


def secrets_of(run: dict[str, Any]) -> dict[str, bytes]:
    """What must appear nowhere: each planted value, and the storage password in the
    only form it can be recognised in (``user:password@``; the test role's password is
    a common word)."""
    pg_url = run["pg_url"]
    out = {name: value.encode() for name, value in run["planted"].items()}
    out["storage password"] = f"{pg_url.username}:{pg_url.password}@".encode()
    return out


def test_the_run_completes_with_the_secrets_sent(secret_run: dict[str, Any]) -> None:
    proc = secret_run["proc"]
    assert proc.returncode == 0, f"tuner run failed:\n{proc.stdout.decode()[-3000:]}\n{proc.stderr.decode()[-3000:]}"
    reports = sorted((secret_run["root"] / ".tuner" / "trials").rglob("report.json"))
    assert reports, "no trial wrote a report"
    context = json.loads(reports[0].read_text())["context"]
    # The request carried every secret (the spec has them) and the report shows where, not what.
    assert context["spec"]["request"]["headers"] == {"Authorization": "***", "X-Api-Key": "***"}
    assert context["spec"]["request"]["body"]["client_secret"] == "***"
    assert context["url"].endswith("/search?access_token=***")


def test_no_planted_secret_under_the_project_or_in_the_output(secret_run: dict[str, Any]) -> None:
    root: Path = secret_run["root"]
    proc = secret_run["proc"]
    assert (root / ".tuner").is_dir() and (root / "mlruns" / "mlflow.db").is_file()
    found = {}
    for name, needle in secrets_of(secret_run).items():
        where = files_holding(root, needle)
        where += [stream for stream, data in (("stdout", proc.stdout), ("stderr", proc.stderr)) if needle in data]
        if where:
            found[name] = where
    assert found == {}


def test_no_planted_secret_in_the_optuna_study(secret_run: dict[str, Any], pg_dsn: str) -> None:  # noqa: F811
    study = optuna.load_study(study_name=secret_run["study"], storage=sqlalchemy_url(pg_dsn))
    trials = study.get_trials(deepcopy=False)
    assert trials
    system_attrs = study._storage.get_study_system_attrs(study._study_id)  # no public accessor in optuna 5
    dump = json.dumps({"study": [study.user_attrs, system_attrs],
                       "trials": [[t.params, t.user_attrs, t.system_attrs] for t in trials]}, default=str).encode()
    assert [name for name, needle in secrets_of(secret_run).items() if needle in dump] == []


def test_printed_dashboard_commands_name_the_variable_not_the_password(secret_run: dict[str, Any]) -> None:
    out = secret_run["proc"].stdout.decode()
    pg_url = secret_run["pg_url"]
    assert f"PGPASSWORD=\"${PG_PASSWORD_VAR}\"" in out
    assert f"postgresql+psycopg2://{pg_url.username}@{pg_url.host}" in out


def _descendants(pid: int) -> set[int]:
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                ppid = int(Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(entry))
    out: set[int] = set()
    todo = [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            if child not in out:
                out.add(child)
                todo.append(child)
    return out


def _cmdline(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""


def test_tuner_dashboard_serves_the_postgresql_study_without_printing_the_password(
        secret_run: dict[str, Any]) -> None:
    optuna_port, mlflow_port = free_port(), free_port()
    proc = subprocess.Popen(
        [PYTHON, "-m", "tuner", "dashboard", str(secret_run["exp_path"]), "--optuna-port", str(optuna_port),
         "--mlflow-port", str(mlflow_port), "--deadline", "180"],
        cwd=secret_run["root"], env=secret_run["env"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    output: list[bytes] = []
    try:
        assert proc.stdout is not None
        end = time.monotonic() + 240
        while not any(line.startswith(b"optuna-dashboard: http") for line in output):
            line = proc.stdout.readline()
            assert line, f"tuner dashboard ended early:\n{b''.join(output).decode()}"
            output.append(line)
            assert time.monotonic() < end, f"no URL printed:\n{b''.join(output).decode()}"
        studies = httpx.get(f"http://127.0.0.1:{optuna_port}/api/studies", timeout=30).json()
        assert secret_run["study"] in {s["study_name"] for s in studies["study_summaries"]}
        below = _descendants(proc.pid) | {proc.pid}
        cmdlines = [_cmdline(p) for p in below]
        assert any(b"optuna-dashboard" in c for c in cmdlines)
        needle = secrets_of(secret_run)["storage password"]
        assert [c for c in cmdlines if needle in c] == []
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            rest, _ = proc.communicate(timeout=120)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            rest, _ = proc.communicate()
        output.append(rest or b"")
    printed = b"".join(output)
    assert [name for name, needle in secrets_of(secret_run).items() if needle in printed] == []
    logs = secret_run["root"] / ".tuner" / "dashboard"
    assert [name for name, needle in secrets_of(secret_run).items() if files_holding(logs, needle)] == []
