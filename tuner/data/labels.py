"""The label cache: graded judgments in SQLite, keyed (dataset_id, query_id, doc_id).

Every label keeps its provenance (source file, importer, time of import); a later
import of the same key replaces the grade and the provenance. Imports are
all-or-nothing: the whole file is parsed and checked first (``tuner.data.labelfiles``),
then written in one transaction, so a bad row leaves the cache exactly as it was.
"""

from __future__ import annotations

import hashlib
import sqlite3
from collections import Counter
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal

from tuner.data.labelfiles import GRADES, Judgment, LabelFormat, detect_format, read_judgments
from tuner.data.qrels import GradeMap
from tuner.data.unjudged import export_unjudged
from tuner.errors import InputError, LabelError

_SCHEMA = """
CREATE TABLE IF NOT EXISTS labels (
    dataset_id  TEXT NOT NULL,
    query_id    TEXT NOT NULL,
    doc_id      TEXT NOT NULL,
    grade       INTEGER NOT NULL CHECK (grade BETWEEN 0 AND 3),
    source_file TEXT NOT NULL,
    importer    TEXT NOT NULL,
    imported_at TEXT NOT NULL,
    PRIMARY KEY (dataset_id, query_id, doc_id)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS imports (
    id          INTEGER PRIMARY KEY,
    dataset_id  TEXT NOT NULL,
    source_file TEXT NOT NULL,
    importer    TEXT NOT NULL,
    imported_at TEXT NOT NULL,
    n_labels    INTEGER NOT NULL,
    file_sha256 TEXT
);
"""


@dataclass(frozen=True)
class ImportSummary:
    dataset_id: str
    source_file: str
    importer: str
    imported_at: str
    n_labels: int
    n_queries: int
    n_replaced: int
    grade_counts: dict[int, int]


@dataclass(frozen=True)
class LabelStats:
    """What the cache holds for one dataset."""

    dataset_id: str
    n_labels: int
    n_queries: int
    grade_counts: dict[int, int]
    #: query_id -> {grade: count} (every grade 0..3 present)
    per_query: dict[str, dict[int, int]]
    #: (source_file, importer, imported_at, n_labels) of every import, oldest first
    imports: list[tuple[str, str, str, int]] = field(default_factory=list)
    fingerprint: str = ""


