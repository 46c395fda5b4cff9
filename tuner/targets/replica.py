"""`Replica`: where replica N of a worker keeps its own copy of the backend's config and
its state (the base of a docker target's `ComposeReplica`, tuner.targets.compose_replica;
built by `replica_of`, tuner.targets.replicas)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

Note = Callable[[str], None]


@dataclass
class Replica:
    """Where replica N keeps its own copy of the backend's config and its state."""

    index: int
    config_files: list[Path]
    state_dir: Path

    @property
    def pid_file(self) -> Path:
        # Not backend.pid: that is the process target's own record (tuner.targets.leftovers),
        # which the next start reads to end a backend a killed run left.
        return self.state_dir / "worker-backend.pid"

    def up(self, note: Note = lambda text: None) -> None:
        """Bring up what this replica runs on before its first trial (nothing for a
        process target: the target starts the backend itself)."""

    def down(self) -> None:
        """Take down what ``up`` brought up."""
