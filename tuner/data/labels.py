"""The label cache: graded judgments in SQLite, keyed (dataset_id, query_id, doc_id).

Every label keeps its provenance (source file, importer, time of import). Imports are
all-or-nothing: the whole file is parsed and checked first (``tuner.data.labelfiles``),
then written in one transaction, so a bad row leaves the cache exactly as it was.

Label *sources*. Every import is recorded as a source of its dataset: a label file
(``kind`` ``file``: ``tuner labels import`` and an experiment's ``dataset.labels``,
with the sha256 of its bytes, its format and grade map) or a graders' queue file
(``kind`` ``grader``: ``tuner labels queue-import``). What each source said is kept
(``source_labels``) beside the grades in force (``labels``), which are derived from
them: for a (query, doc) pair a grader's grade wins over a file's (the newest grader
import first), else the newest file import that grades the pair. So:

- ``source_changes`` tells a label file that changed since it was imported (the
  judgments added / changed / removed), without reading anything but that file;
- importing a file again replaces only that file's judgments and needs ``replace=True``
  when they changed (a plain import of a changed source is refused: it would keep the
  judgments the file no longer has);
- a file never wipes or overrides a grader's grade; where the two differ it is a
  *conflict*, counted on every import and listed by ``conflicts``.

A label DB written before sources existed (only ``labels`` and ``imports``) is adopted
once, when it is first opened: each source's judgments are taken to be the labels whose
provenance names it, its sha256 the one its last import recorded. That is exact unless
a later import overwrote some of a file's pairs (those then count as the later
file's), and the grade map it was read with is unknown (``UNKNOWN_GRADE_MAP``).
"""

from __future__ import annotations

import hashlib
import shlex
import sqlite3
from collections import Counter
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal

from tuner.data.labelfiles import GRADES, Judgment, LabelFormat, detect_format, read_judgments
from tuner.data.qrels import GradeMap
from tuner.data.unjudged import export_unjudged
from tuner.diskspace import disk_full
from tuner.errors import InputError, LabelError, TunerError

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

# Added with label sources; created (and an older DB adopted) in one transaction on open.
_SOURCES_SCHEMA = """
CREATE TABLE sources (
    dataset_id  TEXT NOT NULL,
    source_file TEXT NOT NULL,
    kind        TEXT NOT NULL CHECK (kind IN ('file', 'grader')),
    importer    TEXT NOT NULL,
    grade_map   TEXT,
    file_sha256 TEXT,
    imported_at TEXT NOT NULL,
    import_id   INTEGER NOT NULL,
    adopted     INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY (dataset_id, source_file)
) WITHOUT ROWID;
CREATE TABLE source_labels (
    dataset_id  TEXT NOT NULL,
    source_file TEXT NOT NULL,
    query_id    TEXT NOT NULL,
    doc_id      TEXT NOT NULL,
    grade       INTEGER NOT NULL CHECK (grade BETWEEN 0 AND 3),
    PRIMARY KEY (dataset_id, source_file, query_id, doc_id)
) WITHOUT ROWID;
"""

SourceKind = Literal["file", "grader"]
#: the grade map of a source adopted from a label DB written before sources were recorded
UNKNOWN_GRADE_MAP = "?"
#: a source's recorded importer that names its file format
_FORMATS: dict[str, LabelFormat] = {"qrels": "qrels", "jsonl": "jsonl", "csv": "csv"}


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
    #: this source's judgments against its previous import (all "added" the first time)
    added: int = 0
    changed: int = 0
    removed: int = 0
    #: (query, doc) pairs of the dataset a file and a grader grade differently (the grader's grade is in force)
    n_conflicts: int = 0


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
    #: the dataset's label sources, oldest import first
    sources: list[SourceInfo] = field(default_factory=list)
    n_conflicts: int = 0


@dataclass(frozen=True)
class SourceInfo:
    """One recorded label source of a dataset."""

    source_file: str
    kind: SourceKind
    importer: str
    grade_map: str | None  # GradeMap.describe() text; None: none given; UNKNOWN_GRADE_MAP: adopted, unknown
    file_sha256: str | None
    imported_at: str
    n_labels: int
    adopted: bool


@dataclass(frozen=True)
class DeclaredSource:
    """A label file as an experiment declares it (``dataset.labels``)."""

    path: Path
    fmt: LabelFormat | None = None
    grade_map: GradeMap | None = None


