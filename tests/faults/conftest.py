"""The fault suite's collector and its summary: one line per fault class at the end of
the session, e.g. ``fault sigterm-runner: injected 2, survived 2, trials lost 0, configs
left patched 0, served other than the file 0`` (faultlib has the definitions). Each scenario asserts its own record,
so the suite fails when a fault class regresses; the summary says how badly.

test_sigkill_run.py (another suite's scenario, not changed here) is summarised as the
class ``sigkill-runner`` from the data its module fixture returns.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
from support.integration import need
from workers.conftest import fresh_pg_url, pg_dsn  # noqa: F401  (PostgreSQL for the worker scenarios)

from faults.faultlib import (
    Calibration,
    Damage,
    FaultLog,
    FaultRecord,
    judge,
    processes_naming,
    unrecorded_or_running,
    write_summary,
    write_worker_records,
)

CLASSES = (
    "sigkill-runner", "sigterm-runner", "sigkill-worker", "sigterm-worker", "backend-crash-mid-batch",
    "backend-never-healthy", "http-5xx-storm", "timeouts", "malformed-json", "mlflow-unavailable",
    "postgres-restart", "two-runs-one-study", "slow-drip", "oversized-response", "backend-killed-mid-batch",
    "apply-breaks-constraint", "drift-since-study", "every-trial-fails", "unwritable-config-tag",
    "config-owned-by-service-user", "planted-secret", "failed-label-import", "sigterm-preflight",
    "disk-full", "sigkill-apply", "sigkill-runner-served", "sigkill-docker-runner-served", "sigkill-runner-mlflow",
    "sigkill-runner-http", "http-put-refused", "http-readback-differs", "two-runs-one-url",
    "sigterm-parallel", "sigkill-parallel",
)
_LOG = pytest.StashKey[FaultLog]()
_SIGKILL_RUNS = pytest.StashKey[dict[str, dict[str, Any]]]()
_SIGKILL_FIXTURE = "killed_then_resumed"
FAULT_RECORDS_ENV = "TUNER_TEST_FAULT_RECORDS"  # made by tests/conftest.py for an xdist run


def pytest_configure(config: pytest.Config) -> None:
    config.stash[_LOG] = FaultLog()
    config.stash[_SIGKILL_RUNS] = {}


@pytest.fixture(autouse=True)
def _linux_proc() -> None:
    need(os.path.isdir("/proc"), "the fault suite finds the processes a fault left in /proc (Linux)")


@pytest.fixture(scope="session")
def fault_log(pytestconfig: pytest.Config) -> FaultLog:
    return pytestconfig.stash[_LOG]


@pytest.fixture(scope="session")
def calibration(tmp_path_factory: pytest.TempPathFactory) -> Calibration:
    return Calibration(tmp_path_factory.mktemp("calibration"))


@pytest.fixture
def pg_storage(fresh_pg_url: Any) -> tuple[str, str]:  # noqa: F811
    """(storage URL, application name) of a fresh, empty PostgreSQL place. Every
    connection the tuner opens on it carries the application name, so a test can end
    exactly those (faultlib.terminate_connections) and no other test's."""
    import uuid

    import sqlalchemy as sa

    url, _kind = fresh_pg_url()
    app = f"tuner-faults-{uuid.uuid4().hex[:10]}"
    return sa.engine.make_url(url).update_query_dict({"application_name": app}).render_as_string(
        hide_password=False), app


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Any:
    report = yield
    run = getattr(item, "funcargs", {}).get(_SIGKILL_FIXTURE)
    if isinstance(run, dict) and "shape" in run:
        seen = item.config.stash[_SIGKILL_RUNS].setdefault(run["shape"], {"run": run, "failed": []})
        if report.failed or (report.when == "call" and report.skipped):
            seen["failed"].append(f"{item.name} ({report.when}): {report.outcome}")
    return report


def _sigkill_runner_record(run: dict[str, Any], failed: list[str]) -> FaultRecord:
    """The sigkill-runner scenario of test_sigkill_run.py, measured like every other class."""
    import optuna

    # The reference backend's scores are no known function of the params: a value measured
    # on another config is that suite's own check (distinct params score differently).
    trials = optuna.load_study(study_name=run["exp"].study, storage=run["exp"].storage).get_trials()
    damage = Damage(lost=unrecorded_or_running(trials), orphans=processes_naming(str(run["root"])),
                    patched=[str(run["config"])] if run["config"].read_bytes() != run["original"] else [])
    return judge("sigkill-runner", damage, {f"test passed: {f}": False for f in failed})


def _finished_log(config: pytest.Config) -> FaultLog | None:
    """The session's log with the sigkill-runner records added (once)."""
    log = config.stash.get(_LOG, None)
    if log is None:
        return None
    runs = config.stash.get(_SIGKILL_RUNS, {})
    for shape, seen in sorted(runs.items()):
        try:
            log.add(_sigkill_runner_record(seen["run"], seen["failed"]))
        except (KeyError, AttributeError, OSError) as exc:  # that suite changed its fixture's shape
            log.add(FaultRecord("sigkill-runner", injected=1, problems=[f"{shape}: unreadable ({exc!r})"]))
    runs.clear()
    return log


def pytest_sessionfinish(session: pytest.Session) -> None:
    # An xdist worker prints nothing: its records go to the controller, whose summary
    # (tests/conftest.py) merges every worker's.
    config = session.config
    folder = os.environ.get(FAULT_RECORDS_ENV)
    if hasattr(config, "workerinput") and folder:
        log = _finished_log(config)
        if log is not None and log.records:
            write_worker_records(Path(folder), config.workerinput["workerid"], log, CLASSES)


def pytest_terminal_summary(terminalreporter: Any, exitstatus: int, config: pytest.Config) -> None:
    log = _finished_log(config)
    if log is not None:
        write_summary(terminalreporter, log, CLASSES)

