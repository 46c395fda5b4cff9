"""The fast tier leaves out every test that needs a service: `-m "not integration"`
collects none of the tests that ask for ../shared data, PostgreSQL, Docker or Chromium
(tests/conftest.py marks them from the fixtures they use), and keeps the rest.

Checked in a fresh pytest over a few real modules, one per service, so a fixture that
stops marking its users (or a new way of asking for a service) fails here."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
# module -> a test in it that needs no service (None: every test needs one)
MODULES = {
    "tests/cli/test_score_cmd.py": "test_score_counts_a_query_missing_from_the_run_as_zero",  # ../shared data
    "tests/workers/test_start_race_pg.py": "test_processes_starting_together_on_a_new_sqlite_file_all_succeed",
    "tests/docker/test_docker_engine.py": None,  # Docker
    "tests/browser/test_dashboards_in_chromium.py": None,  # Chromium
}
NEEDS = {  # a test per module that needs its service
    "tests/cli/test_score_cmd.py": "test_score_reproduces_trec_eval_reference_values",
    "tests/workers/test_start_race_pg.py": "test_workers_starting_together_on_an_empty_postgresql_all_succeed",
    "tests/docker/test_docker_engine.py": "",
    "tests/browser/test_dashboards_in_chromium.py": "",
}


def collected(*args: str) -> list[str]:
    proc = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider",
                           "-p", "no:xdist", *args, *MODULES], cwd=REPO, capture_output=True, text=True,
                          timeout=600, env={**os.environ, "TUNER_REQUIRE_INTEGRATION": "0"})
    assert proc.returncode in (0, 5), proc.stdout[-3000:] + proc.stderr[-3000:]  # 5: nothing collected
    return [line for line in proc.stdout.splitlines() if "::" in line]


def test_not_integration_collects_no_test_that_needs_a_service() -> None:
    fast = collected("-m", "not integration")  # a module that fails to collect fails the call
    for module, needing in NEEDS.items():
        assert not [t for t in fast if needing and t.startswith(f"{module}::{needing}")]
    for module, free in MODULES.items():
        kept = [t for t in fast if t.startswith(module + "::")]
        if free is None:
            assert kept == [], f"{module}: every test needs a service, yet the fast tier kept {kept}"
        else:
            assert any(t.startswith(f"{module}::{free}") for t in kept), f"{module}: {free} left the fast tier"
