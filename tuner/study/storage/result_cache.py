"""A small SQLite store of trial results, keyed by what determines them.

A trial's result depends on the config text(s) the backend reads, the queries, the
labels and how the evaluation is run (the *base* key), and on the data the backend
serves: the declared ``target.inputs`` files (tuner.data.inputs) and the data fingerprint
the backend reports on its health URL (``target.health.fingerprint``). Discrete search
spaces propose the same config again, and a resumed study may re-run a variant it
already measured; both reuse the stored result here instead of restarting the backend
and re-evaluating.

Each row keeps its base key and data fingerprints next to the full key, so a miss on
a config measured before says which part changed (`ResultCache.explain_miss`):
"cache miss: target.inputs changed (data/corpus.jsonl) since trial #3 of study s".

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

from tuner.data.inputs import InputsFingerprint, changed_files, describe_files
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
# Added for the data fingerprints; a cache written before them is migrated on open
# (its rows had neither, so their base key is their key).
_DATA_COLUMNS = {"base_key": "TEXT", "inputs_digest": "TEXT", "inputs_files": "TEXT", "backend_fingerprint": "TEXT"}


# The rules that turn answers into scores, as a version in every key: a change to them
# (2: a live answer's repeated doc ids are removed before ranking) must not let a cache
# written under the old rules answer for the new ones.
SCORING_RULES = "2"


def cache_key(
    config_texts: Mapping[str, str],
    *,
    dataset_hash: str,
    labels_fingerprint: str,
    eval_spec_json: str,
) -> str:
    """sha256 over the config, queries, labels and evaluation: the base key.

    ``config_texts`` maps a stable name of each config file (its path relative to
    the project) to the exact text the backend will read; sorted so the order files
    are declared in does not matter. `CacheKey` adds the data fingerprints.
    """
    digest = hashlib.sha256()
    _update(digest, f"scoring rules {SCORING_RULES}")
    for name in sorted(config_texts):
        for part in (name, config_texts[name]):
            _update(digest, part)
    for part in (dataset_hash, labels_fingerprint, eval_spec_json):
        _update(digest, part)
    return digest.hexdigest()


def _update(digest: Any, part: str) -> None:
    data = part.encode("utf-8")
    # Length prefixes keep ("ab", "c") and ("a", "bc") apart.
    digest.update(len(data).to_bytes(8, "big"))
    digest.update(data)


@dataclass(frozen=True)
class CacheKey:
    """A full key and its parts: ``base`` (config, queries, labels, evaluation) and the
    data the backend serves (declared input files, the backend's own fingerprint)."""

    base: str
    inputs: InputsFingerprint | None = None
    backend: str | None = None

    @property
    def key(self) -> str:
        """The base key when no data fingerprint is declared (so caches written before
        them still hit), else a digest over the base key and both fingerprints."""
        if self.inputs is None and self.backend is None:
            return self.base
        full = hashlib.sha256()
        inputs = f"inputs={self.inputs.digest}" if self.inputs is not None else "inputs-undeclared"
        backend = f"backend={self.backend}" if self.backend is not None else "backend-undeclared"
        for part in (self.base, inputs, backend):
            _update(full, part)
        return full.hexdigest()


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
                _migrate(conn)
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

    def get(self, key: str | CacheKey) -> CachedResult | None:
        full = key.key if isinstance(key, CacheKey) else key
        with self._connect() as conn:
            row = conn.execute(
                "SELECT metrics, reports, source_trial, study_name FROM results WHERE key = ?", (full,)
            ).fetchone()
        if row is None:
            return None
        metrics, reports, source_trial, study_name = row
        return CachedResult(json.loads(metrics), json.loads(reports), source_trial, study_name)

    def put(self, key: str | CacheKey, result: CachedResult) -> None:
        parts = key if isinstance(key, CacheKey) else CacheKey(key)
        inputs = parts.inputs
        payload: tuple[Any, ...] = (
            parts.key,
            json.dumps(result.metrics, sort_keys=True),
            json.dumps(result.reports, sort_keys=True),
            result.source_trial,
            result.study_name,
            time.time(),
            parts.base,
            inputs.digest if inputs is not None else None,
            json.dumps(dict(inputs.files)) if inputs is not None else None,
            parts.backend,
        )
        with self._connect() as conn:
            conn.execute(
                "INSERT OR REPLACE INTO results (key, metrics, reports, source_trial, study_name, created,"
                " base_key, inputs_digest, inputs_files, backend_fingerprint) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                payload,
            )

    def explain_miss(self, key: CacheKey) -> str:
        """Why ``key`` has no result: the data parts that differ from the newest result
        stored for the same base key (config, queries, labels, evaluation), or that no
        result was ever stored for it."""
        with self._connect() as conn:
            row = conn.execute(
                "SELECT inputs_files, backend_fingerprint, source_trial, study_name FROM results"
                " WHERE base_key = ? AND key != ? ORDER BY created DESC LIMIT 1",
                (key.base, key.key),
            ).fetchone()
        if row is None:
            return "cache miss: no result stored for this config and evaluation"
        files_json, backend, source_trial, study_name = row
        since = f" since trial #{source_trial}" + (f" of study {study_name}" if study_name else "")
        return "cache miss: " + "; ".join(_differences(key, files_json, backend)) + since

    def __len__(self) -> int:
        with self._connect() as conn:
            return int(conn.execute("SELECT COUNT(*) FROM results").fetchone()[0])


def _migrate(conn: sqlite3.Connection) -> None:
    have = {row[1] for row in conn.execute("PRAGMA table_info(results)")}
    for column, kind in _DATA_COLUMNS.items():
        if column not in have:
            try:
                conn.execute(f"ALTER TABLE results ADD COLUMN {column} {kind}")
            except sqlite3.OperationalError as exc:
                if "duplicate column" not in str(exc):  # another process migrated first
                    raise
    conn.execute("UPDATE results SET base_key = key WHERE base_key IS NULL")
    conn.execute("CREATE INDEX IF NOT EXISTS results_base_key ON results (base_key)")


def _differences(key: CacheKey, files_json: str | None, backend: str | None) -> list[str]:
    out: list[str] = []
    stored_files: dict[str, str] | None = json.loads(files_json) if files_json else None
    if key.inputs is not None and stored_files is None:
        out.append("target.inputs newly declared")
    elif key.inputs is None and stored_files is not None:
        out.append("target.inputs are no longer declared")
    elif key.inputs is not None and stored_files is not None:
        changed = changed_files(stored_files, key.inputs.files)
        if changed:
            out.append(f"target.inputs changed ({describe_files(changed)})")
    if key.backend != backend:
        if key.backend is None:
            out.append("target.health.fingerprint is no longer declared")
        elif backend is None:
            out.append("target.health.fingerprint newly declared")
        else:
            was, now = short_fingerprint(backend), short_fingerprint(key.backend)
            out.append(f"backend fingerprint changed ({was} -> {now})")
    return out or ["data fingerprint differs"]


def short_fingerprint(fingerprint: str | None) -> str:
    """A fingerprint as messages show it: up to 16 characters in full, else 12 and '...'."""
    if fingerprint is None:
        return "none"
    return fingerprint if len(fingerprint) <= 16 else fingerprint[:12] + "..."
