"""A small SQLite store of trial results, keyed by what determines them.

A trial's result depends only on the config text(s) the backend reads, the queries,
the labels and how the evaluation is run. Discrete search spaces propose the same
config again, and a resumed study may re-run a variant it already measured; both
reuse the stored result here instead of restarting the backend and re-evaluating.

Only successful evaluations are stored: a failure may be transient (a slow start,
a flaky network), so it is tried again.
"""

from __future__ import annotations

import hashlib
import json
import sqlite3
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tuner.errors import StudyError

_SCHEMA = """
CREATE TABLE IF NOT EXISTS results (
    key TEXT PRIMARY KEY,
    metrics TEXT NOT NULL,
    reports TEXT NOT NULL,
    source_trial INTEGER,
    study_name TEXT,
    created REAL NOT NULL
)
"""


def cache_key(
    config_texts: Mapping[str, str],
    *,
    dataset_hash: str,
    labels_fingerprint: str,
    eval_spec_json: str,
) -> str:
    """sha256 over everything that determines a trial's metrics.

    ``config_texts`` maps a stable name of each config file (its path relative to
    the project) to the exact text the backend will read; sorted so the order files
    are declared in does not matter.
    """
    digest = hashlib.sha256()
    for name in sorted(config_texts):
        for part in (name, config_texts[name]):
            data = part.encode("utf-8")
            # Length prefixes keep ("ab", "c") and ("a", "bc") apart.
            digest.update(len(data).to_bytes(8, "big"))
            digest.update(data)
    for part in (dataset_hash, labels_fingerprint, eval_spec_json):
        data = part.encode("utf-8")
        digest.update(len(data).to_bytes(8, "big"))
        digest.update(data)
    return digest.hexdigest()


@dataclass(frozen=True)
class CachedResult:
    """What a later trial needs to stand in for a re-run."""

    metrics: dict[str, float]
    reports: dict[str, str] = field(default_factory=dict)
    source_trial: int | None = None
    study_name: str | None = None


class ResultCache:
    """Results by cache key in one SQLite file (created on first use)."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            with self._connect() as conn:
                conn.execute(_SCHEMA)
        except sqlite3.Error as exc:
            raise StudyError(
                f"result cache {self.path} cannot be opened: {exc}; delete the file to start a fresh cache"
            ) from exc

    @contextmanager
    def _connect(self) -> Iterator[sqlite3.Connection]:
        conn = sqlite3.connect(self.path, timeout=30)
        # WAL + NORMAL: no fsync per put on the trial's critical path; a crash of the
        # tuner loses nothing committed (an OS crash may lose the last puts: re-run).
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("PRAGMA synchronous=NORMAL")
        try:
            with conn:  # commits on success, rolls back on error
                yield conn
        finally:
            conn.close()

    def get(self, key: str) -> CachedResult | None:
        with self._connect() as conn:
            row = conn.execute(
                "SELECT metrics, reports, source_trial, study_name FROM results WHERE key = ?", (key,)
            ).fetchone()
        if row is None:
            return None
        metrics, reports, source_trial, study_name = row
        return CachedResult(json.loads(metrics), json.loads(reports), source_trial, study_name)

    def put(self, key: str, result: CachedResult) -> None:
        payload: tuple[Any, ...] = (
            key,
            json.dumps(result.metrics, sort_keys=True),
            json.dumps(result.reports, sort_keys=True),
            result.source_trial,
            result.study_name,
            time.time(),
        )
        with self._connect() as conn:
            conn.execute(
                "INSERT OR REPLACE INTO results (key, metrics, reports, source_trial, study_name, created)"
                " VALUES (?, ?, ?, ?, ?, ?)",
                payload,
            )

    def __len__(self) -> int:
        with self._connect() as conn:
            return int(conn.execute("SELECT COUNT(*) FROM results").fetchone()[0])