class LabelStore:
    """SQLite label cache. Opens a short-lived connection per operation, so one store
    object may be shared by threads and several processes may read the same file."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with self._connect() as con:
            con.executescript(_SCHEMA)

    def __repr__(self) -> str:
        return f"LabelStore({str(self.path)!r})"

    @contextmanager
    def _connect(self) -> Iterator[sqlite3.Connection]:
        try:
            con = sqlite3.connect(self.path, timeout=30.0, isolation_level=None)
        except sqlite3.Error as exc:
            raise LabelError(f"{self.path}: cannot open label database ({exc}); check the path and permissions") from exc
        try:
            yield con
        except sqlite3.DatabaseError as exc:
            raise LabelError(f"{self.path}: label database error ({exc}); is it a fusion-tuner label DB?") from exc
        finally:
            con.close()

    # -- writing

    def import_file(
        self,
        path: str | Path,
        dataset_id: str,
        *,
        fmt: LabelFormat | None = None,
        grade_map: GradeMap | None = None,
    ) -> ImportSummary:
        """Parse ``path`` completely, then store every label in one transaction."""
        p = Path(path)
        resolved_fmt = fmt or detect_format(p)
        judgments = read_judgments(p, resolved_fmt, grade_map)
        if not judgments:
            raise InputError(f"{p}: no labels found; the file has no judgment rows")
        digest = hashlib.sha256(p.read_bytes()).hexdigest()
        return self.import_judgments(
            judgments, dataset_id, source_file=str(p.resolve()), importer=resolved_fmt, file_sha256=digest
        )

    def import_judgments(
        self,
        judgments: Iterable[Judgment],
        dataset_id: str,
        *,
        source_file: str,
        importer: str,
        file_sha256: str | None = None,
    ) -> ImportSummary:
        """Store judgments atomically (all or none); later values of a key win."""
        if not dataset_id or not dataset_id.strip():
            raise LabelError("dataset_id is empty; pass --dataset-id (usually the query set's file stem)")
        rows = {(j.query_id, j.doc_id): j.grade for j in judgments}
        bad = next(((k, g) for k, g in rows.items() if g not in GRADES), None)
        if bad is not None:
            raise LabelError(f"{source_file}: grade {bad[1]} for {bad[0]} is outside 0..3")
        now = datetime.now(UTC).isoformat(timespec="seconds")
        with self._connect() as con:
            con.execute("BEGIN IMMEDIATE")
            try:
                before = con.execute("SELECT COUNT(*) FROM labels WHERE dataset_id = ?", (dataset_id,)).fetchone()[0]
                con.executemany(
                    "INSERT OR REPLACE INTO labels VALUES (?, ?, ?, ?, ?, ?, ?)",
                    [(dataset_id, q, d, g, source_file, importer, now) for (q, d), g in rows.items()],
                )
                after = con.execute("SELECT COUNT(*) FROM labels WHERE dataset_id = ?", (dataset_id,)).fetchone()[0]
                con.execute(
                    "INSERT INTO imports (dataset_id, source_file, importer, imported_at, n_labels, file_sha256)"
                    " VALUES (?, ?, ?, ?, ?, ?)",
                    (dataset_id, source_file, importer, now, len(rows), file_sha256),
                )
                con.execute("COMMIT")
            except BaseException:
                con.execute("ROLLBACK")
                raise
        return ImportSummary(
            dataset_id=dataset_id,
            source_file=source_file,
            importer=importer,
            imported_at=now,
            n_labels=len(rows),
            n_queries=len({q for q, _ in rows}),
            n_replaced=len(rows) - (after - before),
            grade_counts=_grade_counts(rows.values()),
        )

    # -- reading

    def datasets(self) -> list[str]:
        with self._connect() as con:
            return [r[0] for r in con.execute("SELECT DISTINCT dataset_id FROM labels ORDER BY dataset_id")]

    def qrels(self, dataset_id: str) -> dict[str, dict[str, int]]:
        """{query_id: {doc_id: grade}} for one dataset; LabelError when it has no labels."""
        out: dict[str, dict[str, int]] = {}
        with self._connect() as con:
            for qid, doc, grade in con.execute(
                "SELECT query_id, doc_id, grade FROM labels WHERE dataset_id = ?", (dataset_id,)
            ):
                out.setdefault(qid, {})[doc] = grade
        if not out:
            known = ", ".join(self.datasets()) or "none"
            raise LabelError(
                f"{self.path}: no labels for dataset {dataset_id!r} (datasets with labels: {known}); "
                "import them with `tuner labels import FILE --dataset-id ID`"
            )
        return out

    def fingerprint(self, dataset_id: str) -> str:
        """sha256 of the dataset's sorted (query_id, doc_id, grade) rows; provenance is
        left out so re-importing identical labels keeps cached results valid."""
        h = hashlib.sha256()
        with self._connect() as con:
            for qid, doc, grade in con.execute(
                "SELECT query_id, doc_id, grade FROM labels WHERE dataset_id = ? ORDER BY query_id, doc_id",
                (dataset_id,),
            ):
                h.update(f"{qid}\t{doc}\t{grade}\n".encode())
        return h.hexdigest()

    def stats(self, dataset_id: str) -> LabelStats:
        per_query: dict[str, dict[int, int]] = {}
        with self._connect() as con:
            for qid, grade, n in con.execute(
                "SELECT query_id, grade, COUNT(*) FROM labels WHERE dataset_id = ? GROUP BY query_id, grade",
                (dataset_id,),
            ):
                per_query.setdefault(qid, dict.fromkeys(GRADES, 0))[grade] = n
            imports = [
                (s, i, t, n)
                for s, i, t, n in con.execute(
                    "SELECT source_file, importer, imported_at, n_labels FROM imports WHERE dataset_id = ? ORDER BY id",
                    (dataset_id,),
                )
            ]
        totals = dict.fromkeys(GRADES, 0)
        for counts in per_query.values():
            for g, n in counts.items():
                totals[g] += n
        return LabelStats(
            dataset_id=dataset_id,
            n_labels=sum(totals.values()),
            n_queries=len(per_query),
            grade_counts=totals,
            per_query=dict(sorted(per_query.items())),
            imports=imports,
            fingerprint=self.fingerprint(dataset_id),
        )

    def export_unjudged(
        self,
        dataset_id: str,
        hits: Iterable[Mapping[str, Any]],
        out: str | Path,
        *,
        fmt: Literal["csv", "jsonl"] | None = None,
        queries: Mapping[str, str] | None = None,
    ) -> int:
        """Write the hits that still lack a label (checked against the cache now) for
        graders; returns how many pairs were written. See ``export_unjudged``."""
        known = self.qrels(dataset_id) if dataset_id in self.datasets() else {}
        return export_unjudged(hits, out, qrels=known, fmt=fmt, queries=queries)


def _grade_counts(grades: Iterable[int]) -> dict[int, int]:
    counts = Counter(grades)
    return {g: counts.get(g, 0) for g in GRADES}