@dataclass(frozen=True)
class SourceChange:
    """A label file whose judgments differ from what the cache holds from it."""

    path: str
    fmt: str
    grade_map: str | None
    added: int = 0
    changed: int = 0
    removed: int = 0
    never_imported: bool = False
    #: why the judgments could not be counted (the file no longer reads as labels), else None
    unreadable: str | None = None
    #: counted against a source adopted from a label DB written before sources were recorded
    adopted: bool = False

    def counts(self) -> str:
        if self.unreadable is not None:
            return f"it no longer reads as labels ({self.unreadable})"
        return f"{self.added} judgment(s) added, {self.changed} changed, {self.removed} removed" + (
            " (counted against what this label DB, written before label sources were recorded, holds from it)"
            if self.adopted
            else ""
        )


@dataclass(frozen=True)
class Conflict:
    """A (query, doc) pair that a label file and a grader grade differently; the grader's grade is in force."""

    query_id: str
    doc_id: str
    file_grade: int
    file_source: str
    grader_grade: int
    grader_source: str


class LabelStore:
    """SQLite label cache. Opens a short-lived connection per operation, so one store
    object may be shared by threads and several processes may read the same file."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with self._connect() as con:
            con.executescript(_SCHEMA)
            self._add_sources(con)

    def __repr__(self) -> str:
        return f"LabelStore({str(self.path)!r})"

    @contextmanager
    def _connect(self) -> Iterator[sqlite3.Connection]:
        try:
            con = sqlite3.connect(self.path, timeout=30.0, isolation_level=None)
        except sqlite3.Error as exc:
            raise LabelError(
                f"{self.path}: cannot open label database ({exc}); check the path and permissions"
            ) from exc
        try:
            yield con
        except (sqlite3.DatabaseError, OSError) as exc:
            # a full disk hides behind SQLite's "cannot rollback" of the transaction it rolled back itself
            full = disk_full(exc, self.path)
            if full is not None:
                raise full from exc
            if isinstance(exc, OSError):
                raise
            raise LabelError(f"{self.path}: label database error ({exc}); is it a fusion-tuner label DB?") from exc
        finally:
            con.close()

    @staticmethod
    def _add_sources(con: sqlite3.Connection) -> None:
        """Create the source tables, adopting the labels of a DB written before them (once:
        the check and the adoption share one write transaction, so two processes opening
        an old DB at once adopt it once)."""
        if _has_table(con, "sources"):
            return
        con.execute("BEGIN IMMEDIATE")
        try:
            if not _has_table(con, "sources"):
                for statement in filter(str.strip, _SOURCES_SCHEMA.split(";")):  # executescript would commit
                    con.execute(statement)
                con.execute(
                    "INSERT INTO source_labels SELECT dataset_id, source_file, query_id, doc_id, grade FROM labels"
                )
                con.execute(
                    """INSERT INTO sources
                       SELECT l.dataset_id, l.source_file,
                              CASE WHEN l.importer LIKE 'queue-%' THEN 'grader' ELSE 'file' END,
                              l.importer, ?,
                              (SELECT i.file_sha256 FROM imports i WHERE i.dataset_id = l.dataset_id
                                 AND i.source_file = l.source_file ORDER BY i.id DESC LIMIT 1),
                              MAX(l.imported_at),
                              COALESCE((SELECT MAX(i.id) FROM imports i WHERE i.dataset_id = l.dataset_id
                                 AND i.source_file = l.source_file), 0),
                              1
                       FROM labels l GROUP BY l.dataset_id, l.source_file""",
                    (UNKNOWN_GRADE_MAP,),
                )
                # a file every pair of which a later import overwrote still was imported: keep it, empty
                con.execute(
                    """INSERT OR IGNORE INTO sources
                       SELECT i.dataset_id, i.source_file,
                              CASE WHEN i.importer LIKE 'queue-%' THEN 'grader' ELSE 'file' END,
                              i.importer, ?, i.file_sha256, i.imported_at, i.id, 1
                       FROM imports i WHERE i.id = (
                           SELECT MAX(j.id) FROM imports j
                           WHERE j.dataset_id = i.dataset_id AND j.source_file = i.source_file)""",
                    (UNKNOWN_GRADE_MAP,),
                )
            con.execute("COMMIT")
        except BaseException:
            con.execute("ROLLBACK")
            raise

    # -- writing

    def import_file(
        self,
        path: str | Path,
        dataset_id: str,
        *,
        fmt: LabelFormat | None = None,
        grade_map: GradeMap | None = None,
        replace: bool = False,
    ) -> ImportSummary:
        """Parse ``path`` completely, then store every label in one transaction (see
        ``import_judgments``; ``replace`` re-imports a file whose judgments changed)."""
        p = Path(path)
        resolved_fmt = fmt or detect_format(p)
        judgments = read_judgments(p, resolved_fmt, grade_map)
        if not judgments:
            raise InputError(f"{p}: no labels found; the file has no judgment rows")
        digest = hashlib.sha256(p.read_bytes()).hexdigest()
        return self.import_judgments(
            judgments,
            dataset_id,
            source_file=str(p.resolve()),
            importer=resolved_fmt,
            file_sha256=digest,
            replace=replace,
            grade_map=None if grade_map is None else grade_map.describe(),
        )

    def import_judgments(
        self,
        judgments: Iterable[Judgment],
        dataset_id: str,
        *,
        source_file: str,
        importer: str,
        file_sha256: str | None = None,
        kind: SourceKind = "file",
        replace: bool = False,
        grade_map: str | None = None,
    ) -> ImportSummary:
        """Store judgments as the source ``source_file`` atomically (all or none); later
        values of a key win within one call.

        A ``file`` source is what the file says: importing it again with other judgments
        needs ``replace`` (its old judgments are dropped, other sources' kept), else
        LabelError. A ``grader`` source only gains grades: a re-import adds and regrades
        pairs, never drops one. Grades in force follow the module's rule (a grader's
        grade over a file's, else the newest import)."""
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
                old = _source_rows(con, dataset_id, source_file)
                prior_kind = con.execute(
                    "SELECT kind FROM sources WHERE dataset_id = ? AND source_file = ?", (dataset_id, source_file)
                ).fetchone()
                added, changed, removed = _diff(old, rows)
                if kind == "file" and prior_kind is not None and (added or changed or removed) and not replace:
                    raise LabelError(
                        f"{shown_path(source_file)} was imported into {shown_path(self.path)} "
                        f"(dataset {dataset_id}) before and its judgments "
                        f"changed since ({added} added, {changed} changed, {removed} removed); pass --replace to "
                        "replace this file's judgments (other files' and graders' grades are kept)"
                    )
                new = {**old, **rows} if kind == "grader" else rows
                if kind == "grader":
                    removed = 0
                labelled = set(con.execute("SELECT query_id, doc_id FROM labels WHERE dataset_id = ?", (dataset_id,)))
                before = labelled.intersection(rows)
                cur = con.execute(
                    "INSERT INTO imports (dataset_id, source_file, importer, imported_at, n_labels, file_sha256)"
                    " VALUES (?, ?, ?, ?, ?, ?)",
                    (dataset_id, source_file, importer, now, len(rows), file_sha256),
                )
                con.execute(
                    "DELETE FROM source_labels WHERE dataset_id = ? AND source_file = ?", (dataset_id, source_file)
                )
                con.executemany(
                    "INSERT INTO source_labels VALUES (?, ?, ?, ?, ?)",
                    [(dataset_id, source_file, q, d, g) for (q, d), g in new.items()],
                )
                con.execute(
                    "INSERT OR REPLACE INTO sources VALUES (?, ?, ?, ?, ?, ?, ?, ?, 0)",
                    (dataset_id, source_file, kind, importer, grade_map, file_sha256, now, cur.lastrowid),
                )
                _settle(con, dataset_id, set(old) | set(new))
                n_conflicts = len(_conflicts(con, dataset_id))
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
            n_replaced=len(before),
            grade_counts=_grade_counts(rows.values()),
            added=added,
            changed=changed,
            removed=removed,
            n_conflicts=n_conflicts,
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

    def sources(self, dataset_id: str) -> list[SourceInfo]:
        """The dataset's recorded label sources, oldest import first."""
        with self._connect() as con:
            return [
                SourceInfo(s, k, i, g, h, t, n, bool(a))
                for s, k, i, g, h, t, a, n in con.execute(
                    """SELECT s.source_file, s.kind, s.importer, s.grade_map, s.file_sha256, s.imported_at, s.adopted,
                              (SELECT COUNT(*) FROM source_labels l
                                WHERE l.dataset_id = s.dataset_id AND l.source_file = s.source_file)
                       FROM sources s WHERE s.dataset_id = ? ORDER BY s.import_id""",
                    (dataset_id,),
                )
            ]

    def conflicts(self, dataset_id: str) -> list[Conflict]:
        """The pairs a label file and a grader grade differently (the grader's grade is in force)."""
        with self._connect() as con:
            return _conflicts(con, dataset_id)

    def source_changes(self, dataset_id: str, declared: Sequence[DeclaredSource] = ()) -> list[SourceChange]:
        """The label files of ``dataset_id`` whose judgments differ from what the cache
        holds from them: every ``declared`` file (one never imported counts whole as
        added), and every other file source recorded for the dataset that still exists
        (read with its recorded format and grade map). Grader sources are not files
        to follow. A file whose bytes did not change is not read."""
        recorded = {s.source_file: s for s in self.sources(dataset_id) if s.kind == "file"}
        out: list[SourceChange] = []
        for decl in declared:
            grade_map = None if decl.grade_map is None else decl.grade_map.describe()
            fmt = decl.fmt or detect_format(decl.path)
            source = recorded.pop(str(Path(decl.path).resolve()), None)
            change = self._change(dataset_id, decl.path, fmt, decl.grade_map, grade_map, source)
            if change is not None:
                out.append(change)
        for source in recorded.values():
            path = Path(source.source_file)
            if source.file_sha256 is None or not path.is_file():
                continue  # labels given through the API, or a file since removed: nothing to compare
            text = source.grade_map
            gmap = GradeMap.parse(text) if text is not None and text != UNKNOWN_GRADE_MAP else None
            fmt = _FORMATS.get(source.importer) or detect_format(path)
            change = self._change(dataset_id, path, fmt, gmap, source.grade_map, source)
            if change is not None:
                out.append(change)
        return out

    def _change(
        self,
        dataset_id: str,
        path: Path,
        fmt: LabelFormat,
        gmap: GradeMap | None,
        gmap_text: str | None,
        source: SourceInfo | None,
    ) -> SourceChange | None:
        if source is not None:
            try:
                same_bytes = hashlib.sha256(Path(path).read_bytes()).hexdigest() == source.file_sha256
            except OSError:
                same_bytes = False
            if same_bytes and source.grade_map in (gmap_text, UNKNOWN_GRADE_MAP):
                return None
        base = SourceChange(str(path), fmt, gmap_text, adopted=source is not None and source.adopted)
        try:
            now = {(j.query_id, j.doc_id): j.grade for j in read_judgments(path, fmt, gmap)}
        except TunerError as exc:
            if source is None:
                raise  # a declared file never imported: its own error says what to fix
            return SourceChange(base.path, fmt, gmap_text, unreadable=str(exc), adopted=base.adopted)
        if source is None:
            return SourceChange(base.path, fmt, gmap_text, added=len(now), never_imported=True)
        with self._connect() as con:
            old = _source_rows(con, dataset_id, source.source_file)
        added, changed, removed = _diff(old, now)
        if not (added or changed or removed):
            return None  # other bytes, same judgments (spacing, order, line ends)
        return SourceChange(base.path, fmt, gmap_text, added, changed, removed, adopted=base.adopted)

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
            n_conflicts = len(_conflicts(con, dataset_id))
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
            sources=self.sources(dataset_id),
            n_conflicts=n_conflicts,
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


def replace_command(change: SourceChange, dataset_id: str, db: str | Path) -> str:
    """The `tuner labels import --replace` command that re-imports a changed label file."""
    grade_map = (
        f" --grade-map {shlex.quote(change.grade_map)}" if change.grade_map not in (None, UNKNOWN_GRADE_MAP) else ""
    )
    return (
        f"tuner labels import {shlex.quote(shown_path(change.path))} --replace --dataset-id "
        f"{shlex.quote(dataset_id)} "
        f"--db {shlex.quote(shown_path(db))} "
        f"--format {change.fmt}{grade_map}"
    )


def stale_labels_message(changes: Sequence[SourceChange], dataset_id: str, db: str | Path) -> str:
    """One line: the first changed label file, its counts and the fix (the others named)."""
    first = changes[0]
    what = "was never imported into" if first.never_imported else "changed since it was imported into"
    more = ""
    if len(changes) > 1:
        more = f"; {len(changes) - 1} more label file(s) changed too: " + ", ".join(
            shown_path(c.path) for c in changes[1:]
        )
    return (
        f"labels: {shown_path(first.path)} {what} {shown_path(db)} (dataset {dataset_id}): {first.counts()}{more}; "
        f"re-import it with `{replace_command(first, dataset_id, db)}`, then start a new study "
        "(a study's trials measured on the old labels are not compared with new ones)"
    )


def shown_path(path: str | Path) -> str:
    """A path as messages show it: relative to the working directory when under it."""
    try:
        return str(Path(path).resolve().relative_to(Path.cwd()))
    except ValueError:
        return str(path)


def _has_table(con: sqlite3.Connection, name: str) -> bool:
    return con.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?", (name,)).fetchone() is not None


def _source_rows(con: sqlite3.Connection, dataset_id: str, source_file: str) -> dict[tuple[str, str], int]:
    return {
        (q, d): g
        for q, d, g in con.execute(
            "SELECT query_id, doc_id, grade FROM source_labels WHERE dataset_id = ? AND source_file = ?",
            (dataset_id, source_file),
        )
    }


def _diff(old: Mapping[tuple[str, str], int], new: Mapping[tuple[str, str], int]) -> tuple[int, int, int]:
    """(added, changed, removed) judgments going from ``old`` to ``new``."""
    added = sum(1 for k in new if k not in old)
    changed = sum(1 for k, g in new.items() if k in old and old[k] != g)
    removed = sum(1 for k in old if k not in new)
    return added, changed, removed


def _ranked(con: sqlite3.Connection, dataset_id: str) -> Iterator[tuple[str, str, int, str, str, str, str]]:
    """Every source's judgment of the dataset, the one in force first per pair: grader
    sources before files, newer imports before older."""
    return con.execute(
        """SELECT l.query_id, l.doc_id, l.grade, l.source_file, s.kind, s.importer, s.imported_at
           FROM source_labels l JOIN sources s ON s.dataset_id = l.dataset_id AND s.source_file = l.source_file
           WHERE l.dataset_id = ?
           ORDER BY l.query_id, l.doc_id, s.kind = 'grader' DESC, s.import_id DESC""",
        (dataset_id,),
    )


def _settle(con: sqlite3.Connection, dataset_id: str, keys: set[tuple[str, str]]) -> None:
    """Bring the grades in force of ``keys`` in line with the sources (see the module)."""
    winners: dict[tuple[str, str], tuple[int, str, str, str]] = {}
    for q, d, g, source, _kind, importer, at in _ranked(con, dataset_id):
        if (q, d) in keys and (q, d) not in winners:
            winners[(q, d)] = (g, source, importer, at)
    current = {
        (q, d): (g, s)
        for q, d, g, s in con.execute(
            "SELECT query_id, doc_id, grade, source_file FROM labels WHERE dataset_id = ?", (dataset_id,)
        )
        if (q, d) in keys
    }
    con.executemany(
        "DELETE FROM labels WHERE dataset_id = ? AND query_id = ? AND doc_id = ?",
        [(dataset_id, q, d) for (q, d) in current if (q, d) not in winners],
    )
    # a pair whose grade and source stay keeps its row (and the time that grade was imported)
    con.executemany(
        "INSERT OR REPLACE INTO labels VALUES (?, ?, ?, ?, ?, ?, ?)",
        [(dataset_id, q, d, g, s, i, t) for (q, d), (g, s, i, t) in winners.items() if current.get((q, d)) != (g, s)],
    )


def _conflicts(con: sqlite3.Connection, dataset_id: str) -> list[Conflict]:
    grader: dict[tuple[str, str], tuple[int, str]] = {}
    filed: dict[tuple[str, str], tuple[int, str]] = {}
    for q, d, g, source, kind, _importer, _at in _ranked(con, dataset_id):
        (grader if kind == "grader" else filed).setdefault((q, d), (g, source))
    return [
        Conflict(q, d, filed[(q, d)][0], filed[(q, d)][1], g, s)
        for (q, d), (g, s) in sorted(grader.items())
        if (q, d) in filed and filed[(q, d)][0] != g
    ]


def _grade_counts(grades: Iterable[int]) -> dict[int, int]:
    counts = Counter(grades)
    return {g: counts.get(g, 0) for g in GRADES}
