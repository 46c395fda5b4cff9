"""Shared test helpers.

Tests that need a service which may be missing on a user's machine (Docker engine,
PostgreSQL, Chromium, ../shared data) call ``need(condition, reason)``: it skips
with the reason, or fails when TUNER_REQUIRE_INTEGRATION=1 (CI sets it after
provisioning those services).

The fast tier: a test that uses one of ``INTEGRATION_FIXTURES`` (directly or through
another fixture) is marked ``integration`` at collection, so ``./dev test -m "not
integration"`` leaves out everything that needs Docker, PostgreSQL, Chromium or
../shared data. A new test that needs such a service asks for the fixture.

Parallel runs: ``./dev test`` runs pytest-xdist with ``--dist loadscope
--no-loadscope-reorder``: a module's tests run on one worker, so module fixtures (a study
run once, a compose stack) are made once and a new test file needs no mark. Modules are
handed out longest first by a previous run's durations (support/balance.py; refresh them
with ``./dev test --save-module-durations``). (Not ``loadgroup``: pytest-xdist 3.8 renames
node ids to group them, which pytest 9 ignores, so every test would be its own unit.)

Every reference backend the session starts (directly, through `tuner`, in any xdist
worker) shares one index cache through $FUSION_BACKEND_INDEX_CACHE, set here: the
cache is content-addressed, so the seeded demo corpus's dense index is built once per
run instead of once per test project. Set the variable yourself to keep the cache
between runs; a test about the cache itself uses the ``own_index_cache`` fixture. The
demo data set is generated once per run the same way ($TUNER_TEST_DEMO_DATA,
support/demo_data.py's ``copy_demo_data``).
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
from collections.abc import Iterator
from typing import Any
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))

from support.balance import DurationReport, load_durations, order_longest_first  # noqa: E402
from support.integration import DATASETS, SHARED, integration_required, need  # noqa: E402

__all__ = ["DATASETS", "SHARED", "integration_required", "need"]

INDEX_CACHE_ENV = "FUSION_BACKEND_INDEX_CACHE"  # fusion_backend.index.INDEX_CACHE_ENV
DEMO_DATA_ENV = "TUNER_TEST_DEMO_DATA"  # support.demo_data: the demo data set, generated once per run


# Where xdist workers leave the fault suite's records for the controller's summary
# (faults/conftest.py writes them, pytest_terminal_summary below merges them).
FAULT_RECORDS_ENV = "TUNER_TEST_FAULT_RECORDS"
_MADE_DIRS = pytest.StashKey[list[tuple[str, str]]]()

INTEGRATION_FIXTURES = frozenset({"docker_engine", "chromium_browser", "pg_dsn", "datasets_dir"})


def _is_worker(config: pytest.Config) -> bool:
    return hasattr(config, "workerinput")


def _distributed(config: pytest.Config) -> bool:
    return getattr(config.option, "dist", "no") != "no"


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("fusion-tuner")
    group.addoption("--module-durations", type=int, default=0, metavar="N",
                    help="print the N longest xdist units (modules) of this run and each worker's busy time")
    group.addoption("--save-module-durations", action="store_true",
                    help="write this run's seconds per unit to tests/support/module_durations.json "
                         "(the order ./dev test hands modules out in; after a full run)")


def _compile_sources(config: pytest.Config) -> None:
    """Byte-compile tuner/ and the backend once, by the first process of the run, when this
    environment has Python write no bytecode (PYTHONDONTWRITEBYTECODE, set on CI machines):
    else every `tuner` and backend process the tests start compiles the modules it imports
    from source again (about 0.1 s of CPU a `tuner run`, over a thousand processes a run).
    The files go where Python puts them (__pycache__, ignored by git); a later process
    reads them whatever the variable says."""
    if not sys.dont_write_bytecode or _is_worker(config):
        return
    import compileall

    for folder in (REPO / "tuner", REPO / "backend" / "fusion_backend"):
        compileall.compile_dir(folder, quiet=2)


def pytest_configure(config: pytest.Config) -> None:
    _compile_sources(config)
    top, save = config.getoption("module_durations", 0), config.getoption("save_module_durations", False)
    if (top or save) and not _is_worker(config):  # the controller sees every worker's reports
        config.pluginmanager.register(DurationReport(top=top, save=save), "fusion-tuner-durations")
    # The first process of the run (the xdist controller, or the only one) makes the
    # directories; xdist workers inherit the variables from it and every subprocess from them.
    config.stash[_MADE_DIRS] = []
    wanted = [(INDEX_CACHE_ENV, "fusion-tuner-test-index-cache-"), (DEMO_DATA_ENV, "fusion-tuner-test-demo-data-")]
    if _distributed(config) and not _is_worker(config):
        wanted.append((FAULT_RECORDS_ENV, "fusion-tuner-test-fault-records-"))
    for env, prefix in wanted:
        if not os.environ.get(env):
            made = tempfile.mkdtemp(prefix=prefix)
            os.environ[env] = made
            config.stash[_MADE_DIRS].append((env, made))


def pytest_unconfigure(config: pytest.Config) -> None:
    for env, made in config.stash.get(_MADE_DIRS, []):
        shutil.rmtree(made, ignore_errors=True)
        if os.environ.get(env) == made:
            del os.environ[env]


@pytest.hookimpl(tryfirst=True)  # before -m deselects
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if INTEGRATION_FIXTURES.intersection(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.integration)
    if _distributed(config):
        # Workers take the units in collection order (./dev passes --no-loadscope-reorder):
        # the longest first, so that short ones fill the end of the run instead of one
        # long module running alone after everything else.
        order_longest_first(items, load_durations())


def _cpu_now() -> float:
    """CPU seconds of this process and of the children it has waited for (a `tuner` or
    backend subprocess counts once it ended): what a test phase cost the machine."""
    t = os.times()
    return t.user + t.system + t.children_user + t.children_system


_LAST_PHASE_END = [_cpu_now()]  # CPU seconds at the end of this process's previous test phase


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Any:
    """Every report carries its phase's CPU seconds (user_properties, which xdist sends to
    the controller): --module-durations prints them beside the wall seconds."""
    report = yield
    now = _cpu_now()
    report.user_properties.append(("cpu_s", round(max(0.0, now - _LAST_PHASE_END[0]), 3)))
    _LAST_PHASE_END[0] = now
    return report


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter, exitstatus: int,
                            config: pytest.Config) -> None:
    """Under xdist: the fault suite's summary from every worker's records (without xdist
    faults/conftest.py prints it itself)."""
    folder = os.environ.get(FAULT_RECORDS_ENV)
    if _is_worker(config) or not folder or not any(Path(folder).glob("*.json")):
        return
    from faults.faultlib import read_worker_records, write_summary

    classes, log = read_worker_records(Path(folder))
    write_summary(terminalreporter, log, classes)


@pytest.fixture(scope="session")
def docker_engine() -> None:
    """A Docker engine, docker-compose and the base image (bash .ci/provision-10-docker.sh),
    or skip/fail with the reason: what every test that runs containers asks for."""
    sys.path.insert(0, str(REPO / "tests" / "docker"))
    from docker_stack import docker_unavailable

    reason = docker_unavailable()
    need(reason is None, reason or "")


@pytest.fixture(scope="session")
def chromium_browser() -> None:
    """Debian's headless chromium, its chromedriver and selenium (bash
    .ci/provision-20-chromium.sh), or skip/fail with the reason."""
    sys.path.insert(0, str(REPO / "tests" / "browser"))
    from browser_support import chromium_available

    reason = chromium_available()
    need(reason is None, reason or "")


@pytest.fixture
def own_index_cache(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """The backends this test starts (and ``load_index`` in it) use their config's
    ``data.index_cache``, not the session's shared cache: for tests of the cache itself."""
    monkeypatch.delenv(INDEX_CACHE_ENV, raising=False)
    yield


@pytest.fixture(scope="session")
def repo_root() -> Path:
    return REPO


@pytest.fixture(scope="session")
def datasets_dir() -> Path:
    """../shared/datasets, or skip/fail with a clear reason when absent."""
    need(DATASETS.is_dir(), f"shared datasets not found at {DATASETS} (set TUNER_SHARED_DIR)")
    return DATASETS


@pytest.fixture(scope="session")
def cran_inputs(datasets_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Cranfield as JSONL corpus + queries, TREC qrels and two TREC runs (support/cranfield_files.py)."""
    from support.cranfield_files import build_inputs

    return build_inputs(datasets_dir, tmp_path_factory.mktemp("cran-inputs"))


@pytest.fixture(scope="session")
def cran_bundle(cran_inputs: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    """The `files` import of ``cran_inputs``: (bundle dir, importer stdout). Copy it before changing it."""
    from support.cranfield_files import import_bundle

    return import_bundle(cran_inputs, tmp_path_factory.mktemp("cran-bundle") / "cran")
