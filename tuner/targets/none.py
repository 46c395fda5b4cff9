"""A backend that reloads its config by itself: the tuner only patches files.

``restart()`` just waits ``settle_s`` so a file watcher can notice the change before
the health wait starts; ``failure()`` is always None (nothing to watch die).
"""

from __future__ import annotations

import time

from tuner.targets.base import Target


class NoneTarget(Target):
    def __init__(self, settle_s: float = 0.0) -> None:
        self.settle_s = settle_s

    def start(self) -> None:
        return None

    def restart(self) -> None:
        if self.settle_s > 0:
            time.sleep(self.settle_s)

    def stop(self) -> None:
        return None

    def failure(self) -> str | None:
        return None
