"""A fixed extra CPU cost per search, for benchmarks only.

``FUSION_BACKEND_BENCH_CPU_MS=<ms>`` in the backend's environment makes every search
(``POST /search`` and the Azure-shaped route) spend that many milliseconds of CPU
(its thread's CPU time, ``time.thread_time``) on real work -- sha256 over a 16 KiB
buffer, again and again -- before it answers. The answer does not change.

Why: the reference backend spends about 1 ms of CPU on a demo query; the engines
people tune often spend several. ``bench/trial_overhead.py --backend-cost`` runs the
same study with this set to see how the tuner's CPU per trial compares with an
engine's at each cost. hashlib releases the GIL on a buffer this size, so searches
in the thread pool burn in parallel, as a native engine's would. Unset, empty or 0
in every real use: nothing is spent.
"""

from __future__ import annotations

import hashlib
import os
import time
from collections.abc import Callable
from typing import TypeVar

from .errors import ConfigError

T = TypeVar("T")

BENCH_CPU_ENV = "FUSION_BACKEND_BENCH_CPU_MS"

_BLOCK = bytes(range(256)) * 64  # 16 KiB: ~20-40 us of sha256, so the cost lands within a few percent


def cpu_ms_from_env() -> float:
    """The extra CPU milliseconds per search the environment asks for (0: none).
    A value that is not a number >= 0 stops the start (ConfigError, exit code 2)."""
    raw = os.environ.get(BENCH_CPU_ENV, "").strip()
    if not raw:
        return 0.0
    try:
        ms = float(raw)
    except ValueError:
        ms = -1.0
    if not ms >= 0 or ms == float("inf"):
        raise ConfigError(f"{BENCH_CPU_ENV}={raw!r} is not a number of milliseconds >= 0: unset it, or set e.g. 2.5")
    return ms


def burn(ms: float) -> int:
    """Spend ``ms`` milliseconds of this thread's CPU time hashing; returns the rounds done."""
    if ms <= 0:
        return 0
    end = time.thread_time() + ms / 1000.0
    h = hashlib.sha256()
    rounds = 0
    while time.thread_time() < end:
        h.update(_BLOCK)
        rounds += 1
    return rounds


def costed(fn: Callable[..., T], ms: float) -> Callable[..., T]:
    """``fn``, or ``fn`` followed by ``burn(ms)`` in the same (worker) thread when ``ms > 0``."""
    if ms <= 0:
        return fn

    def run(*args: object) -> T:
        out = fn(*args)
        burn(ms)
        return out

    return run
