"""The label cache: graded judgments in SQLite, keyed (dataset_id, query_id, doc_id).

Grades are 0..3 (Irrelevant, Weakly, Mostly, Fully relevant). Every label keeps its
provenance (source file, importer, time of import); a later import of the same key
replaces the grade and the provenance. Imports are all-or-nothing: the whole file is
parsed and checked first, then written in one transaction, so a bad row (reported as
``file:line``) leaves the cache exactly as it was.

Importers: TREC qrels (``qid iter docno label`` with a declared grade mapping, read by
``tuner.data.qrels``), JSONL (``{"query_id": ..., "judgments": [{"doc_id": ..., "relevance": ...}]}``)
and CSV (``query_id,doc_id,relevance`` header; other columns ignored).
"""

from __future__ import annotations

import csv
import hashlib
import io
import json
import sqlite3
from collections import Counter
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal

from tuner.data.qrels import IDENTITY, GradeMap, read_qrels
from tuner.errors import InputError, LabelError
from tuner.files import atomic_write_text

GRADES: tuple[int, ...] = (0, 1, 2, 3)
GRADE_NAMES: dict[int, str] = {0: "Irrelevant", 1: "Weakly", 2: "Mostly", 3: "Fully"}
LabelFormat = Literal["qrels", "jsonl", "csv"]
FORMATS: tuple[str, ...] = ("qrels", "jsonl", "csv")


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


@dataclass(frozen=True, slots=True)
class Judgment:
    """One graded (query, doc) pair read from a file; ``line`` is 1-based (for errors)."""

    query_id: str
    doc_id: str
    grade: int
    line: int = 0


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


@dataclass(frozen=True, slots=True)
class UnjudgedPair:
    """A (query, doc) pair a grader should label."""

    query_id: str
    doc_id: str
    title: str | None = None
    query: str | None = None
    best_rank: int | None = None


# --------------------------------------------------------------------------- parsing


def map_grade(raw: Any, grade_map: GradeMap, where: str) -> int | None:
    """Map one raw label (an integer, possibly written as text or 2.0) through the grade
    map; None means "unjudged" (the map drops it). InputError naming ``where`` otherwise."""
    value: int | None = None
    if isinstance(raw, int) and not isinstance(raw, bool):
        value = raw
    elif isinstance(raw, float) and raw.is_integer():
        value = int(raw)
    elif isinstance(raw, str) and raw.strip().lstrip("-").isdigit():
        value = int(raw.strip())
    if value is None or value not in grade_map.mapping:
        raise InputError(
            f"{where}: grade {raw!r} is outside the grade mapping ({grade_map.describe()}); "
            "fix the label or declare it with --grade-map SOURCE:GRADE"
        )
    grade = grade_map.mapping[value]
    if grade is not None and grade not in GRADES:
        raise InputError(f"{where}: grade {raw!r} maps to {grade}, outside 0..3; fix --grade-map")
    return grade


def detect_format(path: str | Path) -> LabelFormat:
    suffix = Path(path).suffix.lower()
    if suffix in (".jsonl", ".json", ".ndjson"):
        return "jsonl"
    if suffix == ".csv":
        return "csv"
    return "qrels"


def read_judgments(
    path: str | Path, fmt: LabelFormat | None = None, grade_map: GradeMap | None = None
) -> list[Judgment]:
    """Parse a label file (format from the extension unless given). Pure apart from reading."""
    p = Path(path)
    fmt = fmt or detect_format(p)
    if fmt not in FORMATS:
        raise InputError(f"{p}: unknown label format {fmt!r}; use one of {', '.join(FORMATS)}")
    gmap = IDENTITY if grade_map is None else grade_map
    if fmt == "qrels":
        return _read_qrels(p, gmap)
    text = _read_text(p)
    reader = _parse_jsonl if fmt == "jsonl" else _parse_csv
    judgments = reader(text, str(p), gmap)
    _check_conflicts(judgments, str(p))
    return judgments


