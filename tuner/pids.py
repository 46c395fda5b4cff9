"""Whether a process id names a live process on this machine: the one check the lock
holder record (tuner.study.storage.lock_holder) and the restore journal (tuner.config.journal)
make of the process that wrote them."""

from __future__ import annotations

import os


def pid_alive(pid: int) -> bool:
    """True while ``pid`` exists (another user's process included); a reused pid reads as alive."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
