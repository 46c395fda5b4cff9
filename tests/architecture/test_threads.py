"""One BLAS thread per tuner process (tuner.threads), unless the user chose a count: checked
in fresh interpreters, since a limit lasts for the life of the process."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

PROBE = """
import json, os, sys
from tuner.threads import limit_blas_threads
limited = limit_blas_threads()
# the limit is this process's: the backend and other children the tuner starts keep their default
assert "OPENBLAS_NUM_THREADS" not in os.environ or os.environ["OPENBLAS_NUM_THREADS"] == "2", os.environ
assert "threadpoolctl" not in sys.modules  # numpy loaded by the limit itself: no scan of the libraries
from threadpoolctl import threadpool_info
print(json.dumps([limited, [p["num_threads"] for p in threadpool_info() if p["user_api"] == "blas"]]))
"""


def probe(**env: str) -> tuple[bool, list[int]]:
    clean = {k: v for k, v in os.environ.items() if k not in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS",
                                                               "MKL_NUM_THREADS")}
    out = subprocess.run([sys.executable, "-c", PROBE], env={**clean, **env}, capture_output=True, text=True,
                         check=True, timeout=120).stdout
    limited, threads = json.loads(out.strip().splitlines()[-1])
    return limited, threads


def test_a_tuner_process_keeps_one_blas_thread() -> None:
    limited, threads = probe()
    if not threads:
        pytest.skip("numpy here loads no BLAS library that threadpoolctl can see")
    assert limited and threads and set(threads) == {1}


def test_a_count_the_user_set_is_left_alone() -> None:
    limited, threads = probe(OPENBLAS_NUM_THREADS="2")
    assert not limited
    assert 1 not in threads or (os.cpu_count() or 1) < 2  # OpenBLAS took the user's 2


COMMAND = """
import json
from tuner.cli import main
try:
    main(["version"])
except SystemExit:
    pass
from threadpoolctl import threadpool_info
print(json.dumps([p["num_threads"] for p in threadpool_info() if p["user_api"] == "blas"]))
"""


def test_a_tuner_command_runs_with_one_blas_thread() -> None:
    """The CLI limits the threads before any command (not before `tuner --help`, which
    loads no numpy)."""
    clean = {k: v for k, v in os.environ.items() if k not in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS",
                                                               "MKL_NUM_THREADS")}
    out = subprocess.run([sys.executable, "-c", COMMAND], env=clean, capture_output=True, text=True, check=True,
                         timeout=120).stdout
    threads = json.loads(out.strip().splitlines()[-1])
    if not threads:
        pytest.skip("numpy here loads no BLAS library that threadpoolctl can see")
    assert set(threads) == {1}