def _read_text(p: Path) -> str:
    try:
        return p.read_text(encoding="utf-8-sig")
    except FileNotFoundError:
        raise InputError(f"{p}: label file not found; check the path") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise InputError(f"{p}: cannot read label file ({exc}); pass a UTF-8 text file") from exc


def _read_qrels(p: Path, grade_map: GradeMap) -> list[Judgment]:
    # tuner.data.qrels owns the TREC format (3 or 4 columns, CRLF, conflicting duplicates).
    if not p.is_file():
        raise InputError(f"{p}: label file not found; check the path")
    qrels = read_qrels(p, grade_map)
    out = [Judgment(qid, doc, grade) for qid, docs in qrels.items() for doc, grade in docs.items()]
    bad = next((j for j in out if j.grade not in GRADES), None)
    if bad is not None:
        raise InputError(f"{p}: grade map sends ({bad.query_id}, {bad.doc_id}) to {bad.grade}, outside 0..3; fix --grade-map")
    return out


def _parse_jsonl(text: str, name: str, grade_map: GradeMap) -> list[Judgment]:
    out: list[Judgment] = []
    for lineno, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        where = f"{name}:{lineno}"
        try:
            rec = json.loads(line)
        except json.JSONDecodeError as exc:
            raise InputError(f"{where}: malformed JSON ({exc.msg} at column {exc.colno}); write one object per line") from exc
        if not isinstance(rec, dict):
            raise InputError(f"{where}: expected a JSON object with query_id and judgments")
        qid = _id(rec.get("query_id"), "query_id", where)
        if "judgments" in rec:
            items = rec["judgments"]
            if not isinstance(items, list):
                raise InputError(f"{where}: 'judgments' must be a list of {{doc_id, relevance}} objects")
        elif "doc_id" in rec:  # the flat form: one judgment per line
            items = [rec]
        else:
            raise InputError(f"{where}: missing field judgments; write {{\"query_id\": ..., \"judgments\": [{{\"doc_id\": ..., \"relevance\": ...}}]}}")
        for i, item in enumerate(items):
            at = f"{where} (judgment {i + 1})" if "judgments" in rec else where
            if not isinstance(item, dict) or "doc_id" not in item or "relevance" not in item:
                raise InputError(f"{at}: each judgment needs doc_id and relevance")
            doc = _id(item["doc_id"], "doc_id", at)
            grade = map_grade(item["relevance"], grade_map, at)
            if grade is not None:
                out.append(Judgment(qid, doc, grade, lineno))
    return out


def _parse_csv(text: str, name: str, grade_map: GradeMap) -> list[Judgment]:
    reader = csv.reader(io.StringIO(text, newline=""))
    try:
        header = next(reader)
    except StopIteration:
        raise InputError(f"{name}: empty CSV; the first line must be the header query_id,doc_id,relevance") from None
    cols = [c.strip() for c in header]
    missing = [c for c in ("query_id", "doc_id", "relevance") if c not in cols]
    if missing:
        raise InputError(f"{name}:1: CSV header lacks {', '.join(missing)}; the header must name query_id,doc_id,relevance")
    iq, idoc, irel = cols.index("query_id"), cols.index("doc_id"), cols.index("relevance")
    out: list[Judgment] = []
    try:
        for row in reader:
            where = f"{name}:{reader.line_num}"
            if not any(cell.strip() for cell in row):
                continue
            if len(row) != len(cols):
                raise InputError(f"{where}: expected {len(cols)} columns like the header, got {len(row)}")
            rel = row[irel].strip()
            if not rel:
                raise InputError(f"{where}: empty relevance for ({row[iq]}, {row[idoc]}); grade it or delete the row")
            grade = map_grade(rel, grade_map, where)
            if grade is not None:
                out.append(Judgment(_id(row[iq], "query_id", where), _id(row[idoc], "doc_id", where),
                                    grade, reader.line_num))
    except csv.Error as exc:
        raise InputError(f"{name}:{reader.line_num}: malformed CSV ({exc})") from exc
    return out


