"""One BLAS thread per tuner process (``limit_blas_threads``).

numpy's OpenBLAS starts a thread per core and keeps each spinning for a while after
every matrix product. The tuner's products are small (a gate sweep's thresholds x
queries by queries x cuts), so the extra threads buy nothing, and they take the cores
that the backend, the tuner's helper processes and the next trial need. Measured on a
2-core VM (a fusion-replay grid, 294 settings): one helper process made the grid 1.7x
slower with OpenBLAS's default threads, and 1.9x faster with one thread per process;
in one process alone the grid took 12 % less time.

The CLI and the helper processes call it first thing; a BLAS thread count the user set
in the environment (``OPENBLAS_NUM_THREADS``, ``OMP_NUM_THREADS``, ``MKL_NUM_THREADS``)
is theirs and left alone.
"""

from __future__ import annotations

import os
import sys

_USER_SET = ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS")


def limit_blas_threads() -> bool:
    """Limit this process's BLAS libraries to one thread; False when the user set a count
    (or, numpy loaded already, no BLAS library is loaded to limit)."""
    if any(os.environ.get(name) for name in _USER_SET):
        return False
    if "numpy" not in sys.modules:
        # OpenBLAS reads its thread count once, when numpy loads it: the variable set around
        # that import limits it without threadpoolctl's scan of the process's libraries (a
        # tenth of a second of every command), and is removed again so that the backend and
        # the other processes the tuner starts keep their own default.
        os.environ["OPENBLAS_NUM_THREADS"] = "1"
        try:
            import numpy  # noqa: F401
        finally:
            del os.environ["OPENBLAS_NUM_THREADS"]
        return True
    from threadpoolctl import threadpool_info, threadpool_limits

    if not any(p.get("user_api") == "blas" for p in threadpool_info()):
        return False
    threadpool_limits(limits=1, user_api="blas")  # applied now, for the life of the process
    return True
