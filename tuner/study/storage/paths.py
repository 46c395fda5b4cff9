"""Where a study keeps its files under the experiment's state dir (trial folders, the
Optuna artifact store, the result cache)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class StudyPaths:
    """Where a study keeps its files under the experiment's state dir."""

    state_dir: Path
    study_name: str

    @property
    def trials_dir(self) -> Path:
        return self.state_dir / "trials" / _safe(self.study_name)

    @property
    def artifact_dir(self) -> Path:
        # One store for all studies: optuna-dashboard takes a single --artifact-dir.
        return self.state_dir / "optuna-artifacts"

    @property
    def cache_path(self) -> Path:
        return self.state_dir / "result-cache.sqlite"


def _safe(name: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in name)
