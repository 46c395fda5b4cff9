"""Loopback ports for ``port: auto`` (and each replica's port): picked outside the
kernel's ephemeral range.

A backend restarted between trials leaves its port free for a moment. A port from the
ephemeral range (what ``bind(("", 0))`` hands out) is also what the kernel gives every
outgoing connection as its source port: on a busy machine a database or HTTP client
connection took a restarted backend's port, the backend could no longer bind it, and
every later restart of the run failed the same way (the trials failed, then the
failure budget ended the run). Ports below the ephemeral range are never handed out
implicitly, so only a process that asks for that very number can take one.
"""

from __future__ import annotations

import random
import socket
from pathlib import Path

#: Linux's ephemeral range; elsewhere IANA's dynamic range (macOS, Windows) is assumed
EPHEMERAL_RANGE_FILE = Path("/proc/sys/net/ipv4/ip_local_port_range")
IANA_DYNAMIC = (49152, 65535)
#: the lowest port picked: below it sit the usual fixed ports of services (PostgreSQL
#: 5432, MLflow 5000, 8080, ...)
LOWEST = 10000
MIN_CHOICE = 1000  # fewer candidate ports than this: leave the pick to the kernel
ATTEMPTS = 64


def ephemeral_range(path: Path = EPHEMERAL_RANGE_FILE) -> tuple[int, int]:
    try:
        low, high = (int(x) for x in path.read_text().split())
    except (OSError, ValueError):
        return IANA_DYNAMIC
    return low, high


def auto_range(path: Path = EPHEMERAL_RANGE_FILE) -> range | None:
    """The ports ``free_port`` picks from: below the ephemeral range, else above it;
    None when neither side leaves room."""
    low, high = ephemeral_range(path)
    if low - LOWEST >= MIN_CHOICE:
        return range(LOWEST, low)
    if 65535 - high >= MIN_CHOICE:
        return range(high + 1, 65536)
    return None


def bindable(port: int, host: str = "127.0.0.1") -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


def free_port(host: str = "127.0.0.1", *, path: Path = EPHEMERAL_RANGE_FILE, rng: random.Random | None = None) -> int:
    """A loopback port that was free a moment ago (the backend binds it next), outside
    the ephemeral range (module doc); the kernel's pick when no such port is free."""
    candidates = auto_range(path)
    if candidates is not None:
        pick = rng or random.SystemRandom()
        for _ in range(ATTEMPTS):
            port = pick.choice(candidates)
            if bindable(port, host):
                return port
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])
