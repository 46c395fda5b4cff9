"""The names a trial's config files go by in its cache key, its snapshot and its
artifacts: relative to the project directory when below it (so a moved project keeps
its cache), else the path as given."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class ConfigNames:
    project_dir: Path | None = None

    def name(self, path: Path) -> str:
        p = Path(path)
        if self.project_dir is not None:
            try:
                return p.resolve().relative_to(self.project_dir.resolve()).as_posix()
            except ValueError:
                pass
        return p.as_posix()

    def texts(self, texts: Mapping[Path, str]) -> dict[str, str]:
        """``texts`` (path -> config text) keyed by name."""
        return {self.name(p): t for p, t in texts.items()}
