"""The one error the data importers and the demo generator raise on purpose.

Part of the backend's exception tree (the backend never imports the tuner); the
message convention is the same: one line saying where (``file:line``), what is
wrong, and how to fix it.
"""

from __future__ import annotations

from pathlib import Path

from ..errors import BackendError


class DataFormatError(BackendError):
    """An input file is malformed, or an option does not fit the data."""

    exit_code = 2

    @classmethod
    def at(cls, path: Path | str, line: int | None, problem: str, fix: str) -> DataFormatError:
        where = f"{path}:{line}" if line is not None else f"{path}"
        return cls(f"{where}: {problem}; fix: {fix}")