def _id(value: Any, key: str, where: str) -> str:
    if isinstance(value, bool) or not isinstance(value, (str, int)) or not str(value).strip():
        raise InputError(f"{where}: {key} must be a non-empty string, got {value!r}")
    return str(value).strip()


def _check_conflicts(judgments: Sequence[Judgment], name: str) -> None:
    seen: dict[tuple[str, str], Judgment] = {}
    for j in judgments:
        prior = seen.setdefault((j.query_id, j.doc_id), j)
        if prior.grade != j.grade:
            raise InputError(
                f"{name}:{j.line}: ({j.query_id}, {j.doc_id}) graded {j.grade} but {prior.grade} at line "
                f"{prior.line}; keep one grade per pair"
            )


# --------------------------------------------------------------------------- the store


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


# --------------------------------------------------------------------------- unjudged


def unjudged_pairs(
    hits: Iterable[Mapping[str, Any]],
    qrels: Mapping[str, Mapping[str, int]] | None = None,
    queries: Mapping[str, str] | None = None,
) -> list[UnjudgedPair]:
    """Deduplicated (query, doc) pairs from ``hits`` (mappings with query_id, doc_id and
    optionally title, rank) that have no label in ``qrels``; first-seen order, best rank kept."""
    qrels = qrels or {}
    pairs: dict[tuple[str, str], UnjudgedPair] = {}
    for hit in hits:
        qid, doc = str(hit["query_id"]), str(hit["doc_id"])
        if doc in qrels.get(qid, {}):
            continue
        rank = hit.get("rank")
        prior = pairs.get((qid, doc))
        title = hit.get("title") if prior is None or prior.title is None else prior.title
        best = rank if prior is None or prior.best_rank is None else (
            prior.best_rank if rank is None else min(prior.best_rank, rank)
        )
        query = (queries or {}).get(qid) or hit.get("query")
        pairs[(qid, doc)] = UnjudgedPair(qid, doc, title, query, best)
    return list(pairs.values())


def export_unjudged(
    hits: Iterable[Mapping[str, Any]],
    out: str | Path,
    *,
    qrels: Mapping[str, Mapping[str, int]] | None = None,
    fmt: Literal["csv", "jsonl"] | None = None,
    queries: Mapping[str, str] | None = None,
) -> int:
    """Write unjudged pairs for graders, atomically. CSV: ``query_id,query,doc_id,title,relevance``
    with relevance left blank; JSONL: one object per query with ``judgments`` whose
    ``relevance`` is null. Both import back once the relevance values are filled in."""
    target = Path(out)
    fmt = fmt or ("jsonl" if detect_format(target) == "jsonl" else "csv")
    if fmt not in ("csv", "jsonl"):
        raise InputError(f"{target}: unknown export format {fmt!r}; use csv or jsonl")
    pairs = unjudged_pairs(hits, qrels, queries)
    if fmt == "csv":
        buf = io.StringIO(newline="")
        writer = csv.writer(buf, lineterminator="\n")
        writer.writerow(["query_id", "query", "doc_id", "title", "relevance"])
        for p in pairs:
            writer.writerow([p.query_id, p.query or "", p.doc_id, p.title or "", ""])
        text = buf.getvalue()
    else:
        grouped: dict[str, list[UnjudgedPair]] = {}
        for p in pairs:
            grouped.setdefault(p.query_id, []).append(p)
        lines = [
            json.dumps(
                {
                    "query_id": qid,
                    "query": group[0].query,
                    "judgments": [{"doc_id": p.doc_id, "title": p.title, "relevance": None} for p in group],
                },
                ensure_ascii=False,
            )
            for qid, group in grouped.items()
        ]
        text = "".join(line + "\n" for line in lines)
    atomic_write_text(target, text)
    return len(pairs)
